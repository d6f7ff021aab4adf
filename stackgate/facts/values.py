"""What facts are made of: plain frozen values, each part possibly :class:`Missing` with its reason.

:mod:`stackgate.facts.collect` gathers them; checks judge them; provision plans from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from packaging.utils import canonicalize_name
from packaging.version import Version

from stackgate.edges import elf
from stackgate.models.kernelevents import KernelEvent
from stackgate.models.spec import Toolkit

__all__ = [
    "ArchBuild",
    "BasePython",
    "Distribution",
    "ElfFile",
    "ElfScan",
    "EnvFacts",
    "ImportOutcome",
    "KernelEvents",
    "Missing",
    "ProbeFacts",
    "ToolVersion",
    "ToolkitFacts",
]


@dataclass(frozen=True)
class KernelEvents:
    """The GPU events of this boot's kernel log, and which reader printed it."""

    source: str
    events: tuple[KernelEvent, ...]
    lines: int


@dataclass(frozen=True)
class Missing:
    """A fact that could not be gathered, and why."""

    reason: str

    def __bool__(self) -> bool:
        return False


@dataclass(frozen=True)
class ToolVersion:
    path: Path
    release: str  #: "13.0"
    build: Version  #: 13.0.88


@dataclass(frozen=True)
class ArchBuild:
    arch: str
    ok: bool
    output: str


@dataclass(frozen=True)
class ToolkitFacts:
    toolkit: Toolkit
    exists: bool
    nvcc: ToolVersion | Missing
    ptxas: ToolVersion | Missing
    version_json: str | None  #: the release a runfile install records in version.json
    arch_build: ArchBuild | Missing

    @property
    def detected(self) -> ToolVersion | Missing:
        """nvcc's version, else ptxas's (PyPI's CUDA 12 wheels carry ptxas but no nvcc)."""
        return self.nvcc if isinstance(self.nvcc, ToolVersion) else self.ptxas


@dataclass(frozen=True)
class EnvFacts:
    """The environment the stack runs in: this shell's, with the live stackgate.env applied."""

    environ: Mapping[str, str]
    from_file: Mapping[str, str]
    env_file: Path | None
    env_file_error: str | None
    nvcc_on_path: Path | None
    cuda_link: Path | None  #: where /usr/local/cuda resolves, if it exists
    jit_home: Path  #: the CUDA home flashinfer's JIT and sgl-kernel would pick
    jit_home_by: str  #: which rule picked it

    def source(self, name: str) -> str:
        if name in self.from_file:
            return f"set by {self.env_file}"
        return "set in the shell" if name in self.environ else "not set"


@dataclass(frozen=True)
class Distribution:
    name: str
    version: str
    requires: tuple[str, ...]
    location: str
    shared_objects: tuple[str, ...] = ()
    wheel_tags: tuple[str, ...] = ()  #: the Tag lines of its WHEEL file: which build was installed
    direct_url: Mapping[str, Any] | None = None  #: its direct_url.json (PEP 610): installed from a URL or file
    object_sizes: Mapping[str, int | None] = field(default_factory=dict)  #: each shared object, its RECORD size


@dataclass(frozen=True)
class ProbeFacts:
    executable: str
    python_version: str
    markers: Mapping[str, str]
    distributions: Mapping[str, Distribution]
    torch: Mapping[str, Any] | None  #: None when torch is not installed
    duration_s: float

    def dist(self, name: str) -> Distribution | None:
        return self.distributions.get(canonicalize_name(name))


@dataclass(frozen=True)
class ImportOutcome:
    name: str
    ok: bool
    duration_s: float
    output: str = ""  #: the failure's stderr, or the import error text
    timed_out: bool = False
    demangled: Mapping[str, str] = field(default_factory=dict)  #: undefined symbols, readable

    @property
    def error_line(self) -> str:
        lines = [line for line in self.output.strip().splitlines() if line.strip()]
        return lines[-1] if lines else ""


@dataclass(frozen=True)
class ElfFile:
    path: str
    distribution: str
    needed: tuple[str, ...]
    cuda: tuple[elf.CudaNeed, ...]


@dataclass(frozen=True)
class ElfScan:
    files: tuple[ElfFile, ...]
    unreadable: tuple[str, ...] = ()


@dataclass(frozen=True)
class BasePython:
    """An interpreter of the locked Python version found on this machine (what `uv venv` gets)."""

    path: Path  #: the real executable (never a pyenv shim)
    version: str  #: its full version, e.g. 3.12.1
    found_by: str  #: where it was found, for -v and the plan
    bundled_pip: Path | None = None  #: the pip wheel its ensurepip carries: installed offline into new environments
