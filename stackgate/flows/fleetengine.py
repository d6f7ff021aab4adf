"""What a fleet engine is: the protocol every entry of the registry (flows/fleetengines.py) answers.

The controller (flows/fleetengines.py :func:`~stackgate.flows.fleetengines.run`) knows no engine by
name. It asks the engine chosen by ``--engine`` to

1. **check** the request (usage, before anything is asked of anyone: exit 2, nothing touched);
2. **place** it: select the nodes (those to run, and those listed but not dialled: a scheduler's
   down or drained nodes), with the engine's part of the report and how to **cancel** what placing
   took (an allocation) when the run ends, however it ends;
3. **collect** the nodes' documents in one step of its own (Slurm's gate and verify: one srun step,
   one task per node), or say None: then each node is run through the **transport** it opens (a
   connection per node, edges/ssh.py's Transport: SSH's paramiko sessions, Slurm's one-task srun
   steps) by the per-node actions of flows/fleetnode.py.

An engine's own options (``--engine-option KEY=VALUE``, and the flags documented as their
shorthands) are declared by the engine: their names and help (models/fleetoptions.py) and its parser; a
key another engine owns, or none does, is refused before anything runs.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from stackgate.edges import ssh
from stackgate.flows.fleetnode import NodeRun, Shipment
from stackgate.flows.fleetrequest import FleetRequest
from stackgate.models.fleetoptions import EngineOption
from stackgate.models.inventory import Node
from stackgate.render.ui import UI

__all__ = ["EngineOption", "FleetEngine", "Placement"]


@dataclass
class Placement:
    """Where a request runs: the nodes to run (in order), those listed but not run, the engine's
    part of the report, what the engine needs for the rest of the run, and how it is released."""

    nodes: Sequence[Node]
    listed: Sequence[NodeRun] = ()  #: not run (added after the nodes that ran)
    part: dict[str, Any] | None = None  #: the report's ``engine`` part (None: none)
    handle: Any = None  #: the engine's own (Slurm: its allocation and the nodes' states)
    release: Callable[[], None] = field(default=lambda: None)  #: cancel what placing took


class FleetEngine(Protocol):
    """A fleet engine: see the module's docstring."""

    name: str
    summary: str  #: one line: where its nodes come from
    options: Mapping[str, EngineOption]  #: its own options, by name (``--engine-option NAME=VALUE``)

    def parse_options(self, given: Mapping[str, Sequence[str]]) -> Any:
        """Its options from their texts (only keys of :attr:`options`); bad values: UsageError."""
        ...

    def check(self, request: FleetRequest) -> None:
        """Refuse what the engine cannot take (UsageError) before anything is asked of anyone."""
        ...

    def place(self, request: FleetRequest, ui: UI) -> Placement:
        """The nodes; a placement that cannot be made is a UsageError (nothing was run)."""
        ...

    def transport(self, placement: Placement, stop: threading.Event) -> ssh.Transport:
        """A transport to the placement's nodes (one session per node), ended early by ``stop``."""
        ...

    def collect(
        self, request: FleetRequest, placement: Placement, shipment: Shipment, stop: threading.Event, ui: UI
    ) -> Sequence[NodeRun] | None:
        """Every node's NodeRun from one step of the engine's own, in the report's order (the listed
        nodes included); None: the controller runs each node through :meth:`transport`."""
        ...
