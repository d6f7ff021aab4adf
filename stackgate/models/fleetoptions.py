"""The fleet's actions and the options each takes (``stackgate fleet gate|verify|provision|upgrade``), and a
fleet engine's own options (``stackgate fleet --engine NAME --engine-option KEY=VALUE``), as data.

The command line reads :data:`ACTIONS` to show each action's help with only its options and to refuse an
option of another action; the fleet's request checks (flows/fleetrequest.py) take their action names from it.
Each engine (flows/fleetengines.py) declares its options here or in its module; the Slurm engine's
sit here because each is also a flag of its own (``--partition gpu``, the documented shorthand of
``--engine-option partition=gpu``) whose help the command line shows without loading the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

__all__ = ["ACTIONS", "SLURM", "EngineOption", "FleetAction"]


@dataclass(frozen=True)
class EngineOption:
    """One option of an engine: its help, whether it may be given more than once, whether it takes no value."""

    help: str
    repeatable: bool = False
    flag: bool = False  #: takes no value (``--engine-option NAME`` or the shorthand flag alone)


@dataclass(frozen=True)
class FleetAction:
    """One action of `stackgate fleet`: what it does, and the options only it takes (the fleet task's
    parameter names); every other option of the task is common to all actions, or an engine's."""

    summary: str
    options: tuple[str, ...] = ()


#: The fleet's actions, in the order help lists them.
ACTIONS: Mapping[str, FleetAction] = {
    "gate": FleetAction("run the gate on every node: one report, one verdict", ("parallel", "fast_only")),
    "verify": FleetAction("run verify on every node (its checks, or those --check names)", ("parallel", "check")),
    "provision": FleetAction(
        "provision the nodes in batches, then gate each; a node that fails is rolled back", ("batch",)
    ),
    "upgrade": FleetAction(
        "upgrade a canary first, then the rest in batches, each node only if its new stack wins",
        ("batch", "to", "canary", "switch", "accept_output_change", "model"),
    ),
}


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
