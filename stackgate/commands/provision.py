"""`stackgate provision` and `stackgate rollback`.

Provision: load the lock, take the root's lock, gather the facts the plan needs, plan, show the
plan, apply only its steps, check a new generation before switching to it, then gather the facts
again and run the verify checks that cover what was built. Any failure leaves ``current`` where
it was; the next run removes what was half built and builds again.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence, TypeVar

from stackgate.commands import diagnose
from stackgate.edges import fetch
from stackgate.facts import Missing, gather
from stackgate.facts.compare import environment_drift
from stackgate.flows.provision import (
    LIVE_ACTIONS,
    ProvisionError,
    ProvisionRequest,
    _make_plan,
    _verify_built,
    apply,
    plan_for,
    split_live,
)
from stackgate.models import knowledge, pylock
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.models.finding import Finding
from stackgate.models.spec import Spec, load_spec
from stackgate.render.ui import UI
from stackgate.stack import generations, guard, patches, pyenv, toolkit
from stackgate.stack.plan import AREAS, Plan

__all__ = [
    "LIVE_ACTIONS",
    "ProvisionError",
    "ProvisionRequest",
    "ProvisionUsageError",
    "RollbackRequest",
    "apply",
    "plan_for",
    "rollback",
    "run",
    "split_live",
]

_E = TypeVar("_E", bound=BaseException)


class ProvisionUsageError(UsageError):
    """A request provision cannot take (exit 2): nothing was changed."""


@dataclass(frozen=True, kw_only=True)
class RollbackRequest:
    lock_path: Path | None = None
    force: bool = False  #: switch even to a generation that no longer holds what it was built from
    environ: Mapping[str, str] | None = field(default=None, compare=False)  #: default: os.environ


def _load(lock_path: Path | None) -> Spec:
    lock = load_spec(lock_path)
    # Generations keep the path they were built from: one relative to this shell's directory
    # would mean nothing to a later command run elsewhere.
    lock = dataclasses.replace(lock, path=Path(os.path.abspath(lock.path)))
    pylock.check_beside(lock)
    if lock.python.root is None:
        raise ProvisionUsageError(
            f"{lock.path}: python.interpreter names an existing environment ({lock.python.interpreter}); "
            "provision builds only a stackgate-managed one: set python.root instead"
        )
    return lock


def run(request: ProvisionRequest, ui: UI) -> ExitCode:
    """The provision command: plan, show, apply, check, switch, verify."""
    if request.only is not None and request.only not in AREAS:
        raise ProvisionUsageError(f"--only must be one of {', '.join(AREAS)}, not {request.only!r}")
    lock = _load(request.lock_path)
    environ = dict(os.environ if request.environ is None else request.environ)
    root = lock.python.root
    assert root is not None
    if request.dry_run:
        the_plan = _make_plan(lock, generations.read(root), request, environ)
        _show(the_plan, ui)
        return _blocked(the_plan) or ExitCode.PASSED
    # A root never provisioned is planned (and the plan shown, judged, confirmed) before its
    # lock is taken: a refusal then leaves no root and no lock file behind.
    first = None
    if not (root / generations.LOCK_FILE).exists():
        first = _make_plan(lock, generations.read(root), request, environ)
        refused = _decide(first, request, ui)
        if refused is not None:
            return refused
    try:
        with generations.exclusive(
            root, wait=request.wait, command=_command_line(), on_wait=ui.info, busy_advice="wait for it, or pass --wait"
        ):
            _sweep(root, ui)
            return _provision(lock, request, environ, ui, first)
    except (generations.GenerationError, PermissionError) as exc:
        ui.error(f"stackgate provision: {exc}")
        return ExitCode.FAILED


def _decide(the_plan: Plan, request: ProvisionRequest, ui: UI) -> ExitCode | None:
    """Show the plan; the exit code when it is not to be applied (nothing to do, blocked, not
    confirmed), None when it is."""
    if the_plan.empty:
        ui.line(f"nothing to do: {the_plan.lock.name} is provisioned as locked")
        for line in the_plan.in_place:
            ui.line(f"  {line}")
        return ExitCode.PASSED
    _show(the_plan, ui)
    if the_plan.blockers:
        return _blocked(the_plan) or ExitCode.FAILED
    if not request.yes and not _confirmed(the_plan, ui):
        ui.line("nothing was changed")
        return ExitCode.FAILED
    return None


def _provision(
    lock: Spec, request: ProvisionRequest, environ: dict[str, str], ui: UI, first: Plan | None = None
) -> ExitCode:
    """Plan and apply under the root's lock; ``first``, the plan already decided on for a root
    never provisioned, is applied as it is while the root still holds no generation."""
    assert lock.python.root is not None
    state = generations.read(lock.python.root)
    the_plan = first if first is not None and not state.generations and state.current is None else None
    if the_plan is None:
        the_plan = _make_plan(lock, state, request, environ)
        refused = _decide(the_plan, request, ui)
        if refused is not None:
            return refused
    try:
        apply(the_plan, state, environ, ui, wheelhouse=request.wheelhouse)
    except (ProvisionError, pyenv.PyenvError, guard.GuardError) as exc:
        return _failed(exc, exc.log, exc.tail, state, ui, _known_failures(exc.log, lock))
    except (toolkit.ToolkitError, patches.PatchError) as exc:
        return _failed(exc, None, (), state, ui)  # their text names the log and its last lines
    except OSError as exc:  # a full disk, a vanished folder
        return _failed(exc, None, (), state, ui)
    return _verify_built(lock, the_plan, request, environ, ui)


def _known_failures(log: Path | None, lock: Spec) -> list[Finding]:
    """What the knowledge base knows of a failed step, read from its full log (installer output)."""
    if log is None:
        return []
    try:
        done = diagnose.diagnose([(str(log), lambda: open(log, "rb"))], knowledge.lock_context(lock), stage="provision")
    except diagnose.DiagnoseUsageError:
        return []  # the log is gone: the tail shown is all there is
    return list(done.findings)


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
        ui.error(f"{link} is unchanged; {_advice(exc)}")
    else:
        ui.error(
            f"{link} was switched to {now.id if now else '(nothing)'} before the failure; `stackgate rollback` goes back"
        )
    return ExitCode.FAILED


def _advice(exc: BaseException) -> str:
    """What to do before the next run: most failures a plain re-run repeats exactly."""
    again = "then `stackgate provision` again (it removes what was half built)"
    full = _caused_by(exc, OSError)
    if isinstance(exc, guard.GuardError):
        return f"a re-run is blocked the same way: change the lock as said above, {again}"
    if _caused_by(exc, fetch.HashMismatch) is not None:
        return f"a re-run refuses the same file: make the pylock again (stackgate lock) only if you trust the file; {again}"
    if full is not None and full.errno == errno.ENOSPC:
        return f"free space on that disk, {again}"
    if isinstance(exc, pyenv.PyenvError) and exc.unreachable:
        return f"a re-run fails the same way while {', '.join(exc.unreachable)} does not answer: check the URL in the lock and this machine's network; {again}"
    if _caused_by(exc, fetch.FetchError) is not None:
        return "check that the URL answers from this machine; `stackgate provision` again resumes the download"
    if isinstance(exc, ProvisionError) and exc.checks_failed:
        return (
            f"a re-run builds the same generation: fix what the checks name (in the lock or on this machine), {again}"
        )
    return f"fix the cause above, {again}"


def _caused_by(exc: BaseException, kind: type[_E]) -> _E | None:
    """``exc`` or the first exception of ``kind`` it was raised from."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, kind):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _sweep(root: Path, ui: UI) -> None:
    removed = generations.sweep(root)
    if removed:
        ui.info(f"removed what an interrupted run left: {', '.join(str(p) for p in removed)}")


def _show(the_plan: Plan, ui: UI) -> None:
    for line in the_plan.lines():
        ui.line(line)


def _blocked(the_plan: Plan) -> ExitCode | None:
    if not the_plan.blockers:
        return None
    return ExitCode.USAGE if any(b.usage for b in the_plan.blockers) else ExitCode.FAILED


def _confirmed(the_plan: Plan, ui: UI) -> bool:
    answer = ui.confirm(f"apply these {len(the_plan.steps)} steps?")
    if answer is None:
        raise ProvisionUsageError(
            "the plan changes this machine and there is no terminal to ask: pass --yes (or --dry-run to only see the plan)"
        )
    return answer


def _command_line() -> str:
    """How this process was started, for the holder line another provision prints."""
    if not sys.argv:
        return "stackgate"
    program = Path(sys.argv[0])
    name = program.parent.name if program.name == "__main__.py" else program.name  # python -m invoke
    return shlex.join([name, *sys.argv[1:]])


# --- applying a plan ----------------------------------------------------------------------------


# --- after applying -----------------------------------------------------------------------------


# --- rollback -----------------------------------------------------------------------------------


def rollback(request: RollbackRequest, ui: UI) -> ExitCode:
    """Switch ``current`` back to the previous good generation and say to which; refuse one
    that no longer holds what it was built from, unless forced."""
    lock = _load(request.lock_path)
    root = lock.python.root
    assert root is not None
    environ = dict(os.environ if request.environ is None else request.environ)
    if not root.is_dir():
        ui.error(f"stackgate rollback: nothing to roll back: {root} does not exist")
        return ExitCode.FAILED
    try:
        with generations.exclusive(
            root, wait=False, command=_command_line(), busy_advice="run `stackgate rollback` again once it has finished"
        ):
            _sweep(root, ui)
            target = generations.rollback_target(generations.read(root))
            drift = _drift_of(lock, target, environ)
            if drift and not request.force:
                ui.error(_refusal(target, drift))
                return ExitCode.FAILED
            before, after = generations.rollback(root, target)
    except generations.GenerationError as exc:
        ui.error(f"stackgate rollback: {exc}")
        return ExitCode.FAILED
    ui.line(f"rolled back {root / 'current'}: {before.id} -> {after.describe()}")
    if drift:
        ui.warn(f"  switched anyway (--force), though it differs from what it was built from: {'; '.join(drift)}")
    other = _other_lock(lock, (after.marker or {}).get("lock", {}))
    if other:
        ui.line(f"  it was built from {other}; `stackgate provision` would rebuild it")
    ui.line("  `stackgate verify` checks it; `stackgate provision` builds from the lock again")
    return ExitCode.PASSED


def _other_lock(lock: Spec, built_from: Mapping[str, Any]) -> str | None:
    """What a generation was built from when it is not this lock: another lock file (named), or
    another version of this one; None when it is this lock or the marker does not say."""
    sha256, path = built_from.get("sha256"), built_from.get("path")
    if path and Path(str(path)) != lock.path:
        return f"another lock file, {path}" + (f" (sha256 {str(sha256)[:12]})" if sha256 else "")
    if sha256 and sha256 != lock.sha256:
        return f"another version of the lock (sha256 {str(sha256)[:12]})"
    return None


def _drift_of(lock: Spec, generation: generations.Generation, environ: Mapping[str, str]) -> list[str]:
    """How a generation's environment differs from what it was built from (its marker's spec):
    its pins, the frozen packages its guard holds, conflicts; and whether its guard is there."""
    try:
        python = pyenv.built_python(lock.python, (generation.marker or {}).get("spec"), generation.python)
    except ValueError as exc:
        return [f"its {generations.MARKER} does not say what it was built from ({exc})"]
    built = dataclasses.replace(lock, python=python)
    facts = gather(built, ["dists"], environ=environ)
    try:
        dists = facts.dists
    finally:
        facts.close()
    drift = [dists.reason] if isinstance(dists, Missing) else environment_drift(built, dists, _built_pylock(generation))
    if python.frozen and not (generation.path / guard.CONSTRAINTS).is_file():
        drift.append(f"its guard ({guard.CONSTRAINTS}) is missing")
    return drift


def _built_pylock(generation: generations.Generation) -> pylock.Resolution | None:
    """The pylock a generation was built from (its own copy); None for one built before pylocks."""
    try:
        return pylock.load(generation.path / pyenv.BUILT_PYLOCK)
    except pylock.PylockError:
        return None


def _refusal(target: generations.Generation, drift: list[str]) -> str:
    more = f" (and {len(drift) - 4} more)" if len(drift) > 4 else ""
    return (
        f"stackgate rollback: not switching to generation {target.id}: it no longer holds what it was built from: "
        f"{'; '.join(drift[:4])}{more}. `stackgate provision` builds a good generation from the lock; "
        "`stackgate rollback --force` switches to this one anyway"
    )
