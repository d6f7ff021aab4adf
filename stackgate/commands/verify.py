"""`stackgate verify`: gather the facts once, run the checks, report, return one exit code.

With ``--deep`` the static checks run first (in parallel), then the deep ones (real work on the
GPUs), one after another so that they never share the GPUs, and each only when the static
checks it stands on passed (stackgate.checks.deep.PREREQUISITES); otherwise it is reported as
not run, with the reason. The wall time is split into those phases, in the report and the JSON.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from stackgate.checks import deep as deepchecks
from stackgate.checks.all import REGISTRY
from stackgate.checks.core import Check, CheckError, run_checks, select
from stackgate.edges.files import write_json
from stackgate.facts import Facts, gather
from stackgate.models import settings
from stackgate.models import spec as lockmodel
from stackgate.models.exitcodes import ExitCode
from stackgate.models.result import Result
from stackgate.models.verdict import Verdict, judge
from stackgate.models.verdict import document as report_document
from stackgate.render import report
from stackgate.render.ui import UI

__all__ = ["VerifyRequest", "VerifyRun", "list_checks", "phases_line", "plan", "run", "verify"]


@dataclass(frozen=True, kw_only=True)
class VerifyRequest:
    lock_path: Path | None = None
    checks: tuple[str, ...] = ()
    deep: bool = False
    json_path: Path | None = None
    junit_path: Path | None = None
    strict: bool = False
    list_only: bool = False


@dataclass(frozen=True)
class VerifyRun:
    """A finished verify: what a caller (gate, provision) needs of it."""

    lock: lockmodel.Lock
    results: list[Result]
    verdict: Verdict
    started: float
    duration_s: float
    facts: Facts | None = field(default=None, compare=False)
    phases: Mapping[str, float] = field(default_factory=dict)  #: "static", then each deep check: seconds


def run(request: VerifyRequest, ui: UI) -> ExitCode:
    """The verify command: load, check, render, write the reports."""
    ui.settings(settings.report(flags={settings.LOCK: ("--lock", request.lock_path)}))
    lock = lockmodel.load(request.lock_path)
    if request.list_only:
        list_checks(ui)
        return ExitCode.PASSED
    static, deep = plan(request.checks, deep=request.deep)
    done = verify(lock, static, ui, strict=request.strict, deep=deep)
    title = f"stackgate verify{' --deep' if request.deep else ''}: {lock.name} ({lock.path})"
    ui.results(title, report.redacted(done.results), done.verdict, done.duration_s)
    if deep:
        ui.line(phases_line(done.phases, done.duration_s))
    write_reports(done, request)
    return done.verdict.exit_code


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
    lock: lockmodel.Lock, checks: list[Check], ui: UI, *, strict: bool = False, facts: Facts | None = None, deep: Sequence[Check] = ()
) -> VerifyRun:
    """Gather what the checks need, in parallel, judge it; then run the deep checks in turn."""
    started = time.time()
    clock = time.monotonic()
    needs = sorted({part for c in (*checks, *deep) for part in c.needs})
    facts = facts or gather(lock, needs)
    phases: dict[str, float] = {}
    try:
        with ui.progress(f"gathering facts: {', '.join(needs)}"):
            # Every part is bounded by its own subprocess timeouts; a check's timeout then
            # measures the check, not the wait for a slow probe.
            for part in needs:
                facts.get(part)
        results = run_checks(checks, lock, facts, verbose=bool(ui.verbose))
        phases["static"] = time.monotonic() - clock
        for check in deep:
            begun = time.monotonic()
            results.append(_run_deep(check, lock, facts, results, ui))
            phases[check.name] = time.monotonic() - begun
    finally:
        facts.close()
    duration = time.monotonic() - clock
    return VerifyRun(lock, results, judge(results, strict=strict), started, duration, facts, phases)


def _run_deep(check: Check, lock: lockmodel.Lock, facts: Facts, results: Sequence[Result], ui: UI) -> Result:
    blocked = deepchecks.not_run(check.name, results)
    if blocked is not None:
        return blocked
    with ui.progress(f"{check.name}: {check.title}"):
        return run_checks([check], lock, facts, verbose=bool(ui.verbose))[0]


def phases_line(phases: Mapping[str, float], total_s: float) -> str:
    """``wall time 12.3 s: static 1.1 s, deep.gpu_work 4.0 s, deep.collective 7.2 s``."""
    parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases.items())
    return f"wall time {total_s:.1f} s: {parts}"


def write_reports(done: VerifyRun, request: VerifyRequest) -> None:
    if request.json_path:
        extra = {"phases_s": {name: round(seconds, 3) for name, seconds in done.phases.items()}}
        doc = report_document("verify", done.results, done.verdict, lock=done.lock, started=done.started, duration_s=done.duration_s, extra=extra)
        write_json(request.json_path, doc)
    if request.junit_path:
        report.write_junit(request.junit_path, {f"stackgate.verify.{done.lock.name}": done.results}, strict=request.strict)


def list_checks(ui: UI) -> None:
    width = max(len(name) for name in REGISTRY)
    # Deep checks last, as they run, whichever module registered first.
    for check in sorted(REGISTRY.values(), key=lambda c: c.slow):
        when = " (deep: --deep)" if check.slow else " (when named: --check; the gate runs it)" if check.named_only else ""
        ui.line(f"{check.name:<{width}}  {check.title}{when}")
