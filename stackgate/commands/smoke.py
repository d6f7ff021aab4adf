"""`stackgate smoke`: launch the engine as production will, prove what runs, benchmark it, tear it down.

:func:`run_smoke` is the library entry point (the gate calls it): for each configuration (the
lock's, and with --compare a baseline first) it refuses what cannot work before launching,
launches the server in its own process group, waits for readiness while following the log,
reads what really runs, benchmarks it, and always tears it down. Everything it learns becomes
``smoke.*`` Results, so a report can hold them beside verify's.
"""

from __future__ import annotations

from typing import Sequence

from stackgate.edges.files import unwritable, write_json
from stackgate.flows.smoke import (
    SCHEMA,
    Session,
    SmokeInterrupted,
    SmokeRequest,
    SmokeRun,
    SmokeUsageError,
    _ms,
    parse_levels,
    parse_number,
    run_smoke,
)
from stackgate.models import settings
from stackgate.models.exitcodes import ExitCode
from stackgate.models.spec import load_spec
from stackgate.render import report
from stackgate.render.ui import UI
from stackgate.runs import history
from stackgate.serve import bench, launch
from stackgate.serve.launch import LaunchError

__all__ = [
    "BENCHMARK_HEADERS",
    "CONCURRENCY_HEADERS",
    "SCHEMA",
    "LaunchError",
    "Session",
    "SmokeInterrupted",
    "SmokeRequest",
    "SmokeRun",
    "SmokeUsageError",
    "benchmark_rows",
    "concurrency_rows",
    "parse_levels",
    "parse_number",
    "run",
    "run_smoke",
]

#: The columns of a benchmark table (rows: :func:`benchmark_rows`).
BENCHMARK_HEADERS = ("run", "tokens", "seconds", "tok/s", "TTFT ms", "decode tok/s")
#: The columns of a concurrency table (rows: :func:`concurrency_rows`).
CONCURRENCY_HEADERS = (
    "streams",
    "aggregate tok/s",
    "per-stream tok/s",
    "TTFT ms p50/p90/p99",
    "ITL ms p50/p90/p99",
    "failed",
)


# --- the command ------------------------------------------------------------------------------


def run(request: SmokeRequest, ui: UI) -> ExitCode:
    """The smoke command: load the lock, smoke, render, write the JSON report."""
    ui.settings(settings.report(flags={settings.LOCK: ("--lock", request.lock_path)}))
    problem = unwritable({"--json": request.json_path} if request.json_path else {})
    if problem is not None:
        raise SmokeUsageError(problem)
    lock = load_spec(request.lock_path)
    try:
        done = run_smoke(lock, request, ui)
    except SmokeInterrupted as stop:
        _render(stop.run, ui)
        _write(stop.run, request, ui)
        raise
    _render(done, ui)
    _write(done, request, ui)
    return done.verdict.exit_code


def _render(done: SmokeRun, ui: UI) -> None:
    for session in done.sessions:
        if session.figures is not None and session.figures.runs:
            ui.table(f"benchmark ({session.config.title})", list(BENCHMARK_HEADERS), benchmark_rows(session.figures))
        if session.levels:
            ui.table(
                f"concurrency ({session.config.title})", list(CONCURRENCY_HEADERS), concurrency_rows(session.levels)
            )
    title = f"stackgate smoke: {done.lock.name} ({done.lock.path})" + (" [interrupted]" if done.interrupted else "")
    ui.results(
        title, report.redacted(done.results, done.document(), known=done.secrets()), done.verdict, done.duration_s
    )
    for session in done.sessions:
        if session.log_path is not None:
            ui.line(f"server log ({session.config.title}): {session.log_path} ({launch.LOG_NOTE})")
        if session.kept and session.pid is not None:
            ui.line(
                f"the server is still running (--keep-server): pid {session.pid}, process group {session.pid}, {session.config.base_url}"
            )
            ui.line(
                f"stop it with: kill -TERM -- -{session.pid}   (it drains for up to ~5 s; then, if needed: kill -KILL -- -{session.pid})"
            )


def benchmark_rows(figures: bench.BenchFigures) -> list[list[str]]:
    """Each run, then mean, median, min, max, stdev, CV and the 95% interval."""
    rows = []
    for i, sample in enumerate(figures.runs):
        first = f"{sample.ttft_s * 1000:.0f}" if sample.ttft_s is not None else "-"
        rate = f"{sample.decode_tok_s:.2f}" if sample.decode_tok_s is not None else "-"
        mark = " short" if sample.short else " error" if sample.error else ""
        rows.append([f"{i + 1}{mark}", str(sample.tokens), f"{sample.seconds:.3f}", f"{sample.tok_s:.2f}", first, rate])
    tok, ttft, decode = figures.tok_s, figures.ttft_s, figures.decode_tok_s
    if tok is None:
        return rows
    for name, pick in (
        ("mean", lambda s: s.mean),
        ("median", lambda s: s.median),
        ("min", lambda s: s.min),
        ("max", lambda s: s.max),
    ):
        rows.append(
            [
                name,
                "",
                "",
                f"{pick(tok):.2f}",
                f"{pick(ttft) * 1000:.0f}" if ttft else "-",
                f"{pick(decode):.2f}" if decode else "-",
            ]
        )
    rows.append(["stdev", "", "", f"{tok.stdev:.2f}", "", f"{decode.stdev:.2f}" if decode else "-"])
    rows.append(["CV", "", "", f"{tok.cv:.2%}", "", f"{decode.cv:.2%}" if decode else "-"])
    rows.append(["95% CI", "", "", tok.interval(), "", decode.interval() if decode else "-"])
    return rows


def concurrency_rows(levels: Sequence[bench.Level]) -> list[list[str]]:
    """Per level: throughput, then the latencies operators read (TTFT and inter-token, in ms)."""
    rows = []
    for level in levels:
        per = level.per_stream
        rows.append(
            [
                str(level.streams),
                f"{level.aggregate_tok_s:.2f}",
                f"{per.mean:.2f}" if per else "-",
                _ms(level.ttft_s()),
                _ms(level.itl_s()),
                str(level.streams - len(level.good)),
            ]
        )
    return rows


def _write(done: SmokeRun, request: SmokeRequest, ui: UI) -> None:
    """The JSON report, and the same document kept in the history of runs (`stackgate report`)."""
    doc = {**done.document(), "run_id": history.new_id("smoke", done.started)}
    if request.json_path:
        write_json(request.json_path, doc)
    stored = history.keep(doc, done.lock, ui.error)
    if stored is not None:
        ui.info(f"run {doc['run_id']} kept in {stored.parent}")


# --- the library entry point ------------------------------------------------------------------


# --- one configuration ------------------------------------------------------------------------


# --- the end of a configuration ---------------------------------------------------------------


# --- --compare --------------------------------------------------------------------------------
