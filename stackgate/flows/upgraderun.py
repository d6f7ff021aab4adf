"""One node's upgrade as data: what was asked (:class:`UpgradeRequest`, refused up front by
:func:`check_request`), what happened (:class:`UpgradeRun`: the plan, the build, the A/B's legs, the
decision, the switch) and what it adds up to (its results and its JSON document, ``stackgate.upgrade/1``).
The stages that fill it in are :mod:`stackgate.flows.upgrade`'s.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from stackgate.flows import provision, smoke
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.models.result import Result, Status, failed, passed, skipped, warned
from stackgate.models.spec import Spec
from stackgate.models.verdict import Verdict
from stackgate.models.verdict import document as report_document
from stackgate.render import upgradereport as upgrade_render
from stackgate.render.outputs import JSON, Output, check_outputs
from stackgate.runs import abtest, stackdiff
from stackgate.stack import generations, guard, pyenv, toolkit
from stackgate.stack import patching as stackpatches

__all__ = [
    "BUILD_ERRORS",
    "SCHEMA",
    "UpgradeRequest",
    "UpgradeRun",
    "check_request",
]

SCHEMA = "stackgate.upgrade/1"
BUILD_ERRORS = (
    provision.ProvisionError,
    pyenv.PyenvError,
    guard.GuardError,
    toolkit.ToolkitError,
    stackpatches.PatchError,
    OSError,
)


@dataclass(frozen=True, kw_only=True)
class UpgradeRequest:
    to: Path  #: the new spec
    spec_path: Path | None = None  #: the live spec (default: the one the live generation was built from)
    model: str | None = None
    switch: str = "if-better"
    dry_run: bool = False
    accept_output_change: bool = False
    json_path: Path | None = None
    markdown_path: Path | None = None
    html_path: Path | None = None
    rounds: int = 2  #: AB rounds, alternated: 2 is ABBA
    #: Library only, as the gate's: the verify checks (globs) run on the new generation; the
    #: command runs them all, deep ones included. Tests pick what a machine without GPUs passes.
    verify_checks: tuple[str, ...] = ()
    environ: Mapping[str, str] | None = field(default=None, compare=False)  #: default: os.environ
    run_dir: Path | None = None  #: where the servers' logs go (default: reports/upgrade/<run id>)

    def reports(self) -> dict[str, Output]:
        """The asked-for reports: where each goes and how the document becomes its text."""
        return {
            "--json": Output(self.json_path, JSON),
            "--markdown": Output(self.markdown_path, upgrade_render.markdown),
            "--html": Output(self.html_path, upgrade_render.page),
        }


@dataclass
class UpgradeRun:
    """What one node's upgrade did: the document's parts, filled step by step."""

    request: UpgradeRequest
    run_id: str
    started: float
    root: Path
    live_spec: Spec
    new_spec: Spec
    live_generation: generations.Generation
    changes: list[stackdiff.Change]
    plan_lines: list[str]
    step: str = "plan"  #: where it is (or stopped): plan, build, verify, ab, decide, switch, done
    new_generation: generations.Generation | None = None
    build: dict[str, Any] = field(default_factory=dict)
    verify_results: list[Result] = field(default_factory=list)
    legs: list[dict[str, Any]] = field(default_factory=list)
    measured: list[abtest.Leg] = field(default_factory=list)
    smoke_runs: list[tuple[dict[str, Any], smoke.SmokeRun]] = field(
        default_factory=list
    )  #: each leg's part and its smoke
    decision: abtest.Decision | None = None
    current_after: str | None = None
    interrupted: bool = False
    blocked: str | None = None  #: why the plan cannot be applied (nothing was changed)
    duration_s: float = 0.0

    @property
    def switched(self) -> bool:
        return self.current_after is not None and self.current_after != self.live_generation.id

    @property
    def same_generation(self) -> bool:
        """The new spec's Python stack is the live generation's (only flags or env differ)."""
        return self.new_generation is not None and self.new_generation.path == self.live_generation.path

    @property
    def won(self) -> bool:
        """For a fleet's canary: the new stack won and is now live here."""
        return bool(
            self.decision
            and self.decision.switch
            and (self.switched or (self.same_generation and self.current_after is not None))
        )

    @property
    def exit_code(self) -> ExitCode:
        if self.interrupted:
            return ExitCode.INTERRUPTED
        if self.blocked is not None:
            return ExitCode.FAILED
        if self.request.dry_run or self.won or not self.changes:
            return ExitCode.PASSED
        decision = self.decision
        if decision is not None and decision.mode == "never" and decision.conditions and decision.conditions[0].held:
            return ExitCode.PASSED  # report only, and the new stack passed
        return ExitCode.FAILED

    def results(self) -> list[Result]:
        return _results(self)

    def document(self) -> dict[str, Any]:
        return _document(self)


def check_request(request: UpgradeRequest) -> None:
    """Refuse what cannot work before anything runs (exit 2, nothing changed)."""
    if request.switch not in abtest.MODES:
        raise UsageError(f"--switch must be one of {', '.join(abtest.MODES)}, not {request.switch!r}")
    if request.rounds < 1:
        raise UsageError(f"rounds must be 1 or more, not {request.rounds}")
    problem = check_outputs(request.reports())
    if problem is not None:
        raise UsageError(problem)


# --- the report ------------------------------------------------------------------------------


def _results(done: UpgradeRun) -> list[Result]:
    """One result per step, for the verdict and the JSON's ``results``."""
    found = [
        Result(
            "upgrade.plan",
            Status.FAIL if done.blocked else Status.PASS,
            done.blocked or f"{len(done.changes)} change(s) from {done.live_generation.id}",
        )
    ]
    build = done.build
    if build:
        status = (
            Status.FAIL
            if build.get("status") == "failed" or str(build.get("verify", "")).startswith("failed")
            else Status.PASS
        )
        found.append(Result("upgrade.build", status, f"{build.get('reason')}; verify {build.get('verify', 'not run')}"))
    found += [
        dataclasses.replace(r, check=f"upgrade.verify.{r.check}")
        for r in done.verify_results
        if r.status >= Status.WARN
    ]
    if done.measured:
        found.append(_speed_result(done))
    if done.decision is not None:
        make = passed if done.won or done.exit_code == ExitCode.PASSED else failed
        found.append(
            dataclasses.replace(
                make(done.decision.reason, [c.text for c in done.decision.conditions]), check="upgrade.decision"
            )
        )
    if done.interrupted:
        found.append(Result("upgrade.interrupted", Status.FAIL, _interrupted(done)))
    return found


def _interrupted(done: UpgradeRun) -> str:
    after = f"current was switched to {done.current_after}" if done.switched else "current is unchanged"
    return f"interrupted (Ctrl-C or SIGTERM) during {done.step}; {after}"


def _speed_result(done: UpgradeRun) -> Result:
    live, new = abtest.side(abtest.LIVE, done.measured), abtest.side(abtest.NEW, done.measured)
    diff = abtest.difference(live, new)
    if diff is None:
        return dataclasses.replace(skipped("no decode rate from both sides"), check="upgrade.ab")
    text = f"decode new - live: {diff.text()}"
    made = warned(text) if diff.significant and diff.delta < 0 else passed(text)
    return dataclasses.replace(made, check="upgrade.ab")


def _document(done: UpgradeRun) -> dict[str, Any]:
    results = _results(done)
    code = done.exit_code
    counts = {s.name: sum(1 for r in results if r.status == s) for s in Status}
    reason = done.blocked or done.build.get("reason") or "plan only (--dry-run)"
    if done.interrupted:
        reason = _interrupted(done)
    elif done.decision:
        reason = done.decision.reason
    verdict = Verdict(code, counts, str(reason))
    extra = {"run_id": done.run_id, "upgrade": _upgrade_part(done)}
    return report_document(
        "upgrade", results, verdict, spec=done.new_spec, started=done.started, duration_s=done.duration_s, extra=extra
    )


def _generation_part(generation: generations.Generation | None) -> dict[str, Any]:
    if generation is None:
        return {"generation": None, "state": None, "path": None}
    return {"generation": generation.id, "state": generation.state, "path": str(generation.path)}


def _upgrade_part(done: UpgradeRun) -> dict[str, Any]:
    request = {
        k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
        for k, v in dataclasses.asdict(done.request).items()
        if k != "environ"
    }
    live, new = abtest.side(abtest.LIVE, done.measured), abtest.side(abtest.NEW, done.measured)
    diff = abtest.difference(live, new)
    generation = done.new_generation
    return {
        "schema": SCHEMA,
        "request": request,
        "root": str(done.root),
        "step": done.step,
        "interrupted": done.interrupted,
        "blocked": done.blocked,
        "live": {"generation": done.live_generation.id, "lock": str(done.live_spec.path)},
        "new": {"lock": str(done.new_spec.path), **_generation_part(generation)},
        "plan": {"changes": [c.to_dict() for c in done.changes], "lines": done.plan_lines},
        "build": done.build,
        "verify": [r.to_dict() for r in done.verify_results],
        "ab": {
            "order": list(abtest.order(done.request.rounds)),
            "legs": done.legs,
            "sides": {abtest.LIVE: live.to_dict(), abtest.NEW: new.to_dict()},
            "difference": diff.to_dict() if diff else None,
            "difference_text": diff.text() if diff else None,
        },
        "decision": done.decision.to_dict() if done.decision else None,
        "current": {
            "before": done.live_generation.id,
            "after": done.current_after or done.live_generation.id,
            "switched": done.switched,
        },
    }
