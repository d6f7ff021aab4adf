"""`invoke verify` end to end, as a user runs it: real subprocesses, real files, exit codes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from fakes.fake_nvml import gpu, machine
from support import run_program

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"


def verify(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return run_program("verify", *args, program="invoke", env=env, timeout=timeout)


def fake_gpus(tmp_path: Path, spec: dict) -> dict[str, str]:
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps(spec))
    return {"STACKGATE_NVML_MODULE": "fakes.fake_nvml", "STACKGATE_FAKE_NVML": str(path)}


def hopper_like(tmp_path: Path, python: Path, gpus: int = 1) -> Path:
    """The H200 profile, pointed at an interpreter of this machine."""
    text = (ROOT / "lockfiles" / "hopper-sm90-cu130.toml").read_text()
    text = text.replace("/opt/torch/.venv/bin/python3", str(python)).replace(
        'version = "3.12"', f'version = "{VERSION}"'
    )
    text = text.replace("gpu_count = 1", f"gpu_count = {gpus}")
    path = tmp_path / "hopper.toml"
    path.write_text(text)
    return path


def test_the_default_lock_on_a_machine_without_gpus_fails_with_reports(tmp_path):
    done = verify("--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "r.xml"))
    assert done.returncode == 1, done.stderr
    assert "FAIL  gpu.driver" in done.stdout and "FAILED" in done.stdout.splitlines()[-1]
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["lock"]["name"] == "blackwell-sm120-cu130" and len(doc["lock"]["sha256"]) == 64
    assert doc["exit_code"] == 1 and doc["host"]["hostname"]
    by_name = {r["check"]: r for r in doc["results"]}
    assert by_name["gpu.driver"]["status"] == "FAIL" and by_name["gpu.driver"]["fix"]["commands"] == ["nvidia-smi"]
    cases = ET.parse(tmp_path / "r.xml").getroot().findall("testsuite/testcase")
    assert {c.attrib["name"] for c in cases} == set(by_name)


def test_without_a_driver_one_line_says_so_and_the_checks_that_need_a_gpu_are_one_row(tmp_path):
    """Without a spec, the first lines say the shipped default judged a machine with no GPU, and what to type."""
    no_driver = {  # the fake's LIBRARY_NOT_FOUND; no spec in the system folder
        "STACKGATE_NVML_MODULE": "fakes.fake_nvml",
        "STACKGATE_FAKE_NVML": "",
        "STACKGATE_SYSTEM_DIR": str(tmp_path / "etc-stackgate"),
    }
    system = tmp_path / "etc-stackgate" / "stack.toml"
    done = verify("--json", str(tmp_path / "r.json"), env=no_driver)
    assert done.returncode == 1, done.stderr  # as before: gpu.driver fails
    lines = done.stdout.splitlines()
    assert lines[0].startswith("judged against the shipped default profile blackwell-sm120-cu130 (SGLang 0.5.9, TP8")
    assert lines[0].endswith(
        f"no spec was found (--lock, $STACKGATE_LOCK, stackgate.toml here or in a folder above, {system}), "
        "and this machine has no GPU (no NVIDIA driver answers)"
    )
    assert lines[1].startswith("describe this machine with `stackgate init` (it writes ./stackgate.toml")
    assert lines[2] == "no NVIDIA driver on this machine: 6 checks that need a GPU are skipped", lines[:3]
    assert lines[3].startswith("stackgate verify: blackwell-sm120-cu130")
    names = "gpu.driver_cuda, gpu.count, gpu.capability, gpu.pcie, gpu.ecc, gpu.processes"
    row = f"  SKIP  gpu.* (6 checks)    skipped, no NVIDIA driver: {names}"
    assert row in lines and done.stdout.count("NVML Shared Library Not Found") == 1, done.stdout
    results = json.loads((tmp_path / "r.json").read_text())["results"]
    assert ", ".join(r["check"] for r in results if r["data"].get("needs_gpu")) == names
    deep = verify("--deep", env=no_driver)
    assert deep.returncode == 1
    assert deep.stdout.splitlines()[2] == "no NVIDIA driver on this machine: 10 checks that need a GPU are skipped"
    assert "  SKIP  deep.* (4 checks)   skipped, no NVIDIA driver: deep.gpu_work, deep.collective, " in deep.stdout


def test_with_a_driver_there_is_no_such_line(tmp_path):
    env = fake_gpus(tmp_path, machine([gpu(name="NVIDIA H200", cc=(9, 0))], driver="580.159.03"))
    done = verify("--check", "gpu.*", env=env)
    assert "no NVIDIA driver" not in done.stdout and "gpu.*" not in done.stdout
    assert "  FAIL  gpu.capability" in done.stdout


def test_the_h200_scenario_names_the_gpu_its_capability_and_the_lock(tmp_path):
    env = fake_gpus(
        tmp_path, machine([gpu(name="NVIDIA H200", cc=(9, 0), pcie=[5, 5, 5, 16, 16])], driver="580.159.03")
    )
    done = verify("--check", "gpu.*", "--json", str(tmp_path / "r.json"), env=env)
    assert done.returncode == 1
    (capability,) = [
        r for r in json.loads((tmp_path / "r.json").read_text())["results"] if r["check"] == "gpu.capability"
    ]
    assert capability["status"] == "FAIL"
    assert capability["summary"] == "1 of 1 GPU(s) are not compute capability 12.0: NVIDIA H200 is 9.0"


def test_a_matching_machine_and_interpreter_pass(tmp_path, torch_python):
    spec = hopper_like(tmp_path, torch_python)
    env = fake_gpus(tmp_path, machine([gpu(name="NVIDIA H200", cc=(9, 0))], driver="580.159.03"))
    done = verify("--lock", str(spec), "--check", "gpu.*", "--check", "python.interpreter", env=env)
    assert done.returncode == 0, done.stdout
    assert " ".join(done.stdout.split()).count("PASS gpu.capability all 1 GPU(s) are compute capability 9.0") == 1


def test_the_cpu_torch_fails_as_a_cpu_build(tmp_path, torch_python):
    done = verify("--lock", str(hopper_like(tmp_path, torch_python)), "--check", "torch.build")
    assert done.returncode == 1
    assert "is a CPU build: it has no CUDA (the lock wants CUDA 13.0)" in done.stdout


def test_a_bad_lockfile_exits_2_and_writes_nothing(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(
        (ROOT / "lockfiles" / "hopper-sm90-cu130.toml").read_text().replace('torch = "==2.11.0"', 'torch = "=2.11.0"')
    )
    done = verify("--lock", str(bad), "--json", str(tmp_path / "r.json"))
    assert done.returncode == 2
    assert f"{bad}: 1 problem in the lockfile:" in done.stderr
    assert "python.packages.torch: invalid specifier '=2.11.0'" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "r.json").exists()


def test_usage_errors_exit_2():
    done = verify("--check", "gpu.drvier")
    assert done.returncode == 2 and "no check matches 'gpu.drvier'" in done.stderr


def test_list_names_every_check():
    done = verify("--list")
    assert done.returncode == 0
    names = [line.split()[0] for line in done.stdout.splitlines()]
    assert "gpu.capability" in names and "abi.elf" in names
    for name, title in (
        ("environment.generation", "The live generation was built from this lock's Python stack."),
        ("environment.drift", "The installed distributions and the patches are as locked."),
    ):
        assert (
            f"{name:<{len(max(names, key=len))}}  {title} (when named: --check; the gate runs it)"
            in done.stdout.splitlines()
        )


def test_the_gate_s_environment_checks_run_by_name(tmp_path):
    """The default lock's root does not exist here: no live generation, nothing to judge drift on."""
    done = verify("--check", "environment.*", "--json", str(tmp_path / "v.json"))
    assert done.returncode == 1, done.stderr
    results = {r["check"]: r for r in json.loads((tmp_path / "v.json").read_text())["results"]}
    assert list(results) == ["environment.generation", "environment.drift"]
    assert (
        results["environment.generation"]["status"] == "FAIL"
        and results["environment.generation"]["summary"] == "no live environment: /opt/stackgate/current does not exist"
    )
    assert results["environment.generation"]["fix"]["commands"] == [
        f"stackgate provision --lock {ROOT / 'stackgate' / 'lockfiles' / 'blackwell-sm120-cu130.toml'}"
    ]
    assert results["environment.drift"]["status"] == "SKIP"


def test_a_run_where_everything_skipped_is_not_a_pass():
    done = verify("--check", "abi.elf")  # no stack environment here: the scan skips
    assert done.returncode == 1
    assert "nothing was checked: every check was skipped" in done.stdout


def test_strict_fails_on_warnings(tmp_path):
    spec = machine([gpu(processes=[{"pid": 99, "used": 2**30}])] + [gpu() for _ in range(7)])
    env = fake_gpus(tmp_path, spec)
    assert verify("--check", "gpu.processes", env=env).returncode == 0
    assert verify("--check", "gpu.processes", "--strict", env=env).returncode == 1


def test_ctrl_c_exits_130_and_leaves_no_process(tmp_path):
    hang = tmp_path / "python"
    marker = tmp_path / "started"
    hang.write_text(f"#!/bin/sh\necho $$ > {marker}.pid\ntouch {marker}\nexec sleep 60\n")
    hang.chmod(0o755)
    environ = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{TESTS}", "NO_COLOR": "1"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "invoke",
            "verify",
            "--lock",
            str(hopper_like(tmp_path, hang)),
            "--check",
            "python.interpreter",
        ],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130 and "interrupted" in stderr
    # The probe ran in its own process group; the interrupt killed that group too.
    pid = int(Path(f"{marker}.pid").read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_the_last_line_counts_the_start_up_a_person_waited_for(tmp_path):
    """The process sleeps 2 s before the program starts (as a slow import would): the summary's time is at least
    that; the JSON's duration_s is the checks' own time."""
    program = (
        "import runpy, sys, time; time.sleep(2); sys.argv[0] = 'stackgate'; "
        "runpy.run_module('stackgate', run_name='__main__')"
    )
    environ = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{TESTS}", "NO_COLOR": "1"}
    environ.pop("STACKGATE_LOCK", None)
    report = tmp_path / "r.json"
    done = subprocess.run(
        [sys.executable, "-c", program, "verify", "--check", "gpu.driver", "--json", str(report)],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in (0, 1), done.stderr
    last = done.stdout.strip().splitlines()[-1]
    waited = float(last.split(" in ")[1].split(" s:")[0])
    assert waited >= 2.0, last
    assert json.loads(report.read_text())["duration_s"] < waited
