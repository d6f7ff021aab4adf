"""`stackgate provision` and `stackgate rollback`.

Provision: load the spec, take the root's lock, plan, show the plan, apply it and verify what was
built (the flow: stackgate.flows.provision). Any failure leaves ``current`` where it was; the next
run removes what was half built and builds again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from stackgate.flows.provision import (
    Built,
    ProvisionError,
    advice,
    after_build,
    apply,
    command_line,
    drift_of,
    known_failures,
    load_buildable,
    make_plan,
    other_spec,
    refusal,
    sweep,
)
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.models.finding import Finding
from stackgate.models.spec import Spec
from stackgate.render.ui import UI
from stackgate.stack import generations, guard, patching, pyenv, toolkit
from stackgate.stack.plan import AREAS, Plan

__all__ = ["ProvisionRequest", "RollbackRequest", "rollback", "run"]


@dataclass(frozen=True, kw_only=True)
class ProvisionRequest:
    spec_path: Path | None = None
    dry_run: bool = False
    only: str | None = None
    yes: bool = False
    wait: bool = False
    environ: Mapping[str, str] | None = field(default=None, compare=False)  #: default: os.environ
    wheelhouse: Path | None = None  #: install every locked file from this folder, with no index


@dataclass(frozen=True, kw_only=True)
class RollbackRequest:
    spec_path: Path | None = None
    force: bool = False  #: switch even to a generation that no longer holds what it was built from
    environ: Mapping[str, str] | None = field(default=None, compare=False)  #: default: os.environ


def _load(spec_path: Path | None) -> Spec:
    return load_buildable(spec_path, "--lock", "provision")


def run(request: ProvisionRequest, ui: UI) -> ExitCode:
    """The provision command: plan, show, apply, check, switch, verify."""
    if request.only is not None and request.only not in AREAS:
        raise UsageError(f"--only must be one of {', '.join(AREAS)}, not {request.only!r}")
    spec = _load(request.spec_path)
    environ = dict(os.environ if request.environ is None else request.environ)
    root = spec.python.root
    assert root is not None
    if request.dry_run:
        the_plan = make_plan(spec, generations.read(root), environ, only=request.only, wheelhouse=request.wheelhouse)
        _show(the_plan, ui)
        return ExitCode.REFUSED if the_plan.blockers else ExitCode.PASSED
    # A root never provisioned is planned (and the plan shown, judged, confirmed) before its
    # lock is taken: a refusal then leaves no root and no lock file behind.
    first = None
    if not (root / generations.LOCK_FILE).exists():
        first = make_plan(spec, generations.read(root), environ, only=request.only, wheelhouse=request.wheelhouse)
        refused = _decide(first, request, ui)
        if refused is not None:
            return refused
    try:
        with generations.exclusive(
            root, wait=request.wait, command=command_line(), on_wait=ui.info, busy_advice="wait for it, or pass --wait"
        ):
            sweep(root, ui)
            return _provision(spec, request, environ, ui, first)
    except generations.GenerationError as exc:  # the root cannot be locked (another provision holds it)
        ui.error(f"stackgate provision: {exc}")
        return ExitCode.REFUSED
    except PermissionError as exc:
        ui.error(f"stackgate provision: {exc}")
        return ExitCode.FAILED


def _decide(the_plan: Plan, request: ProvisionRequest, ui: UI) -> ExitCode | None:
    """Show the plan; the exit code when it is not to be applied (nothing to do, blocked, not
    confirmed), None when it is."""
    if the_plan.empty:
        ui.line(f"nothing to do: {the_plan.spec.name} is provisioned as locked")
        for line in the_plan.in_place:
            ui.line(f"  {line}")
        return ExitCode.PASSED
    _show(the_plan, ui)
    if the_plan.blockers:
        return ExitCode.REFUSED
    if not request.yes and not _confirmed(the_plan, ui):
        ui.line("nothing was changed")
        return ExitCode.REFUSED
    return None


def _provision(
    spec: Spec, request: ProvisionRequest, environ: dict[str, str], ui: UI, first: Plan | None = None
) -> ExitCode:
    """Plan and apply under the root's lock; ``first``, the plan already decided on for a root
    never provisioned, is applied as it is while the root still holds no generation."""
    assert spec.python.root is not None
    state = generations.read(spec.python.root)
    the_plan = first if first is not None and not state.generations and state.current is None else None
    if the_plan is None:
        the_plan = make_plan(spec, state, environ, only=request.only, wheelhouse=request.wheelhouse)
        refused = _decide(the_plan, request, ui)
        if refused is not None:
            return refused
    try:
        apply(the_plan, state, environ, ui, wheelhouse=request.wheelhouse)
    except (ProvisionError, pyenv.PyenvError, guard.GuardError) as exc:
        return _failed(exc, exc.log, exc.tail, state, ui, known_failures(exc.log, spec))
    except (toolkit.ToolkitError, patching.PatchError) as exc:
        return _failed(exc, None, (), state, ui)  # their text names the log and its last lines
    except OSError as exc:  # a full disk, a vanished folder
        return _failed(exc, None, (), state, ui)
    return _verify_built(spec, the_plan, request, environ, ui)


def _failed(
    exc: BaseException,
    log: Path | None,
    tail: tuple[str, ...],
    before: generations.RootState,
    ui: UI,
    findings: Sequence[Finding] = (),
) -> ExitCode:
    ui.tail(f"stackgate provision failed: {exc}", log, tail, findings)
    now = generations.read(before.root).current
    link = before.root / "current"
    if (now.path if now else None) == (before.current.path if before.current else None):
        ui.error(f"{link} is unchanged; {advice(exc)}")
    else:
        ui.error(
            f"{link} was switched to {now.id if now else '(nothing)'} before the failure; "
            "`stackgate rollback` goes back"
        )
    return ExitCode.FAILED


def _verify_built(
    spec: Spec, the_plan: Plan, request: ProvisionRequest, environ: Mapping[str, str], ui: UI
) -> ExitCode:
    """Plan again (nothing may be left to do) and verify what was built; say what still differs."""
    built = after_build(Built(spec, the_plan, environ, ui, only=request.only, wheelhouse=request.wheelhouse))
    code = ExitCode.PASSED
    done = built.verified
    if done is not None:
        ui.results(
            f"stackgate provision: verify {spec.name} after provisioning", done.results, done.verdict, done.duration_s
        )
        code = done.verdict.exit_code
    if built.left:
        ui.error("the machine still differs from the lock: " + "; ".join(built.left))
        return ExitCode.FAILED
    return code


def _show(the_plan: Plan, ui: UI) -> None:
    for line in the_plan.lines():
        ui.line(line)


def _confirmed(the_plan: Plan, ui: UI) -> bool:
    answer = ui.confirm(f"apply these {len(the_plan.steps)} steps?")
    if answer is None:
        raise UsageError(
            "the plan changes this machine and there is no terminal to ask: "
            "pass --yes (or --dry-run to only see the plan)"
        )
    return answer


def rollback(request: RollbackRequest, ui: UI) -> ExitCode:
    """Switch ``current`` back to the previous good generation and say to which; refuse one
    that no longer holds what it was built from, unless forced. A refusal (nothing to roll back,
    the root busy, a generation that drifted) changes nothing and exits :attr:`ExitCode.REFUSED`."""
    spec = _load(request.spec_path)
    root = spec.python.root
    assert root is not None
    environ = dict(os.environ if request.environ is None else request.environ)
    if not root.is_dir():
        ui.error(f"stackgate rollback: nothing to roll back: {root} does not exist")
        return ExitCode.REFUSED
    try:
        with generations.exclusive(
            root, wait=False, command=command_line(), busy_advice="run `stackgate rollback` again once it has finished"
        ):
            sweep(root, ui)
            target = generations.rollback_target(generations.read(root))
            drift = drift_of(spec, target, environ)
            if drift and not request.force:
                ui.error(refusal(target, drift))
                return ExitCode.REFUSED
            before, after = generations.rollback(root, target)
    except generations.GenerationError as exc:
        ui.error(f"stackgate rollback: {exc}")
        return ExitCode.REFUSED
    ui.line(f"rolled back {root / 'current'}: {before.id} -> {after.describe()}")
    if drift:
        ui.warn(f"  switched anyway (--force), though it differs from what it was built from: {'; '.join(drift)}")
    other = other_spec(spec, (after.marker or {}).get("lock", {}))
    if other:
        ui.line(f"  it was built from {other}; `stackgate provision` would rebuild it")
    ui.line("  `stackgate verify` checks it; `stackgate provision` builds from the lock again")
    return ExitCode.PASSED
