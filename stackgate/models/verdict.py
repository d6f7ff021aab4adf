"""What a run's results add up to (the verdict), and the versioned JSON report document that
carries them: stable and self-contained, for aggregation across a fleet and for the run history.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import platform
import socket
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from stackgate import __version__
from stackgate.models.exitcodes import ExitCode
from stackgate.models.result import Result, Status

__all__ = ["SCHEMA", "Verdict", "document", "hostname", "judge", "machine"]

#: Where systemd (and D-Bus before it) keep the machine's id.
MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")


def machine(files: Sequence[str] = MACHINE_ID_FILES) -> str | None:
    """This machine's identity in reports: an application-specific hash of its machine id (the id
    itself is not to be published), or None when it has none. Nodes cloned from one image may
    share a hostname ("vm"); their machine ids differ."""
    for name in files:
        try:
            with open(name, "rb") as source:
                text = source.read(64).decode("ascii", "replace").strip()
        except OSError:
            continue
        if text:
            return hashlib.sha256(b"stackgate machine:" + text.encode()).hexdigest()[:16]
    return None


def hostname() -> str:
    r"""This machine's host name as text every report can hold: bytes that are not UTF-8 (the kernel
    takes any) written as ``\xNN`` escapes rather than as lone surrogates, which no UTF-8 file,
    Prometheus label or XML document can carry.

    >>> hostname() == socket.gethostname().encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    True
    """
    return socket.gethostname().encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


SCHEMA = "stackgate.report/1"


@dataclass(frozen=True)
class Verdict:
    """What a set of results adds up to."""

    exit_code: ExitCode
    counts: Mapping[str, int] = field(default_factory=dict)
    reason: str = ""

    @property
    def passed(self) -> bool:
        return self.exit_code == ExitCode.PASSED


def judge(results: Sequence[Result], *, strict: bool = False) -> Verdict:
    """Failures and errors fail; warnings fail only when strict; nothing checked is not a pass."""
    counts = Counter(r.status.name for r in results)
    tally = {s.name: counts.get(s.name, 0) for s in Status}
    bad = tally["FAIL"] + tally["ERROR"]
    if bad:
        return Verdict(ExitCode.FAILED, tally, f"{bad} check(s) failed")
    if strict and tally["WARN"]:
        return Verdict(ExitCode.FAILED, tally, f"{tally['WARN']} warning(s) with --strict")
    if not results or tally["SKIP"] == len(results):
        return Verdict(ExitCode.FAILED, tally, "nothing was checked: every check was skipped")
    return Verdict(ExitCode.PASSED, tally, "passed")


def document(
    command: str,
    results: Sequence[Result],
    verdict: Verdict,
    *,
    spec: Any = None,
    started: float,
    duration_s: float,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON report: versioned, self-contained, stable for aggregation across a fleet."""
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "command": command,
        "tool": {"name": "stackgate", "version": __version__},
        "host": {
            "hostname": hostname(),
            "machine": machine(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "lock": {"name": spec.name, "path": str(spec.path), "sha256": spec.sha256} if spec is not None else None,
        "started": _dt.datetime.fromtimestamp(started, _dt.timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(duration_s, 3),
        "results": [r.to_dict() for r in results],
        "counts": dict(verdict.counts),
        "verdict": "passed" if verdict.passed else "failed",
        "reason": verdict.reason,
        "exit_code": int(verdict.exit_code),
    }
    doc.update(extra or {})
    return doc
