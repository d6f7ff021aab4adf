"""The diagnose flow: scan logs for the knowledge base's signatures, and the JSON report of a scan.

Each input is streamed through a :class:`~stackgate.scan.Scanner` in large blocks, so a log of
hundreds of MB is never held whole; the findings of all inputs come most severe first.
"""

from __future__ import annotations

import gzip
import io
import os
import platform
import time
from collections import Counter
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Sequence

from stackgate import __version__, scan
from stackgate.models import knowledge
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.models.finding import Finding
from stackgate.models.verdict import hostname

if TYPE_CHECKING:  # the spec loads only when --lock asks for it
    from stackgate.models.spec import Spec

__all__ = ["SCHEMA", "STDIN", "Diagnosis", "Input", "diagnose", "document", "opener"]

#: The JSON report's schema (its versions: CHANGELOG.md).
SCHEMA = "stackgate.diagnose/4"
STDIN = "<stdin>"


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
    spec: Spec | None = field(default=None, compare=False)
    unrecognized: tuple[Finding, ...] = ()  #: failures no signature explains (``unrecognized-failure``)

    @property
    def counts(self) -> dict[str, int]:
        """The recognised findings by severity, and the unrecognized failures apart."""
        counted = Counter(f.severity for f in self.findings)
        counts = {severity: counted.get(severity, 0) for severity in reversed(knowledge.SEVERITIES)}
        return {**counts, "unrecognized": len(self.unrecognized)}

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.FAILED if self.counts["fail"] or self.unrecognized else ExitCode.PASSED


def live_kernel_log() -> tuple[str, Callable[[], AbstractContextManager[BinaryIO]]]:
    """This boot's kernel log (dmesg, else journalctl -k) as one more input."""
    from stackgate.edges import kernellog

    try:
        log = kernellog.read()
    except kernellog.KernelLogError as exc:
        raise UsageError(str(exc)) from exc
    data = log.text.encode("utf-8", "replace")
    return f"kernel log ({log.source})", lambda: io.BytesIO(data)


def gpu_indexes() -> dict[str, int]:
    """PCI bus id -> GPU index, from NVML; empty when no driver answers (the events keep their bus ids)."""
    from stackgate.edges import nvml  # loads the NVML bindings: only when an input holds kernel GPU events
    from stackgate.models import kernelevents as kernelmodel

    try:
        snap = nvml.snapshot()
    except nvml.NvmlError:
        return {}
    return {kernelmodel.normalize_bus(g.bus_id): g.index for g in snap.gpus if g.bus_id}


def diagnose(
    inputs: Sequence[tuple[str, Callable[[], Any]]],
    context: dict[str, str] | None = None,
    *,
    spec: Spec | None = None,
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
            raise UsageError(f"{name}: cannot read: {getattr(exc, 'strerror', None) or exc}") from exc
        scanned.append(Input(name, scanner.number, scanner.bytes))
        found = scanner.findings
        if scanner.kernel is not None and scanner.kernel.events:
            gpus = gpu_indexes() if gpus is None else gpus  # NVML is asked once, and only when there are events
            xids = scanner.kernel.xid_lines  # an Xid is read from NVIDIA's catalog: no signature repeats it
            found = [f for f in found if f.evidence.line not in xids] + scanner.kernel.findings(gpus, name)
        findings.extend(found)
        unrecognized.extend(scanner.unrecognized)
    findings.sort(key=knowledge.rank)
    return Diagnosis(tuple(scanned), tuple(findings), started, time.monotonic() - clock, spec, tuple(unrecognized))


def document(done: Diagnosis) -> dict[str, Any]:
    """The JSON report: versioned and self-contained, like verify's."""
    spec = done.spec
    return {
        "schema": SCHEMA,
        "command": "diagnose",
        "tool": {"name": "stackgate", "version": __version__},
        "host": {
            "hostname": hostname(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "lock": {"name": spec.name, "path": str(spec.path), "sha256": spec.sha256} if spec is not None else None,
        "started": datetime.fromtimestamp(done.started, timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(done.duration_s, 3),
        "inputs": [{"name": i.name, "lines": i.lines, "bytes": i.bytes} for i in done.inputs],
        "findings": [f.to_dict() for f in done.findings],
        "unrecognized": [f.to_dict() for f in done.unrecognized],
        "counts": done.counts,
        "verdict": "failed" if done.exit_code else "passed",
        "exit_code": int(done.exit_code),
    }


def opener(path: Path) -> tuple[str, Callable[[], AbstractContextManager[BinaryIO | gzip.GzipFile]]]:
    """Check that ``path`` is a readable file now, so that a bad argument stops before any scan."""
    if not path.exists():
        raise UsageError(f"{path}: no such file")
    if path.is_dir():
        raise UsageError(f"{path}: is a directory, not a log")
    if not os.access(path, os.R_OK):
        raise UsageError(f"{path}: cannot read: permission denied")
    if path.suffix == ".gz":
        return str(path), lambda: gzip.open(path, "rb")
    return str(path), lambda: open(path, "rb")


class borrowed:
    """A stream used as a context manager without closing it (standard input stays open)."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream

    def __enter__(self) -> BinaryIO:
        return self.stream

    def __exit__(self, *exc: object) -> None:
        return None
