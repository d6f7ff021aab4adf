"""`stackgate verify --cached --prom`: the static checks' results reused while the stamp of what
they judged holds (a distribution, a toolkit, the spec, the driver changed: they run again), the
live GPU checks run every time (a GPU that loses a link or disappears fails a cached verify too),
a hostile cache ignored with a note, and the .prom file read back by Prometheus' own parser (the
health check's systemd units: tests/test_healthunits.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fakes.fake_nvml import gpu, machine
from prometheus_client.parser import text_string_to_metric_families
from support import SHOW_MODULES

from stackgate.models import pylock, spec
from stackgate.runs import verifycache

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
H200 = gpu(name="NVIDIA H200", cc=(9, 0))
#: What a cache hit does not use, and so does not import: the gathering of the static checks' facts
#: (interpreters' probes, the patches' downloads, the pylock's and the markers' parsers) and rich's
#: tables, progress bars and prompts (the report is plain here). invoke's own imports are not stackgate's to trim.
NOT_ON_A_HIT = (
    "stackgate.facts.interpreters",
    "stackgate.facts.generationstate",
    "stackgate.models.envfile",
    "stackgate.edges.fetch",
    "urllib.request",
    "http.client",
    "packaging.pylock",
    "packaging.markers",
    "packaging.requirements",
    "rich.progress",
    "rich.prompt",
    "rich.table",
    "invoke",  # `verify --cached` of the express lane's flags runs without the command-line framework
    "stackgate.program",
    "stackgate.tasks",
)


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A bare environment of this Python: the stack's interpreter, quick to probe."""
    folder = tmp_path_factory.mktemp("stack") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    return folder


class Node:
    """A node: its lock (the H200 profile on a venv and a toolkit under tmp), its fake GPUs, its cache folder."""

    def __init__(self, tmp: Path, venv: Path) -> None:
        self.tmp, self.venv = tmp, venv
        self.toolkit = tmp / "cuda-13.0"
        (self.toolkit / "bin").mkdir(parents=True)
        text = (ROOT / "lockfiles" / "hopper-sm90-cu130.toml").read_text()
        text = text.replace("/opt/torch/.venv/bin/python3", str(venv / "bin" / "python")).replace(
            'version = "3.12"', f'version = "{VERSION}"'
        )
        self.spec = tmp / "hopper.toml"
        self.spec.write_text(text.replace('prefix = "/usr/local/cuda-13.0"', f'prefix = "{self.toolkit}"'))
        self.gpus(machine([H200], driver="580.159.03"))

    def gpus(self, spec: dict) -> None:
        (self.tmp / "nvml.json").write_text(json.dumps(spec))

    def verify(
        self, *args: str, env: dict[str, str] | None = None, modules: Path | None = None, program: bool = False
    ) -> tuple[subprocess.CompletedProcess[str], dict]:
        """The program's run (with ``modules``, the names of the modules it imported are written there at its exit;
        with ``program``, through the command-line framework's parser rather than the express lane)."""
        env = {
            **os.environ,
            "PYTHONPATH": f"{ROOT}{os.pathsep}{TESTS}",
            "NO_COLOR": "1",
            "XDG_CACHE_HOME": str(self.tmp / "cache"),
            "CUDA_HOME": "/usr/local/cuda-13.0",
            **(env or {}),
        }
        env.update(STACKGATE_NVML_MODULE="fakes.fake_nvml", STACKGATE_FAKE_NVML=str(self.tmp / "nvml.json"))
        env.pop("STACKGATE_LOCK", None)
        report = self.tmp / "report.json"
        report.unlink(missing_ok=True)
        argv = [
            sys.executable,
            *(["-c", SHOW_MODULES, str(modules)] if modules is not None else ["-m"] if not program else []),
            *(["stackgate"] if not program else ["-c", "from stackgate.program import program; program.run()"]),
            "verify",
            "--cached",
            "--lock",
            str(self.spec),
            "--json",
            str(report),
            "--prom",
            str(self.tmp / "node.prom"),
            *args,
        ]
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert "Traceback" not in done.stderr, done.stderr
        return done, json.loads(report.read_text()) if report.exists() else {}

    def cache_file(self) -> Path:
        (found,) = (self.tmp / "cache" / "stackgate" / "verify").glob("verify-*.json")
        return found


def statuses(doc: dict) -> dict[str, str]:
    return {r["check"]: r["status"] for r in doc["results"]}


@pytest.fixture
def node(tmp_path, venv) -> Node:
    return Node(tmp_path, venv)


def test_an_unchanged_node_reuses_the_static_results_and_measures_the_gpus(node):
    first, cold = node.verify()
    assert cold["cache"]["hit"] is False and cold["cache"]["why"] == "no cache yet" and cold["cache"]["written"]
    assert "cache: the static checks ran (no cache yet); written" in first.stdout
    second, warm = node.verify()
    assert warm["cache"]["hit"] is True and second.returncode == first.returncode
    assert statuses(warm) == statuses(cold) and [r["check"] for r in warm["results"]] == [
        r["check"] for r in cold["results"]
    ]
    assert (
        warm["cache"]["live"] == 8 and warm["cache"]["reused"] == len(cold["results"]) - 8
    )  # the 7 NVML checks and gpu.kernel_events
    assert "static check result(s) reused from" in second.stdout and "8 live check(s) run" in second.stdout
    assert node.cache_file().stat().st_mode & 0o022 == 0  # no one else may write what the next verify trusts


def test_a_hit_imports_only_what_the_live_checks_and_the_report_need(node, tmp_path):
    cold, warm = tmp_path / "cold.txt", tmp_path / "warm.txt"
    first, _ = node.verify(modules=cold)  # no cache yet: every static check runs
    assert {"stackgate.facts.interpreters", "stackgate.models.envfile"} <= set(cold.read_text().split())
    again, doc = node.verify(modules=warm)
    assert doc["cache"]["hit"] is True and again.returncode == first.returncode
    assert "8 live check(s) run" in again.stdout
    imported = set(warm.read_text().split())
    assert {"stackgate.flows.verify", "stackgate.edges.nvml", "rich.console"} <= imported  # the list is the program's
    assert sorted(imported.intersection(NOT_ON_A_HIT)) == []


def test_live_checks_run_on_a_hit_a_lost_link_or_ecc_errors_fail_at_once(node):
    node.verify()
    node.gpus(machine([gpu(name="NVIDIA H200", cc=(9, 0), pcie=[5, 5, 5, 8, 16], ecc=[3, 3])], driver="580.159.03"))
    done, doc = node.verify()
    assert doc["cache"]["hit"] is True and done.returncode == 1
    assert statuses(doc)["gpu.pcie"] == "FAIL" and statuses(doc)["gpu.ecc"] == "FAIL"


def test_a_gpu_that_disappears_fails_even_when_cached(node):
    node.gpus(machine([H200, H200], driver="580.159.03"))
    node.spec.write_text(node.spec.read_text().replace("gpu_count = 1", "gpu_count = 2"))
    ok, _ = node.verify()
    assert ok.returncode in (0, 1)
    node.gpus(machine([H200], driver="580.159.03"))
    done, doc = node.verify()
    assert (
        done.returncode == 1
        and statuses(doc)["gpu.count"] == "FAIL"
        and "1 GPU(s) visible, the lock wants 2" in done.stdout
    )
    assert "gpu (count, gpu1)" in doc["cache"]["why"]  # the stamp saw it too: the static checks ran again
    families = {f.name: f for f in text_string_to_metric_families((node.tmp / "node.prom").read_text())}
    assert (
        families["stackgate_verify_passed"].samples[0].value == 0
        and families["stackgate_verify_gpus"].samples[0].value == 1
    )
    failed = {s.labels["check"]: s.value for s in families["stackgate_verify_check_failed"].samples}
    assert failed["gpu.count"] == 1 and failed["gpu.driver"] == 0


@pytest.mark.parametrize(
    "change, section",
    [
        ("distribution", "distributions"),
        ("toolkit", "toolkits"),
        ("spec", "lock (spec)"),
        ("pylock", "lock (pylock)"),
        ("driver", "gpu (driver)"),
        ("environment", "environment (CUDA_HOME)"),
    ],
)
def test_a_change_in_what_the_static_checks_judged_makes_them_run_again(node, change, section):
    node.verify()
    assert node.verify()[1]["cache"]["hit"] is True
    if change == "distribution":
        site = next((node.venv / "lib").glob("python*/site-packages"))
        info = site / f"node_change_{node.tmp.name}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: node-change-{node.tmp.name}\nVersion: 1.0\n")
    elif change == "toolkit":
        (node.toolkit / "bin" / "nvcc").write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    elif change == "spec":
        node.spec.write_text(node.spec.read_text() + "\n# edited\n")
    elif change == "pylock":
        # a pylock appears beside the spec (one that validates: one that does not is exit 2 before any check)
        empty = pylock.stamp('lock-version = "1.0"\ncreated-by = "x"\npackages = []\n', spec.load_spec(node.spec))
        (node.tmp / "pylock.hopper.toml").write_text(empty)
    elif change == "driver":
        node.gpus(machine([H200], driver="580.160.01"))
    done, doc = node.verify(env={"CUDA_HOME": str(node.tmp)} if change == "environment" else None)
    assert (
        doc["cache"]["hit"] is False
        and doc["cache"]["why"].startswith("changed since: ")
        and section in doc["cache"]["why"]
    ), doc["cache"]
    assert (
        node.verify(env={"CUDA_HOME": str(node.tmp)} if change == "environment" else None)[1]["cache"]["hit"] is True
    ), "the refreshed cache answers the next verify"


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda p: p.write_bytes(b"\x00garbage"), "damaged"),
        (
            lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "schema": "other/9"})),
            "damaged: ValueError: not a stackgate.verify-cache/1 document",
        ),
        (
            lambda p: p.write_text(
                json.dumps({**json.loads(p.read_text()), "results": [{"check": "x", "status": "PASS", "summary": 3}]})
            ),
            "a result without its check or summary",
        ),
        (lambda p: p.write_text(p.read_text().replace('"status": "FAIL"', '"status": "GREAT"')), "damaged: KeyError"),
        (
            lambda p: os.chmod(p, 0o666),
            "is writable by others (mode 0666): refused; stackgate trusts only its own user's files here",
        ),
    ],
)
def test_a_hostile_or_damaged_cache_is_ignored_with_a_note(node, damage, why):
    cold = node.verify()[1]
    damage(node.cache_file())
    done, doc = node.verify()
    assert doc["cache"]["hit"] is False and why in doc["cache"]["why"] and statuses(doc) == statuses(cold)
    assert node.verify()[1]["cache"]["hit"] is True  # written again, from a real run


def flip_to_pass(path: Path) -> None:
    """Every FAIL of the cache turned into a PASS, as someone who may replace it would."""
    path.write_text(path.read_text().replace('"status": "FAIL"', '"status": "PASS"'))


@pytest.mark.parametrize("program", [False, True], ids=["express lane", "program"])
@pytest.mark.parametrize(
    "plant, why",
    [
        (lambda p: p.parent.chmod(0o777), "is writable by others (mode 0777), so another user could replace it"),
        (lambda p: p.parent.chmod(0o775), "is writable by its group (mode 0775), so another user could replace it"),
        (
            lambda p: (p.rename(p.with_name("elsewhere.json")), p.symlink_to(p.with_name("elsewhere.json"))),
            "is a symbolic link (to ",
        ),
    ],
    ids=["folder others may write", "folder its group may write", "a symbolic link"],
)
def test_a_forged_pass_where_another_user_could_have_put_it_is_not_trusted(node, plant, why, program):
    """Every FAIL flipped to PASS in a cache that another user could have replaced (its folder writable
    by them) or that is a link to elsewhere: the static checks run again, and the note says why."""
    cold = node.verify(program=program)[1]
    assert "FAIL" in statuses(cold).values() and cold["verdict"] == "failed"
    path = node.cache_file()
    flip_to_pass(path)
    plant(path)
    done, doc = node.verify(program=program)
    assert doc["cache"]["hit"] is False and why in doc["cache"]["why"], doc["cache"]
    assert statuses(doc) == statuses(cold) and done.returncode == 1
    assert f"cache: the static checks ran (the cache {path} is ignored: " in done.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_cache_of_another_user_is_not_trusted(node):
    cold = node.verify()[1]
    flip_to_pass(node.cache_file())
    os.chown(node.cache_file(), 65534, 65534)
    done, doc = node.verify()
    assert doc["cache"]["hit"] is False and "is owned by uid 65534, not by this user (uid 0)" in doc["cache"]["why"]
    assert statuses(doc) == statuses(cold) and done.returncode == 1


def test_cached_and_deep_together_is_bad_usage(node):
    done, doc = node.verify("--deep")
    assert (
        done.returncode == 2
        and "--cached reuses the static checks' results; --deep measures the GPUs every time" in done.stderr
        and doc == {}
    )


def test_a_check_is_live_when_it_reads_only_nvml_or_is_the_kernel_events_check():
    from stackgate.checks.all import REGISTRY
    from stackgate.checks.core import Check

    live = sorted(name for name, check in REGISTRY.items() if verifycache.is_live(check))
    assert live == [
        "gpu.capability",
        "gpu.count",
        "gpu.driver",
        "gpu.driver_cuda",
        "gpu.ecc",
        "gpu.kernel_events",
        "gpu.pcie",
        "gpu.processes",
    ]
    assert verifycache.is_live(Check("gpu.kernel_events", lambda spec, facts: None, "x", ("kernel_log",), 5.0, False))  # type: ignore[arg-type, return-value]
    assert not verifycache.is_live(Check("gpu.other", lambda spec, facts: None, "x", ("kernel",), 5.0, False))  # type: ignore[arg-type, return-value]


def test_a_metadata_rewritten_in_place_is_seen_and_a_stale_fail_clears_when_it_is_restored(tmp_path):
    """A distribution's METADATA edited in place (its folder's entries, and so the folder's time,
    unchanged): the cached verify judges again and FAILs as the full one does; the file restored,
    the FAIL clears."""
    own = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(own)], check=True, timeout=120)
    site = next((own / "lib").glob("python*/site-packages"))
    frozen = (("torch", "2.11.0"), ("triton", "3.6.0"), ("nvidia_nccl_cu13", "2.28.9"))  # the lock's frozen packages
    for name, version in frozen:
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n")
        (info / "RECORD").write_text(f"{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
    metadata = site / "torch-2.11.0.dist-info" / "METADATA"
    node = Node(tmp_path, own)
    pins = []
    for version in ("2.11.0", "2.10.0", "2.11.0"):
        with open(metadata, "r+") as rewrite:  # in place: the same file, the same size
            rewrite.write(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        done, doc = node.verify("--check", "python.frozen")
        pins.append((statuses(doc)["python.frozen"], doc["cache"]["hit"]))
    assert pins == [("PASS", False), ("FAIL", False), ("PASS", False)], pins
    assert node.verify("--check", "python.frozen")[1]["cache"]["hit"] is True  # unchanged since: reused


def _masked(text: str) -> str:
    """Output with its timings and times of day masked: what two runs of one verify share."""
    return re.sub(r"\d+(\.\d+)? s\b|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "#", text)


def test_the_express_lane_and_the_program_give_the_same_verify(node):
    """`verify --cached` of the lane's flags runs without invoke; the program's parser gives the same run."""
    for extra in ((), ("--strict", "-c", "cuda.*", "--check=gpu.driver")):
        node.verify(*extra)  # the cache as this selection of checks leaves it
        lane, lane_doc = node.verify(*extra)
        full, full_doc = node.verify(*extra, program=True)
        assert (lane.returncode, _masked(lane.stdout), lane.stderr) == (
            full.returncode,
            _masked(full.stdout),
            full.stderr,
        ), extra
        assert [(r["check"], r["status"], r["summary"]) for r in lane_doc["results"]] == [
            (r["check"], r["status"], r["summary"]) for r in full_doc["results"]
        ]
    bad = {"STACKGATE_DEEP_TIMEOUT_S": "abc"}  # a usage error: exit 2 and one message, either way
    lane, _ = node.verify(env=bad)
    full, _ = node.verify(env=bad, program=True)
    assert (lane.returncode, lane.stderr) == (full.returncode, full.stderr) == (2, full.stderr)
    assert full.stderr.startswith("stackgate: $STACKGATE_DEEP_TIMEOUT_S='abc'")
