"""The history of runs: every gate and smoke run's JSON document, kept in a runs directory.

Where: ``$STACKGATE_HISTORY_DIR`` when set; else ``<python.root>/runs`` when the lock has a root
that holds a stack (provision made its ``generations`` or ``current``, or runs are kept there
already) and this user may write to; else the user's state directory
(``$XDG_STATE_HOME/stackgate/runs``, by default ``~/.local/state/stackgate/runs``). A root that
does not hold a stack is not used just to keep a report in it: a refused provision leaves only
its lock file there.

Each run is one file, ``<UTC time>-<command>-<random>.json`` (the name without ``.json`` is the
run's id, also written into the document as ``run_id``), written atomically, and entered in the
directory's index (:mod:`stackgate.runs.index`; :mod:`stackgate.runs.catalog` reads through it).
A run whose index entry cannot be written is still kept: the document is the source of truth,
and the next reader finds it. Reading the directory never fails on what is in it: a file that
is not JSON, or JSON that is not a stackgate gate or smoke report, or one whose fields are not
what a run holds (:mod:`stackgate.models.rundoc`: a string where a number belongs, ``1e999``), is
skipped with a warning saying why; such a document is not kept either.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from stackgate.edges.files import write_json
from stackgate.models import rundoc, settings
from stackgate.models.finding import Evidence, Finding, FindingError, Fix, severity
from stackgate.models.spec import Spec
from stackgate.models.verdict import SCHEMA as REPORT_SCHEMA
from stackgate.runs import index

__all__ = [
    "COMMANDS",
    "HistoryError",
    "Run",
    "find",
    "keep",
    "load",
    "new_id",
    "read",
    "row_of",
    "runs_dir",
    "sparkline",
    "store",
]

#: The commands whose runs are kept, and read back.
COMMANDS = ("gate", "smoke")
#: What every kept run has (the rest of it is checked where it is there: models/rundoc.py).
REQUIRED = ("results", "verdict", "started")
BARS = "▁▂▃▄▅▆▇█"
ASCII_BARS = "_.-:=+*#"


class HistoryError(Exception):
    """A run that cannot be stored, read or found."""


def runs_dir(spec: Spec | None, environ: Mapping[str, str] | None = None, *, reading: bool = False) -> Path:
    """Where runs of this lock are kept (see the module's docstring for the order). A reader
    takes ``<root>/runs`` whenever it exists, even where it may not write."""
    environ = os.environ if environ is None else environ
    named = settings.HISTORY_DIR.value(environ)
    if named is not None:
        return named
    root = spec.python.root if spec is not None else None
    if root is not None and reading and (root / "runs").is_dir():
        return root / "runs"
    if root is not None and _holds_a_stack(root) and os.access(root, os.W_OK | os.X_OK):
        return root / "runs"
    return settings.state_home(environ) / "runs"


def _holds_a_stack(root: Path) -> bool:
    return (root / "generations").is_dir() or (root / "current").is_symlink() or (root / "runs").is_dir()


def new_id(command: str, started: float) -> str:
    """``20250101T120000Z-gate-3f9a1c``: sorts by time; the random tail keeps two runs of one second apart."""
    stamp = _dt.datetime.fromtimestamp(started, _dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{command}-{secrets.token_hex(3)}"


def store(doc: Mapping[str, Any], directory: Path, warn: Callable[[str], Any] | None = None) -> Path:
    """Write a run's document as ``<run_id>.json`` in ``directory`` (atomically) and enter it in
    the directory's index; an index that cannot take it is a warning (``warn(text)``), never a
    lost run (the next reader reconciles)."""
    run_id = doc.get("run_id")
    if not isinstance(run_id, str) or not run_id:
        raise HistoryError("the document has no run_id")
    damaged = rundoc.problems(doc, REQUIRED)
    if damaged:
        raise HistoryError(f"the document of run {run_id} is damaged: {'; '.join(damaged)}")
    path = directory / f"{run_id}.json"
    try:
        write_json(path, doc)
    except OSError as exc:
        raise HistoryError(f"cannot keep the run in {directory}: {exc.strerror or exc}") from exc
    problem = enter(path) if settings.HISTORY_INDEX.value() else None
    if problem and warn is not None:
        warn(
            f"stackgate: the run was kept in {path} but not entered in the run index ({problem}); "
            "the next `stackgate report` finds it"
        )
    return path


def enter(path: Path) -> str | None:
    """Enter a run just written in its directory's index; the reason when it could not be."""
    directory = path.parent
    try:
        row = row_of(read(path))
        with index.Store(directory) as db:
            db.record(row)
        return None
    except (HistoryError, index.IndexUnusable) as exc:
        index.mark_dirty(directory)
        return str(exc)


def keep(doc: Mapping[str, Any], spec: Spec | None, warn: Any) -> Path | None:
    """Store a run in its lock's runs directory; a failure is a warning (``warn(text)``), never
    the run's failure."""
    try:
        return store(doc, runs_dir(spec), warn)
    except HistoryError as exc:
        warn(f"stackgate: the run was not kept in the history: {exc}")
        return None


@dataclass(frozen=True)
class Run:
    """A stored run, read back: what listing, comparing and the HTML page need of it."""

    id: str
    path: Path
    doc: Mapping[str, Any]

    @property
    def command(self) -> str:
        return str(self.doc["command"])

    @property
    def started(self) -> str:
        return str(self.doc.get("started", ""))

    @property
    def verdict(self) -> str:
        if _at(self.doc, "gate", "interrupted") is True or _at(self.doc, "smoke", "interrupted") is True:
            return "interrupted"
        return "usage error" if self.doc.get("exit_code") == 2 else str(self.doc.get("verdict", "?"))

    @property
    def lock_name(self) -> str:
        return str(_at(self.doc, "lock", "name") or "?")

    @property
    def host(self) -> str:
        return str(_at(self.doc, "host", "hostname") or "?")

    @property
    def node(self) -> str:
        """The node that ran it: its fleet name when a fleet controller kept it, else its hostname
        with its machine (``vm (machine 1f0e...)``): nodes cloned from one image share a hostname."""
        fleet = _at(self.doc, "fleet", "node")
        if isinstance(fleet, str) and fleet:
            return fleet
        machine = _at(self.doc, "host", "machine")
        return f"{self.host} (machine {machine})" if isinstance(machine, str) and machine else self.host

    @property
    def benchmark(self) -> Mapping[str, Any] | None:
        """The benchmark of the real weights (a fast-mode figure is not the stack's speed)."""
        if self.command == "gate":
            found = _at(self.doc, "gate", "benchmark")
            return found if isinstance(found, Mapping) else None
        sessions = _at(self.doc, "smoke", "sessions")
        if not isinstance(sessions, list) or not sessions or not isinstance(sessions[-1], Mapping):
            return None
        last = sessions[-1]
        found = last.get("benchmark")
        return found if isinstance(found, Mapping) and not last.get("fast_mode") else None

    def figure(self, name: str = "decode_tok_s") -> float | None:
        """The mean of a benchmark figure (``decode_tok_s``, ``tok_s``), if this run measured one."""
        value = _at(self.benchmark, name, "mean")
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    @property
    def decode_tok_s(self) -> float | None:
        return self.figure("decode_tok_s")

    @property
    def fingerprint(self) -> Mapping[str, Any] | None:
        found = _at(self.doc, "gate", "fingerprint")
        return found if isinstance(found, Mapping) and isinstance(found.get("components"), Mapping) else None

    @property
    def results(self) -> list[Mapping[str, Any]]:
        return [r for r in self.doc.get("results", ()) if isinstance(r, Mapping)]

    def findings(self) -> tuple[list[Finding], list[str]]:
        """The known failures the run's server logs showed, session by session, and why each
        one that cannot be read was left out."""
        found = _findings(self)
        return [f for f in found if isinstance(f, Finding)], [str(f) for f in found if isinstance(f, FindingError)]

    def label(self) -> str:
        tok = f", decode {self.decode_tok_s:.2f} tok/s" if self.decode_tok_s is not None else ""
        return f"{self.id} ({self.command} of {self.lock_name}, {self.verdict}{tok})"

    @property
    def kind(self) -> str:
        """``gate``, ``gate --fast-only``, ``smoke``, ``smoke --fast`` or ``smoke --benchmark``."""
        if self.command == "gate":
            return "gate --fast-only" if _at(self.doc, "gate", "request", "fast_only") is True else "gate"
        sessions = _at(self.doc, "smoke", "sessions")
        last = sessions[-1] if isinstance(sessions, list) and sessions and isinstance(sessions[-1], Mapping) else {}
        if last.get("fast_mode"):
            return "smoke --fast"
        return "smoke --benchmark" if self.benchmark is not None else "smoke"

    def result_data(self, check: str) -> Mapping[str, Any]:
        """The ``data`` of the run's result of ``check`` (empty when it has none)."""
        found = next((r.get("data") for r in self.results if r.get("check") == check), None)
        return found if isinstance(found, Mapping) else {}

    @property
    def busbw_gbs(self) -> float | None:
        """deep.collective's peak all-reduce bus bandwidth (GB/s)."""
        return _number(self.result_data("deep.collective").get("peak_busbw_gbs"))

    @property
    def tflops(self) -> float | None:
        """deep.gpu_work's bf16 TFLOP/s, the mean over the GPUs that measured it."""
        gpus = self.result_data("deep.gpu_work").get("gpus")
        rates = [_number(_at(g, "bfloat16", "tflops")) for g in (gpus if isinstance(gpus, list) else ())]
        measured = [r for r in rates if r is not None]
        return sum(measured) / len(measured) if measured else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def row_of(run: Run) -> index.Row:
    """The run as its directory's index holds it."""
    try:
        stat = run.path.stat()
        mtime_ns, size = stat.st_mtime_ns, stat.st_size
    except OSError:
        mtime_ns, size = 0, 0
    finger = run.fingerprint or {}
    digest, short = finger.get("digest"), finger.get("short")
    return index.Row(
        run.path.name,
        run.id,
        run.started,
        run.command,
        run.kind,
        run.host,
        run.node,
        run.lock_name,
        run.verdict,
        run.decode_tok_s,
        run.figure("tok_s"),
        run.busbw_gbs,
        run.tflops,
        str(digest) if digest else None,
        str(short) if short else None,
        mtime_ns,
        size,
    )


def _smoke_parts(run: Run) -> list[Mapping[str, Any]]:
    """The run's smoke documents: its own (a smoke run), or each smoke stage's (a gate run)."""
    if run.command == "smoke":
        parts = [_at(run.doc, "smoke")]
    else:
        stages = _at(run.doc, "gate", "smoke")
        parts = list(stages.values()) if isinstance(stages, Mapping) else []
    return [p for p in parts if isinstance(p, Mapping)]


def _findings(run: Run) -> list[Finding | FindingError]:
    found: list[Finding | FindingError] = []
    for part in _smoke_parts(run):
        sessions = part.get("sessions")
        for session in sessions if isinstance(sessions, list) else ():
            entries = session.get("findings") if isinstance(session, Mapping) else None
            for raw in entries if isinstance(entries, list) else ():
                found.append(_finding(raw, part.get("schema"), session.get("log_path")))
    return found


def _finding(raw: Any, schema: Any, log_path: Any) -> Finding | FindingError:
    try:
        if not isinstance(raw, Mapping):
            raise FindingError(f"not an object: {type(raw).__name__}")
        return _smoke_1_finding(raw, log_path) if schema == "stackgate.smoke/1" else Finding.from_dict(raw)
    except FindingError as exc:
        return exc


def _smoke_1_finding(raw: Mapping[str, Any], log_path: Any) -> Finding:
    """A finding as smoke wrote it before findings had one form (``stackgate.smoke/1``): flat, the
    fix a sentence beside its ``commands``, ``source`` for where it was learned, the matched text
    for its lines; the component, which it did not record, from the knowledge base."""
    from stackgate.models import (
        knowledge,
    )  # the knowledge base loads its patterns: only for a run kept in this old shape

    try:
        signature = next((s for s in knowledge.load() if s.id == raw["id"]), None)
        evidence = Evidence(
            str(log_path or ""),
            int(raw["line"]),
            tuple(str(raw.get("text", "")).splitlines()),
            0,
            int(raw.get("count", 1)),
        )
        return Finding(
            id=str(raw["id"]),
            title=str(raw["title"]),
            severity=severity(str(raw["severity"])),
            component=signature.component if signature else "unknown",
            cause=str(raw["cause"]),
            fix=Fix(str(raw["fix"]), tuple(str(c) for c in raw.get("commands", ()))),
            learned_from=str(raw.get("source", "")),
            evidence=evidence,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise FindingError(f"a stackgate.smoke/1 finding without {exc}") from exc


def _at(value: Any, *keys: str) -> Any:
    """``value[k1][k2]...``, or None wherever a level is missing or not a mapping."""
    for key in keys:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def read(path: Path) -> Run:
    """One stored run; :class:`HistoryError` says why a file is damaged or not a run."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise HistoryError(f"{path}: unreadable ({exc})") from exc
    except ValueError as exc:
        raise HistoryError(f"{path}: damaged: not JSON ({exc})") from exc
    except RecursionError:
        raise HistoryError(f"{path}: damaged: nested too deeply") from None
    if not isinstance(doc, dict):
        raise HistoryError(f"{path}: not a stackgate run: a JSON {type(doc).__name__}, not an object")
    if doc.get("schema") != REPORT_SCHEMA or doc.get("command") not in COMMANDS:
        raise HistoryError(
            f"{path}: not a stackgate run (schema {doc.get('schema')!r}, command {doc.get('command')!r})"
        )
    problems = rundoc.problems(doc, REQUIRED)
    if problems:
        raise HistoryError(f"{path}: damaged: {'; '.join(problems)}")
    run_id = doc.get("run_id")
    return Run(run_id if isinstance(run_id, str) else path.stem, path, doc)


def load(directory: Path) -> tuple[list[Run], list[str]]:
    """Every run in ``directory``, oldest first, and a warning for each file skipped."""
    if not directory.is_dir():
        return [], []
    runs, warnings = [], []
    for path in sorted(directory.glob("*.json")):
        if path.name.startswith(".") or not path.is_file():
            continue  # a report being written (atomic writes use hidden temporary names)
        try:
            runs.append(read(path))
        except HistoryError as exc:
            warnings.append(f"skipped {exc}")
    runs.sort(key=lambda r: (r.started, r.id))
    return runs, warnings


def find(ref: str, runs: Sequence[Run]) -> Run:
    """A run by path, id, unique id prefix, or position from the newest (-1, -2 ...)."""
    path = Path(ref)
    if ref.endswith(".json") or os.sep in ref:
        if not path.is_file():
            raise HistoryError(f"no run file {ref}")
        return read(path)
    if ref.lstrip("-").isdigit() and ref.startswith("-"):
        if int(ref) < -len(runs):
            raise HistoryError(f"{ref}: there are only {len(runs)} run(s)")
        return runs[int(ref)]
    exact = [r for r in runs if r.id == ref]
    matches = exact or [r for r in runs if r.id.startswith(ref)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise HistoryError(f"no run {ref!r} ({len(runs)} run(s) kept; `stackgate report` lists them)")
    raise HistoryError(f"{ref!r} names {len(matches)} runs: {', '.join(r.id for r in matches[:4])}")


def sparkline(values: Iterable[float | None], *, unicode: bool = True) -> str:
    """A bar per value, scaled between the smallest and the largest; a gap for a run without one.

    >>> sparkline([1.0, 2.0, None, 3.0]), sparkline([1.0, 2.0, None, 3.0], unicode=False)
    ('▁▅ █', '_= #')
    """
    bars = BARS if unicode else ASCII_BARS
    values = list(values)
    present = [v for v in values if v is not None]
    if not present:
        return ""
    low, high = min(present), max(present)
    span = high - low
    out = []
    for value in values:
        if value is None:
            out.append(" ")
        else:
            level = round((value - low) / span * (len(bars) - 1)) if span else len(bars) // 2
            out.append(bars[level])
    return "".join(out)
