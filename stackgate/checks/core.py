"""The check framework: one result type, a registry of named checks, a parallel runner.

A check is a small pure function ``(lock, facts) -> Result`` registered under a stable dotted
name. The runner runs the selected checks in parallel with a timeout each; a check that raises
becomes an ERROR result with the exception's text, never a crashed report. KeyboardInterrupt
always propagates.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import enum
import fnmatch
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

if TYPE_CHECKING:
    from stackgate.checks.facts import Facts
    from stackgate.stack.lock import Lock

__all__ = [
    "REGISTRY",
    "Check",
    "CheckError",
    "Fix",
    "Result",
    "Status",
    "check",
    "error",
    "failed",
    "passed",
    "run_checks",
    "select",
    "skipped",
    "warned",
]


class CheckError(Exception):
    """A selection of checks that names nothing, or a registry misuse."""


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
class Fix:
    """What to do about a finding: a sentence and the commands to paste."""

    text: str
    commands: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "commands": list(self.commands)}


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
            fix=Fix(fix["text"], tuple(fix.get("commands", ()))) if fix else None,
            data=dict(raw.get("data", {})),
            duration_s=float(raw.get("duration_s", 0.0)),
        )


def _result(status: Status, summary: str, details: Iterable[str], fix: Fix | None, data: Mapping[str, Any] | None) -> Result:
    # The runner stamps the check's name; a check only says what it found.
    return Result("", status, summary, tuple(details), fix, dict(data or {}))


def passed(summary: str, details: Iterable[str] = (), data: Mapping[str, Any] | None = None) -> Result:
    return _result(Status.PASS, summary, details, None, data)


def skipped(summary: str, details: Iterable[str] = (), data: Mapping[str, Any] | None = None) -> Result:
    return _result(Status.SKIP, summary, details, None, data)


def warned(summary: str, details: Iterable[str] = (), fix: Fix | None = None, data: Mapping[str, Any] | None = None) -> Result:
    return _result(Status.WARN, summary, details, fix, data)


def failed(summary: str, details: Iterable[str] = (), fix: Fix | None = None, data: Mapping[str, Any] | None = None) -> Result:
    return _result(Status.FAIL, summary, details, fix, data)


def error(summary: str, details: Iterable[str] = (), data: Mapping[str, Any] | None = None) -> Result:
    return _result(Status.ERROR, summary, details, None, data)


CheckFunction = Callable[["Lock", "Facts"], Result]


@dataclass(frozen=True)
class Check:
    """A registered check: its stable name, what it looks at, and the facts it needs."""

    name: str
    function: CheckFunction
    title: str
    needs: tuple[str, ...]
    timeout_s: float
    slow: bool

    @property
    def area(self) -> str:
        return self.name.split(".", 1)[0]


#: Every check, by name, in registration order (the order reports list them).
REGISTRY: dict[str, Check] = {}


def check(name: str, *, needs: Sequence[str] = (), timeout_s: float = 30.0, slow: bool = False) -> Callable[[CheckFunction], CheckFunction]:
    """Register a check under a stable dotted name; its docstring's first line is its title."""

    def register(function: CheckFunction) -> CheckFunction:
        if name in REGISTRY:
            raise CheckError(f"check {name!r} is registered twice")
        title = (function.__doc__ or name).strip().splitlines()[0]
        REGISTRY[name] = Check(name, function, title, tuple(needs), timeout_s, slow)
        return function

    return register


def select(patterns: Sequence[str] = (), registry: Mapping[str, Check] | None = None, *, include_slow: bool = True) -> list[Check]:
    """The checks whose names match any pattern (exact name or glob); all of them by default.

    A pattern that matches nothing is an error: a typo must not turn into a green run.
    """
    registry = REGISTRY if registry is None else registry
    checks = [c for c in registry.values() if include_slow or not c.slow]
    if not patterns:
        return checks
    chosen: list[Check] = []
    for pattern in patterns:
        hits = [c for c in checks if c.name == pattern or fnmatch.fnmatchcase(c.name, pattern) or c.name.startswith(pattern + ".")]
        if not hits:
            raise CheckError(f"no check matches {pattern!r}; `invoke verify --list` lists them")
        chosen.extend(c for c in hits if c not in chosen)
    return [c for c in checks if c in chosen]


def run_checks(checks: Sequence[Check], lock: Lock, facts: Facts, *, workers: int = 8, verbose: bool = False) -> list[Result]:
    """Run checks in parallel, each bounded by its timeout; results keep the checks' order."""
    if not checks:
        return []
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(workers, len(checks)), thread_name_prefix="check")
    try:
        futures = [(c, time.monotonic(), pool.submit(_run_one, c, lock, facts, verbose)) for c in checks]
        return [_collect(c, started, future) for c, started, future in futures]
    finally:
        # A timed-out check may still be running; do not wait for it.
        pool.shutdown(wait=False, cancel_futures=True)


def _collect(check_: Check, started: float, future: concurrent.futures.Future[Result]) -> Result:
    remaining = max(0.0, check_.timeout_s - (time.monotonic() - started))
    try:
        return future.result(timeout=remaining)
    except concurrent.futures.TimeoutError:
        return dataclasses.replace(
            error(f"timed out after {check_.timeout_s:g} s"), check=check_.name, duration_s=check_.timeout_s
        )


def _run_one(check_: Check, lock: Lock, facts: Facts, verbose: bool) -> Result:
    started = time.monotonic()
    try:
        result = check_.function(lock, facts)
        if not isinstance(result, Result):
            raise TypeError(f"check returned {type(result).__name__}, not Result")
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # a crashing check becomes ERROR, never a crashed report
        details = traceback.format_exc().rstrip().splitlines() if verbose else ()
        result = error(f"the check crashed: {type(exc).__name__}: {exc}", details)
    return dataclasses.replace(result, check=check_.name, duration_s=time.monotonic() - started)
