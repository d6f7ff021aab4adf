"""The fingerprint: stable on the same stack, changed (and named) by any one component."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
from fakes import fake_nvml
from fakes.fake_nvml import gpu, machine
from packaging.version import Version

from stackgate.edges import nvml
from stackgate.facts import Distribution, Facts, Missing, ProbeFacts, ToolkitFacts, ToolVersion
from stackgate.facts.patchstate import PatchStatus
from stackgate.models.spec import Spec, load_spec
from stackgate.runs import fingerprint as fp

ROOT = Path(__file__).resolve().parents[1]
LOCK = load_spec(ROOT / "lockfiles" / "blackwell-sm120-cu130.toml")
ARGS = json.loads((ROOT / "tests" / "fakes" / "sglang" / "server_args.json").read_text())["fields"]
INFO = {
    **ARGS,
    "model_path": "/models/m",
    "tp_size": 8,
    "attention_backend": "flashinfer",
    "port": 30000,
    "random_seed": 41,
    "nccl_port": 45123,
    "status": "ready",
    "max_total_num_tokens": 512000,
    "internal_states": [{"last_gen_throughput": 92.6}],
    "version": "0.5.9",
}
DISTS = {"torch": "2.9.1+cu130", "flashinfer-python": "0.6.4", "sglang": "0.5.9", "triton": "3.5.1"}


def snapshot(spec: dict) -> nvml.NvmlSnapshot:
    fake_nvml.configure(spec)
    try:
        return nvml.snapshot(fake_nvml)
    finally:
        fake_nvml.configure(None)


def make(
    *,
    gpus: dict | None = None,
    dists: dict[str, str] | None = None,
    toolkit: str = "13.0.88",
    patch: str | None = None,
    info: dict | None = None,
    spec: Spec = LOCK,
) -> fp.Fingerprint:
    facts = Facts(spec, environ={})
    facts.provide("nvml", snapshot(gpus or machine([gpu() for _ in range(8)])))
    default = spec.default_toolkit
    tool = ToolVersion(default.prefix / "bin" / "nvcc", "13.0", Version(toolkit))
    facts.provide("toolkits", (ToolkitFacts(default, True, tool, tool, None, Missing("not asked")),))
    found = {name: Distribution(name, version, (), "/site-packages") for name, version in (dists or DISTS).items()}
    facts.provide("dists", ProbeFacts("/opt/stackgate/current/bin/python", "3.12.3", {}, found, None, 0.1))
    facts.provide("patches", tuple(PatchStatus(p, Path("/site-packages"), "0.5.9", patch) for p in spec.patches))
    try:
        return fp.from_facts(spec, facts, info if info is not None else INFO)
    finally:
        facts.close()


def test_the_same_stack_gives_the_same_fingerprint():
    first, second = make(), make(info=dict(reversed(list(INFO.items()))), dists=dict(reversed(list(DISTS.items()))))
    assert first.digest == second.digest and len(first.digest) == 64 and first.short == first.digest[:12]
    assert list(first.components) == list(fp.SECTIONS)
    assert first.components["gpu"]["gpu7"] == "NVIDIA RTX PRO 6000 Blackwell Server Edition, compute capability 12.0"
    assert first.components["toolkits"] == {"/usr/local/cuda-13.0": "13.0 (V13.0.88)"}
    assert first.components["patches"] == {"sglang-0.5.9-sm120-torch-symm-mem.patch": "applied to sglang 0.5.9"}
    assert first.to_dict()["components"]["distributions"]["torch"] == "2.9.1+cu130"


def test_what_changes_between_launches_of_the_same_stack_is_left_out():
    relaunched = {
        **INFO,
        "port": 30001,
        "random_seed": 7,
        "nccl_port": 40000,
        "max_total_num_tokens": 498000,
        "internal_states": [{"last_gen_throughput": 80.0}],
    }
    fast = {**INFO, "load_format": "dummy", "json_model_override_args": '{"num_hidden_layers": 4}'}
    assert make(info=relaunched).digest == make().digest == make(info=fast).digest
    server = make().components["server"]
    assert {
        "port",
        "random_seed",
        "nccl_port",
        "internal_states",
        "status",
        "max_total_num_tokens",
        "load_format",
    }.isdisjoint(server)
    assert server["attention_backend"] == "flashinfer" and server["tp_size"] == "8" and server["version"] == "0.5.9"


def test_a_different_gpu_is_the_same_stack_only_if_it_is_the_same_model():
    swapped = machine([gpu(uuid=f"GPU-new-{i}") for i in range(8)])
    assert make(gpus=swapped).digest == make().digest


@pytest.mark.parametrize(
    "change, section, name, old, new",
    [
        ({"info": {**INFO, "attention_backend": "triton"}}, "server", "attention_backend", "flashinfer", "triton"),
        ({"dists": {**DISTS, "torch": "2.10.0"}}, "distributions", "torch", "2.9.1+cu130", "2.10.0"),
        ({"gpus": machine([gpu() for _ in range(8)], driver="580.95.05")}, "gpu", "driver", "580.82.07", "580.95.05"),
        (
            {"gpus": machine([gpu() for _ in range(7)] + [gpu("NVIDIA H200", (9, 0))])},
            "gpu",
            "gpu7",
            "NVIDIA RTX PRO 6000 Blackwell Server Edition, compute capability 12.0",
            "NVIDIA H200, compute capability 9.0",
        ),
        ({"toolkit": "13.0.48"}, "toolkits", "/usr/local/cuda-13.0", "13.0 (V13.0.88)", "13.0 (V13.0.48)"),
        (
            {"patch": "not applied"},
            "patches",
            "sglang-0.5.9-sm120-torch-symm-mem.patch",
            "applied to sglang 0.5.9",
            "not applied",
        ),
        ({"spec": dataclasses.replace(LOCK, sha256="0" * 64)}, "lock", "sha256", LOCK.sha256, "0" * 64),
    ],
    ids=["backend", "torch", "driver", "gpu-model", "toolkit", "patch", "lock"],
)
def test_one_changed_component_changes_the_fingerprint_and_is_named(change, section, name, old, new):
    before, after = make(), make(**change)
    assert before.digest != after.digest
    assert [(c.section, c.name, c.old, c.new) for c in fp.changes(before.components, after.components)] == [
        (section, name, old, new)
    ]


def test_secrets_never_reach_the_fingerprint():
    server = make(info={**INFO, "api_key": "sk-secret"}).components["server"]
    assert server["api_key"] == "<redacted>"
    assert "sk-secret" not in json.dumps(make(info={**INFO, "api_key": "sk-secret"}).to_dict())


def test_what_could_not_be_gathered_is_a_component_with_its_reason():
    assert fp.gpu_section(Missing("NVML not usable: NVML Shared Library Not Found")) == {
        "unavailable": "NVML not usable: NVML Shared Library Not Found"
    }
    facts = Facts(LOCK, environ={})
    for part in fp.PARTS:
        facts.provide(part, () if part == "toolkits" else Missing(f"no {part}"))
    finger = fp.from_facts(LOCK, facts, None)
    facts.close()
    assert finger.components["server"] == {"unavailable": "no smoke stage read /server_info"}
    assert finger.components["distributions"] == {"unavailable": "no dists"}


def test_the_pylock_is_a_component_another_resolution_is_another_stack(tmp_path: Path) -> None:
    spec_path = tmp_path / "blackwell-sm120-cu128.toml"
    spec_path.write_bytes((ROOT / "lockfiles" / spec_path.name).read_bytes())
    spec = load_spec(spec_path)
    assert "pylock" not in make(spec=spec).components["lock"]  # none beside it: nothing to name
    shipped = (ROOT / "lockfiles" / "pylock.blackwell-sm120-cu128.toml").read_bytes()
    (tmp_path / "pylock.blackwell-sm120-cu128.toml").write_bytes(shipped)
    first = make(spec=spec)
    assert first.components["lock"]["pylock"] == hashlib.sha256(shipped).hexdigest()
    (tmp_path / "pylock.blackwell-sm120-cu128.toml").write_bytes(
        shipped.replace(b'version = "0.5.9"', b'version = "0.5.10"')
    )
    moved = make(spec=spec)
    assert moved.digest != first.digest
    assert [c.name for c in fp.changes(first.components, moved.components)] == ["pylock"]
