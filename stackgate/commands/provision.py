"""`stackgate provision` and `stackgate rollback`.

Provision: load the lock, take the root's lock, gather the facts the plan needs, plan, show the
plan, apply only its steps, check a new generation before switching to it, then gather the facts
again and run the verify checks that cover what was built. Any failure leaves ``current`` where
it was; the next run removes what was half built and builds again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Mapping, Sequence, TypeVar

from stackgate.checks.all import REGISTRY
from stackgate.checks.core import Check, run_checks
from stackgate.commands import diagnose
from stackgate.commands.verify import verify
from stackgate.edges import fetch
from stackgate.facts import Missing, gather
from stackgate.facts.compare import environment_drift, environment_spec
from stackgate.models import faults, knowledge, pylock
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.models.finding import Finding
from stackgate.models.result import Result, Status
from stackgate.models.spec import Spec, load_spec
from stackgate.render.ui import UI, Activity
from stackgate.stack import generations, guard, patches, pyenv, toolkit
from stackgate.stack.plan import AREAS, Plan, Step, cache_dir, plan

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

#: What a new generation must pass before ``current`` points at it (those registered).
BUILD_CHECKS = (
    "python.interpreter",
    "python.locked",
    "python.pins",
    "python.frozen",
    "python.consistency",
    "torch.build",
    "flashinfer.cubin",
    "patches.applied",
)
#: What verify checks after provisioning, per area provision touched.
VERIFY_CHECKS = {
    "toolkit": ("cuda.toolkits", "cuda.ptxas_arch"),
    "python": (*BUILD_CHECKS, "abi.imports", "abi.elf", "cuda.home", "cuda.triton_ptxas"),
    "patches": ("patches.applied",),
}
#: The steps that change what is live (an upgrade runs them only once it decided to switch).
LIVE_ACTIONS = frozenset({"toolkit.link", "python.envfile.current", "python.switch"})
PLAN_PARTS = {"toolkit": ("toolkits", "env"), "python": ("dists", "pylock"), "patches": ("dists",)}
_E = TypeVar("_E", bound=BaseException)
KEEP_LOGS = 10


class ProvisionError(Exception):
    """Provisioning failed; ``current`` is unchanged unless the message says otherwise."""

    def __init__(
        self, message: str, log: Path | None = None, tail: tuple[str, ...] = (), *, checks_failed: bool = False
    ) -> None:
        super().__init__(message)
        self.log = log
        self.tail = tail
        self.checks_failed = checks_failed  #: the new generation was built and failed its checks


class ProvisionUsageError(UsageError):
    """A request provision cannot take (exit 2): nothing was changed."""


@dataclass(frozen=True, kw_only=True)
class ProvisionRequest:
    lock_path: Path | None = None
    dry_run: bool = False
    only: str | None = None
    yes: bool = False
    wait: bool = False
    environ: Mapping[str, str] | None = field(default=None, compare=False)  #: default: os.environ
    wheelhouse: Path | None = None  #: install every locked file from this folder, with no index


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


def _make_plan(lock: Spec, state: generations.RootState, request: ProvisionRequest, environ: Mapping[str, str]) -> Plan:
    areas = (request.only,) if request.only else AREAS
    parts = sorted({part for area in areas for part in PLAN_PARTS[area]})
    facts = gather(lock, parts, environ=environ)
    try:
        wheelhouse = Path(os.path.abspath(request.wheelhouse)) if request.wheelhouse else None
        return plan(lock, facts, state, only=request.only, uv=pyenv.find_uv(), wheelhouse=wheelhouse)
    finally:
        facts.close()


def plan_for(lock: Spec, state: generations.RootState, environ: Mapping[str, str]) -> Plan:
    """What provision would do to bring this machine to ``lock`` (facts gathered now)."""
    return _make_plan(lock, state, ProvisionRequest(lock_path=lock.path), environ)


def split_live(the_plan: Plan) -> tuple[Plan, Plan]:
    """(the steps that build beside the live stack, the steps that change it: the switch).

    What changes the live stack is the switch of ``current``, the ``/usr/local/cuda`` link and
    what a plan without a new generation does in place (its environment file, its patches). A
    new toolkit goes beside the others and a new generation beside ``current``: those build."""

    def live(step: Step) -> bool:
        return step.action in LIVE_ACTIONS or (the_plan.generation is None and step.area != "toolkit")

    beside = dataclasses.replace(the_plan, steps=tuple(s for s in the_plan.steps if not live(s)))
    switch = dataclasses.replace(
        the_plan, steps=tuple(s for s in the_plan.steps if live(s)), resume=the_plan.generation is not None
    )
    return beside, switch


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


@dataclass
class Build:
    """What the steps of one provision share."""

    lock: Spec
    state: generations.RootState
    environ: dict[str, str]
    logs: Path
    the_plan: Plan
    generation: generations.Generation | None = None
    files: guard.GuardFiles | None = None
    step_number: int = 0
    wheelhouse: Path | None = None

    @property
    def root(self) -> Path:
        assert self.lock.python.root is not None
        return self.lock.python.root

    @property
    def cache(self) -> Path:
        return cache_dir(self.lock)

    def log(self, step: Step) -> Path:
        return self.logs / f"{self.step_number:02d}-{step.action}.log"


def apply(
    the_plan: Plan, state: generations.RootState, environ: dict[str, str], ui: UI, *, wheelhouse: Path | None = None
) -> generations.Generation | None:
    """Run the plan's steps in order; the first failure stops it (``current`` is only switched by
    the last step of a build). Returns the generation the plan built or resumed, if any."""
    lock = the_plan.lock
    stamp = the_plan.generation.name if the_plan.generation else time.strftime("%Y%m%dT%H%M%S")
    build = Build(
        lock,
        state,
        environ,
        _log_dir(lock, stamp),
        the_plan,
        wheelhouse=Path(os.path.abspath(wheelhouse)) if wheelhouse else None,
    )
    if the_plan.resume:
        build.generation = next(g for g in state.generations if g.path == the_plan.generation)
    with _kept_toolkits_untouched(the_plan):
        for number, step in enumerate(the_plan.steps, 1):
            build.step_number = number
            faults.trip(f"before:{step.action}")
            with ui.activity(f"[{number}/{len(the_plan.steps)}] {step.what}") as activity:
                APPLIERS[step.action](build, step, activity)
            faults.trip(f"after:{step.action}")
    return build.generation


def _log_dir(lock: Spec, stamp: str) -> Path:
    assert lock.python.root is not None
    logs = lock.python.root / "logs"
    directory = logs / stamp
    directory.mkdir(parents=True, exist_ok=True)
    for old in sorted((p for p in logs.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)[:-KEEP_LOGS]:
        for file in old.iterdir():
            file.unlink(missing_ok=True)
        old.rmdir()
    return directory


def _kept_toolkits_untouched(the_plan: Plan) -> ContextManager[object]:
    """Around toolkit installs, the toolkit module fingerprints the kept toolkits: they must not change."""
    if "toolkit" not in the_plan.areas:
        return contextlib.nullcontext()
    return toolkit.kept_untouched(the_plan.lock.toolkits)


def _run(build: Build, step: Step, activity: Activity, command: pyenv.Command) -> None:
    seen = False

    def on_line(line: str) -> None:
        nonlocal seen
        if not seen:
            seen = True
            faults.trip(f"during:{step.action}")
        activity.update(line)

    pyenv.run(command, log=build.log(step), environ=build.environ, lock=build.lock, on_line=on_line)


def _discard(build: Build, step: Step, activity: Activity) -> None:
    removed = generations.discard_unfinished(
        build.state, on_renamed=lambda doomed: faults.trip(f"during:{step.action}")
    )
    activity.update(f"removed {', '.join(g.id for g in removed)}")


def _venv(build: Build, step: Step, activity: Activity) -> None:
    base = build.the_plan.base_python
    assert base is not None and build.the_plan.generation is not None
    lock = build.lock
    about = {
        "lock": {"name": lock.name, "path": str(lock.path), "sha256": lock.sha256},
        "spec": environment_spec(lock),
        "base_python": {"path": str(base.path), "version": base.version},
    }
    build.generation = generations.create(build.the_plan.generation, about)
    for command in step.runs:
        _run(build, step, activity, command)


def _guard(build: Build, step: Step, activity: Activity) -> None:
    assert build.generation is not None
    build.files = guard.write(build.lock, build.generation.path)
    resolution = step.subject
    pyenv.write_install_files(
        resolution, build.generation.path, pyenv.local_files(resolution, build.cache / "wheels", build.wheelhouse)
    )


def _preflight(build: Build, step: Step, activity: Activity) -> None:
    """Before anything is created: every source answers, or the wheelhouse holds every file."""
    resolution, wheelhouse = step.subject
    if wheelhouse is not None:
        problems = pyenv.wheelhouse_problems(resolution, wheelhouse)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise ProvisionError(
                f"the wheelhouse {wheelhouse} cannot be installed from: {problems[0]}{more}; fill it again with `{pylock.lock_command(build.lock.path)} --wheelhouse {wheelhouse}`",
                tail=tuple(problems[:15]),
            )
        activity.update(f"{len(resolution.files)} files, sha256 as locked")
        return
    silent = pyenv.unreachable(pyenv.sources(build.lock, resolution))
    if silent:
        said = "; ".join(f"{url} does not answer ({why})" for url, why in silent.items())
        raise pyenv.PyenvError(f"{said}: nothing was created", unreachable=tuple(silent))


def _commands(build: Build, step: Step, activity: Activity) -> None:
    for command in step.runs:
        _run(build, step, activity, command)


def _fetch(build: Build, step: Step, activity: Activity) -> None:
    seen = False

    def progress(done: int, total: int | None) -> None:
        nonlocal seen
        if not seen:
            seen = True
            faults.trip(f"during:{step.action}")
        activity.transfer(done, total)

    name, file = step.subject
    path, downloaded = pyenv.fetch_wheel(
        name, file, build.cache / "wheels", on_progress=progress, on_retry=activity.ui.warn
    )
    activity.update(f"{'downloaded' if downloaded else 'cached'}: {path.name}, sha256 matches")


def _patch(build: Build, step: Step, activity: Activity) -> None:
    home = build.generation.path if build.generation is not None else _current(build).path
    patches.apply_patch(step.subject, _site_packages(home))


def _site_packages(home: Path) -> Path:
    found = sorted(home.glob("lib/python3*/site-packages"))
    if not found:
        raise ProvisionError(f"{home} has no lib/python3.*/site-packages")
    return found[0]


def _current(build: Build) -> generations.Generation:
    if build.state.current is None:
        raise ProvisionError(f"{build.root / 'current'} does not exist")
    return build.state.current


def _envfile(build: Build, step: Step, activity: Activity) -> None:
    home = build.generation.path if build.generation is not None else _current(build).path
    pyenv.write_environment(build.lock, home, build.root)


def _check(build: Build, step: Step, activity: Activity) -> None:
    """The new generation's own checks, run against its interpreter before anything points at it."""
    generation = build.generation
    assert generation is not None
    candidate = dataclasses.replace(
        build.lock, python=dataclasses.replace(build.lock.python, interpreter=generation.python)
    )
    results = _run_named(candidate, BUILD_CHECKS, build.environ)
    bad = [r for r in results if r.status >= Status.FAIL]
    if bad:
        build.generation = generations.mark(generation, "failed", failures=[f"{r.check}: {r.summary}" for r in bad])
        lines = tuple(f"{r.check}: {r.summary}" for r in bad) + tuple(f"  {d}" for r in bad for d in r.details[:5])
        raise ProvisionError(
            f"generation {generation.id} failed its checks, so current was not switched: {bad[0].check}: {bad[0].summary}",
            tail=lines,
            checks_failed=True,
        )
    activity.update(", ".join(f"{r.check} {r.status.name}" for r in results))


def _run_named(lock: Spec, names: tuple[str, ...], environ: Mapping[str, str]) -> list[Result]:
    checks = _registered(names)
    facts = gather(lock, sorted({p for c in checks for p in c.needs}), environ=environ)
    try:
        return run_checks(checks, lock, facts)
    finally:
        facts.close()


def _registered(names: tuple[str, ...]) -> list[Check]:
    return [REGISTRY[name] for name in dict.fromkeys(names) if name in REGISTRY]


def _switch(build: Build, step: Step, activity: Activity) -> None:
    generation = build.generation
    assert generation is not None
    build.generation = generations.mark(generation, "ready")
    faults.trip("during:python.switch")
    build.generation = generations.switch(build.root, build.generation)
    removed = generations.prune(generations.read(build.root))
    activity.update(
        f"current -> {build.generation.id}" + (f"; removed {', '.join(g.id for g in removed)}" if removed else "")
    )


def _toolkit(build: Build, step: Step, activity: Activity) -> None:
    toolkit.install_toolkit(
        step.subject, log=build.log(step), cache=build.cache / "toolkits", on_progress=activity.update
    )


def _link(build: Build, step: Step, activity: Activity) -> None:
    toolkit.set_cuda_link(step.subject.prefix)


APPLIERS: dict[str, Callable[[Build, Step, Activity], None]] = {
    "toolkit.install": _toolkit,
    "toolkit.link": _link,
    "python.discard": _discard,
    "python.preflight": _preflight,
    "python.fetch": _fetch,
    "python.venv": _venv,
    "python.guard": _guard,
    "python.stack": _commands,
    "patches.apply": _patch,
    "python.envfile": _envfile,
    "python.envfile.current": _envfile,
    "python.check": _check,
    "python.switch": _switch,
}


# --- after applying -----------------------------------------------------------------------------


def _verify_built(
    lock: Spec, the_plan: Plan, request: ProvisionRequest, environ: Mapping[str, str], ui: UI
) -> ExitCode:
    """Gather the facts again: plan again (nothing may be left to do), and run the verify checks
    that cover what was built."""
    assert lock.python.root is not None
    again = _make_plan(lock, generations.read(lock.python.root), request, environ)
    left = [f"{s.what} ({s.why})" for s in again.steps] + [b.message for b in again.blockers]
    checks = _registered(tuple(name for area in the_plan.areas for name in VERIFY_CHECKS[area]))
    code = ExitCode.PASSED
    if checks:
        done = verify(lock, checks, ui)
        ui.results(
            f"stackgate provision: verify {lock.name} after provisioning", done.results, done.verdict, done.duration_s
        )
        left += [f"{r.check}: {r.summary}" for r in done.results if r.status >= Status.FAIL]
        code = done.verdict.exit_code
    if left:
        ui.error("the machine still differs from the lock: " + "; ".join(left))
        return ExitCode.FAILED
    return code


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
