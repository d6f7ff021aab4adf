"""`stackgate init`: this machine as a spec (fake NVML, a real CPU torch venv, a toolkit prefix),
then `stackgate verify` on it; the shipped profiles copied out; the order in which the lock is
found; nothing ever written into an installed package. Real subprocesses of `python -m stackgate`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fakes.fake_nvml import gpu, machine
from pkgindex import IndexServer
from support import isolated_environ
from test_cuda import fake_prefix

from stackgate.models import pylock
from stackgate.models.exitcodes import ExitCode
from stackgate.models.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
H200 = machine([gpu(name="NVIDIA H200", cc=(9, 0), memory=[141 * 2**30, 2**29])], driver="580.159.03")
H200X2 = machine(
    [gpu(name="NVIDIA H200", cc=(9, 0), memory=[141 * 2**30, 2**29]) for _ in range(2)], driver="580.159.03"
)
RTX8 = machine([gpu() for _ in range(8)], driver="580.82.07")


def _main(root: Path) -> str:
    """A command line's program text: ``root``'s stackgate, run as ``python -m stackgate``."""
    return f"import runpy, sys; sys.path.insert(0, {str(root)!r}); runpy.run_module('stackgate', run_name='__main__')"


def stackgate(
    *args: str, cwd: Path, env: dict[str, str] | None = None, root: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    """``python -m stackgate ARGS`` with this checkout's package, run in ``cwd``."""
    environ = {
        k: v
        for k, v in os.environ.items()
        if k not in ("STACKGATE_LOCK", "CUDA_HOME", "CUDA_PATH", "TRITON_PTXAS_PATH", "VIRTUAL_ENV")
    }
    environ.update(
        {
            # the checkout goes on sys.path by the command line, not PYTHONPATH: the stack's interpreter inherits
            # PYTHONPATH, and an editable install's egg-info in the checkout would be one more distribution there
            "PYTHONPATH": str(TESTS),
            "NO_COLOR": "1",
            "STACKGATE_SYSTEM_DIR": str(cwd / "etc-stackgate"),
        }
    )
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", _main(root), *args], cwd=cwd, env=environ, capture_output=True, text=True, timeout=600
    )


def nvml(tmp_path: Path, spec: dict) -> dict[str, str]:
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps(spec))
    return {"STACKGATE_NVML_MODULE": "fakes.fake_nvml", "STACKGATE_FAKE_NVML": str(path)}


def toolkit(tmp_path: Path) -> Path:
    """A CUDA 13.0 prefix whose nvcc and ptxas answer as the real ones (and nvvm/ beside bin/)."""
    prefix = fake_prefix(tmp_path / "cuda-13.0", "13.0", "13.0.88")
    (prefix / "nvvm").mkdir()
    return prefix


def test_init_describes_this_machine_and_verify_then_reports_only_true_problems(
    tmp_path: Path, torch_python: Path
) -> None:
    cuda = toolkit(tmp_path)
    venv = torch_python.parent.parent
    env = {
        **nvml(tmp_path, H200),
        "VIRTUAL_ENV": str(venv),
        "CUDA_HOME": str(cuda),
        "TRITON_PTXAS_PATH": str(cuda / "bin" / "ptxas"),
    }
    done = stackgate("init", cwd=tmp_path, env=env)
    assert done.returncode == ExitCode.PASSED, done.stderr
    spec_path = tmp_path / "stackgate.toml"
    assert (
        done.stdout.splitlines()[0] == f"wrote {spec_path}: this machine as a spec, each value with where it came from"
    )
    text = spec_path.read_text()
    spec = load_spec(spec_path)
    assert (
        spec.hardware.gpu_count,
        spec.hardware.gpu_name,
        str(spec.hardware.compute_capability),
        spec.hardware.arch,
    ) == (1, "NVIDIA H200", "9.0", "sm_90a")
    assert str(spec.hardware.min_driver) == "580" and "# NVML: driver 580.159.03; its series is the floor" in text
    default = spec.default_toolkit
    assert default is not None and default.prefix == cuda and default.keep and str(default.nvcc) == "13.0.88"
    assert all(t.keep and t.source is None for t in spec.toolkits)  # found toolkits are kept, never written
    assert (
        "# found by $CUDA_HOME" in text and "# $CUDA_HOME names it: flashinfer's JIT and Triton use it ([env])" in text
    )
    assert spec.python.interpreter == venv / "bin" / "python" and "# found by $VIRTUAL_ENV" in text
    torch_version = spec.python.package("torch").pinned_version  # type: ignore[union-attr]
    assert torch_version is not None and torch_version.startswith("2.") and spec.python.frozen == ("torch",)
    assert spec.python.imports == ("torch",) and "torch_cuda" not in text  # a CPU build: no CUDA to pin
    assert (spec.smoke.tp, spec.smoke.attention_backend, spec.smoke.flags) == (1, "triton", ())
    assert "# flashinfer is not usable here: flashinfer is not installed" in text
    assert all(
        line.startswith(("#", "[")) or " # " in line or not line.strip() or line.startswith("description")
        for line in text.splitlines()
    )

    verified = stackgate("verify", "--json", "r.json", cwd=tmp_path, env=env)  # no --lock: ./stackgate.toml
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["lock"]["path"] == str(spec_path)
    status = {r["check"]: r["status"] for r in doc["results"]}
    # The one true problem of this machine: torch is a CPU build. Everything else it can pass, passes.
    assert {name for name, s in status.items() if s not in ("PASS", "SKIP")} == {"torch.build"}, verified.stdout
    assert {name for name, s in status.items() if s == "PASS"} >= {
        "gpu.driver",
        "gpu.driver_cuda",
        "gpu.count",
        "gpu.capability",
        "gpu.pcie",
        "gpu.ecc",
        "gpu.processes",
        "cuda.toolkits",
        "cuda.home",
        "cuda.ptxas_arch",
        "cuda.triton_ptxas",
        "python.interpreter",
        "python.frozen",
        "python.consistency",
        "abi.imports",
        "abi.elf",
    }
    assert verified.returncode == ExitCode.FAILED and "shipped default" not in verified.stdout

    again = stackgate("init", cwd=tmp_path, env=env)
    assert (again.returncode, again.stderr) == (
        ExitCode.USAGE,
        f"stackgate: {spec_path} exists: nothing was written (--force replaces it; --out FILE writes elsewhere)\n",
    )
    assert spec_path.read_text() == text
    other = tmp_path / "other.toml"
    elsewhere = stackgate(
        "init", "--out", str(other), "--python", str(torch_python), cwd=tmp_path, env={**env, "VIRTUAL_ENV": ""}
    )
    assert elsewhere.returncode == ExitCode.PASSED, elsewhere.stderr
    assert load_spec(other).python.interpreter == torch_python and "# found by --python" in other.read_text()
    assert f"next: stackgate verify --lock {other}" in elsewhere.stdout


def test_init_refuses_without_a_gpu_or_a_torch_and_writes_nothing(tmp_path: Path, plain_python: Path) -> None:
    no_driver = stackgate(
        "init", cwd=tmp_path, env={"STACKGATE_NVML_MODULE": "fakes.fake_nvml", "STACKGATE_FAKE_NVML": ""}
    )
    assert (
        no_driver.returncode == ExitCode.USAGE
        and "no NVIDIA GPU to describe" in no_driver.stderr
        and "stackgate init --list" in no_driver.stderr
    )
    no_torch = stackgate(
        "init", cwd=tmp_path, env={**nvml(tmp_path, H200), "PATH": f"{plain_python.parent}{os.pathsep}/usr/bin:/bin"}
    )
    assert (
        no_torch.returncode == ExitCode.USAGE
        and "no interpreter here holds torch" in no_torch.stderr
        and "--python PATH" in no_torch.stderr
    )
    blind = nvml(tmp_path, machine([gpu(name="NVIDIA H200", unsupported=["capability"])]))
    no_capability = stackgate("init", "--python", str(plain_python), cwd=tmp_path, env=blind)
    assert no_capability.returncode == ExitCode.USAGE
    assert "NVML gives no GPU's compute capability (GPU 0 (NVIDIA H200): Not Supported)" in no_capability.stderr
    missing = stackgate("init", "--python", str(tmp_path / "nope" / "python"), cwd=tmp_path, env=nvml(tmp_path, H200))
    assert missing.returncode == ExitCode.USAGE
    assert f"stackgate: --python {tmp_path / 'nope' / 'python'} cannot be asked: the probe failed" in missing.stderr
    assert not (tmp_path / "stackgate.toml").exists()


def test_init_that_cannot_write_says_why_with_no_traceback(tmp_path: Path, torch_python: Path) -> None:
    (tmp_path / "a-file").write_text("")
    target = tmp_path / "a-file" / "stackgate.toml"  # its folder is a file
    env = nvml(tmp_path, H200)
    done = stackgate("init", "--python", str(torch_python), "--out", str(target), cwd=tmp_path, env=env)
    assert done.returncode == ExitCode.USAGE
    assert done.stderr.splitlines()[-1] == f"stackgate: cannot write {target}: File exists"
    assert "Traceback" not in done.stderr


def install_wheels(python: Path, index: IndexServer, names: tuple[str, ...]) -> None:
    """The test index's wheels ``NAME-VERSION``, installed into ``python``'s environment with uv, no dependencies."""
    wheels = [str(next(index.files.glob(f"{name}-*.whl"))) for name in names]
    install = [sys.executable, "-m", "uv", "pip", "install", "-q", "--no-deps", "--python", str(python), *wheels]
    subprocess.run(install, env=isolated_environ(), check=True, timeout=300)


def stack_env(tmp_path: Path, index: IndexServer, comm_majors: list[int] | None) -> Path:
    """A venv holding the stack's wheels (the test index's torch 2.9.1+cu130 and family, flashinfer
    0.6.4), installed with uv from their files; with ``comm_majors``, flashinfer's comm module
    carries the fusion arch gate, as flashinfer/jit/comm.py does."""
    home = tmp_path / "stack"
    uv = [sys.executable, "-m", "uv"]
    subprocess.run(
        [*uv, "venv", "-q", "--python", sys.executable, str(home)], env=isolated_environ(), check=True, timeout=120
    )
    names = (
        "torch-2.9.1+cu130",
        "triton-3.5.1",
        "nvidia_nccl_cu13-2.27.7",
        "flashinfer_python-0.6.4",
        "flashinfer_cubin-0.6.4",
        "filelock-3.20.0",
    )
    install_wheels(home / "bin" / "python", index, names)
    if comm_majors is not None:
        (site,) = home.glob("lib/python3*/site-packages")
        comm = site / "flashinfer" / "jit" / "comm.py"
        comm.parent.mkdir(parents=True, exist_ok=True)
        comm.write_text(
            f"def gen_trtllm_comm_module():\n    return gen_jit_spec(supported_major_versions={comm_majors})\n"
        )
    return home / "bin" / "python"


def test_init_pins_the_stack_reads_the_fusion_gate_and_its_spec_locks(tmp_path: Path, stack_index: IndexServer) -> None:
    python = stack_env(tmp_path, stack_index, comm_majors=[9, 10])
    cuda = toolkit(tmp_path)
    env = {**nvml(tmp_path, RTX8), "CUDA_HOME": str(cuda)}
    done = stackgate("init", "--python", str(python), cwd=tmp_path, env=env)
    assert done.returncode == ExitCode.PASSED, done.stderr
    assert (
        "TRITON_PTXAS_PATH is not set in this shell: export TRITON_PTXAS_PATH=" in done.stderr
    )  # what verify will say too
    spec_path = tmp_path / "stackgate.toml"
    spec, text = load_spec(spec_path), spec_path.read_text()
    pins = {p.name: p.pinned_version for p in spec.python.packages}
    assert pins == {
        "torch": "2.9.1+cu130",
        "triton": "3.5.1",
        "nvidia-nccl-cu13": "2.27.7",
        "flashinfer-python": "0.6.4",
        "flashinfer-cubin": "0.6.4",
    }
    assert set(spec.python.frozen) == set(pins) and spec.python.imports == ("torch", "triton", "flashinfer")
    assert spec.python.torch_cuda == "13.0" and [(i.url, i.packages) for i in spec.python.indexes] == [
        ("https://download.pytorch.org/whl/cu130", ("torch",))
    ]
    assert (
        spec.hardware.gpu_count,
        str(spec.hardware.compute_capability),
        spec.smoke.tp,
        spec.smoke.attention_backend,
    ) == (8, "12.0", 8, "flashinfer")
    # flashinfer's gate builds the fused path for majors 9 and 10 only: no fusion flag on SM120, and why.
    assert (
        spec.smoke.flags == ()
        and "no fusion flag: compute capability major 12 is not among the majors flashinfer builds" in text
    )
    (site,) = python.parent.parent.glob("lib/python3*/site-packages")
    bundled = site / "triton" / "backends" / "nvidia" / "bin" / "ptxas"  # Triton's own ptxas, which knows sm_90a
    bundled.parent.mkdir(parents=True)
    bundled.write_text("#!/bin/sh\nexit 0\n")
    bundled.chmod(0o755)
    single = stackgate(
        "init", "--python", str(python), "--out", "h200.toml", cwd=tmp_path, env={**env, **nvml(tmp_path, H200)}
    )
    assert single.returncode == ExitCode.PASSED, single.stderr
    # One GPU, one rank: nothing to fuse, so no flag whose log evidence could never show (smoke would fail it).
    assert load_spec(tmp_path / "h200.toml").smoke.flags == ()
    assert "no fusion flag at tp = 1: one rank has no all-reduce to fuse" in (tmp_path / "h200.toml").read_text()
    hopper = stackgate(
        "init",
        "--python",
        str(python),
        "--out",
        "h200.toml",
        "--force",
        cwd=tmp_path,
        env={**env, **nvml(tmp_path, H200X2)},
    )
    assert hopper.returncode == ExitCode.PASSED, hopper.stderr
    assert load_spec(tmp_path / "h200.toml").smoke.flags == ("--enable-flashinfer-allreduce-fusion",)
    h200 = (tmp_path / "h200.toml").read_text()
    assert "flashinfer's fusion arch gate admits majors [9, 10]" in h200
    # The flag carries its evidence though init writes no evidence table: smoke proves the fused path ran.
    assert dict(load_spec(tmp_path / "h200.toml").smoke.evidence) == {
        "--enable-flashinfer-allreduce-fusion": "FlashInfer workspace initialized for rank"
    }
    assert "# smoke proves the fused path ran from the log line 'FlashInfer workspace initialized for rank'" in h200
    assert "TRITON_PTXAS_PATH" not in load_spec(tmp_path / "h200.toml").env
    assert "TRITON_PTXAS_PATH" not in hopper.stderr
    assert "# TRITON_PTXAS_PATH unset: Triton's bundled ptxas builds sm_90a" in h200

    # The spec init wrote resolves with `stackgate lock` (its PyPI and PyTorch indexes pointed at the test's).
    spec_path.write_text(
        text.replace("https://download.pytorch.org/whl/cu130", stack_index.simple("cu130")).replace(
            "[python]\n", f'[python]\ndefault_index = "{stack_index.simple("pypi")}"\n'
        )
    )
    locked = stackgate("lock", cwd=tmp_path, env=isolated_environ(**env))
    assert locked.returncode == ExitCode.PASSED, locked.stderr
    resolution = pylock.load(tmp_path / "pylock.stackgate.toml")
    assert {n: p.version for n, p in resolution.packages.items() if n in pins} == pins
    assert stackgate("lock", "--check", cwd=tmp_path, env=env).returncode == ExitCode.PASSED

    # sglang 0.5.9 pins flashinfer 0.6.3; 0.6.4 is installed: init declares the overrides, with the pin as the reason.
    install_wheels(python, stack_index, ("sglang-0.5.9", "torchaudio-2.9.1+cu130", "sgl_kernel-0.3.21+cu130"))
    full = stackgate("init", "--python", str(python), "--out", "full.toml", cwd=tmp_path, env=env)
    assert full.returncode == ExitCode.PASSED, full.stderr
    described = load_spec(tmp_path / "full.toml").python
    overrides = {o.package: (str(o.specifier), o.reason) for o in described.overrides}
    assert overrides == {
        "flashinfer-python": ("==0.6.4", "sglang 0.5.9 requires flashinfer_python==0.6.3; 0.6.4 is installed here"),
        "flashinfer-cubin": ("==0.6.4", "sglang 0.5.9 requires flashinfer_cubin==0.6.3; 0.6.4 is installed here"),
    }
    assert described.imports == ("torch", "triton", "flashinfer", "sgl_kernel", "sglang")
    consistent = stackgate("verify", "--lock", "full.toml", "--check", "python.consistency", cwd=tmp_path, env=env)
    assert consistent.returncode == ExitCode.PASSED and "2 accepted override(s)" in consistent.stdout, consistent.stdout


def test_init_lists_the_shipped_profiles_and_copies_one_out_with_its_pylock(tmp_path: Path) -> None:
    listed = stackgate("init", "--list", cwd=tmp_path)
    assert listed.returncode == ExitCode.PASSED, listed.stderr
    rows = {
        line.split()[0]: line for line in listed.stdout.splitlines() if line and not line.startswith(("copy", "or "))
    }
    assert set(rows) == {
        "blackwell-sm120-cu128",
        "blackwell-sm120-cu130",
        "blackwell-sm120-cu130-sglang0523",
        "hopper-sm90-cu130",
    }
    assert "(the default)" in rows["blackwell-sm120-cu130"] and "[pylock]" in rows["blackwell-sm120-cu128"]
    assert "SGLang 0.5.23 (torch 2.14.1 cu130" in rows["blackwell-sm120-cu130-sglang0523"]
    assert "[pylock]" in rows["blackwell-sm120-cu130-sglang0523"]
    assert "1x H200 (SM90), CUDA 13.0, the image's torch 2.11.0+cu130" in rows["hopper-sm90-cu130"]

    copied = stackgate("init", "--profile", "blackwell-sm120-cu128", cwd=tmp_path)
    assert copied.returncode == ExitCode.PASSED, copied.stderr
    shipped = ROOT / "stackgate" / "lockfiles"
    assert (tmp_path / "stackgate.toml").read_bytes() == (shipped / "blackwell-sm120-cu128.toml").read_bytes()
    assert (tmp_path / "pylock.stackgate.toml").read_bytes() == (
        shipped / "pylock.blackwell-sm120-cu128.toml"
    ).read_bytes()
    assert (
        stackgate("lock", "--check", cwd=tmp_path).returncode == ExitCode.PASSED
    )  # the copy and its pylock still agree
    refused = stackgate("init", "--profile", "hopper-sm90-cu130", cwd=tmp_path)
    assert refused.returncode == ExitCode.USAGE and "exists: nothing was written" in refused.stderr
    spec_text = (tmp_path / "stackgate.toml").read_text()
    (tmp_path / "stackgate.toml").unlink()  # the spec gone, its pylock left: it still resolves another spec
    alone = stackgate("init", "--profile", "hopper-sm90-cu130", cwd=tmp_path)
    assert alone.returncode == ExitCode.USAGE and f"{tmp_path / 'pylock.stackgate.toml'} exists" in alone.stderr
    (tmp_path / "stackgate.toml").write_text(spec_text)
    forced = stackgate("init", "--profile", "hopper-sm90-cu130", "--force", cwd=tmp_path)
    assert forced.returncode == ExitCode.PASSED, forced.stderr
    assert load_spec(tmp_path / "stackgate.toml").name == "hopper-sm90-cu130"
    assert f"removed {tmp_path / 'pylock.stackgate.toml'}: it resolved the replaced spec" in forced.stdout
    assert not (tmp_path / "pylock.stackgate.toml").exists()  # hopper ships none: the cu128 one would mislead verify
    unknown = stackgate("init", "--profile", "nope", cwd=tmp_path)
    assert (
        unknown.returncode == ExitCode.USAGE
        and "no shipped profile 'nope': the profiles are blackwell-sm120-cu128, " in unknown.stderr
    )

    system = stackgate("init", "--profile", "hopper-sm90-cu130", "--system", cwd=tmp_path)
    assert system.returncode == ExitCode.PASSED, system.stderr
    assert load_spec(tmp_path / "etc-stackgate" / "stack.toml").name == "hopper-sm90-cu130"


def _lock_used(cwd: Path, *flags: str, env: dict[str, str] | None = None) -> str:
    """The lock path a verify run names in its report."""
    done = stackgate("verify", "--check", "gpu.driver", "--json", str(cwd / "which.json"), *flags, cwd=cwd, env=env)
    assert done.returncode in (ExitCode.PASSED, ExitCode.FAILED), done.stderr
    return str(json.loads((cwd / "which.json").read_text())["lock"]["path"])


def test_the_lock_is_found_in_order_and_the_shipped_default_says_when_it_is_not_this_machine(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    env = nvml(tmp_path, H200)
    shipped = ROOT / "stackgate" / "lockfiles"
    assert _lock_used(work, env=env) == str(shipped / "blackwell-sm120-cu130.toml")
    done = stackgate("verify", "--check", "gpu.*", cwd=work, env=env)
    first = done.stdout.splitlines()[:2]
    assert first[0].startswith(
        "this machine is not the one the shipped default profile blackwell-sm120-cu130 describes ("
    )
    assert "gpu.count: " in first[0] and first[1].startswith("describe this machine with `stackgate init`")
    system = work / "etc-stackgate" / "stack.toml"
    system.parent.mkdir()
    shutil.copy(shipped / "hopper-sm90-cu130.toml", system)
    assert _lock_used(work, env=env) == str(system)
    local = work / "stackgate.toml"
    shutil.copy(shipped / "hopper-sm90-cu130.toml", local)
    assert _lock_used(work, env=env) == str(local)
    named = tmp_path / "named.toml"
    shutil.copy(shipped / "hopper-sm90-cu130.toml", named)
    assert _lock_used(work, env={**env, "STACKGATE_LOCK": str(named)}) == str(named)
    flagged = tmp_path / "flagged.toml"
    shutil.copy(shipped / "hopper-sm90-cu130.toml", flagged)
    assert _lock_used(work, "--lock", str(flagged), env={**env, "STACKGATE_LOCK": str(named)}) == str(flagged)
    matching = stackgate("verify", "--check", "gpu.*", cwd=work, env=env)
    assert "shipped default" not in matching.stdout


def test_no_command_writes_into_an_installed_package(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    shutil.copytree(ROOT / "stackgate", site / "stackgate", ignore=shutil.ignore_patterns("__pycache__"))
    work = tmp_path / "work"
    work.mkdir()
    before = sorted(p.name for p in (site / "stackgate" / "lockfiles").iterdir())

    def installed(*args: str) -> subprocess.CompletedProcess[str]:
        return stackgate(*args, cwd=work, env={"PYTHONPATH": f"{site}{os.pathsep}{TESTS}"}, root=site)

    locked = installed("lock")  # the shipped default has no pylock: lock would write one beside it
    assert locked.returncode == ExitCode.USAGE
    default = site / "stackgate" / "lockfiles" / "blackwell-sm120-cu130.toml"
    assert f"{default} is a profile shipped inside the installed stackgate package" in locked.stderr
    assert "`stackgate init --profile blackwell-sm120-cu130`" in locked.stderr
    smoke = installed("smoke")
    assert smoke.returncode == ExitCode.USAGE
    copy = "(`stackgate init --profile blackwell-sm120-cu130` writes ./stackgate.toml)"
    assert f"set [smoke] model in a copy of the shipped profile {copy}" in smoke.stderr
    assert (
        installed("lock", "--lock", str(site / "stackgate" / "lockfiles" / "blackwell-sm120-cu128.toml")).returncode
        == ExitCode.PASSED
    )  # current: no write
    out = installed(
        "init", "--out", str(site / "stackgate" / "lockfiles" / "mine.toml"), "--profile", "hopper-sm90-cu130"
    )
    assert out.returncode == ExitCode.USAGE and "inside the stackgate package" in out.stderr
    assert sorted(p.name for p in (site / "stackgate" / "lockfiles").iterdir()) == before
    copied = installed("init", "--profile", "blackwell-sm120-cu130")
    assert copied.returncode == ExitCode.PASSED and (work / "stackgate.toml").is_file()


def _installed_program(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the package laid out as an installed one (no pyproject.toml beside it) and a folder holding a
    ``stackgate`` program that runs it: its site-packages and the folder to put on PATH."""
    site = tmp_path / "site-packages"
    shutil.copytree(ROOT / "stackgate", site / "stackgate", ignore=shutil.ignore_patterns("__pycache__"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program = bin_dir / "stackgate"
    program.write_text(f'#!/bin/sh\nexec {sys.executable} -c "{_main(site)}" "$@"\n')
    program.chmod(0o755)
    return site, bin_dir


def test_the_fix_for_a_shipped_profile_without_a_pylock_runs_as_printed_from_an_installed_copy(
    tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str]
) -> None:
    from pkgindex import write_stack_lock

    site, bin_dir = _installed_program(tmp_path)
    shipped = write_stack_lock(site / "stackgate" / "lockfiles" / "test-stack.toml", stack_index, tmp_path / "root")
    work = tmp_path / "work"
    work.mkdir()
    env = {
        **install_environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(TESTS),
        "NO_COLOR": "1",
        "STACKGATE_SYSTEM_DIR": str(work / "etc-stackgate"),
    }
    env.pop("STACKGATE_LOCK", None)

    def shell(line: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", "-c", line], cwd=work, env=env, capture_output=True, text=True, timeout=600)

    refused = shell(f"stackgate lock --lock {shipped}")
    assert refused.returncode == ExitCode.USAGE
    assert refused.stderr.rstrip().endswith("then run it again on the copy (`--lock stackgate.toml`)"), refused.stderr
    planned = shell(f"stackgate provision --dry-run --lock {shipped}")
    printed = [line.strip().removeprefix("$ ") for line in (planned.stdout + planned.stderr).splitlines()]
    suggested = [line for line in printed if line.startswith("stackgate ") and " lock " in f"{line} "]
    assert suggested == ["stackgate init --profile test-stack && stackgate lock --lock stackgate.toml"], printed
    done = shell(suggested[0])
    assert done.returncode == ExitCode.PASSED, done.stdout + done.stderr
    assert pylock.load(work / "pylock.stackgate.toml").packages  # the copy's pylock, made where it may be written
    assert not pylock.path_for(shipped).exists()  # nothing written into the installed package


def test_the_spec_is_found_in_the_nearest_folder_above_and_diagnose_quotes_it(tmp_path: Path) -> None:
    shipped = ROOT / "stackgate" / "lockfiles"
    project = tmp_path / "project"
    deeper = project / "logs" / "today"
    deeper.mkdir(parents=True)
    env = nvml(tmp_path, H200)
    system = deeper / "etc-stackgate" / "stack.toml"  # stackgate() points $STACKGATE_SYSTEM_DIR under the cwd
    system.parent.mkdir()
    shutil.copy(shipped / "blackwell-sm120-cu128.toml", system)
    above = project / "stackgate.toml"
    shutil.copy(shipped / "hopper-sm90-cu130.toml", above)
    assert _lock_used(deeper, env=env) == str(above)  # a folder above comes before the system's spec
    nearer = project / "logs" / "stackgate.toml"
    shutil.copy(shipped / "blackwell-sm120-cu128.toml", nearer)
    assert _lock_used(deeper, env=env) == str(nearer)  # the nearest one
    named = tmp_path / "named.toml"
    shutil.copy(shipped / "hopper-sm90-cu130.toml", named)
    assert _lock_used(deeper, env={**env, "STACKGATE_LOCK": str(named)}) == str(named)
    nearer.unlink()

    log = deeper / "server.log"
    log.write_text("ImportError: libnvrtc.so.12: cannot open shared object file: No such file or directory\n")
    done = stackgate("diagnose", str(log), "--json", str(deeper / "d.json"), cwd=deeper, env=env)
    assert done.returncode in (ExitCode.PASSED, ExitCode.FAILED), done.stderr
    assert json.loads((deeper / "d.json").read_text())["lock"]["path"] == str(above)
    assert f"--lock {above}" in done.stdout and "in the default profile" not in done.stdout


@pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another user needs root")
def test_a_spec_above_owned_by_another_user_is_passed_by(tmp_path: Path) -> None:
    from stackgate.models.spec import find_local

    deeper = tmp_path / "shared" / "work"
    deeper.mkdir(parents=True)
    planted = tmp_path / "shared" / "stackgate.toml"
    shutil.copy(ROOT / "stackgate" / "lockfiles" / "hopper-sm90-cu130.toml", planted)
    os.chown(planted, 65534, 65534)
    assert find_local(deeper) is None
    os.chown(planted, 0, 0)
    assert find_local(deeper) == planted
