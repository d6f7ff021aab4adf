"""`stackgate diagnose`: explain logs of this stack (server logs, installer output, tracebacks).

Each input is streamed through a :class:`~stackgate.scan.Scanner` in large blocks, so a
log of hundreds of MB is never held whole; the findings of all inputs are reported most severe
first, with the lines that matched, the cause and the fix. With a lock, causes and fixes quote
the stack's own values (its attention backend, its torch build). Exit 1 when a finding is an
error, 0 otherwise, 2 when an input cannot be read.
"""

from __future__ import annotations

import gzip
import io
import os
import platform
import socket
import sys
import time
from collections import Counter
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Sequence

from stackgate import __version__, scan
from stackgate.edges.files import unwritable, write_json
from stackgate.models import knowledge, settings
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.models.finding import Finding

if TYPE_CHECKING:  # the lock model and the kernel log's readers load only when --lock or --kernel asks for them
    from stackgate.models.spec import Spec

__all__ = [
    "SCHEMA",
    "DiagnoseUsageError",
    "DiagnoseRequest",
    "Diagnosis",
    "Input",
    "diagnose",
    "document",
    "inputs_summary",
    "run",
    "verdict_line",
]

#: /2: each finding in its one form (models.finding): ``evidence`` holds the input, line numbers,
#: lines and count that /1 had at the top level. /3: ``unrecognized`` (failures no signature
#: explains, id ``unrecognized-failure``) apart from ``findings``; ``counts.unrecognized``.
SCHEMA = "stackgate.diagnose/3"
STDIN = "<stdin>"


class DiagnoseUsageError(UsageError):
    """Bad usage or an input that cannot be read: nothing was diagnosed."""


@dataclass(frozen=True, kw_only=True)
class DiagnoseRequest:
    paths: tuple[Path, ...] = ()
    stdin: bool = False
    json_path: Path | None = None
    lock_path: Path | None = None
    kernel: bool = False  #: read this boot's kernel log too
    kernel_path: Path | None = None  #: a saved kernel log to read instead of the live one
    bundle_path: Path | None = None  #: write a support bundle here


@dataclass(frozen=True)
class Input:
    """One log that was read: its name, and how much of it."""

    name: str
    lines: int
    bytes: int


@dataclass(frozen=True)
class Diagnosis:
    """What diagnose found in its inputs, most severe first."""

    inputs: tuple[Input, ...]
    findings: tuple[Finding, ...]  #: recognised: a signature explains each
    started: float
    duration_s: float
    lock: Spec | None = field(default=None, compare=False)
    unrecognized: tuple[Finding, ...] = ()  #: failures no signature explains (``unrecognized-failure``)

    @property
    def counts(self) -> dict[str, int]:
        """The recognised findings by severity, and the unrecognized failures apart."""
        counted = Counter(f.severity for f in self.findings)
        counts = {severity: counted.get(severity, 0) for severity in reversed(knowledge.SEVERITIES)}
        return {**counts, "unrecognized": len(self.unrecognized)}

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.FAILED if self.counts["error"] or self.unrecognized else ExitCode.PASSED


def run(request: DiagnoseRequest, ui: Any, stdin: BinaryIO | None = None) -> ExitCode:
    """The diagnose command: check the inputs, scan them, render, write the JSON report."""
    ui.settings(settings.report(flags={settings.LOCK: ("--lock", request.lock_path)}))
    kernel = request.kernel or request.kernel_path is not None
    if not request.paths and not request.stdin and not kernel and not request.bundle_path:
        raise DiagnoseUsageError("nothing to diagnose: give one or more log files, --stdin, --kernel or --bundle PATH")
    saved_kernel = (request.kernel_path,) if request.kernel_path is not None else ()  # --kernel-log: one more input
    openers = [_opener(path) for path in (*request.paths, *saved_kernel)]  # every file is checked before any is read
    if request.bundle_path is not None and request.bundle_path.is_dir():
        raise DiagnoseUsageError(f"--bundle: {request.bundle_path} is a directory; name the .tar.gz to write")
    problem = unwritable({"--json": request.json_path} if request.json_path else {})
    if problem is not None:
        raise DiagnoseUsageError(problem)
    if request.stdin:
        openers.append((STDIN, lambda: _borrowed(stdin or sys.stdin.buffer)))
    lock = _load_lock(request.lock_path) if request.lock_path else None
    context = knowledge.lock_context(lock) if lock else {}
    if request.kernel and request.kernel_path is None:  # a saved kernel log stands for the live one, as before
        openers.append(live_kernel_log())
    with ui.progress(f"scanning {len(openers)} input(s) for {len(knowledge.load())} known failures"):
        done = diagnose(openers, context, lock=lock, never_silent=True, kernel=True)
    ui.findings(
        f"stackgate diagnose: {inputs_summary(done)}", done.findings, verdict_line(done), unrecognized=done.unrecognized
    )
    if request.json_path:
        write_json(request.json_path, document(done))
    if request.bundle_path is not None:
        from stackgate.runs import bundle  # gathers facts: loaded only when a bundle is asked for

        with ui.progress(f"writing the support bundle {request.bundle_path}"):
            try:
                made = bundle.write(request.bundle_path, lock=lock, diagnose_report=document(done))
            except bundle.BundleError as exc:
                raise DiagnoseUsageError(str(exc)) from exc
        ui.line(
            f"support bundle: {request.bundle_path} ({len(made.members) + 1} files, secrets redacted; {len(made.notes)} part(s) missing, see NOTES.txt)"
        )
    return done.exit_code


def _load_lock(path: Path) -> Spec:
    from stackgate.models.spec import load_spec

    return load_spec(path)


def live_kernel_log() -> tuple[str, Callable[[], AbstractContextManager[BinaryIO]]]:
    """This boot's kernel log (dmesg, else journalctl -k) as one more input."""
    from stackgate.edges import kernellog

    try:
        log = kernellog.read()
    except kernellog.KernelLogError as exc:
        raise DiagnoseUsageError(str(exc)) from exc
    data = log.text.encode("utf-8", "replace")
    return f"kernel log ({log.source})", lambda: io.BytesIO(data)


def gpu_indexes() -> dict[str, int]:
    """PCI bus id -> GPU index, from NVML; empty when no driver answers (the events keep their bus ids)."""
    from stackgate.edges import nvml  # loads the NVML bindings: only when an input holds kernel GPU events
    from stackgate.models import kernellog as kernelmodel

    try:
        snap = nvml.snapshot()
    except nvml.NvmlError:
        return {}
    return {kernelmodel.normalize_bus(g.bus_id): g.index for g in snap.gpus if g.bus_id}


def diagnose(
    inputs: Sequence[tuple[str, Callable[[], Any]]],
    context: dict[str, str] | None = None,
    *,
    lock: Spec | None = None,
    stage: str | None = None,
    never_silent: bool = False,
    kernel: bool = False,
) -> Diagnosis:
    """Scan each ``(name, open)`` input (``open()`` gives a binary stream) and gather the findings
    (of the signatures of ``stage`` only, when given: provision reads installer logs so); with
    ``never_silent``, failures no signature explains as well (``unrecognized-failure``); with
    ``kernel``, the kernel's GPU lines in any input (Xid, NVRM, AER), their GPUs named by NVML."""
    started, clock = time.time(), time.monotonic()
    scanned, findings, unrecognized, gpus = [], [], [], None
    for name, opener in inputs:
        scanner = scan.Scanner(stage=stage, context=context, source=name, never_silent=never_silent, kernel=kernel)
        try:
            with opener() as stream:
                scanner.scan_stream(stream)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            raise DiagnoseUsageError(f"{name}: cannot read: {getattr(exc, 'strerror', None) or exc}") from exc
        scanned.append(Input(name, scanner.number, scanner.bytes))
        found = scanner.findings
        if scanner.kernel is not None and scanner.kernel.events:
            gpus = gpu_indexes() if gpus is None else gpus  # NVML is asked once, and only when there are events
            xids = scanner.kernel.xid_lines  # an Xid is read from NVIDIA's catalog: no signature repeats it
            found = [f for f in found if f.evidence.line not in xids] + scanner.kernel.findings(gpus, name)
        findings.extend(found)
        unrecognized.extend(scanner.unrecognized)
    findings.sort(key=knowledge.rank)
    return Diagnosis(tuple(scanned), tuple(findings), started, time.monotonic() - clock, lock, tuple(unrecognized))


def document(done: Diagnosis) -> dict[str, Any]:
    """The JSON report: versioned and self-contained, like verify's."""
    lock = done.lock
    return {
        "schema": SCHEMA,
        "command": "diagnose",
        "tool": {"name": "stackgate", "version": __version__},
        "host": {
            "hostname": socket.gethostname(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "lock": {"name": lock.name, "path": str(lock.path), "sha256": lock.sha256} if lock is not None else None,
        "started": datetime.fromtimestamp(done.started, timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(done.duration_s, 3),
        "inputs": [{"name": i.name, "lines": i.lines, "bytes": i.bytes} for i in done.inputs],
        "findings": [f.to_dict() for f in done.findings],
        "unrecognized": [f.to_dict() for f in done.unrecognized],
        "counts": done.counts,
        "verdict": "failed" if done.exit_code else "passed",
        "exit_code": int(done.exit_code),
    }


def _opener(path: Path) -> tuple[str, Callable[[], AbstractContextManager[BinaryIO | gzip.GzipFile]]]:
    """Check that ``path`` is a readable file now, so that a bad argument stops before any scan."""
    if not path.exists():
        raise DiagnoseUsageError(f"{path}: no such file")
    if path.is_dir():
        raise DiagnoseUsageError(f"{path}: is a directory, not a log")
    if not os.access(path, os.R_OK):
        raise DiagnoseUsageError(f"{path}: cannot read: permission denied")
    if path.suffix == ".gz":
        return str(path), lambda: gzip.open(path, "rb")
    return str(path), lambda: open(path, "rb")


class _borrowed:
    """A stream used as a context manager without closing it (standard input stays open)."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream

    def __enter__(self) -> BinaryIO:
        return self.stream

    def __exit__(self, *exc: object) -> None:
        return None


def verdict_line(done: Diagnosis) -> str:
    """``3 findings (2 errors, 1 warning) in 0.41 s: FAILED``; a run with no error passes."""
    counts = {k: v for k, v in done.counts.items() if k != "unrecognized"}
    apart = f"; {len(done.unrecognized)} unrecognized failure(s)" if done.unrecognized else ""
    if not done.findings and not done.unrecognized:
        return f"no known failure found in {done.duration_s:.2f} s: passed"
    parts = (
        ", ".join(f"{n} {word}{'s' if n != 1 and word != 'info' else ''}" for word, n in counts.items() if n)
        or "none recognised"
    )
    word = "FAILED" if done.exit_code else "passed (no error-level finding)"
    return f"{len(done.findings)} finding(s) ({parts}){apart} in {done.duration_s:.2f} s: {word}"


def inputs_summary(done: Diagnosis) -> str:
    """``2 inputs, 1,204 lines, 3.1 MB``; ``1 input, 1 line, 27 B``."""
    lines = sum(i.lines for i in done.inputs)
    size = sum(i.bytes for i in done.inputs)
    return f"{_count(len(done.inputs), 'input')}, {_count(lines, 'line')}, {_size(size)}"


def _count(n: int, noun: str) -> str:
    """
    >>> _count(1, "line"), _count(1204, "line")
    ('1 line', '1,204 lines')
    """
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _size(n: float) -> str:
    if n < 1000:
        return f"{n:.0f} B"
    for unit in ("kB", "MB", "GB"):
        n /= 1000
        if n < 1000 or unit == "GB":
            break
    return f"{n:.1f} {unit}"
