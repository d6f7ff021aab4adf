"""What this machine is, observed without a spec: its GPUs (NVML), every CUDA toolkit on it, the
interpreter that holds torch and what that interpreter holds, and the arch gate of its
flashinfer's fused all-reduce. `stackgate init` writes a spec from it."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Mapping

from stackgate.edges import nvml
from stackgate.facts.deepruns import FusionGate, read_gate
from stackgate.facts.interpreters import describe
from stackgate.facts.toolkits import build_for_arch, tool_version
from stackgate.facts.values import ArchBuild, Missing, ProbeFacts, ToolVersion
from stackgate.models.spec import Capability

__all__ = ["CUDA_ROOT", "FoundPython", "FoundToolkit", "Machine", "find_python", "find_toolkits", "observe"]

#: Where CUDA toolkits are installed side by side (cuda-12.8, cuda-13.0, and the cuda link).
CUDA_ROOT = Path("/usr/local")


@dataclass(frozen=True)
class FoundToolkit:
    prefix: Path  #: the real folder (links resolved)
    version: ToolVersion  #: nvcc's, else ptxas's "release X.Y, VX.Y.Z"
    found_by: str  #: where it was found: $CUDA_HOME, the nvcc on PATH, /usr/local/cuda-*


@dataclass(frozen=True)
class FoundPython:
    path: Path
    found_by: str  #: --python, $VIRTUAL_ENV, python3 on PATH ...
    facts: ProbeFacts  #: its distributions and torch's facts


@dataclass(frozen=True)
class Machine:
    nvml: nvml.NvmlSnapshot | Missing
    toolkits: tuple[FoundToolkit, ...]
    #: the toolkit flashinfer's JIT and Triton should use, and why it was chosen
    default: tuple[FoundToolkit, str] | None
    python: FoundPython | Missing
    gate: FusionGate | None  #: None when there is no interpreter to read it with
    environ: Mapping[str, str]
    #: whether the ptxas Triton bundles builds GPU 0's arch (None: no Triton, or no GPU to ask for)
    triton_ptxas: ArchBuild | Missing | None = None


def observe(environ: Mapping[str, str], python: Path | None = None, nvml_lib: ModuleType | None = None) -> Machine:
    """Everything `stackgate init` describes, each part possibly missing with its reason."""
    try:
        snapshot: nvml.NvmlSnapshot | Missing = nvml.snapshot(nvml_lib)
    except nvml.NvmlError as exc:
        snapshot = Missing(str(exc))
    toolkits = find_toolkits(environ)
    found = find_python(environ, python)
    gate = read_gate(found.path, environ) if isinstance(found, FoundPython) else None
    triton = _triton_ptxas(found, snapshot) if isinstance(found, FoundPython) else None
    return Machine(snapshot, toolkits, _default(toolkits, environ), found, gate, environ, triton)


#: Where Triton keeps the ptxas it bundles, by release (3.x, then 2.x), under its package.
_TRITON_PTXAS = ("triton/backends/nvidia/bin/ptxas", "triton/third_party/cuda/bin/ptxas")


def _triton_ptxas(found: FoundPython, snapshot: nvml.NvmlSnapshot | Missing) -> ArchBuild | Missing | None:
    """Whether the ptxas Triton bundles builds GPU 0's arch (None: no Triton, or no GPU)."""
    triton = found.facts.dist("triton")
    if triton is None or isinstance(snapshot, Missing) or not snapshot.gpus or snapshot.gpus[0].capability is None:
        return None
    arch = Capability(*snapshot.gpus[0].capability).arch
    bundled = next((Path(triton.location) / p for p in _TRITON_PTXAS if (Path(triton.location) / p).is_file()), None)
    if bundled is None:
        return Missing(f"triton {triton.version} bundles no ptxas ({', '.join(_TRITON_PTXAS)} under {triton.location})")
    return build_for_arch(bundled, arch)


def _jit_places(environ: Mapping[str, str]) -> list[tuple[Path, str]]:
    """Where flashinfer's JIT looks for its toolkit, in its order: CUDA_HOME, CUDA_PATH, the nvcc
    on PATH, /usr/local/cuda."""
    places = [(Path(environ[n]), f"${n}") for n in ("CUDA_HOME", "CUDA_PATH") if environ.get(n)]
    nvcc = shutil.which("nvcc", path=environ.get("PATH", ""))
    if nvcc:
        places.append((Path(nvcc).parent.parent, f"the nvcc on PATH ({nvcc})"))
    return [*places, (CUDA_ROOT / "cuda", str(CUDA_ROOT / "cuda"))]


def _places(environ: Mapping[str, str]) -> list[tuple[Path, str]]:
    """Where a toolkit may be: where the JIT looks, then every cuda-* beside /usr/local/cuda."""
    return [*_jit_places(environ), *((p, str(CUDA_ROOT / "cuda-*")) for p in sorted(CUDA_ROOT.glob("cuda-*")))]


def find_toolkits(environ: Mapping[str, str]) -> tuple[FoundToolkit, ...]:
    """Every CUDA toolkit on this machine, once each by its real folder: a prefix whose nvcc (or,
    for a kept 12.x laid out from wheels, ptxas) prints its release and that has nvvm/ beside bin/
    (a folder of wrapper scripts such as /usr/local/bin is not a toolkit)."""
    found: dict[Path, FoundToolkit] = {}
    for place, by in _places(environ):
        try:
            prefix = place.resolve()
        except OSError:
            continue
        if prefix in found or not (prefix / "nvvm").is_dir():
            continue
        version = tool_version(prefix / "bin" / "nvcc")
        if isinstance(version, Missing):
            version = tool_version(prefix / "bin" / "ptxas")
        if isinstance(version, ToolVersion):
            found[prefix] = FoundToolkit(prefix, version, by)
    return tuple(sorted(found.values(), key=lambda t: t.version.build, reverse=True))


def _default(toolkits: tuple[FoundToolkit, ...], environ: Mapping[str, str]) -> tuple[FoundToolkit, str] | None:
    """The toolkit CUDA_HOME (or CUDA_PATH, or the nvcc on PATH, or /usr/local/cuda) names, as the
    JIT would pick it; else the newest."""
    if not toolkits:
        return None
    by_prefix = {t.prefix: t for t in toolkits}
    for place, by in _jit_places(environ):
        try:
            chosen = by_prefix.get(place.resolve())
        except OSError:
            chosen = None
        if chosen is not None:
            return chosen, f"{by} names it"
    return toolkits[0], "the newest found (CUDA_HOME is not set)"


def _interpreters(environ: Mapping[str, str]) -> list[tuple[Path, str]]:
    """Interpreters that may hold the stack: the active venv or conda env, python3 and python on PATH,
    then stackgate's own (installed into the stack's environment)."""
    places = [(Path(environ[n]) / "bin" / "python", f"${n}") for n in ("VIRTUAL_ENV", "CONDA_PREFIX") if environ.get(n)]
    for name in ("python3", "python"):
        found = shutil.which(name, path=environ.get("PATH", ""))
        if found:
            places.append((Path(found), f"{name} on PATH"))
    places.append((Path(sys.executable), "stackgate's own interpreter"))
    return [(p, by) for p, by in places if os.access(p, os.X_OK)]


def find_python(environ: Mapping[str, str], python: Path | None = None) -> FoundPython | Missing:
    """``python`` (--python), else the first interpreter here whose environment holds torch."""
    candidates = [(python, "--python")] if python is not None else _interpreters(environ)
    tried = []
    for path, by in candidates:
        listed = describe(path, environ, torch=False)
        if isinstance(listed, Missing) and python is not None:
            return Missing(f"--python {python} cannot be asked: {listed.reason}")
        if isinstance(listed, Missing):
            tried.append(f"{path} ({by}): {listed.reason}")
        elif listed.dist("torch") is None and python is None:
            tried.append(f"{path} ({by}): no torch installed")
        else:
            facts = describe(path, environ, torch=True)
            return FoundPython(path, by, facts) if isinstance(facts, ProbeFacts) else facts
    return Missing(f"no interpreter here holds torch ({'; '.join(tried) or 'none found'}): name one with --python PATH")
