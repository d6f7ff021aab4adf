"""Toolkit facts against the real CUDA 13.0 here and against fake prefixes; the cuda.* checks."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from packaging.version import Version
from specs import minimal_spec
from support import interpreter_lock

from stackgate.checks.all import REGISTRY
from stackgate.facts import Missing, build_for_arch, gather, inspect_toolkit, jit_cuda_home, tool_version
from stackgate.models.result import Status
from stackgate.models.spec import Spec, loads_spec

REAL = Path("/usr/local/cuda-13.0")
needs_real_cuda = pytest.mark.skipif(
    not (REAL / "bin" / "nvcc").exists(), reason="no CUDA 13.0 toolkit at /usr/local/cuda-13.0"
)

VERSION_TEXT = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Cuda compilation tools, release {release}, V{build}
Build cuda_{release}.r{release}/compiler.0_0
"""


def fake_tool(path: Path, stdout: str, exit_code: int = 0, stderr: str = "") -> None:
    """A program that prints what the real tool prints, and exits as it would."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{stdout}EOF\nprintf '%s' '{stderr}' >&2\nexit {exit_code}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def fake_prefix(root: Path, release: str, build: str, nvcc: bool = True, ptxas_fails: bool = False) -> Path:
    text = VERSION_TEXT.format(release=release, build=build)
    if nvcc:
        fake_tool(root / "bin" / "nvcc", text)
    # ptxas answers --version, and refuses an arch it does not know.
    script = root / "bin" / "ptxas"
    script.parent.mkdir(parents=True, exist_ok=True)
    refuse = "ptxas fatal   : Value 'sm_120a' is not defined for option 'gpu-name'"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "--version" ]; then cat <<\'EOF\'\n{text}EOF\nexit 0; fi\n'
        + (f'echo "{refuse}" >&2; exit 255\n' if ptxas_fails else "exit 0\n")
    )
    script.chmod(0o755)
    return root


def spec_with(tmp_path: Path, *toolkits: str, env: str = "") -> Spec:
    return loads_spec(
        minimal_spec(toolkits="".join(toolkits) + "\n", version="3.11", root=tmp_path / "root", tail=f"[env]\n{env}\n")
    )


def toolkit(version: str, prefix: Path, default: bool = False, keep: bool = True, nvcc: str | None = None) -> str:
    lines = [
        f'[[toolkit]]\nversion = "{version}"\nprefix = "{prefix}"\n',
        "keep = true\n" if keep else 'source = "pypi"\n',
    ]
    if default:
        lines.append("default = true\n")
    if nvcc:
        lines.append(f'nvcc = "{nvcc}"\n')
    return "".join(lines)


def check(name, spec, environ=None):
    facts = gather(spec, REGISTRY[name].needs, environ=environ if environ is not None else {"PATH": "/usr/bin:/bin"})
    try:
        return REGISTRY[name].function(spec, facts)
    finally:
        facts.close()


@needs_real_cuda
def test_the_real_toolkit_reports_13_0_88_and_builds_sm_120a():
    nvcc = tool_version(REAL / "bin" / "nvcc")
    assert (nvcc.release, nvcc.build) == ("13.0", Version("13.0.88"))
    assert build_for_arch(REAL / "bin" / "ptxas", "sm_120a").ok
    assert build_for_arch(REAL / "bin" / "ptxas", "sm_90a").ok
    refused = build_for_arch(REAL / "bin" / "ptxas", "sm_999a")
    assert not refused.ok and "sm_999a" in refused.output


@needs_real_cuda
def test_the_real_toolkit_passes_the_checks(tmp_path):
    spec = spec_with(
        tmp_path,
        toolkit("13.0.1", REAL, default=True, nvcc="13.0.88"),
        env=f'CUDA_HOME = "{REAL}"\nTRITON_PTXAS_PATH = "{REAL}/bin/ptxas"',
    )
    assert check("cuda.toolkits", spec).status is Status.PASS
    assert check("cuda.ptxas_arch", spec).summary == "ptxas of CUDA 13.0.1 builds sm_120a"
    environ = {"PATH": "/usr/bin", "CUDA_HOME": str(REAL), "TRITON_PTXAS_PATH": f"{REAL}/bin/ptxas"}
    assert check("cuda.home", spec, environ).status is Status.PASS
    assert check("cuda.triton_ptxas", spec, environ).status is Status.PASS


def test_a_kept_toolkit_without_nvcc_is_judged_by_its_ptxas(tmp_path):
    kept = fake_prefix(tmp_path / "cuda-12.8", "12.8", "12.8.93", nvcc=False)
    facts = inspect_toolkit(spec_with(tmp_path, toolkit("12.8", kept, default=True)).toolkits[0], "sm_120a")
    assert isinstance(facts.nvcc, Missing) and facts.ptxas.build == Version("12.8.93")
    assert facts.detected.release == "12.8"
    result = check("cuda.toolkits", spec_with(tmp_path, toolkit("12.8", kept, default=True)))
    assert result.status is Status.PASS and "ptxas V12.8.93" in result.summary


def test_wrong_versions_and_missing_prefixes_fail_by_name(tmp_path):
    old = fake_prefix(tmp_path / "cuda-13.0", "12.4", "12.4.131")
    gone = tmp_path / "cuda-12.8"
    spec = spec_with(tmp_path, toolkit("13.0.1", old, default=True, keep=False), toolkit("12.8", gone))
    result = check("cuda.toolkits", spec)
    assert result.status is Status.FAIL
    assert result.details == (
        f"CUDA 13.0.1 at {old}: nvcc reports release 12.4, the lock wants 13.0",
        f"CUDA 12.8 at {gone}: missing (a kept toolkit must stay installed)",
    )
    assert "never installed by stackgate" in result.fix.text


def test_the_nvcc_build_must_match_when_the_lock_names_it(tmp_path):
    other = fake_prefix(tmp_path / "cuda-13.0", "13.0", "13.0.48")
    result = check("cuda.toolkits", spec_with(tmp_path, toolkit("13.0.1", other, default=True, nvcc="13.0.88")))
    assert result.status is Status.FAIL and "nvcc is V13.0.48, the lock wants V13.0.88" in result.summary


def test_a_ptxas_that_does_not_know_the_arch_fails(tmp_path):
    old = fake_prefix(tmp_path / "cuda-12.6", "12.6", "12.6.85", ptxas_fails=True)
    result = check("cuda.ptxas_arch", spec_with(tmp_path, toolkit("12.6", old, default=True)))
    assert result.status is Status.FAIL
    assert result.summary == (
        "CUDA 12.6's ptxas cannot build sm_120a: ptxas fatal   : Value 'sm_120a' is not defined for option 'gpu-name'"
    )


@pytest.mark.parametrize(
    ("environ", "nvcc", "home", "by"),
    [
        ({"CUDA_HOME": "/a", "CUDA_PATH": "/b"}, "/c/bin/nvcc", "/a", "CUDA_HOME"),
        ({"CUDA_HOME": "", "CUDA_PATH": "/b"}, "/c/bin/nvcc", "/b", "CUDA_PATH"),
        ({}, "/usr/local/bin/nvcc", "/usr/local", "the nvcc on PATH"),
        ({}, None, "/usr/local/cuda", "the /usr/local/cuda fallback"),
    ],
)
def test_the_jit_picks_cuda_home_as_flashinfer_does(environ, nvcc, home, by):
    assert jit_cuda_home(environ, nvcc) == (Path(home), by)


def test_cuda_home_on_another_toolkit_fails_with_the_source_named(tmp_path):
    new = fake_prefix(tmp_path / "cuda-13.0", "13.0", "13.0.88")
    old = fake_prefix(tmp_path / "cuda-12.8", "12.8", "12.8.93")
    spec = spec_with(tmp_path, toolkit("13.0", new, default=True), toolkit("12.8", old))
    result = check("cuda.home", spec, {"PATH": f"{old}/bin:/usr/bin", "CUDA_HOME": str(old)})
    assert result.status is Status.FAIL
    assert result.summary == f"flashinfer's JIT would use {old} (chosen by CUDA_HOME), not CUDA 13.0 at {new}"
    # Only nvcc on PATH: the JIT takes dirname(dirname(which nvcc)).
    on_path = check("cuda.home", spec, {"PATH": f"{new}/bin:/usr/bin"})
    assert on_path.status is Status.PASS and "chosen by the nvcc on PATH" in on_path.summary


def test_the_environment_file_of_the_live_generation_is_applied(tmp_path):
    new = fake_prefix(tmp_path / "cuda-13.0", "13.0", "13.0.88")
    spec = spec_with(tmp_path, toolkit("13.0", new, default=True))
    env_file = tmp_path / "root" / "current" / "stackgate.env"
    env_file.parent.mkdir(parents=True)
    env_file.write_text(
        f'export CUDA_HOME="{new}"\nexport TRITON_PTXAS_PATH="{new}/bin/ptxas"\nexport PATH="{new}/bin:$PATH"\n'
    )
    home = check("cuda.home", spec, {"PATH": "/usr/bin"})
    assert home.status is Status.PASS and f"CUDA_HOME: {new} (set by {env_file})" in home.details
    assert check("cuda.triton_ptxas", spec, {"PATH": "/usr/bin"}).status is Status.PASS


def test_triton_ptxas_unset_or_elsewhere_fails(tmp_path):
    new = fake_prefix(tmp_path / "cuda-13.0", "13.0", "13.0.88")
    old = fake_prefix(tmp_path / "cuda-12.8", "12.8", "12.8.93")
    spec = spec_with(tmp_path, toolkit("13.0", new, default=True))
    unset = check("cuda.triton_ptxas", spec, {"PATH": "/usr/bin"})
    assert unset.status is Status.FAIL and unset.summary.startswith("TRITON_PTXAS_PATH is not set")
    assert unset.fix.commands == ("stackgate provision", f". {tmp_path / 'root' / 'current' / 'stackgate.env'}")
    elsewhere = check("cuda.triton_ptxas", spec, {"PATH": "/usr/bin", "TRITON_PTXAS_PATH": f"{old}/bin/ptxas"})
    assert (
        elsewhere.status is Status.FAIL
        and elsewhere.summary == f"TRITON_PTXAS_PATH is {old}/bin/ptxas (set in the shell), not {new}/bin/ptxas"
    )


def test_an_interpreter_spec_that_leaves_triton_ptxas_out_skips_it_and_one_that_names_it_fails_unset(tmp_path):
    left_out = check("cuda.triton_ptxas", interpreter_lock(tmp_path / "bin" / "python"), {"PATH": "/usr/bin"})
    assert left_out.status is Status.SKIP
    assert left_out.summary == "the lock's [env] leaves TRITON_PTXAS_PATH unset: Triton uses its bundled ptxas"
    env = '[env]\nTRITON_PTXAS_PATH = "{toolkit.default}/bin/ptxas"'
    named = interpreter_lock(tmp_path / "bin" / "python", extra=env)
    unset = check("cuda.triton_ptxas", named, {"PATH": "/usr/bin"})
    want = 'export TRITON_PTXAS_PATH="/usr/local/cuda-13.0/bin/ptxas"'
    assert unset.status is Status.FAIL and unset.fix.commands == (want,)
