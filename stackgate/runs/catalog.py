"""The kept runs read through their index: a listing, a trend, a run by name, the HTML page's
runs, and which hosts regressed since a time, in time that does not grow with the history.

Each function reads the index (:mod:`stackgate.runs.index`) after bringing it up to date with
the folder (one stat when nothing came or went by hand), and reads a document only where one is
needed (the runs named, a regression's two runs). When the index cannot be used (damaged,
locked past its timeout, written by a newer stackgate, ``$STACKGATE_HISTORY_INDEX=off``) the
same answer comes from reading every document, without the index, after a warning
(``warn(text)``) that says why. Rows shown from the index are checked against their files (a
document edited or deleted by hand is read again or dropped), so a stale index is repaired, not
believed.
"""

from __future__ import annotations

import datetime as _dt
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from stackgate.models import settings
from stackgate.runs import history, index
from stackgate.runs.index import IndexUnusable, Row, Skipped

if TYPE_CHECKING:
    from stackgate.runs import fingerprint

__all__ = [
    "Listing",
    "Regression",
    "Reindexed",
    "find",
    "html_runs",
    "listing",
    "parse_since",
    "regressed_since",
    "regressions",
    "reindex",
    "sync",
]

#: The trend shows at most this many of a lock's newest runs; the HTML page at most HTML_RUNS.
TREND = 40
HTML_RUNS = 200
#: Documents read per transaction while rebuilding (memory stays flat whatever the history's size).
BATCH = 2000

Warn = Callable[[str], Any]


@dataclass(frozen=True)
class Listing:
    rows: list[Row]  #: the newest runs shown, oldest first
    total: int  #: every run kept
    trends: list[tuple[str, list[float | None]]]  #: per lock (in order of its first run): its newest runs' decode tok/s
    skipped: list[Skipped] = field(default_factory=list)


@dataclass(frozen=True)
class Regression:
    """A run of a node slower than its previous measured run beyond the threshold, or failed after a pass."""

    node: str  #: history.Run.node: a fleet node's name, else the hostname with the machine
    run: Row
    against: Row  #: the node's earlier run it is judged against
    reasons: tuple[str, ...]
    changes: tuple[fingerprint.Change, ...] = ()
    compared: tuple[str, ...] = ()  #: the fingerprint sections both runs recorded (empty: not compared)


@dataclass(frozen=True)
class Reindexed:
    runs: int
    skipped: int
    seconds: float


def _warn_fallback(warn: Warn, directory: Path, exc: Exception) -> None:
    warn(
        f"warning: the run index of {directory} cannot be used ({exc}); "
        "reading every run instead (`stackgate report --reindex` rebuilds it)"
    )


def _indexing() -> bool:
    return bool(settings.HISTORY_INDEX.value())


# --- keeping the index true to the folder ---------------------------------------------------------


def _read_rows(directory: Path, files: Sequence[str]) -> tuple[list[Row], list[Skipped]]:
    rows, skipped = [], []
    for file in files:
        try:
            rows.append(history.row_of(history.read(directory / file)))
        except history.HistoryError as exc:
            skipped.append(Skipped(file, f"skipped {exc}"))
    return rows, skipped


def sync(db: index.Store) -> None:
    """Bring the index up to date with the folder when a document came or went outside it."""
    if db.fresh():
        return
    directory = db.directory
    known = db.known()  # first: a run a writer enters after this is not taken for one deleted
    seen = index.folder_mtime(directory)
    on_disk = set(index.names(directory))
    added = sorted(on_disk - known)
    for start in range(0, max(len(added), 1), BATCH):
        rows, skipped = _read_rows(directory, added[start : start + BATCH])
        last = start + BATCH >= len(added)
        db.reconcile(seen if last else None, rows, skipped, sorted(known - on_disk) if last else ())


def _open(directory: Path) -> index.Store:
    db = index.Store(directory)
    try:
        sync(db)
    except BaseException:
        db.close()
        raise
    return db


def _checked(db: index.Store, rows: Sequence[Row]) -> bool:
    """Whether every row still matches its file; a file gone or changed is dropped or read again."""
    stale = []
    for row in rows:
        try:
            stat = (db.directory / row.file).stat()
            if (stat.st_mtime_ns, stat.st_size) == (row.mtime_ns, row.size):
                continue
        except OSError:
            pass
        stale.append(row.file)
    if not stale:
        return True
    present = [f for f in stale if (db.directory / f).is_file()]
    fresh, skipped = _read_rows(db.directory, present)
    db.reconcile(None, fresh, skipped, [f for f in stale if f not in present])
    return False


def reindex(directory: Path) -> Reindexed:
    """Rebuild the index from the documents (also a damaged database: its files are replaced)."""
    started = time.monotonic()
    index.remove(directory)
    count = skipped_count = 0
    with index.Store(directory) as db:
        seen = index.folder_mtime(directory)  # after the index's own folder was made: that is no document
        batch: list[str] = []
        for name in index.names(directory):
            batch.append(name)
            if len(batch) >= BATCH:
                count, skipped_count = _add(db, batch, count, skipped_count)
                batch = []
        count, skipped_count = _add(db, batch, count, skipped_count)
        db.reconcile(seen, (), (), ())
    return Reindexed(count, skipped_count, time.monotonic() - started)


def _add(db: index.Store, files: Sequence[str], count: int, skipped_count: int) -> tuple[int, int]:
    rows, skipped = _read_rows(db.directory, files)
    db.reconcile(None, rows, skipped, ())
    return count + len(rows), skipped_count + len(skipped)


# --- the listing ------------------------------------------------------------------------------------


def listing(directory: Path, last: int, warn: Warn) -> Listing:
    """The newest ``last`` runs, the count of all, a trend per lock, the files skipped."""
    if _indexing():
        try:
            return _listing_indexed(directory, last)
        except IndexUnusable as exc:
            _warn_fallback(warn, directory, exc)
    return _listing_scanned(directory, last)


def _listing_indexed(directory: Path, last: int) -> Listing:
    if not directory.is_dir():
        return Listing([], 0, [])
    with _open(directory) as db:
        for _ in range(3):  # a row found stale is repaired, and the listing read again
            rows = db.newest(last)
            if _checked(db, rows):
                break
        trends = [(spec, [r.decode_tok_s for r in db.of_spec(spec, TREND)]) for spec in db.specs()]
        return Listing(rows, db.count(), trends, db.skipped())


def _listing_scanned(directory: Path, last: int) -> Listing:
    runs, warnings = history.load(directory)
    rows = [history.row_of(r) for r in runs]
    locks = list(dict.fromkeys(r.spec for r in rows))
    trends = [(spec, [r.decode_tok_s for r in rows if r.spec == spec][-TREND:]) for spec in locks]
    return Listing(rows[-last:] if last else [], len(rows), trends, [Skipped("", w) for w in warnings])


# --- naming runs ------------------------------------------------------------------------------------


def find(ref: str, directory: Path, warn: Warn) -> history.Run:
    """A run by path, id, unique id prefix, or position from the newest (-1, -2 ...); only its
    document is read. :class:`history.HistoryError` says why none is found."""
    if ref.endswith(".json") or os.sep in ref:
        return history.find(ref, [])
    if _indexing():
        try:
            return _find_indexed(ref, directory)
        except IndexUnusable as exc:
            _warn_fallback(warn, directory, exc)
    return history.find(ref, history.load(directory)[0])


def _find_indexed(ref: str, directory: Path) -> history.Run:
    if not directory.is_dir():
        return history.find(ref, [])
    with _open(directory) as db:
        for _ in range(2):
            row = _row_named(db, ref)
            try:
                return history.read(directory / row.file)
            except history.HistoryError:
                if _checked(db, [row]):
                    raise
        return history.read(directory / _row_named(db, ref).file)


def _row_named(db: index.Store, ref: str) -> Row:
    if ref.lstrip("-").isdigit() and ref.startswith("-"):
        row = db.at(-int(ref)) if int(ref) < 0 else None
        if row is None:
            raise history.HistoryError(f"{ref}: there are only {db.count()} run(s)")
        return row
    matches = db.named(ref, limit=5)
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise history.HistoryError(f"no run {ref!r} ({db.count()} run(s) kept; `stackgate report` lists them)")
    return _ambiguous(ref, matches)


def _ambiguous(ref: str, matches: Sequence[Row]) -> Row:
    more = "+" if len(matches) >= 5 else ""
    raise history.HistoryError(f"{ref!r} names {len(matches)}{more} runs: {', '.join(r.id for r in matches[:4])}")


def html_runs(directory: Path, focus: history.Run | None, warn: Warn) -> list[history.Run]:
    """The runs the HTML page shows: the newest :data:`HTML_RUNS` of the focus's lock (else of
    the newest run's lock), oldest first."""
    if _indexing() and directory.is_dir():
        try:
            with _open(directory) as db:
                newest = db.newest(1)
                spec = focus.lock_name if focus else newest[0].spec if newest else None
                rows = db.of_spec(spec, HTML_RUNS) if spec else []
                return [r for r in (_read_or_none(directory / row.file, warn) for row in rows) if r is not None]
        except IndexUnusable as exc:
            _warn_fallback(warn, directory, exc)
    runs = history.load(directory)[0]
    spec = focus.lock_name if focus else runs[-1].lock_name if runs else None
    return [r for r in runs if r.lock_name == spec][-HTML_RUNS:]


def _read_or_none(path: Path, warn: Warn | None = None) -> history.Run | None:
    try:
        return history.read(path)
    except history.HistoryError as exc:
        if warn is not None:
            warn(f"warning: skipped {exc}")
        return None


# --- regressions ------------------------------------------------------------------------------------


def parse_since(text: str) -> str:
    """A date or time (ISO 8601; a date means its midnight UTC) as the runs' ``started`` sort.

    >>> parse_since("2026-11-23"), parse_since("2026-11-23T08:30+01:00")
    ('2026-11-23T00:00:00+00:00', '2026-11-23T07:30:00+00:00')
    """
    try:
        when = _dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a date or time (e.g. 2026-11-23 or 2026-11-23T08:00:00+00:00)") from None
    when = when.replace(tzinfo=_dt.timezone.utc) if when.tzinfo is None else when.astimezone(_dt.timezone.utc)
    return when.isoformat(timespec="seconds")


def regressions(
    node: str, rows: Sequence[Row], before: Row | None, measured: Row | None, threshold: float
) -> list[Regression]:
    """A node's regressions among ``rows`` (its runs since the time asked, oldest first), given
    its last run before them and its last run with a decode figure before them."""
    found = []
    for row in rows:
        reasons, against = [], None
        if (
            row.decode_tok_s is not None
            and measured is not None
            and measured.decode_tok_s
            and row.decode_tok_s < measured.decode_tok_s * (1 - threshold)
        ):
            old, new = measured.decode_tok_s, row.decode_tok_s
            reasons.append(f"decode tok/s {old:.2f} -> {new:.2f} ({new / old - 1:+.1%})")
            against = measured
        if before is not None and before.verdict == "passed" and row.verdict == "failed":
            reasons.append("verdict passed -> failed")
            against = against or before
        if reasons and against is not None:
            found.append(Regression(node, row, against, tuple(reasons)))
        before = row
        measured = row if row.decode_tok_s is not None else measured
    return found


def regressed_since(
    directory: Path, since: str, warn: Warn, *, threshold: float = 0.05
) -> tuple[list[Regression], int]:
    """Every node's regressions since ``since`` (see :func:`parse_since`), each with what changed
    on the node between the two runs; and how many nodes ran since then. A node is who ran the
    run (:attr:`history.Run.node`), not its hostname, which nodes cloned from one image share."""
    found, nodes = [], 0
    for node, rows, before, measured in _by_node(directory, since, warn):
        nodes += 1
        found += regressions(node, rows, before, measured, threshold)
    return [_with_changes(directory, r) for r in found], nodes


def _by_node(directory: Path, since: str, warn: Warn) -> list[tuple[str, list[Row], Row | None, Row | None]]:
    if _indexing():
        try:
            if not directory.is_dir():
                return []
            with _open(directory) as db:
                return [
                    (n, db.of_node(n, since), db.before(n, since), db.before(n, since, measured=True))
                    for n in db.nodes_since(since)
                ]
        except IndexUnusable as exc:
            _warn_fallback(warn, directory, exc)
    rows = [history.row_of(r) for r in history.load(directory)[0]]
    out = []
    for node in sorted({r.node for r in rows if r.started >= since}):
        mine = [r for r in rows if r.node == node]
        earlier = [r for r in mine if r.started < since]
        out.append(
            (
                node,
                [r for r in mine if r.started >= since],
                earlier[-1] if earlier else None,
                next((r for r in reversed(earlier) if r.decode_tok_s is not None), None),
            )
        )
    return out


def _with_changes(directory: Path, found: Regression) -> Regression:
    """What changed on the host between the two runs: nothing when their fingerprints are equal,
    else both documents compared component by component (as `report A B` does)."""
    if found.run.fingerprint and found.run.fingerprint == found.against.fingerprint:
        return found
    old, new = _read_or_none(directory / found.against.file), _read_or_none(directory / found.run.file)
    if old is None or new is None:
        return found
    from stackgate.runs import (
        rundiff,
    )  # the comparison's machinery (the facts' model) only where a regression is explained

    comparison = rundiff.compare(old, new)
    return Regression(found.node, found.run, found.against, found.reasons, comparison.changes, comparison.sections)
