"""The verify flow: gather the facts once, run the checks, judge them.

With deep checks the static checks run first (in parallel), then the deep ones (real work on the
GPUs), one after another so that they never share the GPUs, and each only when the static checks
it stands on passed (stackgate.checks.deep.PREREQUISITES); otherwise it is reported as not run,
with the reason. The wall time is split into those phases. The cached flow reuses the static
checks' results while the stamp of what they judged is unchanged (:mod:`stackgate.runs.verifycache`)
and runs only the live checks.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping, Sequence

from stackgate.checks import deep as deepchecks
from stackgate.checks.all import REGISTRY
from stackgate.checks.core import Check, run_checks, select
from stackgate.facts import Facts, Missing, deepruns, gather, stamp
from stackgate.flows.stages import Stage, run_stages
from stackgate.models import settings
from stackgate.models.exitcodes import UsageError
from stackgate.models.result import Result
from stackgate.models.spec import Spec
from stackgate.models.verdict import Verdict, judge
from stackgate.render.ui import UI
from stackgate.runs import verifycache

__all__ = ["STAGES", "VerifyRun", "plan", "verify", "verify_cached"]


@dataclass(frozen=True)
class VerifyRun:
    """A finished verify: what a caller (gate, provision) needs of it."""

    spec: Spec
    results: list[Result]
    verdict: Verdict
    started: float
    duration_s: float
    facts: Facts | None = field(default=None, compare=False)
    phases: Mapping[str, float] = field(default_factory=dict)  #: "static", then each deep check: seconds
    cache: Mapping[str, Any] | None = None  #: with --cached: hit, why not, what was reused, from when
    ahead: Mapping[str, int] | None = None  #: with deep checks: runs started ahead of their checks, and taken


def plan(patterns: Sequence[str], *, deep: bool) -> tuple[list[Check], list[Check]]:
    """(static checks, deep checks) to run. Plain verify runs no deep check; --deep adds the
    static checks the chosen deep ones stand on, so `--deep --check deep.collective` is enough."""
    if not deep:
        try:
            return select(patterns, REGISTRY, include_slow=False), []
        except UsageError:
            wanted = [c.name for c in select(patterns, REGISTRY) if c.slow]  # raises again for a real typo
            raise UsageError(f"{', '.join(wanted)} run only with --deep") from None
    chosen = select(patterns, REGISTRY)
    deep_checks = [c for c in chosen if c.slow]
    needed = {name for c in deep_checks for name in deepchecks.PREREQUISITES.get(c.name, ())}
    static = [c for c in REGISTRY.values() if not c.slow and (c in chosen or c.name in needed)]
    return static, deep_checks


@dataclass
class Verifying:
    """One verify under way: what its stages read and fill."""

    spec: Spec
    checks: list[Check]
    deep: Sequence[Check]
    ui: UI
    facts: Facts
    needs: list[str]
    clock: float
    results: list[Result] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    rest: concurrent.futures.Future[list[Result]] | None = None  #: the static checks judged beside the deep ones
    ahead: deepruns.Ahead | None = None  #: the deep runs started ahead of their checks (None: setting off)


def _static(run: Verifying) -> None:
    """Gather and judge the static checks; with deep checks, only those the deep ones stand on
    (the others are judged in a thread beside the deep checks)."""
    checks, deep = run.checks, run.deep
    standing = (
        {name for c in deep for name in deepchecks.PREREQUISITES.get(c.name, ())} if deep else {c.name for c in checks}
    )
    first = [c for c in checks if c.name in standing]
    with run.ui.progress(f"gathering facts: {', '.join(sorted({p for c in first for p in c.needs}) or run.needs)}"):
        # Every deep run's interpreter and torch import overlap the prerequisites' gathering (the
        # fusion's last: whether it starts anything waits for the probe's count of GPUs).
        for index in range(len(deep)):
            _start_ahead(run, index)
        # Every part is bounded by its own subprocess timeouts; a check's timeout then
        # measures the check, not the wait for a slow probe.
        for part in sorted({p for c in (first if deep else checks) for p in c.needs}):
            run.facts.get(part)
    run.results = run_checks(first, run.spec, run.facts, verbose=bool(run.ui.verbose))
    run.phases["static" if not deep else "prerequisites"] = time.monotonic() - run.clock
    run.rest = _beside(checks, first, run.spec, run.facts, run.ui, run.clock, run.phases) if deep else None


def _deep(run: Verifying) -> None:
    """The deep checks, one after another (their runs were started ahead, in :func:`_static`)."""
    for check in run.deep:
        begun = time.monotonic()
        run.results.append(_run_deep(check, run.spec, run.facts, run.results, run.ui))
        run.phases[check.name] = time.monotonic() - begun


def _start_ahead(run: Verifying, index: int) -> None:
    """Start deep check ``index``'s run ahead of it, unless it starts nothing of its own. From this (the
    flow's) thread: Linux ends a run started ahead when the thread that started it ends. One whose
    prerequisites then fail is ended unused when the deep checks end."""
    if run.ahead is None:
        return
    name = run.deep[index].name
    try:
        launch = deepchecks.launch(name, run.spec, run.facts)
    except Exception:  # the check itself meets (and reports) what failed here
        return
    if launch is not None:
        run.ahead.start(launch)


def _join(run: Verifying) -> None:
    """The static checks judged beside the deep ones, and every result in verify's order."""
    if run.rest is not None:
        run.results = _in_order(run.checks, run.deep, [*run.results, *run.rest.result()])


STAGES: tuple[Stage[Verifying], ...] = (Stage("static", _static), Stage("deep", _deep), Stage("join", _join))


def verify(
    spec: Spec,
    checks: list[Check],
    ui: UI,
    *,
    strict: bool = False,
    facts: Facts | None = None,
    deep: Sequence[Check] = (),
) -> VerifyRun:
    """Gather what the checks need, in parallel, judge it; then run the deep checks in turn.

    With deep checks, only the static checks they stand on are awaited first; the others (the imports,
    the ELF scan, the toolkits: seconds of CPU work) are gathered and judged beside the deep checks,
    which use the GPUs."""
    started = time.time()
    clock = time.monotonic()
    needs = sorted({part for c in (*checks, *deep) for part in c.needs})
    facts = facts or gather(spec, needs)
    run = Verifying(spec, checks, deep, ui, facts, needs, clock)
    try:
        with deepruns.ahead() if deep and settings.DEEP_AHEAD.value() else contextlib.nullcontext() as run.ahead:
            facts.start(needs)
            run_stages(STAGES, run)
    finally:
        facts.close()
    duration = time.monotonic() - clock
    ahead = {"started": run.ahead.started, "taken": run.ahead.taken} if run.ahead is not None else None
    verdict = judge(run.results, strict=strict)
    return VerifyRun(spec, run.results, verdict, started, duration, facts, run.phases, ahead=ahead)


def _beside(
    checks: Sequence[Check],
    first: Sequence[Check],
    spec: Spec,
    facts: Facts,
    ui: UI,
    clock: float,
    phases: dict[str, float],
) -> concurrent.futures.Future[list[Result]]:
    """The static checks the deep ones do not stand on, judged in a thread while the deep checks run."""
    rest = [c for c in checks if c not in first]

    def judge_rest() -> list[Result]:
        done = run_checks(rest, spec, facts, verbose=bool(ui.verbose))
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


def verify_cached(
    spec: Spec,
    checks: list[Check],
    ui: UI,
    *,
    strict: bool = False,
    environ: Mapping[str, str] | None = None,
    nvml_lib: ModuleType | None = None,
) -> VerifyRun:
    """The live checks now; the static ones' results from the cache while its stamp holds, else
    a full verify that refreshes the cache."""
    started, clock = time.time(), time.monotonic()
    path = verifycache.path_for(spec, environ)
    live = [c for c in checks if verifycache.is_live(c)]
    static = [c for c in checks if not verifycache.is_live(c)]
    facts = gather(spec, sorted({"nvml", *(p for c in live for p in c.needs)}), environ=environ, nvml_lib=nvml_lib)
    note = None
    try:
        entry = verifycache.load(path)
    except verifycache.CacheError as exc:
        entry, note = None, f"the cache {path} is ignored: {exc}"
    before = stamp.take(spec, lambda: facts.nvml, entry.sites if entry else (), facts.base_environ)
    why = verifycache.miss(entry, before, [c.name for c in static], started)
    if entry is None or why is not None:
        return _refresh(spec, checks, static, facts, before, path, ui, strict, note or why or "no cache yet")
    try:
        with ui.progress("live checks"):
            fresh = run_checks(live, spec, facts, verbose=bool(ui.verbose))
    finally:
        facts.close()
    order = {c.name: i for i, c in enumerate(checks)}
    results = sorted([*entry.results, *fresh], key=lambda r: order.get(r.check, len(order)))
    cache = {"hit": True, "path": str(path), "reused": len(entry.results), "live": len(fresh), "written": entry.written}
    return VerifyRun(
        spec,
        results,
        judge(results, strict=strict),
        started,
        time.monotonic() - clock,
        None,
        {"live": time.monotonic() - clock},
        cache,
    )


def _refresh(
    spec: Spec,
    checks: list[Check],
    static: list[Check],
    facts: Facts,
    before: stamp.Stamp,
    path: Path,
    ui: UI,
    strict: bool,
    why: str,
) -> VerifyRun:
    """A full verify, and the cache written from it when nothing it judged moved while it ran."""
    facts.start(sorted({part for c in checks for part in c.needs}))
    done = verify(spec, checks, ui, strict=strict, facts=facts)
    sites = tuple(sorted({d.location for d in _distributions(facts)}))
    after = stamp.take(spec, lambda: facts.nvml, _sites_of(before), facts.base_environ)
    if after != before:
        written: str | None = f"not cached: changed while it ran: {'; '.join(stamp.changed(before, after))}"
    else:
        names = {c.name for c in static}
        entry = verifycache.Entry(
            stamp.take(spec, lambda: facts.nvml, sites, facts.base_environ),
            tuple(c.name for c in static),
            tuple(r for r in done.results if r.check in names),
            sites,
            done.started,
        )
        written = verifycache.save(path, entry)
    return dataclasses.replace(
        done,
        cache={
            "hit": False,
            "path": str(path),
            "why": why,
            "written": done.started if written is None else None,
            "not_written": written,
        },
    )


def _sites_of(before: stamp.Stamp) -> tuple[str, ...]:
    """The site-packages folders a stamp covers."""
    return tuple(before.get("distributions", {}))


def _distributions(facts: Facts) -> list[Any]:
    """The stack's installed distributions, where the full verify gathered them (the probe)."""
    probe = facts.probe if "probe" in facts.started else facts.dists if "dists" in facts.started else None
    return [] if probe is None or isinstance(probe, Missing) else list(probe.distributions.values())


def _run_deep(check: Check, spec: Spec, facts: Facts, results: Sequence[Result], ui: UI) -> Result:
    blocked = deepchecks.not_run(check.name, results)
    if blocked is not None:
        return blocked
    with ui.progress(f"{check.name}: {check.title}"):
        return run_checks([check], spec, facts, verbose=bool(ui.verbose))[0]
