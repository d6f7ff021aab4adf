"""The fleet engines, by name, and the controller that runs any of them (flows/fleetengine.py).

Adding an engine is one edge module (how its nodes are reached: a Transport, as edges/ssh.py and
edges/slurm.py give), one engine module (flows/fleet_<name>.py: an object answering
:class:`~stackgate.flows.fleetengine.FleetEngine`) and one line in :data:`ENGINES`.
"""

from __future__ import annotations

import difflib
import threading
import time
from dataclasses import replace
from typing import Mapping, Sequence

from stackgate.edges import ssh
from stackgate.flows import fleet_slurm, fleet_ssh
from stackgate.flows.fleet import FleetRun, run_fleet
from stackgate.flows.fleetengine import FleetEngine
from stackgate.flows.fleetnode import Shipment
from stackgate.flows.fleetrequest import FleetRequest
from stackgate.models.exitcodes import UsageError
from stackgate.models.spec import Spec
from stackgate.render.ui import UI
from stackgate.runs import history

__all__ = ["ENGINES", "engine_options", "named", "register", "run"]

#: Every fleet engine, by the name ``--engine`` takes (the first is the default).
ENGINES: dict[str, FleetEngine] = {
    fleet_ssh.ENGINE.name: fleet_ssh.ENGINE,
    fleet_slurm.ENGINE.name: fleet_slurm.ENGINE,
}


def register(engine: FleetEngine) -> None:
    """One more engine under its name (an engine of a site's own, an engine a test brings)."""
    ENGINES[engine.name] = engine


def named(name: str) -> FleetEngine:
    """The engine ``--engine NAME`` names; an unknown name is a usage error naming the nearest one.

    >>> named("slurm").name
    'slurm'
    """
    if name in ENGINES:
        return ENGINES[name]
    near = difflib.get_close_matches(name, ENGINES, n=1)
    hint = f": did you mean {near[0]}?" if near else ""
    raise UsageError(f"fleet: --engine {name!r}{hint} (one of: {', '.join(ENGINES)})")


def engine_options(name: str, given: Mapping[str, Sequence[str]], pairs: Sequence[str] = ()) -> object:
    """The named engine's options from its flags (``given``: option name -> its values) and from
    ``--engine-option NAME=VALUE`` pairs; an option of another engine, or of none, is refused."""
    engine = named(name)
    merged = {key: list(values) for key, values in given.items() if values}
    for pair in pairs:
        key, has_value, value = pair.partition("=")
        merged.setdefault(key.strip(), []).append(value if has_value else "")
    for key, values in merged.items():
        option = engine.options.get(key)
        if option is None:
            raise UsageError(_not_an_option(engine, key))
        if len(values) > 1 and not option.repeatable:
            raise UsageError(f"fleet --engine {engine.name}: {key} given {len(values)} times: once")
    return engine.parse_options(merged)


def _not_an_option(engine: FleetEngine, key: str) -> str:
    owners = [other.name for other in ENGINES.values() if key in other.options]
    if owners:
        return f"fleet: --{key} is an option of --engine {' or '.join(owners)}, not of --engine {engine.name}"
    near = difflib.get_close_matches(key, engine.options, n=1)
    hint = f": did you mean {near[0]}?" if near else ""
    known = ", ".join(engine.options) or "none"
    return f"fleet --engine {engine.name}: no option {key!r}{hint} (its options: {known})"


def run(
    engine: FleetEngine,
    request: FleetRequest,
    spec: Spec,
    ui: UI,
    live: Spec | None = None,
    transport: ssh.Transport | None = None,
) -> FleetRun:
    """The request's action on the engine's nodes (flows/fleetengine.py's steps); what placing took is
    released however the run ends. ``transport`` replaces the engine's own (the tests' simulated nodes)."""
    started, clock, stop = time.time(), time.monotonic(), threading.Event()
    placement = engine.place(request, ui)
    try:
        shipment = Shipment.of(spec, live)
        collected = engine.collect(request, placement, shipment, stop, ui)
        if collected is not None:
            run_id = history.new_id("fleet", started)
            ran = tuple(collected)
            done = FleetRun(request, run_id, spec, shipment, ran, started, time.monotonic() - clock, stop.is_set())
        elif placement.nodes:

            def opener(stop: threading.Event) -> ssh.Transport:
                return engine.transport(placement, stop)

            done = run_fleet(request, placement.nodes, spec, ui, transport, live, opener)
            done = replace(done, nodes=done.nodes + tuple(placement.listed))
        else:
            run_id = history.new_id("fleet", time.time())
            done = FleetRun(request, run_id, spec, shipment, tuple(placement.listed), time.time(), 0.0, False)
    finally:
        placement.release()
    return replace(done, engine=placement.part) if placement.part is not None else done
