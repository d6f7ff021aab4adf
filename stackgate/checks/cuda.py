"""Checks of the CUDA toolkits and of the environment that selects one."""

from __future__ import annotations

from pathlib import Path

from stackgate.checks.core import check
from stackgate.facts import EnvFacts, Facts, Missing, ToolkitFacts, ToolVersion
from stackgate.facts.compare import toolkit_problem
from stackgate.models.finding import Fix
from stackgate.models.result import Result, failed, passed, skipped
from stackgate.models.spec import Spec, Toolkit

__all__: list[str] = []

_PROVISION = "stackgate provision --only toolkit"


@check("cuda.toolkits", needs=("toolkits",))
def toolkits(spec: Spec, facts: Facts) -> Result:
    """Every locked toolkit is at its prefix with its locked version."""
    if not spec.toolkits:
        return skipped("the lock names no CUDA toolkit")
    problems = [(t, p) for t in facts.toolkits if (p := toolkit_problem(t))]
    found = [f"{t.toolkit.label}: {_describe(t)}" for t in facts.toolkits]
    data = {str(t.toolkit.version): _data(t) for t in facts.toolkits}
    if problems:
        details = [f"{t.toolkit.label}: {p}" for t, p in problems]
        return failed(
            f"{len(problems)} of {len(spec.toolkits)} toolkit(s) wrong: {problems[0][1]}",
            details,
            _toolkit_fix([t.toolkit for t, _ in problems]),
            data,
        )
    return passed(", ".join(f"CUDA {t.toolkit.version} ({_describe(t)})" for t in facts.toolkits), found, data)


def _describe(t: ToolkitFacts) -> str:
    detected = t.detected
    if isinstance(detected, Missing):
        return detected.reason
    return f"{detected.path.name} V{detected.build}"


def _data(t: ToolkitFacts) -> dict[str, object]:
    detected = t.detected
    return {
        "prefix": str(t.toolkit.prefix),
        "exists": t.exists,
        "nvcc": str(t.nvcc.build) if isinstance(t.nvcc, ToolVersion) else None,
        "ptxas": str(t.ptxas.build) if isinstance(t.ptxas, ToolVersion) else None,
        "release": detected.release if isinstance(detected, ToolVersion) else None,
        "keep": t.toolkit.keep,
    }


def _toolkit_fix(wrong: list[Toolkit]) -> Fix:
    kept = [t for t in wrong if t.keep]
    if kept:
        names = ", ".join(t.label for t in kept)
        return Fix(
            f"{names} is kept, never installed by stackgate: restore it from its own installer (runfile or apt) "
            "without touching the other toolkits."
        )
    return Fix("Install the locked toolkit beside the others.", (_PROVISION,))


@check("cuda.home", needs=("toolkits", "env"))
def home(spec: Spec, facts: Facts) -> Result:
    """CUDA_HOME and the nvcc that flashinfer's JIT picks are the default toolkit's."""
    default = spec.default_toolkit
    if default is None:
        return skipped("the lock names no default toolkit")
    env = facts.env
    want = _real(default.prefix)
    picked = _real(env.jit_home)
    data = {
        "jit_home": str(env.jit_home),
        "chosen_by": env.jit_home_by,
        "want": str(default.prefix),
        "CUDA_HOME": env.environ.get("CUDA_HOME"),
    }
    details = [
        f"CUDA_HOME: {env.environ.get('CUDA_HOME', '(unset)')} ({env.source('CUDA_HOME')})",
        f"nvcc on PATH: {env.nvcc_on_path or '(none)'}",
        f"/usr/local/cuda -> {env.cuda_link or '(absent)'}",
    ]
    if env.env_file_error:
        details.append(f"stackgate.env unreadable: {env.env_file_error}")
    if picked != want:
        return failed(
            f"flashinfer's JIT would use {env.jit_home} (chosen by {env.jit_home_by}), not CUDA {default.version} "
            f"at {default.prefix}",
            details,
            _env_fix(spec, env),
            data,
        )
    if not (default.prefix / "bin" / "nvcc").exists():
        return failed(
            f"{default.prefix}/bin/nvcc is missing", details, Fix("Install the default toolkit.", (_PROVISION,)), data
        )
    return passed(f"JIT nvcc is {default.prefix}/bin/nvcc (chosen by {env.jit_home_by})", details, data)


@check("cuda.ptxas_arch", needs=("toolkits",))
def ptxas_arch(spec: Spec, facts: Facts) -> Result:
    """The default toolkit's ptxas builds code for the locked GPU architecture."""
    default = spec.default_toolkit
    if default is None:
        return skipped("the lock names no default toolkit")
    build = facts.toolkit(default).arch_build
    arch = spec.hardware.arch
    if isinstance(build, Missing):
        return failed(
            f"cannot try ptxas for {arch}: {build.reason}", fix=Fix("Install the default toolkit.", (_PROVISION,))
        )
    if not build.ok:
        detail = build.output.splitlines()[-1] if build.output else "no output"
        return failed(
            f"CUDA {default.version}'s ptxas cannot build {arch}: {detail}",
            build.output.splitlines()[-5:],
            Fix(f"Use a toolkit that knows {arch} (12.8 or newer for sm_120a).", (_PROVISION,)),
        )
    return passed(f"ptxas of CUDA {default.version} builds {arch}", data={"arch": arch})


@check("cuda.triton_ptxas", needs=("toolkits", "env"))
def triton_ptxas(spec: Spec, facts: Facts) -> Result:
    """TRITON_PTXAS_PATH points at the default toolkit's ptxas."""
    default = spec.default_toolkit
    if default is None:
        return skipped("the lock names no default toolkit")
    env = facts.env
    value = env.environ.get("TRITON_PTXAS_PATH")
    want = default.prefix / "bin" / "ptxas"
    data = {"TRITON_PTXAS_PATH": value, "want": str(want)}
    if not value and spec.python.env_file is None and "TRITON_PTXAS_PATH" not in spec.env:
        # An existing interpreter's spec that leaves it out: its Triton's bundled ptxas knows the arch
        # (`stackgate init` writes it only when that ptxas cannot build the GPUs' arch).
        return skipped("the lock's [env] leaves TRITON_PTXAS_PATH unset: Triton uses its bundled ptxas", data=data)
    if not value:
        return failed(
            f"TRITON_PTXAS_PATH is not set: Triton uses its bundled ptxas, which may not know {spec.hardware.arch}",
            fix=_env_fix(spec, env),
            data=data,
        )
    if _real(Path(value)) != _real(want):
        return failed(
            f"TRITON_PTXAS_PATH is {value} ({env.source('TRITON_PTXAS_PATH')}), not {want}",
            fix=_env_fix(spec, env),
            data=data,
        )
    if not want.exists():
        return failed(
            f"TRITON_PTXAS_PATH names {value}, which does not exist",
            fix=Fix("Install the default toolkit.", (_PROVISION,)),
            data=data,
        )
    return passed(f"TRITON_PTXAS_PATH is {value}", data=data)


def _env_fix(spec: Spec, env: EnvFacts) -> Fix:
    file = spec.python.env_file
    if file is not None and env.env_file is not None:
        return Fix(
            f"Source the stack's environment file before running the stack (provision writes it: {file}).",
            (f". {file}",),
        )
    if file is not None:
        return Fix(
            "Provision writes the stack's environment file; then source it.", ("stackgate provision", f". {file}")
        )
    exports = tuple(f'export {k}="{v}"' for k, v in spec.env.items() if k in ("CUDA_HOME", "TRITON_PTXAS_PATH"))
    return Fix("Export the lock's [env] in the shell that runs the stack.", exports)


def _real(path: Path) -> Path:
    try:
        return path.resolve()
    except OSError:
        return path
