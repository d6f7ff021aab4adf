"""`stackgate smoke`: launch the engine as production will, prove what runs, benchmark it, tear it down.

The workflow (launch, readiness, the benchmark sessions, teardown, the run record) is the smoke
flow, :mod:`stackgate.flows.smoke`; this command turns its options into a request, runs the flow,
renders the result and writes the JSON report.
"""

from __future__ import annotations

import os

from stackgate.flows import smokesweep
from stackgate.flows.smoke import run_smoke
from stackgate.flows.smokeplan import plan_smoke
from stackgate.flows.smokerun import SmokeInterrupted, SmokeRequest, SmokeRun
from stackgate.models import pylock, settings
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.models.spec import Spec, load_spec
from stackgate.render import reporting
from stackgate.render.benchtables import BENCHMARK_HEADERS, CONCURRENCY_HEADERS, benchmark_rows, concurrency_rows
from stackgate.render.outputs import JSON, Output, check_outputs, write_reports
from stackgate.render.sweeptables import SWEEP_HEADERS, knee_line, sweep_rows
from stackgate.render.ui import UI
from stackgate.runs import history
from stackgate.serve import launch

__all__ = ["parse_levels", "parse_number", "parse_rates", "run"]


def parse_number(option: str, text: str | None) -> int | None:
    """A whole-number option, or None when not given.

    >>> parse_number("--tp", "8"), parse_number("--tp", None)
    (8, None)
    """
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"{option} takes a whole number, not {text!r}") from None


def parse_levels(text: str | None) -> tuple[int, ...]:
    """``"1,10,30"`` -> (1, 10, 30).

    >>> parse_levels("1, 10,30"), parse_levels(None)
    ((1, 10, 30), ())
    """
    if not text:
        return ()
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UsageError(f"--concurrency takes stream counts separated by commas, e.g. 1,10,30, not {text!r}") from None
    if not levels or any(n < 1 for n in levels):
        raise UsageError(f"--concurrency levels must be 1 or more, not {text!r}")
    return levels


def parse_rates(text: str | None) -> tuple[float, ...]:
    """``"2,4.5,8"`` -> (2.0, 4.5, 8.0): request rates, requests per second.

    >>> parse_rates("2, 4.5,8"), parse_rates(None)
    ((2.0, 4.5, 8.0), ())
    """
    if not text:
        return ()
    try:
        rates = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UsageError(
            f"--rates takes request rates (requests per second) separated by commas, e.g. 2,4,8, not {text!r}"
        ) from None
    if not rates or not all(0 < rate < float("inf") for rate in rates):
        raise UsageError(f"--rates must be numbers of requests per second above 0, not {text!r}")
    return rates


def run(request: SmokeRequest, ui: UI) -> ExitCode:
    """The smoke command: load the lock, smoke, render, write the JSON report."""
    ui.settings(settings.report(flags={settings.LOCK: ("--lock", request.spec_path)}))
    problem = check_outputs(_outputs(request))
    if problem is not None:
        raise UsageError(problem)
    spec = load_spec(request.spec_path)
    pylock.check_beside(spec)  # a pylock that cannot be used is a bad lockfile here too: exit 2
    if request.dry_run:
        return _dry_run(spec, request, ui)
    try:
        done = run_smoke(spec, request, ui)
    except SmokeInterrupted as stop:
        _render(stop.run, ui)
        _write(stop.run, request, ui)
        raise
    _render(done, ui)
    _write(done, request, ui)
    return done.verdict.exit_code


def _dry_run(spec: Spec, request: SmokeRequest, ui: UI) -> ExitCode:
    """Print what smoke would launch and check; nothing is launched, no report is written."""
    configs = launch.configs(
        spec, model=request.model, tp=request.tp, port=request.port, fast=request.fast, compare=request.compare
    )
    ui.line(f"stackgate smoke --dry-run: {spec.name} ({spec.path}); nothing is launched")
    sweep = bool(smokesweep.rates(spec, request.rates, request.measures))
    plans = plan_smoke(
        spec, configs, os.environ, measures=request.measures, concurrency=bool(request.concurrency), sweep=sweep
    )
    for planned in plans:
        for text in planned.lines():
            ui.line(text)
    return ExitCode.PASSED


def _render(done: SmokeRun, ui: UI) -> None:
    for session in done.sessions:
        if session.figures is not None and session.figures.runs:
            ui.table(f"benchmark ({session.config.title})", list(BENCHMARK_HEADERS), benchmark_rows(session.figures))
        if session.levels:
            ui.table(
                f"concurrency ({session.config.title})", list(CONCURRENCY_HEADERS), concurrency_rows(session.levels)
            )
        if session.sweep is not None:
            sweep = session.sweep.to_dict()
            ui.table(f"request-rate sweep ({session.config.title})", list(SWEEP_HEADERS), sweep_rows(sweep))
            ui.line(knee_line(sweep))
    title = f"stackgate smoke: {done.spec.name} ({done.spec.path})" + (" [interrupted]" if done.interrupted else "")
    ui.results(
        title,
        reporting.redacted(done.results, done.document(), known=done.secrets()),
        done.verdict,
        ui.waited_s(done.duration_s),
    )
    for session in done.sessions:
        if session.log_path is not None:
            ui.line(f"server log ({session.config.title}): {session.log_path} ({launch.LOG_NOTE})")
        if session.kept and session.pid is not None:
            ui.line(
                f"the server is still running (--keep-server): pid {session.pid}, "
                f"process group {session.pid}, {session.config.base_url}"
            )
            ui.line(
                f"stop it with: kill -TERM -- -{session.pid}   "
                f"(it drains for up to ~5 s; then, if needed: kill -KILL -- -{session.pid})"
            )


def _outputs(request: SmokeRequest) -> dict[str, Output]:
    return {"--json": Output(request.json_path, JSON)}


def _write(done: SmokeRun, request: SmokeRequest, ui: UI) -> None:
    """The JSON report, and the same document kept in the history of runs (`stackgate report`)."""
    doc = {**done.document(), "run_id": history.new_id("smoke", done.started)}
    write_reports(doc, _outputs(request))
    stored = history.keep(doc, done.spec, ui.error)
    if stored is not None:
        ui.info(f"run {doc['run_id']} kept in {stored.parent}")
