"""`stackgate gate`: one verdict before deploy, from the lock to a benchmark of the real weights.

The stages and what each stands on are the gate flow's (:mod:`stackgate.flows.gate`); this command
checks the report paths, runs the flow, prints the summary, writes every report and keeps the run.
"""

from __future__ import annotations

from typing import Any, Mapping

from stackgate.flows.gate import (
    GateRequest,
    GateRun,
    run_gate,
)
from stackgate.flows.smokerun import SmokeRun
from stackgate.models import settings
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.models.redact import redact
from stackgate.models.result import Result
from stackgate.render import reporting, summaries
from stackgate.render.benchtables import BENCHMARK_HEADERS, benchmark_rows
from stackgate.render.outputs import JSON, Output, check_outputs, write_reports
from stackgate.render.ui import UI
from stackgate.runs import history
from stackgate.serve import launch

__all__ = ["run"]


def run(request: GateRequest, ui: UI) -> ExitCode:
    """The gate command: run it, print the summary, write every report, keep the run.

    Everything shown or written is made from one document, redacted once here: the console,
    every report and the kept run say the same, none with a secret in it.
    """
    ui.settings(settings.report(flags={settings.LOCK: ("--lock", request.spec_path)}))
    problem = check_outputs(_outputs(request))
    if problem is not None:
        raise UsageError(problem)
    done = run_gate(request, ui)
    doc = redact(done.document())
    if done.usage is not None:
        ui.error(f"stackgate: {doc['gate']['usage_error']}")  # the exit-2 message, on standard error as every one
    render(done, doc, ui)
    write_reports(doc, _outputs(request))
    if done.usage is None:
        stored = history.keep(doc, done.spec, ui.error)
        if stored is not None:
            ui.info(f"run {done.run_id} kept in {stored.parent}")
    if done.interrupted:
        raise KeyboardInterrupt
    return done.exit_code


def render(done: GateRun, doc: Mapping[str, Any], ui: UI) -> None:
    """The console summary: each stage that ran, the benchmark, the stage table, the verdict.

    Words come from the (redacted) document, so the console shows no more than the reports;
    ``done`` gives only figures and counts."""
    count = len(done.stages)
    for number, (stage, shown) in enumerate(zip(done.stages, doc["gate"]["stages"], strict=True), 1):
        if not stage.ran or stage.verdict is None:
            continue
        results = [Result.from_dict(r) for r in shown["results"]]
        ui.results(f"gate {number}/{count} {stage.name}: {stage.title}", results, stage.verdict, stage.duration_s)
        if stage.name == "verify" and done.verify_run is not None and len(done.verify_run.phases) > 1:
            ui.line(reporting.phases_line(done.verify_run.phases, done.verify_run.duration_s))
        _render_smoke(done.smoke_runs.get(stage.name), doc["gate"]["smoke"].get(stage.name), stage.name, ui)
    ui.line()
    word = "PASSED" if done.exit_code == ExitCode.PASSED else "INTERRUPTED" if done.interrupted else "FAILED"
    reason = "" if done.verdict.passed else f" ({doc['reason']})"
    failed = [r for s in doc["gate"]["stages"] for r in s["results"] if r["status"] in ("FAIL", "ERROR")]
    if done.usage is not None and failed:  # the gate could not run: the failing row above says why, once
        reason = f" (the gate cannot run: {', '.join(r['check'] for r in failed)} above; no stage after it ran)"
    else:
        rows = [[s["name"], s["status"], f"{s['duration_s']:.1f}", s["reason"]] for s in doc["gate"]["stages"]]
        spec = doc["lock"]
        title = f"{spec['name']} ({spec['path']})" if spec["name"] else spec["path"]
        ui.table(f"stackgate gate: {title}", ["stage", "status", "seconds", "reason"], rows, align="llrl")
        for line in summaries.headline_lines(doc):
            ui.line(line)
    ui.line(
        f"{reporting.counts_line(done.verdict.counts, ui.waited_s(done.duration_s))}: {word}{reason}",
        "success" if done.verdict.passed else "error",
    )


def _render_smoke(done: SmokeRun | None, shown: Mapping[str, Any] | None, name: str, ui: UI) -> None:
    sessions = zip(done.sessions, (shown or {}).get("sessions", ()), strict=False) if done is not None else ()
    for session, written in sessions:
        if session.figures is not None and session.figures.runs:
            ui.table(f"benchmark ({name})", list(BENCHMARK_HEADERS), benchmark_rows(session.figures))
        if written.get("log_path") is not None:
            ui.line(f"server log ({name}): {written['log_path']} ({launch.LOG_NOTE})")


def _outputs(request: GateRequest) -> dict[str, Output]:
    """The reports the gate was asked for, each rendered from the (redacted) document."""

    def junit(doc: Mapping[str, Any]) -> str:
        return reporting.junit_text(summaries.suites(doc), strict=request.strict)

    return {
        "--json": Output(request.json_path, JSON),
        "--junit": Output(request.junit_path, junit),
        "--markdown": Output(request.markdown_path, summaries.markdown),
        "--prom": Output(request.prom_path, summaries.prometheus),
    }
