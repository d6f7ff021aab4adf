"""The upgrade flow: plan, build beside, verify, A/B, decide, switch; one node's upgrade.

- plan: what changes between the live generation (its spec, its own copy of the pylock) and the
  new spec: toolkits, every distribution that moves, the spec's other inputs, patches, ``[env]``
  and smoke's flags; with the provision steps that would build it (``--dry-run`` stops here).
- build: provision's own steps, without those that change what is live (the switch of
  ``current``, the ``/usr/local/cuda`` link, in-place edits); a new toolkit goes beside the others.
- verify: provision's build checks, then ``verify``'s static and deep checks against the new
  generation's interpreter. One that fails is marked failed and kept for inspection, never
  switched or rolled back to, and nothing is measured on it.
- ab: the live generation and the new one launched one after the other on the same GPUs, with
  the same model and the same benchmark, in alternated order (ABBA), each leg a full smoke
  (decode tok/s, the server's resolved configuration, the flags' evidence in the log, greedy
  outputs). Each leg's servers are torn down before the next starts.
- decide (``--switch``): ``if-better`` switches only when the new stack passes everything, gives
  the same greedy tokens (or ``--accept-output-change``) and is not slower beyond the measured
  noise; ``if-passes`` when it passes; ``never`` only reports.
- switch: the live steps of the new spec's plan.

The stages after the plan are :data:`STAGES`, run in turn by flows/stages.py's loop. ``current``
changes only in the switch, atomically, holding the root's provision lock for the whole run; a
kill at any point leaves it serving the old stack (servers die with their parent), and the next
provision or upgrade removes what was half built. :func:`upgrade_node` is the entry point the
command and a fleet (a canary first) call per node. The request and the run's record (its results
and JSON document) are :mod:`stackgate.flows.upgraderun`'s, importable from here.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping

from stackgate.edges import faults, runner
from stackgate.facts import gather
from stackgate.facts.compare import environment_spec
from stackgate.flows import provision, smoke, smokerun
from stackgate.flows import verify as verifyflow
from stackgate.flows.stages import FAILED, Stage, run_stages
from stackgate.flows.upgraderun import (
    BUILD_ERRORS,
    SCHEMA,
    UpgradeRequest,
    UpgradeRun,
    check_request,
)
from stackgate.models import pylock, settings
from stackgate.models.exitcodes import UsageError
from stackgate.models.result import Status
from stackgate.models.spec import Accuracy, Benchmark, Spec
from stackgate.render import upgradereport as upgrade_render
from stackgate.render.ui import UI
from stackgate.runs import abtest, history, stackdiff
from stackgate.runs import fingerprint as fp
from stackgate.serve import launch, launched
from stackgate.stack import generations, pyenv

__all__ = [
    "SCHEMA",
    "STAGES",
    "UpgradeRequest",
    "UpgradeRun",
    "check_request",
    "upgrade_node",
]

# --- one node ---------------------------------------------------------------------------------


def upgrade_node(request: UpgradeRequest, ui: UI, *, nvml_lib: ModuleType | None = None) -> UpgradeRun:
    """Plan, build beside, verify, A/B, decide, switch: this node's upgrade. Never raises for what
    it finds; UpgradeUsage (nothing changed) for a request it cannot take. Ctrl-C ends it with
    ``interrupted`` set, every server and installer stopped and ``current`` as it was."""
    check_request(request)
    environ = dict(os.environ if request.environ is None else request.environ)
    started, clock = time.time(), time.monotonic()
    done = _plan(request, environ, started)
    for line in done.plan_lines:
        ui.line(line)
    if not done.changes and not done.blocked:
        ui.line(f"nothing to upgrade: the live generation {done.live_generation.id} already is {request.to}'s stack")
    if request.dry_run or done.blocked or not done.changes:
        done.duration_s = time.monotonic() - clock
        return done
    launched.reap_and_tell(ui.warn)  # what a run killed outright left would skew the A/B
    try:
        with generations.exclusive(
            done.root,
            wait=False,
            command=f"stackgate upgrade --to {request.to}",
            busy_advice="run `stackgate upgrade` again once it has finished",
        ):
            _sweep(done.root, ui)
            _run_stages(done, environ, ui, nvml_lib)
    except KeyboardInterrupt:
        runner.terminate_all()
        done.interrupted = True
    except generations.GenerationError as exc:
        done.blocked = str(exc)
    done.duration_s = time.monotonic() - clock
    return done


def _sweep(root: Path, ui: UI) -> None:
    removed = generations.sweep(root)
    if removed:
        ui.info(f"removed what an interrupted run left: {', '.join(str(p) for p in removed)}")


@dataclass(frozen=True)
class _Upgrading:
    """One node's upgrade under way: the run its stages fill, and what every stage reads besides."""

    done: UpgradeRun
    environ: dict[str, str]
    ui: UI
    nvml_lib: ModuleType | None


def _run_stages(done: UpgradeRun, environ: dict[str, str], ui: UI, nvml_lib: ModuleType | None) -> None:
    """Each of :data:`STAGES` in turn, until one fails (the rest stand on it); ``step`` is ``done`` after the last."""

    def begin(stage: Stage[_Upgrading]) -> None:
        done.step = stage.name

    records = run_stages(STAGES, _Upgrading(done, environ, ui, nvml_lib), begin=begin)
    if all(r.status != FAILED for r in records):
        done.step = "done"


def _build_stage(state: _Upgrading) -> bool:
    done = state.done
    if _build(done, state.environ, state.ui) is not None:
        return True
    done.decision = abtest.not_measured(
        done.request.switch, f"the new generation was not built: {done.build.get('reason')}"
    )
    return False


def _verify_stage(state: _Upgrading) -> bool:
    done = state.done
    assert done.new_generation is not None
    if _verify(done, done.new_generation, state.environ, state.ui, state.nvml_lib):
        return True
    bad = [f"{r.check}: {r.summary}" for r in done.verify_results if r.status >= Status.FAIL]
    done.decision = abtest.not_measured(
        done.request.switch,
        f"the new generation failed verify, so it was not launched: {'; '.join(bad[:3]) or done.build.get('verify')}",
    )
    return False


def _ab_stage(state: _Upgrading) -> None:
    _ab(state.done, state.environ, state.ui, state.nvml_lib)


def _decide_stage(state: _Upgrading) -> None:
    done = state.done
    live, new = abtest.side(abtest.LIVE, done.measured), abtest.side(abtest.NEW, done.measured)
    done.decision = abtest.decide(
        done.request.switch, live, new, accept_output_change=done.request.accept_output_change
    )


def _switch_stage(state: _Upgrading) -> None:
    _switch(state.done, state.environ, state.ui)


def _unless_switching(state: _Upgrading) -> str | None:
    decision = state.done.decision
    return None if decision is not None and decision.switch else "the decision is not to switch"


#: The upgrade after its plan, in order, each standing on the one before; the run's ``step`` names the
#: stage it is in (or stopped at); a fault point ``before:upgrade.<name>`` precedes each but the decision.
STAGES: tuple[Stage[_Upgrading], ...] = (
    Stage("build", _build_stage, fault="before:upgrade.build"),
    Stage("verify", _verify_stage, needs=("build",), fault="before:upgrade.verify"),
    Stage("ab", _ab_stage, needs=("verify",), fault="before:upgrade.ab"),
    Stage("decide", _decide_stage, needs=("ab",)),
    Stage("switch", _switch_stage, needs=("decide",), left_out=_unless_switching, fault="before:upgrade.switch"),
)


# --- the plan --------------------------------------------------------------------------------


def _plan(request: UpgradeRequest, environ: Mapping[str, str], started: float) -> UpgradeRun:
    new = _load(request.to, "--to")
    root = new.python.root
    assert root is not None
    state = generations.read(root)
    live_generation = state.current
    if live_generation is None:
        why = state.current_error or f"{root / 'current'} does not exist"
        raise UsageError(
            f"nothing live to upgrade: {why}; provision builds a first stack",
            hint=f"stackgate provision --lock {request.to}",
        )
    live = _live_spec(request.spec_path, live_generation)
    if live.python.root is None or Path(os.path.abspath(live.python.root)) != Path(os.path.abspath(root)):
        raise UsageError(
            f"{request.to}: python.root is {root}, but the live spec {live.path} has {live.python.root}: "
            "an upgrade builds beside the live stack, under the same root"
        )
    the_plan = provision.plan_for(new, state, environ)
    beside, _ = provision.split_live(the_plan)
    changes = stackdiff.changes(
        live,
        (live_generation.marker or {}).get("spec"),
        _built_pylock(live_generation),
        new,
        environment_spec(new),
        _pylock_of(new),
    )
    done = UpgradeRun(
        request, history.new_id("upgrade", started), started, root, live, new, live_generation, changes, []
    )
    done.plan_lines = upgrade_render.plan_lines(
        done.live_generation.id, live.path, new.path, [c.to_dict() for c in changes], beside.lines()
    )
    usage = [b for b in the_plan.blockers if b.usage]
    if usage:  # the new spec cannot be built as it is (no pylock, a stale one, a patch file): nothing changed
        fix = f" ({usage[0].fix.text} `{usage[0].fix.commands[0]}`)" if usage[0].fix and usage[0].fix.commands else ""
        raise UsageError(f"{request.to}: {'; '.join(b.message for b in usage)}{fix}")
    if the_plan.blockers:
        done.blocked = "; ".join(b.message for b in the_plan.blockers)
    return done


def _load(path: Path | None, option: str) -> Spec:
    return provision.load_buildable(path, option, "upgrade")


def _live_spec(path: Path | None, live: generations.Generation) -> Spec:
    if path is not None:
        return _load(path, "--lock")
    built_from = (live.marker or {}).get("lock", {}).get("path")
    if not built_from or not Path(built_from).is_file():
        raise UsageError(
            f"the live {live.describe()} does not name a spec that still exists "
            f"({built_from or 'none recorded'}): pass it with --lock LIVE_SPEC"
        )
    return _load(Path(built_from), "--lock")


def _built_pylock(generation: generations.Generation) -> pylock.Resolution | None:
    try:
        return pylock.load(generation.path / pyenv.BUILT_PYLOCK)
    except pylock.PylockError:
        return None


def _pylock_of(spec: Spec) -> pylock.Resolution | None:
    try:
        return pylock.load_beside(spec)
    except pylock.PylockError:
        return None


# --- build beside, verify --------------------------------------------------------------------


def _build(done: UpgradeRun, environ: dict[str, str], ui: UI) -> generations.Generation | None:
    """Provision's steps, less those that change what is live; the generation built (or the live
    one, when the new spec's environment is the live one's), None when the build failed."""
    state = generations.read(done.root)
    beside, _ = provision.split_live(provision.plan_for(done.new_spec, state, environ))
    if beside.blockers:
        done.build = {"status": "failed", "reason": "; ".join(b.message for b in beside.blockers)}
        return None
    try:
        built = provision.apply(beside, state, environ, ui) if beside.steps else None
    except BUILD_ERRORS as exc:
        _failed_build(done, exc)
        return None
    if beside.generation is None:
        done.new_generation = done.live_generation
        done.build = {
            "status": "not needed",
            "reason": f"the live generation {done.live_generation.id} already holds the new spec's Python stack",
        }
        return done.live_generation
    assert built is not None
    done.new_generation = built
    how = "resumed" if beside.resume else "built"
    done.build = {
        "status": how,
        "reason": f"generation {built.id} {how} beside {done.live_generation.id}",
        "generation": built.id,
        "path": str(built.path),
    }
    return built


def _failed_build(done: UpgradeRun, exc: BaseException) -> None:
    """A build that stopped: its generation is kept, marked failed, when its checks failed."""
    state = generations.read(done.root)
    newest = state.generations[-1] if state.generations else None
    if newest is not None and newest.path != done.live_generation.path and not newest.ready:
        done.new_generation = newest if newest.failed else generations.mark(newest, "failed", failures=[str(exc)])
    tail = list(getattr(exc, "tail", ()))[:10]
    done.build = {
        "status": "failed",
        "reason": str(exc),
        "tail": tail,
        "generation": done.new_generation.id if done.new_generation else None,
    }


def _verify(
    done: UpgradeRun, generation: generations.Generation, environ: dict[str, str], ui: UI, nvml_lib: ModuleType | None
) -> bool:
    """verify's static, then deep checks on the new generation's interpreter; a failure marks it
    failed (kept for inspection) and ends the upgrade."""
    candidate = _side_spec(done.new_spec, generation, done.new_spec.benchmark)
    static, deep = verifyflow.plan(done.request.verify_checks, deep=True)
    facts = gather(
        candidate,
        sorted({part for check in (*static, *deep) for part in check.needs}),
        environ=environ,
        nvml_lib=nvml_lib,
    )
    ran = verifyflow.verify(candidate, static, ui, facts=facts, deep=deep)  # it closes the facts
    done.verify_results = list(ran.results)
    bad = [r for r in ran.results if r.status >= Status.FAIL]
    if not ran.verdict.passed:
        if generation.path != done.live_generation.path:
            done.new_generation = generations.mark(
                generation, "failed", failures=[f"{r.check}: {r.summary}" for r in bad] or [ran.verdict.reason]
            )
        done.build["verify"] = f"failed: {ran.verdict.reason}"
        return False
    if generation.path != done.live_generation.path:
        # Built and verified: a later run (after a kill during the A/B) resumes it, not rebuilds it.
        done.new_generation = generations.mark(generation, "ready", candidate_of=done.run_id)
    done.build["verify"] = f"passed: {ran.verdict.reason}"
    return True


def _side_spec(
    spec: Spec, generation: generations.Generation, benchmark: Benchmark, accuracy: Accuracy | None = None
) -> Spec:
    """``spec`` pointed at ``generation``'s interpreter and environment file, with ``benchmark``
    (and ``accuracy``: both sides of the A/B are asked the same)."""
    python = dataclasses.replace(spec.python, interpreter=generation.python)
    return dataclasses.replace(spec, python=python, benchmark=benchmark, accuracy=accuracy or spec.accuracy)


# --- the A/B ---------------------------------------------------------------------------------


def _ab(done: UpgradeRun, environ: dict[str, str], ui: UI, nvml_lib: ModuleType | None) -> None:
    """Each leg a full smoke, in alternated order; stops at the new side's first failed leg."""
    assert done.new_generation is not None
    # One benchmark for both (the new spec's), judged against each other, not a baseline.
    bench = dataclasses.replace(done.new_spec.benchmark, baseline_tok_s=None)
    sides = {abtest.LIVE: (done.live_spec, done.live_generation), abtest.NEW: (done.new_spec, done.new_generation)}
    run_dir = done.request.run_dir or settings.LOG_DIR.value().resolve() / "upgrade" / done.run_id
    legs = abtest.order(done.request.rounds)
    for position, name in enumerate(legs, 1):
        spec, generation = sides[name]
        faults.trip(f"before:upgrade.leg{position}")
        ui.info(f"A/B leg {position}/{len(legs)}: {name} stack, generation {generation.id}")
        leg = _leg(
            done,
            name,
            position,
            _side_spec(spec, generation, bench, done.new_spec.accuracy),
            generation,
            run_dir,
            environ,
            ui,
            nvml_lib,
        )
        if name == abtest.NEW and not leg.passed:
            ui.warn(f"the new stack failed leg {position}: no further legs")
            break


def _leg(
    done: UpgradeRun,
    name: str,
    position: int,
    spec: Spec,
    generation: generations.Generation,
    run_dir: Path,
    environ: Mapping[str, str],
    ui: UI,
    nvml_lib: ModuleType | None,
) -> abtest.Leg:
    request = smokerun.SmokeRequest(
        spec_path=spec.path, model=done.request.model, benchmark=True, run_dir=run_dir / f"{position}-{name}"
    )
    try:
        ran = smoke.run_smoke(spec, request, ui, environ=environ, nvml_lib=nvml_lib)
    except smokerun.SmokeInterrupted as stop:
        _record(done, name, position, generation, stop.run)
        raise KeyboardInterrupt from None
    except launch.LaunchError as exc:
        leg = abtest.Leg(name, position, False, (), failures=(f"smoke.usage: {exc}",))
        done.measured.append(leg)
        done.legs.append(
            {
                "side": name,
                "position": position,
                "generation": generation.id,
                "passed": False,
                "failures": list(leg.failures),
            }
        )
        return leg
    return _record(done, name, position, generation, ran)


def _record(
    done: UpgradeRun, name: str, position: int, generation: generations.Generation, ran: smokerun.SmokeRun
) -> abtest.Leg:
    session = ran.sessions[-1] if ran.sessions else None
    figures = session.figures if session is not None else None
    good = figures.good if figures is not None else []
    decode = tuple(s.decode_tok_s for s in good if s.decode_tok_s is not None)
    bad = tuple(f"{r.check}: {r.summary}" for r in ran.results if r.status >= Status.FAIL)
    score = session.engine_report.score if session is not None else None
    leg = abtest.Leg(
        name,
        position,
        ran.verdict.passed and not ran.interrupted,
        decode,
        good[0].output_ids if good else (),
        bad,
        (score.right, len(score.answers)) if score is not None else None,
    )
    done.measured.append(leg)
    done.legs.append(_leg_part(leg, generation, ran))
    done.smoke_runs.append((done.legs[-1], ran))
    return leg


def _leg_part(leg: abtest.Leg, generation: generations.Generation, ran: smokerun.SmokeRun) -> dict[str, Any]:
    """A leg for the report: its figures, what the server really ran, the flags' evidence."""
    session = ran.sessions[-1] if ran.sessions else None
    info = session.server_info if session is not None else None
    figures = session.figures if session is not None else None
    evidence = [r for r in ran.results if ".evidence." in r.check]
    return {
        "side": leg.side,
        "position": leg.position,
        "generation": generation.id,
        "passed": leg.passed,
        "failures": list(leg.failures),
        "decode_tok_s": figures.decode_tok_s.to_dict() if figures is not None and figures.decode_tok_s else None,
        "attention_backend": (info or {}).get("attention_backend"),
        "findings": [f.title for f in (session.findings if session else ())],
        "server": fp.server_section(info) if info else {},
        "evidence": [{"check": r.check, "status": r.status.name, "summary": r.summary} for r in evidence],
        "evidence_lines": [dataclasses.asdict(e) for e in (session.evidence if session else ())],
        "log_path": str(session.log_path) if session is not None and session.log_path else None,
        "verdict": ran.verdict.reason,
    }


# --- the switch ------------------------------------------------------------------------------


def _switch(done: UpgradeRun, environ: dict[str, str], ui: UI) -> None:
    """The live steps of the new spec's plan, planned again now (the switch, the link, ...)."""
    state = generations.read(done.root)
    _, live = provision.split_live(provision.plan_for(done.new_spec, state, environ))
    if live.steps:
        provision.apply(live, state, environ, ui)
    now = generations.read(done.root).current
    done.current_after = now.id if now else None
