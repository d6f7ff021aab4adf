"""Observation: what this machine is, gathered once, in parallel; each part may be
:class:`Missing` with its reason, never an exception.

The parts (:mod:`.collect`) are made of plain values (:mod:`.model`); the toolkits
(:mod:`.toolkits`), the stack's interpreter and a base one (:mod:`.interpreters`), the patches'
state (:mod:`.patches`), the deep checks' measurements (:mod:`.deep`) and a serving engine's
log (:mod:`.serverlog`) are observed here; :mod:`.compare` holds the comparisons with the lock
that both the checks and provisioning make.
"""

from __future__ import annotations

from stackgate.facts.collect import PARTS, Facts, gather, jit_cuda_home
from stackgate.facts.toolkits import build_for_arch, inspect_toolkit, tool_version
from stackgate.facts.values import (
    ArchBuild,
    BasePython,
    Distribution,
    ElfFile,
    ElfScan,
    EnvFacts,
    ImportOutcome,
    KernelEvents,
    Missing,
    ProbeFacts,
    ToolkitFacts,
    ToolVersion,
)

__all__ = [
    "PARTS",
    "ArchBuild",
    "BasePython",
    "Distribution",
    "ElfFile",
    "ElfScan",
    "EnvFacts",
    "Facts",
    "ImportOutcome",
    "KernelEvents",
    "Missing",
    "ProbeFacts",
    "ToolVersion",
    "ToolkitFacts",
    "build_for_arch",
    "gather",
    "inspect_toolkit",
    "jit_cuda_home",
    "tool_version",
]
