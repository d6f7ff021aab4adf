"""The check framework: a registry of named checks and a parallel runner (the result type they
return is :mod:`stackgate.models.result`).

A check is a small pure function ``(lock, facts) -> Result`` registered under a stable dotted
name. The runner runs the selected checks in parallel with a timeout each; a check that raises
becomes an ERROR result with the exception's text, never a crashed report. KeyboardInterrupt
always propagates.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import fnmatch
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from stackgate.models.exitcodes import UsageError
from stackgate.models.result import Result, error

if TYPE_CHECKING:
    from stackgate.facts import Facts
    from stackgate.models.spec import Spec

__all__ = ["REGISTRY", "Check", "check", "run_checks", "select"]


CheckFunction = Callable[["Spec", "Facts"], Result]


@dataclass(frozen=True)
class Check:
    """A registered check: its stable name, what it looks at, and the facts it needs."""

    name: str
    function: CheckFunction
    title: str
    needs: tuple[str, ...]
    timeout: float | Callable[[], float]  #: seconds, or how to read them when the check runs (a setting)
    slow: bool
    #: Runs only when a pattern names it (``verify --check environment.*``, the gate's
    #: environment stage), never in a plain ``verify``.
    named_only: bool = False

    @property
    def timeout_s(self) -> float:
        return self.timeout() if callable(self.timeout) else self.timeout

    @property
    def area(self) -> str:
        return self.name.split(".", 1)[0]


#: Every check, by name, in registration order (the order reports list them).
REGISTRY: dict[str, Check] = {}


def check(
    name: str,
    *,
    needs: Sequence[str] = (),
    timeout_s: float | Callable[[], float] = 30.0,
    slow: bool = False,
    named_only: bool = False,
) -> Callable[[CheckFunction], CheckFunction]:
    """Register a check under a stable dotted name; its docstring's first line is its title."""

    def register(function: CheckFunction) -> CheckFunction:
        if name in REGISTRY:
            raise UsageError(f"check {name!r} is registered twice")
        title = (function.__doc__ or name).strip().splitlines()[0]
        REGISTRY[name] = Check(name, function, title, tuple(needs), timeout_s, slow, named_only)
        return function

    return register


def select(
    patterns: Sequence[str] = (), registry: Mapping[str, Check] | None = None, *, include_slow: bool = True
) -> list[Check]:
    """The checks whose names match any pattern (exact name or glob); without a pattern, all of
    them but those that run only when named.

    A pattern that matches nothing is an error: a typo must not turn into a green run.
    """
    registry = REGISTRY if registry is None else registry
    checks = [c for c in registry.values() if include_slow or not c.slow]
    if not patterns:
        return [c for c in checks if not c.named_only]
    chosen: list[Check] = []
    for pattern in patterns:
        hits = [
            c
            for c in checks
            if c.name == pattern or fnmatch.fnmatchcase(c.name, pattern) or c.name.startswith(pattern + ".")
        ]
        if not hits:
            raise UsageError(f"no check matches {pattern!r}", hint="stackgate verify --list")
        chosen.extend(c for c in hits if c not in chosen)
    return [c for c in checks if c in chosen]


def run_checks(
    checks: Sequence[Check], spec: Spec, facts: Facts, *, workers: int = 8, verbose: bool = False
) -> list[Result]:
    """Run checks in parallel, each bounded by its timeout; results keep the checks' order."""
    if not checks:
        return []
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(workers, len(checks)), thread_name_prefix="check")
    try:
        futures = [(c, time.monotonic(), pool.submit(_run_one, c, spec, facts, verbose)) for c in checks]
        return [_collect(c, started, future) for c, started, future in futures]
    finally:
        # A timed-out check may still be running; do not wait for it.
        pool.shutdown(wait=False, cancel_futures=True)


def _collect(check_: Check, started: float, future: concurrent.futures.Future[Result]) -> Result:
    limit = check_.timeout_s
    remaining = max(0.0, limit - (time.monotonic() - started))
    try:
        return future.result(timeout=remaining)
    except concurrent.futures.TimeoutError:
        return dataclasses.replace(error(f"timed out after {limit:g} s"), check=check_.name, duration_s=limit)


def _run_one(check_: Check, spec: Spec, facts: Facts, verbose: bool) -> Result:
    started = time.monotonic()
    try:
        result = check_.function(spec, facts)
        if not isinstance(result, Result):
            raise TypeError(f"check returned {type(result).__name__}, not Result")
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # a crashing check becomes ERROR, never a crashed report
        details = traceback.format_exc().rstrip().splitlines() if verbose else ()
        result = error(f"the check crashed: {type(exc).__name__}: {exc}", details)
    return dataclasses.replace(result, check=check_.name, duration_s=time.monotonic() - started)
