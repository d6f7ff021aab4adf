"""The probe and the Python/torch/NCCL checks against real interpreters: one without torch,
one with the CPU build of torch, and venvs holding real distribution metadata."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from fakes import fake_nvml
from fakes.fake_nvml import gpu, machine
from support import install_dist, interpreter_lock, make_venv

from stackgate.checks.all import REGISTRY
from stackgate.facts import Facts, Missing, ProbeFacts, gather
from stackgate.facts.compare import conflicts
from stackgate.facts.interpreters import PROBE
from stackgate.models import pylock
from stackgate.models.result import Status
from stackgate.models.spec import Spec

VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"


def spec_for(python: Path, packages: str = "", extra: str = "", version: str = VERSION) -> Spec:
    return interpreter_lock(python, packages, extra, version=version)


def run(name, spec):
    facts = gather(spec, REGISTRY[name].needs, environ={"PATH": "/usr/bin:/bin"})
    try:
        return REGISTRY[name].function(spec, facts), facts
    finally:
        facts.close()


def test_the_probe_runs_in_an_interpreter_without_torch(tmp_path):
    out = tmp_path / "facts.json"
    done = subprocess.run(
        [sys.executable, str(PROBE), str(out), json.dumps({"torch": True})], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    facts = json.loads(out.read_text())
    assert facts["schema"] == "stackgate.probe/1"
    assert facts["python"]["markers"]["python_version"] == VERSION
    assert "packaging" in facts["distributions"] and facts["torch"] is None


def test_the_probe_and_the_distributions_read_the_metadata_once(torch_python, monkeypatch):
    """verify gathers both (the probe for the checks, the distributions for environment.drift and the
    deep runs' start): torch's import is the probe's own run, the distributions are read once for both."""
    from stackgate.facts import interpreters

    requests: list[dict[str, Any]] = []
    real = interpreters._run_probe
    monkeypatch.setattr(
        interpreters, "_run_probe", lambda py, request, env: requests.append(request) or real(py, request, env)
    )
    facts = gather(spec_for(torch_python, 'torch = ">=2"'), ["probe", "dists"], environ={"PATH": "/usr/bin:/bin"})
    try:
        probe, dists = facts.probe, facts.dists
    finally:
        facts.close()
    assert isinstance(probe, ProbeFacts) and isinstance(dists, ProbeFacts)
    assert sorted(bool(r["torch"]) for r in requests) == [False, True]  # two interpreters, not three
    assert probe.distributions == dists.distributions and probe.torch is not None and probe.torch["imported"]
    assert probe.dist("torch") is not None and probe.dist("torch").shared_objects  # the ELF scan's files


def test_the_probe_reads_torch_from_the_cpu_build(torch_python):
    result, facts = run("torch.build", spec_for(torch_python, 'torch = ">=2"'))
    torch = facts.probe.torch
    assert torch["imported"] and torch["version"].startswith("2.13.0") and torch["cuda"] is None
    assert torch["cuda_available"] is False and torch["arch_list"] == []
    assert "error" in torch["nccl_version"]
    assert result.status is Status.FAIL
    assert result.summary == f"torch {torch['version']} is a CPU build: it has no CUDA (the lock wants CUDA 13.0)"


def test_torch_checks_that_depend_on_a_cuda_build_skip_with_the_reason(torch_python):
    spec = spec_for(torch_python, 'torch = ">=2"')
    for name in ("torch.arch", "nccl.version"):
        result, _ = run(name, spec)
        assert result.status is Status.SKIP and "see torch.build" in result.summary, name


def test_pins_compare_distribution_versions_with_the_local_label(torch_python):
    right, facts = run(
        "python.frozen", spec_for(torch_python, 'torch = "==2.13.0"', '[python.guard]\nfrozen = ["torch"]')
    )
    installed = facts.probe.dist("torch").version
    assert right.status is Status.PASS, right.summary
    wrong, _ = run(
        "python.frozen", spec_for(torch_python, 'torch = "==2.13.0+cu130"', '[python.guard]\nfrozen = ["torch"]')
    )
    assert wrong.status is Status.FAIL
    assert wrong.summary == f"frozen package(s) moved: torch is {installed}, locked ==2.13.0+cu130"


def test_a_missing_pinned_package_fails_the_pins(torch_python):
    result, _ = run("python.pins", spec_for(torch_python, 'torch = ">=2"\nsglang = "==0.5.9"'))
    assert result.status is Status.FAIL
    assert result.details == ("sglang is not installed (locked ==0.5.9)",)


def test_the_wrong_python_version_fails(tmp_path):
    python, _ = make_venv(tmp_path / "venv")
    result, _ = run("python.interpreter", spec_for(python, version="3.9"))
    assert result.status is Status.FAIL and result.summary.endswith(
        f"is Python {sys.version.split()[0]}, the lock wants 3.9"
    )


def overridden_venv(tmp_path):
    python, site = make_venv(tmp_path / "venv")
    install_dist(
        site,
        "sglang",
        "0.5.9",
        ("flashinfer_python==0.6.3", "torch==2.9.1; sys_platform == 'win32'", "uvloop; extra == 'srt'"),
    )
    install_dist(site, "flashinfer-python", "0.6.4", ("torch",))
    return python, site


def test_a_declared_override_is_accepted_with_its_reason(tmp_path):
    python, site = overridden_venv(tmp_path)
    install_dist(site, "torch", "2.9.1+cu130")
    override = (
        '[[python.override]]\npackage = "flashinfer-python"\nversion = "==0.6.4"\nreason = "sglang 0.5.9 pins 0.6.3"'
    )
    result, _ = run("python.consistency", spec_for(python, 'flashinfer-python = "==0.6.4"', override))
    assert result.status is Status.PASS
    assert result.details == (
        "accepted override: sglang 0.5.9 requires flashinfer_python==0.6.3, but flashinfer-python 0.6.4 is "
        "installed (reason: sglang 0.5.9 pins 0.6.3)",
    )


def test_any_other_conflict_fails(tmp_path):
    python, site = overridden_venv(tmp_path)
    install_dist(site, "torch", "2.10.0", ())
    install_dist(site, "xgrammar", "0.1.27", ("torch>=2.10", "ninja"))
    result, _ = run("python.consistency", spec_for(python, 'flashinfer-python = "==0.6.4"'))
    assert result.status is Status.FAIL
    assert set(result.data["conflicts"]) == {
        "sglang 0.5.9 requires flashinfer_python==0.6.3, but flashinfer-python 0.6.4 is installed",
        "xgrammar 0.1.27 requires ninja, but ninja is not installed",
    }


def test_conflicts_skip_requirements_behind_extras_and_false_markers():
    dist = type("D", (), {})
    sglang = dist()
    sglang.name, sglang.version = "sglang", "0.5.9"
    sglang.requires = ("uvloop; extra == 'srt'", "torch==2.9.1; sys_platform == 'win32'", "not a requirement !!")
    markers = {
        "python_version": VERSION,
        "sys_platform": "linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "platform_system": "Linux",
        "platform_release": "",
        "platform_version": "",
        "python_full_version": "3.11.7",
        "platform_python_implementation": "CPython",
        "implementation_name": "cpython",
        "implementation_version": "3.11.7",
    }
    assert conflicts({"sglang": sglang}, markers) == []


def test_flashinfer_cubin_must_equal_flashinfer_python(tmp_path):
    python, site = make_venv(tmp_path / "venv")
    install_dist(site, "flashinfer-python", "0.6.4")
    install_dist(site, "flashinfer-cubin", "0.6.3")
    install_dist(site, "flashinfer-jit-cache", "0.6.4+cu130")
    result, _ = run("flashinfer.cubin", spec_for(python))
    assert result.status is Status.FAIL
    assert result.summary == "flashinfer-cubin 0.6.3 != flashinfer-python 0.6.4: import flashinfer raises RuntimeError"
    (site / "flashinfer_cubin-0.6.3.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: flashinfer-cubin\nVersion: 0.6.4\n"
    )
    result, _ = run("flashinfer.cubin", spec_for(python))
    assert (
        result.status is Status.PASS
        and result.summary == "flashinfer-python 0.6.4, flashinfer-cubin 0.6.4, flashinfer-jit-cache 0.6.4+cu130"
    )


def test_a_missing_interpreter_is_one_failure_and_the_rest_skip(tmp_path):
    spec = spec_for(tmp_path / "nowhere" / "python", 'torch = ">=2"')
    result, _ = run("python.interpreter", spec)
    assert (
        result.status is Status.FAIL
        and result.summary == f"the lock's interpreter {tmp_path / 'nowhere' / 'python'} does not exist"
    )
    for name in ("python.pins", "torch.build", "abi.imports", "abi.elf"):
        assert run(name, spec)[0].status is Status.SKIP, name


def test_probe_facts_parse_what_the_probe_writes(torch_python, tmp_path):
    _, facts = run("python.interpreter", spec_for(torch_python))
    assert isinstance(facts.probe, ProbeFacts)
    assert facts.probe.executable.startswith(str(torch_python.parent.parent))


def _wheel(tag: str) -> bytes:
    return f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n".encode()


def _pylocked(tmp_path: Path, python: Path, packages: str, locked: str) -> Spec:
    """A spec for ``python`` at tmp_path/spec.toml with the pylock ``locked`` (PEP 751 packages) beside it."""
    spec = dataclasses.replace(spec_for(python, packages), path=tmp_path / "spec.toml")
    (tmp_path / "pylock.spec.toml").write_text(
        pylock.stamp('lock-version = "1.0"\ncreated-by = "test"\n' + locked, spec)
    )
    return spec


def _locked(name: str, version: str, filename: str, url: str = "https://files.example/", marker: str = "") -> str:
    digest = hashlib.sha256(filename.encode()).hexdigest()
    marker_line = f"marker = {json.dumps(marker)}\n" if marker else ""
    return (
        f'\n[[packages]]\nname = "{name}"\nversion = "{version}"\n{marker_line}wheels = [{{ url = '
        f'"{url}{filename}", hashes = {{ sha256 = "{digest}" }} }}]\n'
    )


def test_python_locked_names_every_difference_from_the_pylock(tmp_path):
    python, site = make_venv(tmp_path / "env")
    install_dist(site, "torch", "2.9.1", files={"torch-2.9.1.dist-info/WHEEL": _wheel("py3-none-any")})
    install_dist(site, "sglang", "0.5.8", files={"sglang-0.5.8.dist-info/WHEEL": _wheel("py3-none-any")})
    # sgl-kernel: the locked version, but PyPI's build instead of the locked cu130 URL wheel
    origin = {
        "url": "https://files.example/sgl_kernel-0.3.21-cp39-abi3-manylinux2014_x86_64.whl",
        "archive_info": {"hashes": {"sha256": "ab" * 32}},
    }
    install_dist(
        site, "sgl-kernel", "0.3.21", files={"sgl_kernel-0.3.21.dist-info/direct_url.json": json.dumps(origin).encode()}
    )
    install_dist(
        site,
        "flashinfer-python",
        "0.6.4",
        files={"flashinfer_python-0.6.4.dist-info/WHEEL": _wheel("cp311-cp311-win_amd64")},
    )
    install_dist(site, "xgrammar", "0.1.27")
    install_dist(site, "pip", "24.0")  # the environment's own pip: put there on purpose
    locked = (
        _locked("torch", "2.9.1", "torch-2.9.1-py3-none-any.whl")
        + _locked("sglang", "0.5.9", "sglang-0.5.9-py3-none-any.whl")
        + _locked(
            "sgl-kernel",
            "0.3.21",
            "sgl_kernel-0.3.21-cp310-abi3-manylinux2014_x86_64.whl",
            url="https://github.example/",
        )
        + _locked("flashinfer-python", "0.6.4", "flashinfer_python-0.6.4-py3-none-any.whl")
        + _locked("triton", "3.5.1", "triton-3.5.1-py3-none-any.whl")
        + _locked(
            "nvidia-nccl-cu13",
            "2.27.7",
            "nvidia_nccl_cu13-2.27.7-py3-none-win_amd64.whl",
            marker="sys_platform == 'win32'",
        )
    )
    result, _ = run("python.locked", _pylocked(tmp_path, python, 'torch = "==2.9.1"', locked))
    assert result.status is Status.FAIL
    assert result.details == (
        "flashinfer-python 0.6.4 was installed from a wheel tagged cp311-cp311-win_amd64, not from the pylock's "
        "flashinfer_python-0.6.4-py3-none-any.whl",
        "sgl-kernel 0.3.21 was installed from the direct URL "
        "https://files.example/sgl_kernel-0.3.21-cp39-abi3-manylinux2014_x86_64.whl, "
        "not from the pylock's sgl_kernel-0.3.21-cp310-abi3-manylinux2014_x86_64.whl",
        "sglang is 0.5.8, the pylock holds 0.5.9",
        "triton 3.5.1 is locked but not installed",
        "xgrammar 0.1.27 is installed but not in the pylock",
    )  # nvidia-nccl-cu13 is locked for Windows only (its marker): not expected here
    assert result.summary.startswith(
        "5 difference(s) from pylock.spec.toml: flashinfer-python 0.6.4 was installed from a wheel tagged"
    )
    assert result.fix is not None and result.fix.commands == ("stackgate provision --only python",)


def test_python_locked_reads_wheel_tags_as_the_real_wheels_write_them(tmp_path):
    # As a real provision of the cu128 profile installed them: hf-transfer 0.1.9's WHEEL (maturin) holds
    # a compressed tag set on one line; sgl-kernel 0.3.21's and torch-memory-saver 0.0.9's say
    # linux_x86_64 under a manylinux2014 file name. Each is the locked file; another architecture is not.
    python, site = make_venv(tmp_path / "env")
    shipped = {
        "hf-transfer": ("0.1.9", "cp38-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64"),
        "sgl-kernel": ("0.3.21", "cp310-abi3-linux_x86_64"),
        "torch-memory-saver": ("0.0.9", "cp39-abi3-linux_x86_64"),
        "triton": ("3.5.1", "cp311-cp311-linux_aarch64"),
    }
    for name, (version, tag) in shipped.items():
        info = f"{name.replace('-', '_')}-{version}.dist-info/WHEEL"
        install_dist(site, name, version, files={info: _wheel(tag)})
    locked = (
        _locked("hf-transfer", "0.1.9", "hf_transfer-0.1.9-cp38-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
        + _locked("sgl-kernel", "0.3.21", "sgl_kernel-0.3.21-cp310-abi3-manylinux2014_x86_64.whl")
        + _locked("torch-memory-saver", "0.0.9", "torch_memory_saver-0.0.9-cp39-abi3-manylinux2014_x86_64.whl")
        + _locked("triton", "3.5.1", "triton-3.5.1-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl")
    )
    result, _ = run("python.locked", _pylocked(tmp_path, python, 'torch = "==2.9.1"', locked))
    assert result.details == (
        "triton 3.5.1 was installed from a wheel tagged cp311-cp311-linux_aarch64, not from the pylock's "
        "triton-3.5.1-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
    ), result.details


def test_python_locked_passes_on_exactly_the_pylock_and_warns_when_the_spec_moved_on(tmp_path):
    python, site = make_venv(tmp_path / "env")
    kernel = "sgl_kernel-0.3.21+cu130-cp310-abi3-manylinux2014_x86_64.whl"
    origin = {
        "url": f"file:///srv/wheelhouse/{kernel.replace('+', '%2B')}",
        "archive_info": {"hashes": {"sha256": hashlib.sha256(kernel.encode()).hexdigest()}},
    }
    install_dist(
        site,
        "sgl-kernel",
        "0.3.21+cu130",
        files={"sgl_kernel-0.3.21+cu130.dist-info/direct_url.json": json.dumps(origin).encode()},
    )
    install_dist(site, "torch", "2.9.1", files={"torch-2.9.1.dist-info/WHEEL": _wheel("py3-none-any")})
    locked = _locked("torch", "2.9.1", "torch-2.9.1-py3-none-any.whl") + _locked("sgl-kernel", "0.3.21+cu130", kernel)
    spec = _pylocked(tmp_path, python, 'torch = "==2.9.1"', locked)
    result, _ = run("python.locked", spec)
    assert result.status is Status.PASS, result.details
    assert result.summary.startswith("2 distributions exactly as pylock.spec.toml (sha256 ")
    moved = dataclasses.replace(spec_for(python, 'torch = "==2.9.2"'), path=spec.path)
    result, _ = run("python.locked", moved)
    assert result.status is Status.WARN
    assert result.summary == (
        "installed exactly as pylock.spec.toml, but the pylock no longer matches the spec: "
        "python.packages.torch: ==2.9.1 in the pylock, ==2.9.2 in the spec"
    )


def test_python_locked_skips_without_a_pylock_saying_how_to_make_one(tmp_path):
    python, _ = make_venv(tmp_path / "env")
    spec = dataclasses.replace(spec_for(python), path=tmp_path / "spec.toml")
    result, _ = run("python.locked", spec)
    assert result.status is Status.SKIP
    assert result.summary == (
        f"the spec has no pylock: {tmp_path / 'pylock.spec.toml'} does not exist (`stackgate lock --lock "
        f"{tmp_path / 'spec.toml'}` makes it)"
    )


def _cuda_torch_seeing_no_gpu(plain_python: Path, nvml_lib: Any = None) -> Facts:
    """The facts of a cu130 torch that sees no GPU (CUDA_VISIBLE_DEVICES hides them, or no driver):
    torch.cuda.get_arch_list() is then empty, as it was on the H200 with the GPU hidden."""
    spec = spec_for(plain_python)
    facts = gather(spec, ["probe"], environ={"PATH": "/usr/bin:/bin"}, nvml_lib=nvml_lib)
    probe = facts.probe
    assert isinstance(probe, ProbeFacts), probe
    torch = {
        "imported": True,
        "version": "2.11.0+cu130",
        "cuda": "13.0",
        "hip": None,
        "arch_list": [],
        "cuda_available": False,
    }
    return facts.provide("probe", dataclasses.replace(probe, torch=torch))


def test_an_empty_arch_list_is_not_a_missing_kernel(plain_python):
    fake_nvml.configure(fake_nvml.machine([fake_nvml.gpu("NVIDIA H200", (9, 0))]))
    facts = _cuda_torch_seeing_no_gpu(plain_python, fake_nvml)
    try:
        result = REGISTRY["torch.arch"].function(spec_for(plain_python), facts)
    finally:
        fake_nvml.configure(None)
        facts.close()
    assert result.status is Status.FAIL
    assert result.summary == (
        "torch sees none of the 1 GPU(s) NVML lists, and CUDA_VISIBLE_DEVICES is not set: the cause is not known "
        "from this; torch's arch list is judged only when torch sees the GPUs"
    )
    assert "it carries" not in result.summary and "arch list includes" not in result.fix.text


def test_a_torch_that_counts_the_gpu_but_cannot_start_cuda_is_not_told_to_make_it_visible(plain_python):
    """On the H200 under `ulimit -v`, torch 2.11 counted the GPU (from NVML) while CUDA could not start
    (is_available() False): the cause is not the GPU's visibility, so the evidence sweep is asked, not a guess."""
    fake_nvml.configure(fake_nvml.machine([fake_nvml.gpu("NVIDIA H200", (9, 0))]))
    facts = _cuda_torch_seeing_no_gpu(plain_python, fake_nvml)
    probe = facts.probe
    assert isinstance(probe, ProbeFacts)
    facts.provide("probe", dataclasses.replace(probe, torch={**probe.torch, "device_count": 1}))
    try:
        result = REGISTRY["torch.arch"].function(spec_for(plain_python), facts)
    finally:
        fake_nvml.configure(None)
        facts.close()
    assert result.status is Status.FAIL and result.fix is not None
    assert result.summary.startswith(
        "torch sees none of the 1 GPU(s) NVML lists (torch.cuda.device_count() is 1, torch.cuda.is_available() is "
        "False), and CUDA_VISIBLE_DEVICES is not set"
    ), result.summary
    assert "visible" not in result.fix.text and "CUDA_VISIBLE_DEVICES" not in result.fix.text


def test_an_empty_arch_list_without_a_gpu_skips(plain_python):
    facts = _cuda_torch_seeing_no_gpu(plain_python).provide(
        "nvml", Missing("NVML not loadable: libnvidia-ml.so.1 not found")
    )
    try:
        result = REGISTRY["torch.arch"].function(spec_for(plain_python), facts)
    finally:
        facts.close()
    assert result.status is Status.SKIP and "sees no GPU" in result.summary, result.summary


def hidden_gpus(torch_python, visible: str):
    """torch.arch on one H200 (fake NVML) with the probe run for real, by the CPU torch venv, under
    CUDA_VISIBLE_DEVICES=``visible``; CPU torch sees no GPU just as a hidden CUDA one does (device_count 0, an
    empty arch list), and only its CUDA version is set as a CUDA build would report it."""
    spec = spec_for(torch_python, 'torch = ">=2"')
    fake_nvml.configure(machine([gpu(name="NVIDIA H200", cc=(9, 0))]))
    facts = gather(
        spec,
        ["probe", "nvml", "env"],
        environ={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": visible},
        nvml_lib=fake_nvml,
    )
    try:
        probe = facts.probe
        assert probe.torch["device_count"] == 0 and probe.torch["arch_list"] == []
        facts.provide("probe", dataclasses.replace(probe, torch={**probe.torch, "cuda": "13.0"}))
        return REGISTRY["torch.arch"].function(spec, facts)
    finally:
        facts.close()
        fake_nvml.configure(None)


def test_hidden_gpus_are_named_as_the_variable_that_hides_them_not_as_a_missing_arch(torch_python):
    result = hidden_gpus(torch_python, "")
    assert result.status is Status.FAIL
    assert result.summary.startswith("torch sees no GPU: CUDA_VISIBLE_DEVICES='' hides 1 of the 1 GPU(s) NVML lists; ")
    assert "arch list is judged only when torch sees the GPUs" in result.summary and "sm_" not in result.fix.text
    assert "Unset CUDA_VISIBLE_DEVICES" in result.fix.text
    missing = hidden_gpus(torch_python, "3")
    assert missing.summary.startswith(
        "torch sees no GPU: CUDA_VISIBLE_DEVICES='3' hides 1 of the 1 GPU(s) NVML lists: it names 3, which is not a "
        "GPU here (NVML lists 0)"
    )
