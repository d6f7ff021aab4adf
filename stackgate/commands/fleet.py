"""`stackgate fleet gate|verify|provision|upgrade`: the same command on every node, one fleet verdict.

The rollouts are the fleet flow's, over the engine ``--engine`` names (flows/fleetengines.py: ssh,
slurm, ...); this command checks the request before any node is touched, runs the flow, renders its
document to the console and the file reports, and keeps each gate document collected in this
controller's run history (runs/history.py), as local runs are, with a ``fleet`` part naming the
node and the fleet run.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from stackgate.edges import ssh
from stackgate.flows import fleetengines
from stackgate.flows.fleet import (
    FleetRun,
)
from stackgate.flows.fleetrequest import (
    FleetRequest,
    upgrade_specs,
)
from stackgate.models import settings
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.models.redact import redact
from stackgate.models.spec import load_spec
from stackgate.render import fleetreport, outputs
from stackgate.render.outputs import JSON, Output
from stackgate.render.ui import UI
from stackgate.runs import history

__all__ = ["run"]

_RUN_ID = re.compile(r"^[0-9]{8}T[0-9]{6}Z-[a-z]+-[0-9a-f]{1,32}$")


def reports(request: FleetRequest) -> dict[str, Output]:
    """The asked-for reports: where each goes and how the fleet document becomes its text."""
    return {
        "--json": Output(request.json_path, JSON),
        "--junit": Output(request.junit_path, fleetreport.junit),
        "--markdown": Output(request.markdown_path, fleetreport.markdown),
        "--prom": Output(request.prom_path, fleetreport.prometheus),
        "--html": Output(request.html_path, fleetreport.html_page),
    }


def check_outputs(request: FleetRequest) -> None:
    """Refuse, before any node is touched, a report path that could not be written at the end."""
    problem = outputs.check_outputs(reports(request))
    if problem is not None:
        raise UsageError(problem)


def keep_node_runs(done: FleetRun, warn: Callable[[str], None]) -> list[Path]:
    """Each node's gate document in this controller's run history, named by node and fleet run."""
    kept: list[Path] = []
    seen: set[str] = set()
    for node in done.nodes:
        doc = node.doc
        if doc is None or doc.get("command") not in history.COMMANDS:
            continue
        run_id = str(doc.get("run_id"))
        if (
            not _RUN_ID.match(run_id) or run_id in seen
        ):  # a path in a run id, or two nodes' reports with one id: a fresh one
            run_id = history.new_id(str(doc.get("command")), time.time())
        seen.add(run_id)
        stored = {
            **doc,
            "run_id": run_id,
            "fleet": {"node": node.node.name, "address": node.node.address, "fleet_run_id": done.run_id},
        }
        path = history.keep(redact(stored), done.spec, warn)
        if path is not None:
            kept.append(path)
    return kept


def run(request: FleetRequest, ui: UI, transport: ssh.Transport | None = None) -> ExitCode:
    """The fleet command: nodes, spec, the run, the console report, every file report, the history."""
    ui.settings(settings.report(flags={settings.LOCK: ("--lock", request.spec_path)}))
    engine = fleetengines.named(request.engine)
    engine.check(request)
    check_outputs(request)
    spec, live = upgrade_specs(request) if request.action == "upgrade" else (load_spec(request.spec_path), None)
    done = fleetengines.run(engine, request, spec, ui, live, transport)
    doc = redact(done.document())
    fleetreport.render(doc, ui)
    write_reports(doc, request)
    kept = keep_node_runs(done, ui.error)
    if kept:
        ui.info(f"{len(kept)} node run(s) kept in {kept[0].parent}")
    if done.interrupted:
        raise KeyboardInterrupt
    return ExitCode(doc["exit_code"])


def write_reports(doc: Mapping[str, Any], request: FleetRequest) -> None:
    outputs.write_reports(doc, reports(request))
