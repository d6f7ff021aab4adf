"""`stackgate report`: the history of runs, one run, what changed between two, or an HTML page.

- no run named: the newest kept runs (``--last N``, 20 by default) with their verdict and decode
  tok/s, how many are kept, and a trend per lock;
- one run (``A``): its stages, failures, the known failures its server logs showed (also as a
  run kept before findings had one form wrote them), benchmark and fingerprint;
- two runs (``A B``): what changed from A to B, component by component, next to the change
  in tok/s, and the checks whose status changed;
- ``--html PATH`` (with no run or one): a self-contained page for the history or that run;
- ``--regressed-since T``: which hosts regressed since T (decode tok/s below the host's previous
  measured run by more than ``--threshold`` percent, or a pass followed by a failure), and what
  changed on each between the two runs;
- ``--reindex``: rebuild the run index from the documents.

Everything but ``--reindex`` reads the run index (:mod:`stackgate.runs.catalog`), so its time does
not grow with the history; only the runs named are read whole.

A run is named by its id, a unique prefix of it, a path to its JSON file, or its position from
the newest (``-1`` the last run, ``-2`` the one before). Damaged or foreign files in the runs
directory are skipped with a warning. Runs are shown with their secrets hidden, also one kept
before stackgate hid them, or copied in from elsewhere.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence, TypeVar

from stackgate.edges.files import write_text
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.models.redact import redact
from stackgate.models.spec import SpecError, load_spec
from stackgate.render import summaries
from stackgate.render.ui import UI
from stackgate.runs import catalog, history, index

if TYPE_CHECKING:
    from stackgate.runs import rundiff

__all__ = ["ReportRequest", "ReportUsageError", "parse_number", "run", "show_findings", "show_regressions"]

N = TypeVar("N", int, float)

#: The trend shows at most this many of the newest runs.
TREND = catalog.TREND


class ReportUsageError(UsageError):
    """Bad usage: too many runs named, or one that cannot be found or read."""


@dataclass(frozen=True, kw_only=True)
class ReportRequest:
    runs: tuple[str, ...] = ()
    lock_path: Path | None = None
    html_path: Path | None = None
    runs_dir: Path | None = None
    last: int = 20  #: the listing shows this many of the newest runs
    reindex: bool = False
    regressed_since: str | None = None
    threshold_pct: float = 5.0


def run(request: ReportRequest, ui: UI) -> ExitCode:
    _check(request)
    directory = request.runs_dir or _directory(request.lock_path)
    if request.reindex:
        return _reindex(directory, ui)
    if request.regressed_since is not None:
        return _regressed(directory, request, ui)
    chosen = [_find(ref, directory, ui) for ref in request.runs]
    if request.html_path is not None:
        return _html(request.html_path, chosen[0] if chosen else None, directory, ui)
    if len(chosen) == 2:
        from stackgate.runs import (
            rundiff,
        )  # only here: the listing need not load the comparison's machinery (a tenth of a second)

        show_comparison(rundiff.compare(_redacted(chosen[0]), _redacted(chosen[1])), ui)
    elif chosen:
        show_run(_redacted(chosen[0]), ui)
    else:
        list_runs(
            catalog.listing(directory, request.last, ui.warn), directory, ui
        )  # ids, verdicts and figures: nothing a run's secrets could be in
    return ExitCode.PASSED


def parse_number(flag: str, text: str | None, default: N) -> N:
    """A flag's number, of the default's type (``--last 50``, ``--threshold 2.5``)."""
    if text is None or text == "":
        return default
    try:
        return type(default)(text)
    except ValueError:
        raise ReportUsageError(
            f"{flag}: {text!r} is not a {'whole ' if isinstance(default, int) else ''}number"
        ) from None


def _check(request: ReportRequest) -> None:
    if len(request.runs) > 2:
        raise ReportUsageError(f"name at most two runs (A, or A B to compare), not {len(request.runs)}")
    if request.html_path is not None and len(request.runs) > 1:
        raise ReportUsageError("--html takes at most one run (none: the history)")
    if request.last < 1:
        raise ReportUsageError(f"--last: {request.last}: show at least 1 run")
    if not 0 < request.threshold_pct < 100:
        raise ReportUsageError(f"--threshold: {request.threshold_pct:g}: a percentage above 0 and below 100")
    alone = [
        flag
        for flag, given in (("--reindex", request.reindex), ("--regressed-since", request.regressed_since is not None))
        if given
    ]
    if alone and (request.runs or request.html_path is not None or len(alone) > 1):
        raise ReportUsageError(f"{alone[0]} takes no run, no --html{' and no ' + alone[1] if len(alone) > 1 else ''}")


def _reindex(directory: Path, ui: UI) -> ExitCode:
    if not directory.is_dir():
        ui.line(f"no runs kept in {directory} yet: nothing to index")
        return ExitCode.PASSED
    try:
        done = catalog.reindex(directory)
    except index.IndexUnusable as exc:
        raise ReportUsageError(f"cannot rebuild the run index of {directory}: {exc}") from None
    skipped = f", {done.skipped} file(s) skipped (not runs; `stackgate report` names them)" if done.skipped else ""
    ui.line(
        f"indexed {done.runs} run(s) of {directory} in {done.seconds:.1f} s{skipped}: {index.database_path(directory)}"
    )
    return ExitCode.PASSED


def _regressed(directory: Path, request: ReportRequest, ui: UI) -> ExitCode:
    try:
        since = catalog.parse_since(request.regressed_since or "")
    except ValueError as exc:
        raise ReportUsageError(f"--regressed-since: {exc}") from None
    found, nodes = catalog.regressed_since(directory, since, ui.warn, threshold=request.threshold_pct / 100)
    show_regressions(found, nodes, since, request.threshold_pct, ui)
    return ExitCode.PASSED


def show_regressions(found: Sequence[catalog.Regression], nodes: int, since: str, threshold_pct: float, ui: UI) -> None:
    rule = f"decode tok/s more than {threshold_pct:g}% below the node's previous measured run, or passed -> failed"
    regressed = list(dict.fromkeys(r.node for r in found))
    ui.line(f"{len(regressed)} of {nodes} node(s) with runs since {since} regressed ({rule})")
    for item in found:
        ui.line(
            f"{item.node}: {item.run.id} ({item.run.kind} of {item.run.lock}): {'; '.join(item.reasons)}; against {item.against.id}"
        )
        prints = (
            f"fingerprint {item.against.short} -> {item.run.short}"
            if item.against.short and item.run.short
            else "fingerprints not both recorded"
        )
        if item.run.fingerprint and item.run.fingerprint == item.against.fingerprint:
            ui.line(f"  nothing changed in the stack (fingerprint {item.run.short}): look at the node itself")
        elif not item.changes:
            ui.line(f"  no difference in what both runs recorded ({', '.join(item.compared) or 'nothing'}; {prints})")
        else:
            ui.line(f"  what changed ({len(item.changes)} component(s), {prints}):")
            for change in item.changes[:30]:
                ui.line(f"    {change.section}: {change}")


def _directory(lock_path: Path | None) -> Path:
    """The runs directory of the lock (a default lock that does not load still has a history)."""
    try:
        lock = load_spec(lock_path)
    except SpecError:
        if lock_path is not None:
            raise
        lock = None
    return history.runs_dir(lock, reading=True)


def _redacted(run: history.Run) -> history.Run:
    return dataclasses.replace(run, doc=redact(run.doc))


def _find(ref: str, directory: Path, ui: UI) -> history.Run:
    try:
        return catalog.find(ref, directory, ui.warn)
    except history.HistoryError as exc:
        raise ReportUsageError(str(exc)) from None


def list_runs(listing: catalog.Listing, directory: Path, ui: UI) -> None:
    for skipped in listing.skipped:
        ui.warn(f"warning: {skipped.reason}")
    if not listing.rows:
        ui.line(f"no runs kept in {directory} yet: `stackgate gate` and `stackgate smoke` keep theirs there")
        return
    rows = [
        [r.id, r.command, r.lock, r.verdict, _num(r.decode_tok_s), _num(r.tok_s), r.short or ""] for r in listing.rows
    ]
    shown = (
        f"{listing.total} run(s)" if len(rows) == listing.total else f"the last {len(rows)} of {listing.total} run(s)"
    )
    ui.table(
        f"{shown} in {directory}, oldest first",
        ["run", "command", "lock", "verdict", "decode tok/s", "tok/s", "fingerprint"],
        rows,
        align="llllrrl",
    )
    for lock, values in listing.trends:
        ui.line(trend_line(lock, values, unicode=ui.unicode))


def trend_line(lock: str, values: Sequence[float | None], *, unicode: bool) -> str:
    """``trend standin (decode tok/s, last 5 runs): ▁▃█ ▅  197.31 -> 148.02``"""
    recent = list(values)[-TREND:]
    measured = [v for v in recent if v is not None]
    if not measured:
        return f"trend {lock}: no run with a benchmark of the real weights yet"
    spark = history.sparkline(recent, unicode=unicode)
    arrow = "→" if unicode else "->"
    return f"trend {lock} (decode tok/s, last {len(recent)} run(s)): {spark}  {measured[0]:.2f} {arrow} {measured[-1]:.2f} (min {min(measured):.2f}, max {max(measured):.2f})"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def show_run(run: history.Run, ui: UI) -> None:
    ui.line(f"run {run.label()}")
    ui.line(f"  started {run.started} on {run.host}; {run.doc.get('reason', '')}")
    stages = (run.doc.get("gate") or {}).get("stages") or []
    if stages:
        ui.table(
            "stages",
            ["stage", "status", "seconds", "reason"],
            [[s["name"], s["status"], f"{s['duration_s']:.1f}", s["reason"]] for s in stages],
            align="llrl",
        )
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
    from stackgate.models import knowledge  # its patterns load at import: not for a listing

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
        ui.line(
            f"the stack is the same in what both runs recorded ({', '.join(comparison.sections) or 'nothing'}){prints}"
        )
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
        ui.line(
            f"  (not compared: {', '.join(missing)}: {'a smoke run records only its lock and its server' if smoke else 'not recorded by both runs'})"
        )
    if comparison.statuses:
        ui.line(f"checks whose status changed ({len(comparison.statuses)}):")
        for status in comparison.statuses[:30]:
            ui.line(f"  {status}")


def _html(path: Path, focus: history.Run | None, directory: Path, ui: UI) -> ExitCode:
    from stackgate.render import html

    fallback: list[str] = []

    def warn(text: str) -> None:
        fallback.append(text.removeprefix("warning: "))
        ui.warn(text)

    chosen = catalog.html_runs(directory, focus, warn)
    skipped = [s.reason for s in catalog.listing(directory, 1, lambda text: None).skipped]
    for reason in skipped:
        ui.warn(f"warning: {reason}")
    anchor = focus or (chosen[-1] if chosen else None)
    lock = anchor.lock_name if anchor else None
    if focus is not None and all(r.id != focus.id for r in chosen):
        chosen.append(focus)  # a run named by a path from elsewhere
    title = f"stackgate: run {focus.id}" if focus else f"stackgate: {len(chosen)} run(s) of {lock or 'no lock'}"
    shown = [_redacted(r) for r in chosen]
    centre = next((r for r in shown if anchor is not None and r.id == (focus or anchor).id), None)
    text = html.page(shown, centre, title=title, source=f"runs in {directory}", warnings=[*fallback, *skipped])
    write_text(path, text)
    ui.line(f"wrote {path} ({len(chosen)} run(s){f', focus {focus.id}' if focus else ''})")
    return ExitCode.PASSED
