"""The fleet's SSH engine (edges/ssh.py): the nodes of ``--hosts`` or ``--inventory``, one SSH
session per node, the per-node actions of flows/fleet.py over it."""

from __future__ import annotations

import threading
from typing import Any, Mapping, Sequence

from stackgate.edges import ssh
from stackgate.flows.fleetengine import Placement
from stackgate.flows.fleetnode import NodeRun, Shipment
from stackgate.flows.fleetrequest import FleetRequest, nodes_of
from stackgate.models.exitcodes import UsageError
from stackgate.models.fleetoptions import EngineOption
from stackgate.render.ui import UI

__all__ = ["ENGINE", "SshEngine"]


class SshEngine:
    """Bare fleets: the nodes named by ``--hosts``/``--inventory``, dialled with paramiko."""

    name = "ssh"
    summary = "the nodes of --hosts or --inventory, over SSH (paramiko)"
    options: Mapping[str, EngineOption] = {}

    def parse_options(self, given: Mapping[str, Sequence[str]]) -> Any:
        if given:
            raise UsageError(f"fleet --engine ssh: takes no engine option ({', '.join(given)})")
        return None

    def check(self, request: FleetRequest) -> None:
        nodes_of(request)

    def place(self, request: FleetRequest, ui: UI) -> Placement:
        return Placement(nodes_of(request))

    def transport(self, placement: Placement, stop: threading.Event) -> ssh.Transport:
        return ssh.SshTransport(stop)

    def collect(
        self, request: FleetRequest, placement: Placement, shipment: Shipment, stop: threading.Event, ui: UI
    ) -> Sequence[NodeRun] | None:
        return None


ENGINE = SshEngine()
