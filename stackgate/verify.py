"""`invoke verify`: gather the facts once, run the checks, report, return one exit code."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from stackgate.checks import report
from stackgate.checks.all import REGISTRY
from stackgate.checks.core import Check, Result, run_checks, select
from stackgate.checks.facts import Facts, gather
from stackgate.exitcodes import ExitCode
from stackgate.stack import lock as lockmodel
from stackgate.ui import UI

__all__ = ["VerifyRequest", "VerifyRun", "list_checks", "run", "verify"]


@dataclass(frozen=True)
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
    verdict: report.Verdict
    started: float
    duration_s: float
    facts: Facts | None = field(default=None, compare=False)


def run(request: VerifyRequest, ui: UI) -> ExitCode:
    """The verify command: load, check, render, write the reports."""
    lock = lockmodel.load(request.lock_path)
    if request.list_only:
        list_checks(ui)
        return ExitCode.PASSED
    done = verify(lock, select(request.checks, REGISTRY), ui, strict=request.strict)
    title = f"stackgate verify: {lock.name} ({lock.path})"
    ui.results(title, done.results, done.verdict, done.duration_s)
    write_reports(done, request)
    return done.verdict.exit_code


def verify(lock: lockmodel.Lock, checks: list[Check], ui: UI, *, strict: bool = False, facts: Facts | None = None) -> VerifyRun:
    """Gather what ``checks`` need, in parallel, and judge it."""
    started = time.time()
    clock = time.monotonic()
    needs = sorted({part for c in checks for part in c.needs})
    facts = facts or gather(lock, needs)
    try:
        with ui.progress(f"gathering facts: {', '.join(needs)}"):
            # Every part is bounded by its own subprocess timeouts; a check's timeout then
            # measures the check, not the wait for a slow probe.
            for part in needs:
                facts.get(part)
        results = run_checks(checks, lock, facts, verbose=bool(ui.verbose))
    finally:
        facts.close()
    duration = time.monotonic() - clock
    return VerifyRun(lock, results, report.judge(results, strict=strict), started, duration, facts)


def write_reports(done: VerifyRun, request: VerifyRequest) -> None:
    if request.json_path:
        doc = report.document("verify", done.results, done.verdict, lock=done.lock, started=done.started, duration_s=done.duration_s)
        report.write_json(request.json_path, doc)
    if request.junit_path:
        report.write_junit(request.junit_path, {f"stackgate.verify.{done.lock.name}": done.results}, strict=request.strict)


def list_checks(ui: UI) -> None:
    width = max(len(name) for name in REGISTRY)
    for check in REGISTRY.values():
        slow = " (slow)" if check.slow else ""
        ui.line(f"{check.name:<{width}}  {check.title}{slow}")
