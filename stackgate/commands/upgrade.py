"""`stackgate upgrade --to NEW_SPEC`: rehearse a stack upgrade beside the live one, A/B it on the
same GPUs, switch only if it wins.

The steps (plan, build beside, verify, A/B, decide, switch) are the upgrade flow's
(:mod:`stackgate.flows.upgrade`); this command runs it on this node, keeps each A/B leg's smoke
in the history and explains the result in one document, rendered to the console, JSON, Markdown
and HTML.
"""

from __future__ import annotations

from typing import Any, Mapping

from stackgate.flows.upgrade import (
    UpgradeRequest,
    UpgradeRun,
    check_request,
    upgrade_node,
)
from stackgate.models import settings
from stackgate.models.exitcodes import ExitCode
from stackgate.models.redact import redact
from stackgate.render import outputs
from stackgate.render import upgradereport as upgrade_render
from stackgate.render.ui import UI
from stackgate.runs import history

__all__ = ["keep_legs", "run", "write_reports"]


def run(request: UpgradeRequest, ui: UI) -> ExitCode:
    """The upgrade command: upgrade this node, show and write the report."""
    ui.settings(settings.report(flags={settings.LOCK: ("--lock", request.spec_path)}))
    check_request(request)
    done = upgrade_node(request, ui)
    keep_legs(done, ui)
    doc = redact(done.document())
    upgrade_render.console(doc, ui)
    write_reports(doc, request)
    if done.interrupted:
        raise KeyboardInterrupt
    return done.exit_code


def keep_legs(done: UpgradeRun, ui: UI) -> None:
    """Each leg's smoke kept in the history, as `stackgate smoke` keeps its runs: `stackgate
    report LIVE_RUN NEW_RUN` then shows what changed between the two sides, component by component."""
    for part, ran in done.smoke_runs:
        doc = {**ran.document(), "run_id": history.new_id("smoke", ran.started)}
        if history.keep(doc, ran.spec, ui.error) is not None:
            part["run_id"] = doc["run_id"]
    ids: dict[str, str] = {}
    for part, _ in done.smoke_runs:
        if "run_id" in part:
            ids.setdefault(part["side"], part["run_id"])  # each side's first leg
    if len(ids) == 2:
        ui.info(
            f"each leg is kept in the history: `stackgate report {ids['live']} {ids['new']}` compares the two sides"
        )


def write_reports(doc: Mapping[str, Any], request: UpgradeRequest) -> None:
    outputs.write_reports(doc, request.reports())
