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
from typing import TYPE_CHECKING, TypeVar

from stackgate.edges.files import write_text
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.models.redact import redact
from stackgate.models.spec import SpecError, load_spec
from stackgate.render.runlines import list_runs, show_comparison, show_regressions, show_run
from stackgate.render.ui import UI
from stackgate.runs import catalog, history, index

if TYPE_CHECKING:
    pass

__all__ = ["ReportRequest", "parse_number", "run"]

N = TypeVar("N", int, float)


@dataclass(frozen=True, kw_only=True)
class ReportRequest:
    runs: tuple[str, ...] = ()
    spec_path: Path | None = None
    html_path: Path | None = None
    runs_dir: Path | None = None
    last: int = 20  #: the listing shows this many of the newest runs
    reindex: bool = False
    regressed_since: str | None = None
    threshold_pct: float = 5.0


def run(request: ReportRequest, ui: UI) -> ExitCode:
    _check(request)
    directory = request.runs_dir or _directory(request.spec_path)
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
        raise UsageError(f"{flag}: {text!r} is not a {'whole ' if isinstance(default, int) else ''}number") from None


def _check(request: ReportRequest) -> None:
    if len(request.runs) > 2:
        raise UsageError(f"name at most two runs (A, or A B to compare), not {len(request.runs)}")
    if request.html_path is not None and len(request.runs) > 1:
        raise UsageError("--html takes at most one run (none: the history)")
    if request.last < 1:
        raise UsageError(f"--last: {request.last}: show at least 1 run")
    if not 0 < request.threshold_pct < 100:
        raise UsageError(f"--threshold: {request.threshold_pct:g}: a percentage above 0 and below 100")
    alone = [
        flag
        for flag, given in (("--reindex", request.reindex), ("--regressed-since", request.regressed_since is not None))
        if given
    ]
    if alone and (request.runs or request.html_path is not None or len(alone) > 1):
        raise UsageError(f"{alone[0]} takes no run, no --html{' and no ' + alone[1] if len(alone) > 1 else ''}")


def _reindex(directory: Path, ui: UI) -> ExitCode:
    if not directory.is_dir():
        ui.line(f"no runs kept in {directory} yet: nothing to index")
        return ExitCode.PASSED
    try:
        done = catalog.reindex(directory)
    except index.IndexUnusable as exc:
        raise UsageError(f"cannot rebuild the run index of {directory}: {exc}") from None
    skipped = f", {done.skipped} file(s) skipped (not runs; `stackgate report` names them)" if done.skipped else ""
    ui.line(
        f"indexed {done.runs} run(s) of {directory} in {done.seconds:.1f} s{skipped}: {index.database_path(directory)}"
    )
    return ExitCode.PASSED


def _regressed(directory: Path, request: ReportRequest, ui: UI) -> ExitCode:
    try:
        since = catalog.parse_since(request.regressed_since or "")
    except ValueError as exc:
        raise UsageError(f"--regressed-since: {exc}") from None
    found, nodes = catalog.regressed_since(directory, since, ui.warn, threshold=request.threshold_pct / 100)
    show_regressions(found, nodes, since, request.threshold_pct, ui)
    return ExitCode.PASSED


def _directory(spec_path: Path | None) -> Path:
    """The runs directory of the lock (a default lock that does not load still has a history)."""
    try:
        spec = load_spec(spec_path)
    except SpecError:
        if spec_path is not None:
            raise
        spec = None
    return history.runs_dir(spec, reading=True)


def _redacted(run: history.Run) -> history.Run:
    return dataclasses.replace(run, doc=redact(run.doc))


def _find(ref: str, directory: Path, ui: UI) -> history.Run:
    try:
        return catalog.find(ref, directory, ui.warn)
    except history.HistoryError as exc:
        raise UsageError(str(exc)) from None


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
    spec = anchor.lock_name if anchor else None
    if focus is not None and all(r.id != focus.id for r in chosen):
        chosen.append(focus)  # a run named by a path from elsewhere
    title = f"stackgate: run {focus.id}" if focus else f"stackgate: {len(chosen)} run(s) of {spec or 'no lock'}"
    shown = [_redacted(r) for r in chosen]
    centre = next((r for r in shown if anchor is not None and r.id == (focus or anchor).id), None)
    text = html.page(shown, centre, title=title, source=f"runs in {directory}", warnings=[*fallback, *skipped])
    write_text(path, text)
    ui.line(f"wrote {path} ({len(chosen)} run(s){f', focus {focus.id}' if focus else ''})")
    return ExitCode.PASSED
