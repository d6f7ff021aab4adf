"""The spec's model: :class:`Spec`, the whole document, built one section at a time, and [stack].

Each section is a frozen, typed dataclass built from its TOML table beside it (hardware.py,
packages.py, serving.py, deepshapes.py). A section's ``_from_table`` reads its
:class:`~stackgate.models.spec.reader.Table`, records every problem with its key path, and returns
the section (with placeholders where a value was bad: the caller raises once all problems are known).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from stackgate.models.spec.accuracy import Accuracy
from stackgate.models.spec.deepshapes import Deep
from stackgate.models.spec.hardware import CUDA_LINK_POLICIES, Hardware, Nccl, Toolkit
from stackgate.models.spec.packages import Patch, Python
from stackgate.models.spec.reader import Table
from stackgate.models.spec.rules import (
    resolve_references,
    strings_table,
)
from stackgate.models.spec.serving import Benchmark, Smoke
from stackgate.models.spec.slurm import Slurm

__all__ = ["Spec", "Stack"]


@dataclass(frozen=True)
class Stack:
    name: str
    description: str = ""
    cuda_link: str = "leave"  #: what provision does with /usr/local/cuda: leave | default

    @classmethod
    def _from_table(cls, t: Table) -> Stack:
        name = t.get("name", str)
        if name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            t.error("name", f"{name!r} must be letters, digits, '.', '_' or '-'")
        cuda_link = t.get("cuda_link", str, "leave")
        t.choice("cuda_link", cuda_link, CUDA_LINK_POLICIES)
        stack = cls(name or "", t.get("description", str, ""), cuda_link or "leave")
        t.finish()
        return stack


@dataclass(frozen=True)
class Spec:
    path: Path
    sha256: str  #: of the file's bytes: what the reports name
    stack: Stack
    hardware: Hardware
    toolkits: tuple[Toolkit, ...]
    python: Python
    patches: tuple[Patch, ...]
    env: Mapping[str, str]  #: [env] with references resolved
    nccl: Nccl
    smoke: Smoke
    benchmark: Benchmark
    deep: Deep = field(default_factory=Deep)
    slurm: Slurm = field(default_factory=Slurm)
    accuracy: Accuracy = field(default_factory=Accuracy)

    @property
    def name(self) -> str:
        return self.stack.name

    @property
    def default_toolkit(self) -> Toolkit | None:
        return next((t for t in self.toolkits if t.default), None)

    @classmethod
    def _from_table(cls, top: Table, path: Path, sha256: str) -> Spec | None:
        """The whole document, one section at a time; None once any problem is recorded."""
        if not top.ok:
            return None
        stack = Stack._from_table(top.sub("stack", required=True))
        hardware = Hardware._from_table(top.sub("hardware", required=True))
        toolkits = Toolkit._all_from_table(top)
        python = Python._from_table(top.sub("python", required=True), toolkits)
        patches = tuple(Patch._from_table(t, path.parent) for t in top.array("patch"))
        nccl = Nccl._from_table(top.sub("nccl"))
        smoke = Smoke._from_table(top.sub("smoke"), hardware)
        benchmark = Benchmark._from_table(top.sub("benchmark"))
        deep = Deep._from_table(top.sub("deep"))
        slurm = Slurm._from_table(top.sub("slurm"))
        accuracy = Accuracy._from_table(top.sub("accuracy"))
        env = _env(top.sub("env"), stack, toolkits, python)
        top.finish()
        if top.errors:
            return None
        return cls(
            path, sha256, stack, hardware, toolkits, python, patches, env, nccl, smoke, benchmark, deep, slurm, accuracy
        )


def _env(t: Table, stack: Stack, toolkits: tuple[Toolkit, ...], python: Python) -> Mapping[str, str]:
    """[env] with its ``{stack.name}``-style references resolved."""
    default = next((tk for tk in toolkits if tk.default), None)
    references = {"stack.name": stack.name}
    if default is not None:
        references["toolkit.default"] = str(default.prefix)
        references["toolkit.default.version"] = str(default.version)
    if python.root is not None:
        references["python.root"] = str(python.root)
    resolved = {}
    for name, value in strings_table(t).items():
        resolved[name] = resolve_references(t, name, value, references)
    return MappingProxyType(resolved)
