"""The gate flow: one verdict before deploy, from the lock to a benchmark of the real weights.

The stages, in order, and what each stands on:

==============  =====================================================  =======================
stage           what it proves                                         runs only if passed
==============  =====================================================  =======================
lock            the lockfile loads, and names a model to launch        (first)
environment     the live environment is the one the lock describes:    lock
                same generation (built from this lock's Python stack),
                no drift (pins, requirements, patches): the
                registered ``environment.*`` checks
verify          ``verify --deep``: every check, then real GPU work     lock
fast_smoke      ``smoke --fast``: the launch, random weights, a few    lock, environment, verify
                layers (minutes, not a full load)
benchmark       ``smoke --benchmark`` with the real weights            fast_smoke
==============  =====================================================  =======================

verify runs even when the environment drifted, so that one report says both what drifted and
what that breaks; the model is only ever launched on a stack that passed both, and the real
weights only after the fast launch worked (no ten-minute load on a broken stack). A stage that
is not run is reported as such, with the reason, as a SKIP result. ``--fast-only`` stops after
the fast smoke.

One exit code: 0 when every stage that ran passed (warnings allowed unless --strict), 1 when one
failed (or nothing was checked), 2 when the lockfile is bad or names no model (the reports are
still written and say so; nothing was run and the run is not kept in the history), 130 when
interrupted (the reports are written with what was learned, the run is kept, then it exits).
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Mapping, Sequence

from stackgate.checks.all import REGISTRY
from stackgate.checks.core import run_checks, select
from stackgate.edges import runner
from stackgate.facts import Facts, gather
from stackgate.flows import smoke, smokerun, stages
from stackgate.flows import verify as verify_flow
from stackgate.flows.stages import FAILED, INTERRUPTED, NOT_RUN, PASSED, StageRecord, run_stages
from stackgate.models import pylock, settings
from stackgate.models.exitcodes import ExitCode
from stackgate.models.finding import Fix
from stackgate.models.result import Result, Status, failed, passed
from stackgate.models.spec import Spec, SpecError, default_spec_path, load_spec
from stackgate.models.verdict import Verdict, judge
from stackgate.models.verdict import document as report_document
from stackgate.render.ui import UI
from stackgate.runs import fingerprint as fp
from stackgate.runs import history
from stackgate.serve import launch, launched

__all__ = [
    "SCHEMA",
    "STAGES",
    "GateContext",
    "GateRequest",
    "GateRun",
    "GateStage",
    "Stage",
    "StageInterrupted",
    "StageRun",
    "run_gate",
]

SCHEMA = "stackgate.gate/1"
#: The environment stage: the registered checks of the environment area (checks/environment.py).
ENVIRONMENT_CHECKS = ("environment.*",)


class StageInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM inside a stage, carrying the results the stage had when it stopped."""

    def __init__(self, results: Sequence[Result]) -> None:
        super().__init__("interrupted")
        self.results = list(results)


@dataclass(frozen=True, kw_only=True)
class GateRequest:
    spec_path: Path | None = None
    json_path: Path | None = None
    junit_path: Path | None = None
    markdown_path: Path | None = None
    prom_path: Path | None = None
    fast_only: bool = False
    model: str | None = None
    strict: bool = False
    #: Library only (the command always runs every check): glob patterns of the verify checks to
    #: run, as ``verify --check`` takes them. Tests use it to pick the checks a machine without
    #: GPUs can pass, so that the stages after verify run for real.
    verify_checks: tuple[str, ...] = ()
    run_dir: Path | None = None  #: where the servers' logs go (default: reports/gate/<time>-<pid>)


@dataclass
class GateContext:
    """What the stages share: the request, and what each stage learned for the later ones."""

    request: GateRequest
    ui: UI
    environ: Mapping[str, str]
    nvml_lib: ModuleType | None = None
    run_dir: Path = Path("reports")
    spec: Spec | None = None
    usage: str | None = None  #: why the lock stage refused the run (exit 2)
    verify_run: verify_flow.VerifyRun | None = None
    smoke_runs: dict[str, smokerun.SmokeRun] = field(default_factory=dict)
    results: dict[str, list[Result]] = field(default_factory=dict)  #: each stage's, as it returned them
    _facts: Facts | None = None

    @property
    def facts(self) -> Facts:
        """Gathered once for the environment, verify and the fingerprint, started on first use."""
        if self._facts is None:
            assert self.spec is not None
            static, deep = verify_flow.plan(self.request.verify_checks, deep=True)
            environment = select(ENVIRONMENT_CHECKS, REGISTRY)
            parts = sorted({*fp.PARTS, *(part for c in (*environment, *static, *deep) for part in c.needs)})
            self._facts = gather(self.spec, parts, environ=self.environ, nvml_lib=self.nvml_lib)
        return self._facts

    def close(self) -> None:
        if self._facts is not None:
            self._facts.close()


#: A gate stage: the one Stage type (flows/stages.py) over the gate's context; :func:`Stage` builds one.
GateStage = stages.Stage[GateContext]


def Stage(  # noqa: N802 - it builds the one Stage type, as a class would
    name: str,
    title: str,
    needs: tuple[str, ...],
    run: Callable[[GateContext], list[Result]],
    left_out: Callable[[GateContext], str | None] | None = None,
) -> GateStage:
    """A gate stage: flows/stages.py's Stage whose ``run`` returns the stage's results, kept in the
    context, and passes when they do (warnings too, unless --strict); ``left_out`` says why the
    request leaves it out (e.g. --fast-only). An interrupt during it stops every process the run
    started before the reports are written."""

    def judged(ctx: GateContext) -> bool:
        ctx.results[name] = run(ctx)
        return judge(ctx.results[name], strict=ctx.request.strict).passed

    return GateStage(name, judged, title, needs, left_out, interrupt=_stop_processes)


def _stop_processes(ctx: GateContext) -> None:
    runner.terminate_all()  # before the reports are written, not after


@dataclass(frozen=True)
class StageRun:
    """A stage's outcome: its status, the reason in one line, its results and wall time."""

    name: str
    title: str
    needs: tuple[str, ...]
    status: str  #: passed | failed | not run | interrupted
    reason: str
    results: tuple[Result, ...]
    duration_s: float
    verdict: Verdict | None = None  #: None when the stage did not run

    @property
    def ran(self) -> bool:
        return self.status != NOT_RUN

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "needs": list(self.needs),
            "status": self.status,
            "reason": self.reason,
            "duration_s": round(self.duration_s, 3),
            "counts": dict(self.verdict.counts) if self.verdict else {},
            "results": [r.to_dict() for r in self.results],
        }


# --- the stages -------------------------------------------------------------------------------


def _spec_stage(ctx: GateContext) -> list[Result]:
    try:
        spec = load_spec(ctx.request.spec_path)
        pylock.check_beside(spec)
    except SpecError as exc:
        ctx.usage = str(exc)
        summary = str(exc).splitlines()[0].rstrip(":")
        return [
            _named(
                "lock.load",
                failed(summary, exc.problems, Fix("Fix the lockfile: every problem is listed with its key path.")),
            )
        ]
    ctx.spec = spec
    results = [
        _named(
            "lock.load", passed(f"{spec.name} ({spec.path}, sha256 {spec.sha256[:12]})", data={"sha256": spec.sha256})
        )
    ]
    try:
        (config,) = launch.configs(spec, model=ctx.request.model, fast=True)
    except launch.LaunchError as exc:
        ctx.usage = str(exc)
        fix = Fix("Name the model the gate launches.", (f"stackgate gate --model /path/to/model --lock {spec.path}",))
        results.append(_named("lock.model", failed(str(exc), fix=fix)))
        return results
    readable = launch.check_model(config, {**os.environ, **config.env})  # a Hub cache named in [smoke.env] too
    if readable.status >= Status.FAIL:
        ctx.usage = readable.summary
        fix = Fix(
            "Name a readable Hugging Face model directory (--model PATH or [smoke] model).",
            readable.fix.commands if readable.fix else (),
        )
        results.append(_named("lock.model", failed(readable.summary, fix=fix)))
        return results
    results.append(
        _named("lock.model", passed(f"the smoke stages launch {config.model}", data={"model": config.model}))
    )
    return results


def _environment_stage(ctx: GateContext) -> list[Result]:
    assert ctx.spec is not None
    checks = select(ENVIRONMENT_CHECKS, REGISTRY)
    for part in sorted({part for c in checks for part in c.needs}):
        ctx.facts.get(part)  # gathered first, as verify does: a check's timeout measures the check, not a slow probe
    return run_checks(checks, ctx.spec, ctx.facts, verbose=bool(ctx.ui.verbose))


def _verify_stage(ctx: GateContext) -> list[Result]:
    assert ctx.spec is not None
    static, deep = verify_flow.plan(ctx.request.verify_checks, deep=True)
    done = verify_flow.verify(ctx.spec, static, ctx.ui, strict=ctx.request.strict, facts=ctx.facts, deep=deep)
    ctx.verify_run = done
    return done.results


def _smoke_stage(name: str, *, fast: bool) -> Callable[[GateContext], list[Result]]:
    def run_stage(ctx: GateContext) -> list[Result]:
        assert ctx.spec is not None
        request = smokerun.SmokeRequest(
            spec_path=ctx.spec.path,
            model=ctx.request.model,
            fast=fast,
            benchmark=not fast,
            strict=ctx.request.strict,
            run_dir=ctx.run_dir / name,
        )
        try:
            done = smoke.run_smoke(ctx.spec, request, ctx.ui, environ=ctx.environ, nvml_lib=ctx.nvml_lib)
        except smokerun.SmokeInterrupted as stop:
            ctx.smoke_runs[name] = stop.run
            raise StageInterrupted(stop.run.results) from None
        except launch.LaunchError as exc:
            return [_named("smoke.usage", failed(f"smoke refused the launch: {exc}"))]
        ctx.smoke_runs[name] = done
        return done.results

    return run_stage


STAGES: tuple[GateStage, ...] = (
    Stage("lock", "the lockfile loads and names a model", (), _spec_stage),
    Stage(
        "environment", "the live environment is the lock's: same generation, no drift", ("lock",), _environment_stage
    ),
    Stage("verify", "verify --deep", ("lock",), _verify_stage),
    Stage(
        "fast_smoke",
        "smoke --fast: launch with random weights and a few layers",
        ("lock", "environment", "verify"),
        _smoke_stage("fast_smoke", fast=True),
    ),
    Stage(
        "benchmark",
        "smoke --benchmark with the real weights",
        ("fast_smoke",),
        _smoke_stage("benchmark", fast=False),
        left_out=lambda ctx: "--fast-only: the gate stops after the fast smoke" if ctx.request.fast_only else None,
    ),
)


def _named(check: str, result: Result) -> Result:
    return dataclasses.replace(result, check=check)


# --- running the stages -----------------------------------------------------------------------


def _stage_runs(stages_: Sequence[GateStage], ctx: GateContext) -> tuple[list[StageRun], bool]:
    """Run the stages (flows/stages.py's loop); (each stage's outcome in order, whether interrupted)."""
    records: list[StageRecord] = []
    try:
        run_stages(stages_, ctx, records=records)
    except KeyboardInterrupt:
        if not any(r.status == INTERRUPTED for r in records):
            raise  # not inside a stage: nothing of the gate's to report
    outcomes, interrupted = [], False
    for stage, record in zip(stages_, records, strict=True):
        outcomes.append(_stage_run(stage, record, ctx, interrupted))
        interrupted = interrupted or record.status == INTERRUPTED
    return outcomes, interrupted


def _stage_run(stage: GateStage, record: StageRecord, ctx: GateContext, after_interrupt: bool) -> StageRun:
    """A stage's outcome from its record: its results judged, or why it did not run."""
    if record.status == NOT_RUN:
        reasons = ["the gate was interrupted"] if after_interrupt else list(record.reasons)
        reason = "; ".join(reasons)
        result = Result(
            f"gate.{stage.name}", Status.SKIP, f"not run: {reason}", tuple(reasons), data={"not_run": reasons}
        )
        return StageRun(stage.name, stage.title, stage.needs, NOT_RUN, reason, (result,), 0.0)
    if record.status == INTERRUPTED:
        results = [
            *getattr(record.error, "results", ()),
            _named(f"gate.{stage.name}", failed("interrupted (Ctrl-C or SIGTERM)")),
        ]
        return _outcome(stage, results, record.seconds, ctx.request.strict, True)
    return _outcome(stage, ctx.results[stage.name], record.seconds, ctx.request.strict, False)


def _outcome(stage: GateStage, results: Sequence[Result], seconds: float, strict: bool, interrupted: bool) -> StageRun:
    verdict = judge(results, strict=strict)
    if interrupted:
        status, reason = INTERRUPTED, "interrupted (Ctrl-C or SIGTERM)"
    elif verdict.passed:
        words = {"PASS": "passed", "WARN": "warning(s)", "SKIP": "skipped"}
        status, reason = (
            PASSED,
            ", ".join(f"{verdict.counts[k]} {w}" for k, w in words.items() if verdict.counts.get(k)),
        )
    else:
        first = next((r for r in results if r.status >= Status.FAIL), None)
        status, reason = FAILED, verdict.reason + (f": {first.check}: {first.summary}" if first is not None else "")
    return StageRun(stage.name, stage.title, stage.needs, status, reason, tuple(results), seconds, verdict)


# --- the gate ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class GateRun:
    """A finished gate: every stage's outcome, the verdict, the fingerprint and the figures."""

    request: GateRequest
    run_id: str
    spec: Spec | None
    stages: tuple[StageRun, ...]
    verdict: Verdict
    started: float
    duration_s: float
    fingerprint: fp.Fingerprint | None
    smoke_runs: Mapping[str, smokerun.SmokeRun]
    verify_run: verify_flow.VerifyRun | None
    interrupted: bool = False
    usage: str | None = None

    @property
    def results(self) -> list[Result]:
        return [r for stage in self.stages for r in stage.results]

    @property
    def exit_code(self) -> ExitCode:
        return self.verdict.exit_code

    def stage(self, name: str) -> StageRun:
        return next(s for s in self.stages if s.name == name)

    def document(self) -> dict[str, Any]:
        extra = {"run_id": self.run_id, "gate": self._gate_part()}
        doc = report_document(
            "gate",
            self.results,
            self.verdict,
            spec=self.spec,
            started=self.started,
            duration_s=self.duration_s,
            extra=extra,
        )
        doc["results"] = [{**r.to_dict(), "stage": s.name} for s in self.stages for r in s.results]
        if self.spec is None:
            doc["lock"] = {"name": None, "path": str(self.request.spec_path or default_spec_path()), "sha256": None}
        return doc

    def _gate_part(self) -> dict[str, Any]:
        request = {
            k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
            for k, v in dataclasses.asdict(self.request).items()
        }
        return {
            "schema": SCHEMA,
            "request": request,
            "interrupted": self.interrupted,
            "usage_error": self.usage,
            "stages": [s.to_dict() for s in self.stages],
            "fingerprint": self.fingerprint.to_dict() if self.fingerprint else None,
            "benchmark": self._benchmark(),
            "phases_s": {k: round(v, 3) for k, v in self.verify_run.phases.items()} if self.verify_run else {},
            "smoke": {name: done.document()["smoke"] for name, done in self.smoke_runs.items()},
        }

    def _benchmark(self) -> dict[str, Any] | None:
        done = self.smoke_runs.get("benchmark")
        if done is None or done.figures is None or self.spec is None:
            return None
        bench = self.spec.benchmark
        verdict = next((r for r in done.results if r.check == "smoke.benchmark"), None)
        floor = bench.floor_tok_s
        judged = {
            "baseline_tok_s": bench.baseline_tok_s,
            "max_regression": bench.max_regression,
            "floor_tok_s": round(floor, 3) if floor else None,
        }
        return {
            **done.figures.to_dict(),
            **judged,
            "status": verdict.status.name if verdict else None,
            "summary": verdict.summary if verdict else None,
        }


def run_gate(
    request: GateRequest,
    ui: UI,
    *,
    environ: Mapping[str, str] | None = None,
    nvml_lib: ModuleType | None = None,
    stages: Sequence[GateStage] = STAGES,
) -> GateRun:
    """Run the stages and judge them; never raises for what it finds (see :func:`run`)."""
    started, clock = time.time(), time.monotonic()
    run_id = history.new_id("gate", started)
    ctx = GateContext(
        request, ui, dict(os.environ if environ is None else environ), nvml_lib, _run_dir(request, run_id)
    )
    launched.reap_and_tell(ui.warn)  # before verify: what a run killed outright left holds GPUs and ports
    try:
        outcomes, interrupted = _stage_runs(stages, ctx)
        finger = (
            None
            if interrupted or ctx.spec is None or ctx.usage
            else fp.from_facts(ctx.spec, ctx.facts, _server_info(ctx), ctx.verify_run.results if ctx.verify_run else ())
        )
    finally:
        ctx.close()
    verdict = judge([r for s in outcomes for r in s.results], strict=request.strict)
    if ctx.usage is not None:
        verdict = Verdict(ExitCode.USAGE, verdict.counts, f"the gate cannot run: {ctx.usage.splitlines()[0]}")
    elif interrupted:
        where = next(s.name for s in outcomes if s.status == INTERRUPTED)
        verdict = Verdict(ExitCode.INTERRUPTED, verdict.counts, f"interrupted (Ctrl-C or SIGTERM) during {where}")
    return GateRun(
        request,
        run_id,
        ctx.spec,
        tuple(outcomes),
        verdict,
        started,
        time.monotonic() - clock,
        finger,
        dict(ctx.smoke_runs),
        ctx.verify_run,
        interrupted,
        ctx.usage,
    )


def _run_dir(request: GateRequest, run_id: str) -> Path:
    if request.run_dir is not None:
        return request.run_dir
    return settings.LOG_DIR.value().resolve() / "gate" / run_id


def _server_info(ctx: GateContext) -> Mapping[str, Any] | None:
    """What the engine reported, from the last smoke stage that read it."""
    for name in ("benchmark", "fast_smoke"):
        done = ctx.smoke_runs.get(name)
        if done is not None and done.server_info is not None:
            return done.server_info
    return None
