"""The verify flow: plan the checks, gather the facts, judge them; the deep checks one by one, the
static ones beside them."""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from stackgate.checks import deep as deepchecks
from stackgate.checks.all import REGISTRY
from stackgate.checks.core import Check, CheckError, run_checks, select
from stackgate.facts import Facts, gather
from stackgate.models.result import Result
from stackgate.models.spec import Spec
from stackgate.models.verdict import Verdict, judge
from stackgate.render.ui import UI


@dataclass(frozen=True)
class VerifyRun:
    """A finished verify: what a caller (gate, provision) needs of it."""

    lock: Spec
    results: list[Result]
    verdict: Verdict
    started: float
    duration_s: float
    facts: Facts | None = field(default=None, compare=False)
    phases: Mapping[str, float] = field(default_factory=dict)  #: "static", then each deep check: seconds
    cache: Mapping[str, Any] | None = None  #: with --cached: hit, why not, what was reused, from when


def plan(patterns: Sequence[str], *, deep: bool) -> tuple[list[Check], list[Check]]:
    """(static checks, deep checks) to run. Plain verify runs no deep check; --deep adds the
    static checks the chosen deep ones stand on, so `--deep --check deep.collective` is enough."""
    if not deep:
        try:
            return select(patterns, REGISTRY, include_slow=False), []
        except CheckError:
            wanted = [c.name for c in select(patterns, REGISTRY) if c.slow]  # raises again for a real typo
            raise CheckError(f"{', '.join(wanted)} run only with --deep") from None
    chosen = select(patterns, REGISTRY)
    deep_checks = [c for c in chosen if c.slow]
    needed = {name for c in deep_checks for name in deepchecks.PREREQUISITES.get(c.name, ())}
    static = [c for c in REGISTRY.values() if not c.slow and (c in chosen or c.name in needed)]
    return static, deep_checks


def verify(
    lock: Spec,
    checks: list[Check],
    ui: UI,
    *,
    strict: bool = False,
    facts: Facts | None = None,
    deep: Sequence[Check] = (),
) -> VerifyRun:
    """Gather what the checks need, in parallel, judge it; then run the deep checks in turn.

    With deep checks, only the static checks they stand on are awaited first; the others (the imports, the ELF scan,
    the toolkits: seconds of CPU work) are gathered and judged beside the deep checks, which use the GPUs."""
    started = time.time()
    clock = time.monotonic()
    needs = sorted({part for c in (*checks, *deep) for part in c.needs})
    facts = facts or gather(lock, needs)
    phases: dict[str, float] = {}
    try:
        facts.start(needs)
        standing = (
            {name for c in deep for name in deepchecks.PREREQUISITES.get(c.name, ())}
            if deep
            else {c.name for c in checks}
        )
        first = [c for c in checks if c.name in standing]
        with ui.progress(f"gathering facts: {', '.join(sorted({p for c in first for p in c.needs}) or needs)}"):
            # Every part is bounded by its own subprocess timeouts; a check's timeout then
            # measures the check, not the wait for a slow probe.
            for part in sorted({p for c in (first if deep else checks) for p in c.needs}):
                facts.get(part)
        results = run_checks(first, lock, facts, verbose=bool(ui.verbose))
        phases["static" if not deep else "prerequisites"] = time.monotonic() - clock
        rest = _beside(checks, first, lock, facts, ui, clock, phases) if deep else None
        for check in deep:
            begun = time.monotonic()
            results.append(_run_deep(check, lock, facts, results, ui))
            phases[check.name] = time.monotonic() - begun
        if rest is not None:
            results = _in_order(checks, deep, [*results, *rest.result()])
    finally:
        facts.close()
    duration = time.monotonic() - clock
    return VerifyRun(lock, results, judge(results, strict=strict), started, duration, facts, phases)


def _beside(
    checks: Sequence[Check],
    first: Sequence[Check],
    lock: Spec,
    facts: Facts,
    ui: UI,
    clock: float,
    phases: dict[str, float],
) -> concurrent.futures.Future[list[Result]]:
    """The static checks the deep ones do not stand on, judged in a thread while the deep checks run."""
    rest = [c for c in checks if c not in first]

    def judge_rest() -> list[Result]:
        done = run_checks(rest, lock, facts, verbose=bool(ui.verbose))
        phases["static (beside the deep checks)"] = time.monotonic() - clock
        return done

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="static")
    try:
        return pool.submit(judge_rest)
    finally:
        pool.shutdown(wait=False)


def _in_order(checks: Sequence[Check], deep: Sequence[Check], results: Sequence[Result]) -> list[Result]:
    """Results in the order verify lists its checks: the static ones, then the deep ones."""
    order = {c.name: i for i, c in enumerate((*checks, *deep))}
    return sorted(results, key=lambda r: order.get(r.check, len(order)))


def _run_deep(check: Check, lock: Spec, facts: Facts, results: Sequence[Result], ui: UI) -> Result:
    blocked = deepchecks.not_run(check.name, results)
    if blocked is not None:
        return blocked
    with ui.progress(f"{check.name}: {check.title}"):
        return run_checks([check], lock, facts, verbose=bool(ui.verbose))[0]
