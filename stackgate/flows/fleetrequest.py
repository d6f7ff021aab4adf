"""A fleet run's request, checked before any node is touched, and its nodes when they are named.

What every engine shares about a request (flows/fleetengines.py): the actions, the options each
action takes, the numbers given as text, the specs an upgrade ships, the nodes of ``--hosts`` and
``--inventory`` (the SSH engine's), each refusal a :class:`UsageError` (exit 2, nothing run).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from stackgate.models import fleetoptions
from stackgate.models.exitcodes import UsageError
from stackgate.models.inventory import Node, load_inventory, parse_hosts
from stackgate.models.spec import Spec, load_spec

__all__ = [
    "ACTIONS",
    "MAX_NODES",
    "SWITCHES",
    "FleetRequest",
    "check_batch",
    "check_upgrade",
    "nodes_of",
    "seconds",
    "unknown_action",
    "upgrade_specs",
    "whole",
]


ACTIONS = tuple(fleetoptions.ACTIONS)


def unknown_action(action: str) -> str:
    """The usage error for an action fleet does not know, with the nearest one when there is one.

    >>> unknown_action("verfy")
    "fleet: unknown action 'verfy': did you mean verify? (one of: gate, verify, provision, upgrade)"
    """
    near = difflib.get_close_matches(action, ACTIONS, n=1)
    hint = f": did you mean {near[0]}?" if near else ""
    return f"fleet: unknown action {action!r}{hint} (one of: {', '.join(ACTIONS)})"


#: upgrade's --switch modes a rollout can take (``never`` moves no node: the canary could not win).
SWITCHES = ("if-better", "if-passes")


#: The most nodes a fleet run takes unless --max-nodes says more: a generated inventory gone wrong
#: (10,000 hosts) is refused before anything is dialled.
MAX_NODES = 1000


@dataclass(frozen=True, kw_only=True)
class FleetRequest:
    action: str
    hosts: str | None = None
    inventory: Path | None = None
    spec_path: Path | None = None
    parallel: int = 8
    batch: int = 1  #: provision, upgrade: nodes moved at a time
    fast_only: bool = False
    checks: tuple[str, ...] = ()  #: verify only: ``--check`` patterns handed to each node
    timeout_s: float | None = None  #: every node's; default: the inventory's, else models.fleet's
    connect_timeout_s: float | None = None
    strict: bool = False
    json_path: Path | None = None
    junit_path: Path | None = None
    markdown_path: Path | None = None
    prom_path: Path | None = None
    html_path: Path | None = None
    to_path: Path | None = None  #: upgrade only: the new spec (``spec_path``, when given, is the live one)
    canary: int = 1  #: upgrade only: nodes upgraded first; the rest only if every one of them won
    switch: str = "if-better"  #: upgrade only: each node's ``stackgate upgrade --switch``
    accept_output_change: bool = False  #: upgrade only
    model: str | None = None  #: upgrade only: the model both sides launch on each node
    max_nodes: int = MAX_NODES  #: more nodes than this is refused (a runaway inventory); --max-nodes raises it
    engine: str = "ssh"  #: a fleet engine's name (flows/fleetengines.py): ssh (the inventory's nodes), slurm, ...
    options: Any = None  #: that engine's own options (its module's dataclass; None: its defaults)

    @property
    def upgrade_options(self) -> bool:
        """Whether an option only ``fleet upgrade`` takes was given."""
        return (
            self.to_path is not None
            or self.canary != 1
            or self.switch != "if-better"
            or self.accept_output_change
            or self.model is not None
        )


def whole(flag: str, value: Any, default: int) -> int:
    """A flag's whole number, from its text (taken as text: invoke's own int flags end in a
    traceback on a word that is not a number)."""
    if value is None:
        return default
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise UsageError(f"{flag} {value!r}: not a whole number") from None
    if number < 1:
        raise UsageError(f"{flag} {value!r}: must be at least 1")
    return number


def seconds(flag: str, value: Any) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{flag} {value!r}: not a number of seconds") from None
    if not (number > 0 and number != float("inf")):
        raise UsageError(f"{flag} {value!r}: must be a number of seconds above 0")
    return number


def nodes_of(request: FleetRequest) -> list[Node]:
    """The request's nodes, with its timeouts; bad usage before anything connects."""
    if request.action not in ACTIONS:
        raise UsageError(unknown_action(request.action))
    if (request.hosts is None) == (request.inventory is None):
        raise UsageError(
            "fleet: name the nodes with --hosts a,b,c or --inventory FILE (one of them)",
            hint=f"stackgate fleet {request.action} --hosts gpu01,gpu02",
        )
    if request.parallel < 1 or request.batch < 1:
        raise UsageError("fleet: --parallel and --batch must be at least 1")
    check_batch(request)
    if request.checks and request.action != "verify":
        raise UsageError("fleet: --check is for `fleet verify`")
    check_upgrade(request)
    if request.hosts is not None:
        nodes = parse_hosts(request.hosts)
    else:
        nodes = load_inventory(request.inventory)  # type: ignore[arg-type]
    if len(nodes) > request.max_nodes:
        raise UsageError(
            f"fleet: {len(nodes)} nodes, more than {request.max_nodes} (--max-nodes): nothing was dialled; "
            f"pass --max-nodes {len(nodes)} if the fleet really is that large"
        )
    if request.action == "upgrade" and request.canary > len(nodes):
        raise UsageError(f"fleet upgrade: --canary {request.canary}: the fleet has {len(nodes)} node(s)")
    return [
        replace(
            node,
            timeout_s=request.timeout_s or node.timeout_s,
            connect_timeout_s=request.connect_timeout_s or node.connect_timeout_s,
        )
        for node in nodes
    ]


def check_batch(request: FleetRequest) -> None:
    if request.batch != 1 and request.action not in ("provision", "upgrade"):
        raise UsageError("fleet: --batch is for `fleet provision` and `fleet upgrade` (gate and verify use --parallel)")


def check_upgrade(request: FleetRequest) -> None:
    if request.action != "upgrade":
        if request.upgrade_options:
            raise UsageError(
                "fleet: --to, --canary, --switch, --accept-output-change and --model are for `fleet upgrade`"
            )
        return
    if request.to_path is None:
        raise UsageError("fleet upgrade: --to NEW_SPEC is required: the spec every node upgrades to")
    if request.switch not in SWITCHES:
        raise UsageError(
            f"fleet upgrade: --switch {request.switch!r}: one of {', '.join(SWITCHES)} "
            "(`never` would move no node; `stackgate upgrade --switch never` rehearses one)"
        )
    if request.canary < 1:
        raise UsageError("fleet upgrade: --canary must be at least 1")


def upgrade_specs(request: FleetRequest) -> tuple[Spec, Spec | None]:
    """The new spec and the live one (None: each node's live generation names its own), loaded
    here, before any node is touched: what a node would refuse is refused here first."""
    assert request.to_path is not None
    new = load_spec(request.to_path)
    live = load_spec(request.spec_path) if request.spec_path is not None else None
    for option, spec in (("--to", new), ("--lock", live)):
        if spec is not None and spec.python.root is None:
            raise UsageError(
                f"fleet upgrade: {option} {spec.path}: python.interpreter names an existing environment; "
                "an upgrade builds generations under a python.root"
            )
    if live is not None and live.python.root != new.python.root:
        raise UsageError(
            f"fleet upgrade: --to {new.path}: python.root is {new.python.root}, "
            f"but the live spec {live.path} has {live.python.root}: an upgrade builds beside the live stack"
        )
    return new, live
