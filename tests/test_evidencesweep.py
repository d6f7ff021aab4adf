"""The evidence sweep (stackgate.facts.evidencesweep): failures whose own output does not say why, on real files
and real processes: a truncated extension module, a file where a folder belongs, a toolkit without nvcc under a JIT
build's log, and the limits a process runs under."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakes import fake_nvml
from fakes.fake_nvml import gpu
from support import ROOT, install_dist, interpreter_spec, make_venv
from test_abi import run, spec_for
from test_deep_flashinfer import H200, run_check
from test_deep_flashinfer import interpreter_lock as flashinfer_lock

from stackgate.facts import KernelEvents, Missing, evidencesweep
from stackgate.facts.evidencesweep import EvidenceSweep, Limit, PathState

_JSON = __import__("_json").__file__
NO_DISTS = Missing("no interpreter asked")
NO_EVENTS = KernelEvents("dmesg", (), 0)


def truncated_extension(tmp_path: Path, keep: int = 20000) -> tuple[Path, Path]:
    """A venv whose distribution ``jsonx`` 1.0 holds a copy of a real extension module (CPython's _json), cut to
    ``keep`` bytes after its install, as a killed copy or a full disk leaves it."""
    python, site = make_venv(tmp_path / "venv")
    name = Path(_JSON).name
    install_dist(
        site,
        "jsonx",
        "1.0",
        files={"jsonx/__init__.py": b"from jsonx import _json\n", f"jsonx/{name}": Path(_JSON).read_bytes()},
    )
    module = site / "jsonx" / name
    os.truncate(module, keep)
    return python, module


def test_a_truncated_extension_module_is_named_with_its_distribution_not_left_unknown(tmp_path):
    python, module = truncated_extension(tmp_path)
    result = run("abi.imports", spec_for(python, "", '["jsonx"]'))
    assert result.status.name == "FAIL"
    assert f"{module} of jsonx 1.0 is damaged" in result.summary, result.summary
    assert "cut short" in result.summary and "not known" not in result.summary
    assert f"uv pip install --python {python} --reinstall --no-deps jsonx==1.0" in result.fix.commands


def test_abi_elf_scans_the_stacks_shared_objects_when_the_lock_names_none_and_finds_the_damaged_one(tmp_path):
    python, module = truncated_extension(tmp_path)
    result = run("abi.elf", spec_for(python, ""))
    assert result.status.name == "FAIL", result.summary
    assert str(module) in result.summary and "jsonx 1.0" in result.summary


def test_abi_elf_says_what_it_scanned_when_the_locks_packages_hold_no_shared_object(tmp_path):
    python, site = make_venv(tmp_path / "venv")
    install_dist(site, "jsonx", "1.0", files={"jsonx/_json.so": Path(_JSON).read_bytes()})
    result = run("abi.elf", spec_for(python, ""))
    assert result.status.name == "PASS"
    assert result.summary.startswith("1 shared object(s) of the stack checked whole"), result.summary
    assert "the lock's packages hold no shared object: no CUDA link to judge" in result.summary


def test_a_file_where_a_folder_belongs_is_the_cause_not_a_reinstall(tmp_path):
    blocker = tmp_path / "workspace"
    blocker.write_text("a file\n")
    sweep = evidencesweep.observe({"FLASHINFER_WORKSPACE_BASE": str(blocker)}, NO_DISTS, NO_EVENTS, limits=())
    text, fix = evidencesweep.explain(sweep, "NotADirectoryError: [Errno 20] Not a directory: '...'")
    assert text.startswith(f"FLASHINFER_WORKSPACE_BASE={blocker}: it is a file, not a folder")
    assert "Reinstall" not in fix.text and "Install" not in fix.text
    under = tmp_path / "workspace" / "cache"
    sweep = evidencesweep.observe({"TRITON_CACHE_DIR": str(under)}, NO_DISTS, NO_EVENTS, limits=())
    assert evidencesweep.judge(sweep)[0].text == f"TRITON_CACHE_DIR={under}: {blocker} is a file, not a folder"


NINJA = "\n".join(
    [f"[{i}/131] /usr/bin/c++ -MMD -MF x{i}.o.d -fPIC -O3 -c /src/x{i}.cpp -o x{i}.o" for i in range(1, 70)]
    + ["/bin/sh: 1: {home}/bin/nvcc: not found", "FAILED: batch_prefill.cuda.o"]
    + [f"[{i}/131] /usr/bin/c++ -MMD -c /src/y{i}.cpp -o y{i}.o" for i in range(70, 131)]
    + ["ninja: build stopped: subcommand failed."]
)


def test_a_toolkit_without_nvcc_is_named_with_the_build_logs_buried_error(tmp_path):
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    log = NINJA.replace("{home}", str(home))
    sweep = evidencesweep.observe({"CUDA_HOME": str(home)}, NO_DISTS, NO_EVENTS, limits=())
    text, fix = evidencesweep.explain(sweep, log)
    assert text.startswith(f"CUDA_HOME={home}: it has no bin/nvcc; its first error: /bin/sh: 1: {home}/bin/nvcc")
    assert fix.text.startswith("Point CUDA_HOME at a CUDA toolkit that has bin/nvcc")


def test_nothing_abnormal_says_what_was_checked(tmp_path):
    sweep = EvidenceSweep(
        (Limit("open files", 65536, 65536, "-n", "LimitNOFILE"),),
        (PathState("TMPDIR", str(tmp_path), None),),
        412,
        (),
        (),
    )
    text, fix = evidencesweep.explain(sweep, "RuntimeError: odd")
    assert fix is None
    assert text == (
        "the cause is not known from this; nothing abnormal in the limits (open files 65536), 1 path(s) in play "
        "(TMPDIR), 412 shared object(s) of the stack, the kernel log (0 GPU event(s))"
    )


def test_limits_are_read_as_the_kernel_applies_them_to_a_running_process():
    child = subprocess.Popen(["prlimit", "--nofile=64:128", "--as=4000000000", "sleep", "30"])
    try:
        for _ in range(200):
            limits = evidencesweep.read_limits(child.pid)
            named = {x.name: x for x in limits}
            if named["open files"].soft == 64:
                break
            time.sleep(0.05)  # prlimit sets the limits, then execs sleep: on a loaded machine that takes a while
        assert (named["open files"].soft, named["open files"].hard) == (64, 128)
        assert named["address space"].soft == 4000000000
    finally:
        child.kill()
        child.wait()


def _verify(spec: Path, check: str, *limit: str) -> dict:
    """`stackgate verify --check CHECK --json -` run under ``prlimit LIMIT...`` (the limits it passes on)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the stack's interpreter gets it too
    start = f"import runpy, sys; sys.path[:0] = [{str(ROOT)!r}]; runpy.run_module('stackgate', run_name='__main__')"
    done = subprocess.run(
        ["prlimit", *limit, sys.executable, "-c", start, "verify", "--lock", str(spec), "--check", check,
         "--json", "-"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=240,
    )  # fmt: skip # one command line
    return json.loads(done.stdout)


@pytest.mark.torch
def test_an_address_space_limit_is_named_where_torch_fails_to_import(tmp_path, torch_python):
    spec = tmp_path / "stack.toml"
    spec.write_text(interpreter_spec(torch_python, imports='["torch"]'))
    document = _verify(spec, "abi.imports", "--as=600000000")
    (result,) = [r for r in document["results"] if r["check"] == "abi.imports"]
    assert result["status"] == "FAIL"
    assert "the address space limit (ulimit -v) the stack runs under is 572 MiB" in result["summary"], result
    assert "not known" not in result["summary"]
    assert result["fix"]["commands"][0] == "ulimit -v unlimited"


def test_an_open_files_limit_is_named_where_a_device_says_busy(tmp_path):
    python, site = make_venv(tmp_path / "venv")
    # What the CUDA driver does at init: open its device files; at the limit it says the device is busy.
    (site / "gpuish.py").write_text(
        "import os\nheld = []\ntry:\n    for _ in range(100):\n        held.append(os.open('/dev/null', os.O_RDONLY))\n"
        "except OSError:\n    raise RuntimeError('CUDA error: CUDA-capable device(s) is/are busy or unavailable')\n"
    )
    spec = tmp_path / "stack.toml"
    spec.write_text(interpreter_spec(python, imports='["gpuish"]'))
    document = _verify(spec, "abi.imports", "--nofile=64:64")
    (result,) = [r for r in document["results"] if r["check"] == "abi.imports"]
    assert result["status"] == "FAIL"
    assert "the open files limit (ulimit -n) the stack runs under is 64 (hard 64)" in result["summary"], result
    assert result["fix"]["commands"][0] == "ulimit -n 1024"


def test_the_stacks_own_truncated_libnccl_is_named_where_the_probe_dies_of_sigbus(tmp_path):
    python, site = make_venv(tmp_path / "venv")
    library = site / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    # torch preloads its CUDA libraries from the nvidia-* distributions with ctypes, as torch/__init__.py does.
    loader = f"import ctypes\nctypes.CDLL({str(library)!r})\n".encode()
    install_dist(site, "torch", "2.11.0", files={"torch/__init__.py": loader})
    install_dist(site, "nvidia-nccl-cu13", "2.28.9", files={"nvidia/nccl/lib/libnccl.so.2": Path(_JSON).read_bytes()})
    os.truncate(library, 20000)
    result = run("abi.imports", spec_for(python, "", '["torch"]'))
    assert result.status.name == "FAIL"
    assert "the probe failed" in result.summary and "(exit -7)" in result.summary
    assert f"{library} of nvidia-nccl-cu13 2.28.9 is damaged" in result.summary, result.summary
    assert "nvidia-nccl-cu13==2.28.9" in result.fix.commands[1]


@pytest.mark.torch
def test_a_workspace_variable_naming_a_file_is_the_cause_of_flashinfers_failure_not_a_reinstall(
    torch_python: Path, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    (site / "flashinfer").mkdir(parents=True)
    # What flashinfer does at import: make its JIT folder under the workspace base.
    (site / "flashinfer" / "__init__.py").write_text(
        "import os\n__version__ = '0.6.4'\n"
        "os.makedirs(os.path.join(os.environ['FLASHINFER_WORKSPACE_BASE'], '.cache', 'flashinfer'), exist_ok=True)\n"
    )
    blocker = tmp_path / "workspace"
    blocker.write_text("not a folder\n")
    spec = flashinfer_lock(tmp_path, torch_python, base=ROOT / "lockfiles" / "hopper-sm90-cu130.toml")
    result = run_check(
        "deep.flashinfer_attention", spec, site, fake_nvml, [gpu(H200, (9, 0))], FLASHINFER_WORKSPACE_BASE=str(blocker)
    )
    assert result.status.name == "FAIL"
    assert result.summary.startswith("NotADirectoryError"), result.summary
    assert f"cause: FLASHINFER_WORKSPACE_BASE={blocker}: it is a file, not a folder" in result.summary
    assert "nstall" not in result.fix.text and "stackgate provision --only python" not in result.fix.commands
    assert result.fix.commands[0] == f"ls -ld {blocker}"


def test_a_failed_provision_step_gets_the_sweeps_finding_before_the_logs_generic_one(tmp_path, monkeypatch):
    from stackgate.flows.provision import known_failures

    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    monkeypatch.setenv("CUDA_HOME", str(home))
    log = tmp_path / "step.log"
    log.write_text(NINJA.replace("{home}", str(home)) + "\n")
    python, _ = make_venv(tmp_path / "venv")
    finding, *generic = known_failures(log, spec_for(python, ""))
    assert finding.id == "evidence-sweep" and [f.id for f in generic] == ["jit-build-failed"]
    assert finding.cause.startswith(f"CUDA_HOME={home}: it has no bin/nvcc; its first error: /bin/sh: 1: {home}")
    assert finding.evidence.lines == (f"/bin/sh: 1: {home}/bin/nvcc: not found",)
    assert finding.evidence.line == 70 and finding.evidence.file == str(log)


@pytest.mark.parametrize(
    ("raised", "install"),
    [
        ("RuntimeError('an error only its author knows')", False),
        ("ModuleNotFoundError(\"No module named 'sympy'\")", True),
    ],
)
def test_torch_that_does_not_import_gets_an_install_only_when_its_error_names_what_is_missing(
    tmp_path, raised, install
):
    python, site = make_venv(tmp_path / "venv")
    install_dist(site, "torch", "2.11.0", files={"torch/__init__.py": f"raise {raised}\n".encode()})
    result = run("torch.build", spec_for(python, ""))
    assert result.status.name == "FAIL" and result.summary.startswith("import torch fails: ")
    assert ("stackgate provision --only python" in result.fix.commands) is install, result.fix
    assert ("nstall" in result.fix.text) is install
    if not install:
        assert result.fix.commands == (f"{python} -c 'import torch'",)
        assert result.details[-1].startswith("Evidence sweep: the cause is not known from this; nothing abnormal in")
