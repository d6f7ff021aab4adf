"""A fleet engine's own options (``stackgate fleet --engine NAME --engine-option KEY=VALUE``), as data.

Each engine (flows/fleetengines.py) declares its options here or in its module; the Slurm engine's
sit here because each is also a flag of its own (``--partition gpu``, the documented shorthand of
``--engine-option partition=gpu``) whose help the command line shows without loading the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

__all__ = ["SLURM", "EngineOption"]


@dataclass(frozen=True)
class EngineOption:
    """One option of an engine: its help, whether it may be given more than once, whether it takes no value."""

    help: str
    repeatable: bool = False
    flag: bool = False  #: takes no value (``--engine-option NAME`` or the shorthand flag alone)


#: The Slurm engine's options (flows/fleet_slurm.py), by name; each is also the flag ``--NAME``.
SLURM: Mapping[str, EngineOption] = {
    "partition": EngineOption("outside an allocation: the partition to ask nodes of"),
    "nodes": EngineOption("outside an allocation: how many nodes to ask for (or --nodelist)"),
    "nodelist": EngineOption("outside an allocation: the nodes to ask for, a Slurm host list (gpu[01-04])"),
    "time": EngineOption("outside an allocation: the allocation's time limit (salloc --time)"),
    "slurm-arg": EngineOption(
        "outside an allocation: one more salloc flag, e.g. --slurm-arg=--account=ops (repeatable)", repeatable=True
    ),
    "stackgate": EngineOption("the stackgate program on the nodes (default: stackgate on the PATH srun exports)"),
    "node-dir": EngineOption("node-local folder the spec is sent to with sbcast (default /tmp)"),
    "shared-dir": EngineOption(
        "a folder every node and this host share: the documents come back there, not through srun"
    ),
    "count-unavailable": EngineOption(
        "with --nodes N: the partition's down or drained nodes fail the verdict too (default: they are listed as "
        "unavailable; the nodes a run names always count)",
        flag=True,
    ),
}
