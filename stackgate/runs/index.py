"""The index of kept runs: one SQLite database (stdlib ``sqlite3``) beside the run documents.

The JSON documents stay the source of truth; the index holds one row per document (when, where,
which spec, the verdict, the figures a listing and a trend need, the fingerprint, the file's
name, size and modification time) so that a listing, a trend, naming a run or asking which
hosts regressed reads rows, not every document. It lives in ``<runs>/.index/runs.sqlite3`` (a
hidden folder, so the runs directory's own modification time changes only when a document comes
or goes), in WAL mode with a busy timeout: several writers (a gate, a fleet controller) and any
number of readers at once.

The schema is versioned (``PRAGMA user_version``); each version's migration runs once, in order,
in one transaction. A database that a newer stackgate wrote, that is damaged or that stays
locked is :class:`IndexUnusable`: the caller reads the documents instead and says so.

Freshness without reading the folder: the index stores the runs directory's modification time
as it last saw the folder complete. A reader that finds the folder's time different (a document
added or deleted by hand, a writer that crashed or could not reach the index) lists the folder's
names once and reconciles: it reads only the documents it does not know and drops the rows of
those gone. A writer, in the transaction that adds its row, reads the folder's time and then
lists its names (no document is read): when they are exactly the index's, the index is complete
as of that time; when they are not (a document copied in meanwhile, another writer's not entered
yet), it leaves the ``dirty`` marker, which forces the next reader's reconciliation, as does a
writer that could not update the index at all. The same listing removes the hidden temporary
files (``.RUNID.json.XXXXXXXX``) that writes killed mid-way left, once they are older than
:data:`TEMPORARY_AGE_S`.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

__all__ = [
    "DB_NAME",
    "FOLDER",
    "SCHEMA_VERSION",
    "IndexUnusable",
    "Row",
    "Skipped",
    "Store",
    "database_path",
    "folder_mtime",
    "mark_dirty",
    "names",
    "remove",
]

FOLDER = ".index"
DB_NAME = "runs.sqlite3"
DIRTY = "dirty"
#: How long a writer waits for another writer's transaction before giving up (seconds).
BUSY_TIMEOUT_S = 10.0
#: A report's temporary file (edges/files.py: ``.<name>.`` and mkstemp's eight characters) this
#: old was left by a write that was killed: a write takes milliseconds.
TEMPORARY_AGE_S = 600.0
_TEMPORARY = re.compile(r"^\.[^/]+\.json\.[A-Za-z0-9_]{8}$")

#: Each schema version's migration, applied in order to a database whose user_version is lower.
MIGRATIONS: tuple[tuple[int, str], ...] = (
    (
        1,
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE runs (
            file TEXT PRIMARY KEY,          -- the document's name in the runs directory
            id TEXT NOT NULL,               -- its run_id (the name without .json when it has none)
            started TEXT NOT NULL,          -- ISO 8601, as the document says: runs sort by (started, id)
            command TEXT NOT NULL,          -- gate | smoke
            kind TEXT NOT NULL,             -- gate, gate --fast-only, smoke, smoke --fast, smoke --benchmark
            host TEXT NOT NULL,
            lock TEXT NOT NULL,
            verdict TEXT NOT NULL,
            decode_tok_s REAL,              -- the benchmark of the real weights (None: not measured)
            tok_s REAL,
            busbw_gbs REAL,                 -- deep.collective's peak all-reduce bus bandwidth
            tflops REAL,                    -- deep.gpu_work's bf16 TFLOP/s, mean over GPUs
            fingerprint TEXT,               -- the full digest (None: a smoke run or no fingerprint)
            short TEXT,
            mtime_ns INTEGER NOT NULL,
            size INTEGER NOT NULL
        );
        CREATE INDEX runs_order ON runs (started, id);
        CREATE INDEX runs_id ON runs (id);
        CREATE INDEX runs_lock ON runs (lock, started, id);
        CREATE INDEX runs_host ON runs (host, started, id);
        CREATE TABLE skipped (file TEXT PRIMARY KEY, reason TEXT NOT NULL);
        """,
    ),
    (
        2,
        # the node that ran it (a fleet node's name, else its hostname and machine): its rows are
        # read again from their documents, so the folder is listed at the next read
        """
        ALTER TABLE runs ADD COLUMN node TEXT NOT NULL DEFAULT '';
        CREATE INDEX runs_node ON runs (node, started, id);
        DELETE FROM runs;
        DELETE FROM skipped;
        DELETE FROM meta WHERE key = 'folder_mtime_ns';
        """,
    ),
    (
        3,
        # the stack description is a spec everywhere in the code: its column is named so
        """
        ALTER TABLE runs RENAME COLUMN lock TO spec;
        DROP INDEX runs_lock;
        CREATE INDEX runs_spec ON runs (spec, started, id);
        """,
    ),
)
SCHEMA_VERSION = MIGRATIONS[-1][0]


class IndexUnusable(Exception):
    """The index cannot be used now (damaged, locked, newer, unwritable): read the documents."""


@dataclass(frozen=True)
class Row:
    """One run as the index holds it."""

    file: str
    id: str
    started: str
    command: str
    kind: str
    host: str
    node: str  #: who ran it (history.Run.node): the node regressions are judged per
    spec: str
    verdict: str
    decode_tok_s: float | None
    tok_s: float | None
    busbw_gbs: float | None
    tflops: float | None
    fingerprint: str | None
    short: str | None
    mtime_ns: int
    size: int


@dataclass(frozen=True)
class Skipped:
    """A file in the runs directory that is not a readable run, and why (warned about on every listing)."""

    file: str
    reason: str


COLUMNS = tuple(f.name for f in fields(Row))
_SELECT = f"SELECT {', '.join(COLUMNS)} FROM runs"
_NEWEST = "ORDER BY started DESC, id DESC"


def database_path(directory: Path) -> Path:
    return directory / FOLDER / DB_NAME


def folder_mtime(directory: Path) -> int | None:
    try:
        return directory.stat().st_mtime_ns
    except OSError:
        return None


def names(directory: Path) -> Iterator[str]:
    """The names of the folder's documents (a hidden name is a report being written)."""
    try:
        entries = os.scandir(directory)
    except OSError:
        return
    with entries:
        yield from (entry.name for entry in entries if _document(entry))


def _document(entry: os.DirEntry[str]) -> bool:
    return entry.name.endswith(".json") and not entry.name.startswith(".") and entry.is_file()


def _listed(directory: Path) -> tuple[set[str], list[Path]]:
    """The folder's documents, and the temporary files killed writes left there (old enough)."""
    documents: set[str] = set()
    left: list[Path] = []
    oldest = time.time() - TEMPORARY_AGE_S
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            if _document(entry):
                documents.add(entry.name)
            elif _TEMPORARY.match(entry.name) and entry.is_file() and entry.stat().st_mtime < oldest:
                left.append(Path(entry.path))
    return documents, left


def mark_dirty(directory: Path) -> bool:
    """Leave the marker that makes the next reader reconcile; False when even that is impossible."""
    try:
        (directory / FOLDER).mkdir(exist_ok=True)
        (directory / FOLDER / DIRTY).touch()
        return True
    except OSError:
        return False


class Store:
    """An open index of one runs directory (a context manager; closes its connection)."""

    def __init__(self, directory: Path, *, timeout_s: float | None = None) -> None:
        timeout_s = BUSY_TIMEOUT_S if timeout_s is None else timeout_s
        self.directory = directory
        self.path = database_path(directory)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(self.path, timeout=timeout_s, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise IndexUnusable(f"cannot open {self.path}: {exc}") from exc
        try:
            self._prepare()
        except (OSError, sqlite3.Error, IndexUnusable) as exc:
            self.db.close()
            raise exc if isinstance(exc, IndexUnusable) else IndexUnusable(f"{self.path}: {exc}") from exc

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.db.close()

    def _prepare(self) -> None:
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise IndexUnusable(
                f"{self.path} has schema version {version}, newer than this stackgate's {SCHEMA_VERSION}"
            )
        if version < SCHEMA_VERSION:
            self._migrate()
        self.db.execute("SELECT count(*) FROM runs LIMIT 1").fetchone()  # a damaged file says so here

    def _migrate(self) -> None:
        with self.transaction():
            version = self.db.execute("PRAGMA user_version").fetchone()[
                0
            ]  # another process may have migrated meanwhile
            for target, script in MIGRATIONS:
                if target > version:
                    for statement in (s for s in script.split(";") if s.strip()):
                        self.db.execute(statement)
                    self.db.execute(f"PRAGMA user_version = {int(target)}")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (BEGIN IMMEDIATE): writers queue on the busy timeout."""
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise IndexUnusable(f"{self.path}: {exc}") from exc
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        try:
            self.db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise IndexUnusable(f"{self.path}: {exc}") from exc

    # --- writing -------------------------------------------------------------------------------

    def record(self, row: Row) -> None:
        """Add a run just written. Then the folder's time, and after it the folder's names: when
        they are the index's, the index is complete as of that time; else it is marked dirty (the
        next reader reconciles). Temporary files killed writes left are removed."""
        with self.transaction() as db:
            _upsert(db, [row])
            db.execute("DELETE FROM skipped WHERE file = ?", (row.file,))
            seen = folder_mtime(self.directory)  # before the listing: what comes after it changes the time again
            documents, left = _listed(self.directory)
            if seen is not None and documents == self.known():
                self._set_meta("folder_mtime_ns", str(seen))
                complete = True
            else:
                complete = False
        if complete:
            with contextlib.suppress(OSError):
                (self.path.parent / DIRTY).unlink()
        else:
            mark_dirty(self.directory)
        for path in left:
            with contextlib.suppress(OSError):
                path.unlink()

    def reconcile(
        self,
        seen_ns: int | None,
        add: Sequence[Row],
        skip: Sequence[Skipped],
        gone: Iterable[str],
        *,
        complete: bool = False,
    ) -> None:
        """Apply what a listing of the folder found; ``seen_ns`` is the folder's time read before it."""
        with self.transaction() as db:
            if complete:
                db.execute("DELETE FROM runs")
                db.execute("DELETE FROM skipped")
            for file in gone:
                db.execute("DELETE FROM runs WHERE file = ?", (file,))
                db.execute("DELETE FROM skipped WHERE file = ?", (file,))
            _upsert(db, add)
            db.executemany(
                "INSERT OR REPLACE INTO skipped (file, reason) VALUES (?, ?)", [(s.file, s.reason) for s in skip]
            )
            if seen_ns is not None:
                self._set_meta("folder_mtime_ns", str(seen_ns))
        with contextlib.suppress(OSError):
            (self.path.parent / DIRTY).unlink()

    def upsert(self, rows: Sequence[Row]) -> None:
        with self.transaction() as db:
            _upsert(db, rows)

    # --- reading -------------------------------------------------------------------------------

    def fresh(self) -> bool:
        """Whether the index has seen the folder as it is now (no document came or went by hand)."""
        if (self.path.parent / DIRTY).exists():
            return False
        return self._meta("folder_mtime_ns") == str(folder_mtime(self.directory))

    def known(self) -> set[str]:
        """Every file name the index has an entry for (a run or a skipped file)."""
        return {file for (file,) in self.db.execute("SELECT file FROM runs UNION ALL SELECT file FROM skipped")}

    def count(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM runs").fetchone()[0])

    def newest(self, limit: int) -> list[Row]:
        """The newest ``limit`` runs, oldest first."""
        return list(reversed(self._rows(f"{_SELECT} {_NEWEST} LIMIT ?", (limit,))))

    def at(self, position: int) -> Row | None:
        """The run ``position`` places from the newest (1: the newest)."""
        found = self._rows(f"{_SELECT} {_NEWEST} LIMIT 1 OFFSET ?", (position - 1,))
        return found[0] if found else None

    def named(self, ref: str, limit: int = 5) -> list[Row]:
        """Runs whose id is ``ref``, else those whose id starts with it (at most ``limit``)."""
        exact = self._rows(f"{_SELECT} WHERE id = ? ORDER BY started, id LIMIT ?", (ref, limit))
        return exact or self._rows(
            f"{_SELECT} WHERE id >= ? AND id < ? ORDER BY id LIMIT ?", (ref, ref + "\U0010ffff", limit)
        )

    def specs(self) -> list[str]:
        """Every spec with runs, in the order of each one's first run."""
        return [spec for (spec,) in self.db.execute("SELECT spec FROM runs GROUP BY spec ORDER BY min(started), spec")]

    def of_spec(self, spec: str, limit: int) -> list[Row]:
        """The newest ``limit`` runs of a spec, oldest first."""
        return list(reversed(self._rows(f"{_SELECT} WHERE spec = ? {_NEWEST} LIMIT ?", (spec, limit))))

    def nodes_since(self, since: str) -> list[str]:
        return [
            node
            for (node,) in self.db.execute("SELECT DISTINCT node FROM runs WHERE started >= ? ORDER BY node", (since,))
        ]

    def of_node(self, node: str, since: str) -> list[Row]:
        """A node's runs since ``since``, oldest first."""
        return self._rows(f"{_SELECT} WHERE node = ? AND started >= ? ORDER BY started, id", (node, since))

    def before(self, node: str, since: str, *, measured: bool = False) -> Row | None:
        """A node's last run before ``since`` (``measured``: the last one with a decode figure)."""
        extra = " AND decode_tok_s IS NOT NULL" if measured else ""
        found = self._rows(f"{_SELECT} WHERE node = ? AND started < ?{extra} {_NEWEST} LIMIT 1", (node, since))
        return found[0] if found else None

    def skipped(self) -> list[Skipped]:
        return [
            Skipped(file, reason) for file, reason in self.db.execute("SELECT file, reason FROM skipped ORDER BY file")
        ]

    def _rows(self, sql: str, args: Sequence[Any]) -> list[Row]:
        return [Row(*values) for values in self.db.execute(sql, tuple(args))]

    def _meta(self, key: str) -> str | None:
        found = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if found is None else str(found[0])

    def _set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))


def _upsert(db: sqlite3.Connection, rows: Sequence[Row]) -> None:
    marks = ", ".join("?" for _ in COLUMNS)
    db.executemany(
        f"INSERT OR REPLACE INTO runs ({', '.join(COLUMNS)}) VALUES ({marks})",
        [tuple(getattr(r, c) for c in COLUMNS) for r in rows],
    )


def remove(directory: Path) -> None:
    """Delete the index's files (a rebuild starts from nothing, also from a damaged database)."""
    folder = directory / FOLDER
    for name in (DB_NAME, f"{DB_NAME}-wal", f"{DB_NAME}-shm", DIRTY):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(folder / name)
