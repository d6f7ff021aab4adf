"""One result type: what a check (or a smoke stage, or the gate) found, in an ordered Status.

Every layer that judges returns a :class:`Result`; renderers only read them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from stackgate.models.finding import Fix

__all__ = ["NEEDS_GPU", "NO_DRIVER", "Result", "Status", "error", "failed", "passed", "skipped", "warned"]

#: ``data`` key of gpu.driver's failure when no NVIDIA driver answers at all (its value: NVML's reason).
NO_DRIVER = "no_driver"
#: ``data`` key of a check skipped only because there is no driver: the report folds these into one line.
NEEDS_GPU = "needs_gpu"


class Status(enum.IntEnum):
    """Ordered by severity: the worst status of a run decides its verdict."""

    PASS = 0
    SKIP = 1
    WARN = 2
    FAIL = 3
    ERROR = 4  #: the check itself crashed or timed out

    @property
    def label(self) -> str:
        return self.name


@dataclass(frozen=True)
class Result:
    """The outcome of one check: a one-line summary, details, a fix and machine-readable data."""

    check: str
    status: Status
    summary: str
    details: tuple[str, ...] = ()
    fix: Fix | None = None
    data: Mapping[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0

    @property
    def area(self) -> str:
        return self.check.split(".", 1)[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "status": self.status.name,
            "summary": self.summary,
            "details": list(self.details),
            "fix": self.fix.to_dict() if self.fix else None,
            "data": dict(self.data),
            "duration_s": round(self.duration_s, 4),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Result:
        fix = raw.get("fix")
        return cls(
            check=raw["check"],
            status=Status[raw["status"]],
            summary=raw["summary"],
            details=tuple(raw.get("details", ())),
            fix=Fix.from_dict(fix) if fix else None,
            data=dict(raw.get("data", {})),
            duration_s=float(raw.get("duration_s", 0.0)),
        )


def _result(
    status: Status, summary: str, details: Iterable[str], fix: Fix | None, data: Mapping[str, Any] | None
) -> Result:
    # The runner stamps the check's name; a check only says what it found.
    return Result("", status, summary, tuple(details), fix, dict(data or {}))


def passed(summary: str, details: Iterable[str] = (), data: Mapping[str, Any] | None = None) -> Result:
    return _result(Status.PASS, summary, details, None, data)


def skipped(summary: str, details: Iterable[str] = (), data: Mapping[str, Any] | None = None) -> Result:
    return _result(Status.SKIP, summary, details, None, data)


def warned(
    summary: str, details: Iterable[str] = (), fix: Fix | None = None, data: Mapping[str, Any] | None = None
) -> Result:
    return _result(Status.WARN, summary, details, fix, data)


def failed(
    summary: str, details: Iterable[str] = (), fix: Fix | None = None, data: Mapping[str, Any] | None = None
) -> Result:
    return _result(Status.FAIL, summary, details, fix, data)


def error(summary: str, details: Iterable[str] = (), data: Mapping[str, Any] | None = None) -> Result:
    return _result(Status.ERROR, summary, details, None, data)
