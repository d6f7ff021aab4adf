"""`stackgate report`: the history of runs, one run, what changed between two, or an HTML page.

- no run named: every kept run with its verdict and decode tok/s, and a trend per lock;
- one run (``A``): its stages, failures, the known failures its server logs showed (also as a
  run kept before findings had one form wrote them), benchmark and fingerprint;
- two runs (``A B``): what changed from A to B, component by component, next to the change
  in tok/s, and the checks whose status changed;
- ``--html PATH`` (with no run or one): a self-contained page for the history or that run.

A run is named by its id, a unique prefix of it, a path to its JSON file, or its position from
the newest (``-1`` the last run, ``-2`` the one before). Damaged or foreign files in the runs
directory are skipped with a warning. Runs are shown with their secrets hidden, also one kept
before stackgate hid them, or copied in from elsewhere.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from stackgate.edges.files import write_text
from stackgate.models import knowledge
from stackgate.models import spec as lockmodel
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.models.redact import redact
from stackgate.render import html, summaries
from stackgate.render.ui import UI
from stackgate.runs import history, rundiff

__all__ = ["ReportRequest", "ReportUsage", "run", "show_findings"]

#: The trend shows at most this many of the newest runs.
TREND = 40


class ReportUsage(UsageError):
    """Bad usage: too many runs named, or one that cannot be found or read."""


@dataclass(frozen=True, kw_only=True)
class ReportRequest:
    runs: tuple[str, ...] = ()
    lock_path: Path | None = None
    html_path: Path | None = None
    runs_dir: Path | None = None


def run(request: ReportRequest, ui: UI) -> ExitCode:
    if len(request.runs) > 2:
        raise ReportUsage(f"name at most two runs (A, or A B to compare), not {len(request.runs)}")
    if request.html_path is not None and len(request.runs) > 1:
        raise ReportUsage("--html takes at most one run (none: the history)")
    directory = request.runs_dir or _directory(request.lock_path)
    runs, warnings = history.load(directory)
    for warning in warnings:
        ui.warn(f"warning: {warning}")
    chosen = [_find(ref, runs) for ref in request.runs]
    if request.html_path is not None:
        return _html(request.html_path, runs, chosen[0] if chosen else None, directory, warnings, ui)
    if len(chosen) == 2:
        show_comparison(rundiff.compare(_redacted(chosen[0]), _redacted(chosen[1])), ui)
    elif chosen:
        show_run(_redacted(chosen[0]), ui)
    else:
        list_runs(runs, directory, ui)  # ids, verdicts and figures: nothing a run's secrets could be in
    return ExitCode.PASSED


def _directory(lock_path: Path | None) -> Path:
    """The runs directory of the lock (a default lock that does not load still has a history)."""
    try:
        lock = lockmodel.load(lock_path)
    except lockmodel.LockError:
        if lock_path is not None:
            raise
        lock = None
    return history.runs_dir(lock, reading=True)


def _redacted(run: history.Run) -> history.Run:
    return dataclasses.replace(run, doc=redact(run.doc))


def _find(ref: str, runs: Sequence[history.Run]) -> history.Run:
    try:
        return history.find(ref, runs)
    except history.HistoryError as exc:
        raise ReportUsage(str(exc)) from None


def list_runs(runs: Sequence[history.Run], directory: Path, ui: UI) -> None:
    if not runs:
        ui.line(f"no runs kept in {directory} yet: `stackgate gate` and `stackgate smoke` keep theirs there")
        return
    rows = [[r.id, r.command, r.lock_name, r.verdict, _num(r.decode_tok_s), _num(r.figure("tok_s")), (r.fingerprint or {}).get("short", "")] for r in runs]
    ui.table(f"{len(runs)} run(s) in {directory}, oldest first", ["run", "command", "lock", "verdict", "decode tok/s", "tok/s", "fingerprint"], rows, align="llllrrl")
    for lock in dict.fromkeys(r.lock_name for r in runs):
        ui.line(trend_line(lock, [r for r in runs if r.lock_name == lock], unicode=ui.unicode))


def trend_line(lock: str, runs: Sequence[history.Run], *, unicode: bool) -> str:
    """``trend standin (decode tok/s, last 5 runs): ▁▃█ ▅  197.31 -> 148.02``"""
    recent = list(runs)[-TREND:]
    values = [r.decode_tok_s for r in recent]
    measured = [v for v in values if v is not None]
    if not measured:
        return f"trend {lock}: no run with a benchmark of the real weights yet"
    spark = history.sparkline(values, unicode=unicode)
    arrow = "→" if unicode else "->"
    return f"trend {lock} (decode tok/s, last {len(recent)} run(s)): {spark}  {measured[0]:.2f} {arrow} {measured[-1]:.2f} (min {min(measured):.2f}, max {max(measured):.2f})"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def show_run(run: history.Run, ui: UI) -> None:
    ui.line(f"run {run.label()}")
    ui.line(f"  started {run.started} on {run.host}; {run.doc.get('reason', '')}")
    stages = (run.doc.get("gate") or {}).get("stages") or []
    if stages:
        ui.table("stages", ["stage", "status", "seconds", "reason"], [[s["name"], s["status"], f"{s['duration_s']:.1f}", s["reason"]] for s in stages], align="llrl")
    bad = [r for r in run.results if r.get("status") in ("FAIL", "ERROR", "WARN")]
    for result in bad:
        ui.line(f"  {result['status']:<5} {result.get('stage', run.command)} {result['check']}: {result['summary']}")
        fix = result.get("fix") or {}
        if fix:
            ui.line(f"        fix: {fix.get('text', '')}")
            for command in fix.get("commands", ()):
                ui.line(f"        $ {command}")
    show_findings(run, ui)
    if run.command == "gate":
        ui.line(summaries.benchmark_line(run.benchmark))
    elif run.benchmark is not None:
        ui.line(f"decode {_num(run.decode_tok_s)} tok/s; {_num(run.figure('tok_s'))} tok/s")
    finger = run.fingerprint
    if finger:
        ui.line(f"fingerprint {finger.get('short')} ({', '.join(finger['components'])})")
    ui.line(f"file: {run.path}")


def show_findings(run: history.Run, ui: UI) -> None:
    """The known failures the run's server logs showed, one line each, most severe first."""
    findings, unreadable = run.findings()
    if findings:
        ui.line(f"known failures in the server logs ({len(findings)}):")
    for finding in sorted(findings, key=knowledge.rank):
        seen = f", {finding.evidence.count} times" if finding.evidence.count > 1 else ""
        ui.line(f"  {finding.severity.upper():<7} {finding.id}: {finding.title} ({finding.evidence.where}{seen})")
    for problem in unreadable:
        ui.warn(f"warning: a finding of run {run.id} cannot be read: {problem}")


def show_comparison(comparison: rundiff.Comparison, ui: UI) -> None:
    old, new = comparison.old, comparison.new
    ui.line(f"A: {old.label()}, started {old.started}")
    ui.line(f"B: {new.label()}, started {new.started}")
    for speed in comparison.speed:
        ui.line(speed.text())
    for figure in comparison.figures:
        ui.line(figure.text())
    a, b = (old.fingerprint or {}).get("short"), (new.fingerprint or {}).get("short")
    prints = f"; fingerprint {a} -> {b}" if a and b else ""
    if comparison.same_stack:
        ui.line(f"the stack is the same in what both runs recorded ({', '.join(comparison.sections) or 'nothing'}){prints}")
    else:
        ui.line(f"what changed from A to B ({len(comparison.changes)} component(s){prints}):")
        section = None
        for change in comparison.changes:
            if change.section != section:
                section = change.section
                ui.line(f"  {section}:")
            ui.line(f"    {change}")
    missing = [s for s in ("gpu", "toolkits", "distributions", "patches") if s not in comparison.sections]
    if missing and comparison.sections:
        smoke = "smoke" in (old.command, new.command)
        ui.line(f"  (not compared: {', '.join(missing)}: {'a smoke run records only its lock and its server' if smoke else 'not recorded by both runs'})")
    if comparison.statuses:
        ui.line(f"checks whose status changed ({len(comparison.statuses)}):")
        for status in comparison.statuses[:30]:
            ui.line(f"  {status}")


def _html(path: Path, runs: Sequence[history.Run], focus: history.Run | None, directory: Path, warnings: Sequence[str], ui: UI) -> ExitCode:
    anchor = focus or (runs[-1] if runs else None)
    lock = anchor.lock_name if anchor else None
    chosen = [r for r in runs if r.lock_name == lock] if lock else list(runs)
    if focus is not None and focus not in chosen:
        chosen.append(focus)  # a run named by a path from elsewhere
    title = f"stackgate: run {focus.id}" if focus else f"stackgate: {len(chosen)} run(s) of {lock or 'no lock'}"
    shown = [_redacted(r) for r in chosen]
    centre = next((r for r in shown if anchor is not None and r.id == (focus or anchor).id), None)
    text = html.page(shown, centre, title=title, source=f"runs in {directory}", warnings=warnings)
    write_text(path, text)
    ui.line(f"wrote {path} ({len(chosen)} run(s){f', focus {focus.id}' if focus else ''})")
    return ExitCode.PASSED
