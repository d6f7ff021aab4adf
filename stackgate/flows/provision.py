"""The provision flow: plan what brings this machine to the spec, apply the plan's steps (each
action a named applier, in the plan's order), check a new generation before switching to it, and
after the build plan again and verify what was built. Rollback's judgement of a generation
(what it was built from, how it drifted) is here too.

Any failure leaves ``current`` where it was; the next run removes what was half built.
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
from typing import Any, Callable, ContextManager, Mapping, TypeVar

from stackgate.checks.all import REGISTRY
from stackgate.checks.core import Check, run_checks
from stackgate.edges import faults, fetch
from stackgate.facts import Facts, Missing, gather
from stackgate.facts.compare import environment_drift, environment_spec
from stackgate.facts.evidencesweep import as_finding
from stackgate.flows.diagnose import diagnose
from stackgate.flows.stages import Stage, run_stages
from stackgate.flows.verify import VerifyRun, verify
from stackgate.models import knowledge, pylock
from stackgate.models.exitcodes import UsageError
from stackgate.models.finding import Finding
from stackgate.models.result import Result, Status
from stackgate.models.spec import Spec, load_spec
from stackgate.render.ui import UI, Activity
from stackgate.stack import coherence, generations, guard, patching, pyenv, toolkit
from stackgate.stack.plan import AREAS, Plan, Step, cache_dir, plan

__all__ = [
    "AFTER_BUILD",
    "APPLIERS",
    "LIVE_ACTIONS",
    "Built",
    "ProvisionError",
    "advice",
    "after_build",
    "apply",
    "command_line",
    "drift_of",
    "known_failures",
    "load_buildable",
    "make_plan",
    "other_spec",
    "plan_for",
    "refusal",
    "split_live",
    "sweep",
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


def load_buildable(path: Path | None, option: str, command: str) -> Spec:
    """The spec at ``path`` (``option`` names it in messages) as a build needs it: its path absolute
    (a generation keeps the path it was built from, which a later command run elsewhere must still
    find), its pylock beside it, and a stackgate-managed ``python.root`` to build generations under."""
    spec = load_spec(path)
    spec = dataclasses.replace(spec, path=Path(os.path.abspath(spec.path)))
    pylock.check_beside(spec)  # first: a bad pylock is a bad lockfile in every command
    if spec.python.root is None:
        raise UsageError(
            f"{option} {spec.path}: python.interpreter names an existing environment ({spec.python.interpreter}); "
            f"{command} builds generations only under a stackgate-managed python.root: set python.root instead"
        )
    return spec


def known_failures(log: Path | None, spec: Spec) -> list[Finding]:
    """What the knowledge base knows of a failed step, read from its full log (installer output), after what the
    evidence sweep finds abnormal (evidence first: a log's reading of a failure may be generic)."""
    if log is None:
        return []
    try:
        done = diagnose([(str(log), lambda: open(log, "rb"))], knowledge.spec_context(spec), stage="provision")
    except UsageError:
        return []  # the log is gone: the tail shown is all there is
    facts = Facts(spec)
    try:
        swept = as_finding(facts.sweep, log.read_text(errors="replace"), str(log))
    except OSError:
        swept = None
    finally:
        facts.close()
    return [*([swept] if swept is not None else []), *done.findings]


def advice(exc: BaseException) -> str:
    """What to do before the next run: most failures a plain re-run repeats exactly."""
    again = "then `stackgate provision` again (it removes what was half built)"
    full = _caused_by(exc, OSError)
    if isinstance(exc, guard.GuardError):
        return f"a re-run is blocked the same way: change the lock as said above, {again}"
    if _caused_by(exc, fetch.HashMismatch) is not None:
        return (
            "a re-run refuses the same file: make the pylock again (stackgate lock) only if you trust the file; "
            f"{again}"
        )
    if full is not None and full.errno == errno.ENOSPC:
        return f"free space on that disk, {again}"
    if isinstance(exc, pyenv.PyenvError) and exc.unreachable:
        return (
            f"a re-run fails the same way while {', '.join(exc.unreachable)} does not answer: "
            f"check the URL in the lock and this machine's network; {again}"
        )
    if _caused_by(exc, fetch.PartRefused) is not None:
        return f"a re-run is refused the same way: remove what the line above names (after a look at it), {again}"
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


def sweep(root: Path, ui: UI) -> None:
    """Remove what an interrupted run left in the root, and say so."""
    removed = generations.sweep(root)
    if removed:
        ui.info(f"removed what an interrupted run left: {', '.join(str(p) for p in removed)}")


def make_plan(
    spec: Spec,
    state: generations.RootState,
    environ: Mapping[str, str],
    *,
    only: str | None = None,
    wheelhouse: Path | None = None,
) -> Plan:
    """The plan for ``lock`` (of the area ``only``, or all), from facts gathered now."""
    areas = (only,) if only else AREAS
    parts = sorted({part for area in areas for part in PLAN_PARTS[area]})
    facts = gather(spec, parts, environ=environ)
    try:
        house = Path(os.path.abspath(wheelhouse)) if wheelhouse else None
        return plan(spec, facts, state, only=only, uv=pyenv.find_uv(), wheelhouse=house)
    finally:
        facts.close()


def plan_for(spec: Spec, state: generations.RootState, environ: Mapping[str, str]) -> Plan:
    """What provision would do to bring this machine to ``lock`` (facts gathered now)."""
    return make_plan(spec, state, environ)


def command_line() -> str:
    """How this process was started, for the holder line another provision prints."""
    if not sys.argv:
        return "stackgate"
    program = Path(sys.argv[0])
    name = program.parent.name if program.name == "__main__.py" else program.name  # python -m invoke
    return shlex.join([name, *sys.argv[1:]])


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


@dataclass
class Build:
    """What the steps of one provision share."""

    spec: Spec
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
        assert self.spec.python.root is not None
        return self.spec.python.root

    @property
    def cache(self) -> Path:
        return cache_dir(self.spec)

    def log(self, step: Step) -> Path:
        return self.logs / f"{self.step_number:02d}-{step.action}.log"


def apply(
    the_plan: Plan, state: generations.RootState, environ: dict[str, str], ui: UI, *, wheelhouse: Path | None = None
) -> generations.Generation | None:
    """Run the plan's steps in order; the first failure stops it (``current`` is only switched by
    the last step of a build). Returns the generation the plan built or resumed, if any."""
    spec = the_plan.spec
    stamp = the_plan.generation.name if the_plan.generation else time.strftime("%Y%m%dT%H%M%S")
    build = Build(
        spec,
        state,
        environ,
        _log_dir(spec, stamp),
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


def _log_dir(spec: Spec, stamp: str) -> Path:
    assert spec.python.root is not None
    logs = spec.python.root / "logs"
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
    return toolkit.kept_untouched(the_plan.spec.toolkits)


def _run(build: Build, step: Step, activity: Activity, command: pyenv.Command) -> None:
    seen = False

    def on_line(line: str) -> None:
        nonlocal seen
        if not seen:
            seen = True
            faults.trip(f"during:{step.action}")
        activity.update(line)

    pyenv.run(command, log=build.log(step), environ=build.environ, spec=build.spec, on_line=on_line)


def _discard(build: Build, step: Step, activity: Activity) -> None:
    removed = generations.discard_unfinished(
        build.state, on_renamed=lambda doomed: faults.trip(f"during:{step.action}")
    )
    activity.update(f"removed {', '.join(g.id for g in removed)}")


def _venv(build: Build, step: Step, activity: Activity) -> None:
    base = build.the_plan.base_python
    assert base is not None and build.the_plan.generation is not None
    spec = build.spec
    about = {
        "lock": {"name": spec.name, "path": str(spec.path), "sha256": spec.sha256},
        "spec": environment_spec(spec),
        "base_python": {"path": str(base.path), "version": base.version},
    }
    build.generation = generations.create(build.the_plan.generation, about)
    for command in step.runs:
        _run(build, step, activity, command)


def _guard(build: Build, step: Step, activity: Activity) -> None:
    assert build.generation is not None
    build.files = guard.write(build.spec, build.generation.path)
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
                f"the wheelhouse {wheelhouse} cannot be installed from: {problems[0]}{more}; "
                f"fill it again with `{pylock.lock_command(build.spec.path)} --wheelhouse {wheelhouse}`",
                tail=tuple(problems[:15]),
            )
        activity.update(f"{len(resolution.files)} files, sha256 as locked")
        return
    silent = pyenv.unreachable(pyenv.sources(build.spec, resolution))
    if silent:
        said = "; ".join(f"{url} does not answer ({why})" for url, why in silent.items())
        raise pyenv.PyenvError(f"{said}: nothing was created", unreachable=tuple(silent))


def _commands(build: Build, step: Step, activity: Activity) -> None:
    for command in step.runs:
        _run(build, step, activity, command)


def _install(build: Build, step: Step, activity: Activity) -> None:
    """Install exactly the pylock, then check that each shared folder (sgl_kernel/) holds exactly
    the files its installed owner's RECORD lists."""
    _commands(build, step, activity)
    assert build.generation is not None
    problems = coherence.folder_problems(_site_packages(build.generation.path))
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        build.generation = generations.mark(build.generation, "failed", failures=problems[:15])
        raise ProvisionError(
            f"generation {build.generation.id} was installed wrong, so current was not switched: {problems[0]}{more}",
            tail=tuple(problems[:15]),
            checks_failed=True,
        )


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
    patching.apply_patch(step.subject, _site_packages(home))


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
    pyenv.write_environment(build.spec, home, build.root)


def _check(build: Build, step: Step, activity: Activity) -> None:
    """The new generation's own checks, run against its interpreter before anything points at it."""
    generation = build.generation
    assert generation is not None
    candidate = dataclasses.replace(
        build.spec, python=dataclasses.replace(build.spec.python, interpreter=generation.python)
    )
    results = _run_named(candidate, BUILD_CHECKS, build.environ)
    bad = [r for r in results if r.status >= Status.FAIL]
    if bad:
        build.generation = generations.mark(generation, "failed", failures=[f"{r.check}: {r.summary}" for r in bad])
        lines = tuple(f"{r.check}: {r.summary}" for r in bad) + tuple(f"  {d}" for r in bad for d in r.details[:5])
        raise ProvisionError(
            f"generation {generation.id} failed its checks, so current was not switched: "
            f"{bad[0].check}: {bad[0].summary}",
            tail=lines,
            checks_failed=True,
        )
    activity.update(", ".join(f"{r.check} {r.status.name}" for r in results))


def _run_named(spec: Spec, names: tuple[str, ...], environ: Mapping[str, str]) -> list[Result]:
    checks = _registered(names)
    facts = gather(spec, sorted({p for c in checks for p in c.needs}), environ=environ)
    try:
        # The facts first, each bounded by its own limit (the probe's: STACKGATE_PROBE_TIMEOUT_S), so that a
        # check's limit bounds its judgement, not the import of a large stack on a loaded machine.
        for part in sorted(facts.started):
            facts.get(part)
        return run_checks(checks, spec, facts)
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
    "python.stack": _install,
    "patches.apply": _patch,
    "python.envfile": _envfile,
    "python.envfile.current": _envfile,
    "python.check": _check,
    "python.switch": _switch,
}


@dataclass
class Built:
    """After a plan was applied: what is left to do (planned again) and the verify run of what was built."""

    spec: Spec
    the_plan: Plan
    environ: Mapping[str, str]
    ui: UI
    only: str | None = None
    wheelhouse: Path | None = None
    left: list[str] = field(default_factory=list)  #: what still differs from the spec
    verified: VerifyRun | None = None


def _plan_again(built: Built) -> None:
    """Gather the facts again and plan: nothing may be left to do."""
    spec = built.spec
    assert spec.python.root is not None
    state = generations.read(spec.python.root)
    again = make_plan(spec, state, built.environ, only=built.only, wheelhouse=built.wheelhouse)
    built.left += [f"{s.what} ({s.why})" for s in again.steps] + [b.message for b in again.blockers]


def _verify_areas(built: Built) -> None:
    """Run the verify checks that cover the areas the plan touched."""
    checks = _registered(tuple(name for area in built.the_plan.areas for name in VERIFY_CHECKS[area]))
    if checks:
        built.verified = verify(built.spec, checks, built.ui)


AFTER_BUILD: tuple[Stage[Built], ...] = (Stage("plan again", _plan_again), Stage("verify", _verify_areas))


def after_build(built: Built) -> Built:
    """Run the stages that follow a build; ``built.left`` also holds the checks that failed."""
    run_stages(AFTER_BUILD, built)
    if built.verified is not None:
        built.left += [f"{r.check}: {r.summary}" for r in built.verified.results if r.status >= Status.FAIL]
    return built


def other_spec(spec: Spec, built_from: Mapping[str, Any]) -> str | None:
    """What a generation was built from when it is not this lock: another lock file (named), or
    another version of this one; None when it is this lock or the marker does not say."""
    sha256, path = built_from.get("sha256"), built_from.get("path")
    if path and Path(str(path)) != spec.path:
        return f"another lock file, {path}" + (f" (sha256 {str(sha256)[:12]})" if sha256 else "")
    if sha256 and sha256 != spec.sha256:
        return f"another version of the lock (sha256 {str(sha256)[:12]})"
    return None


def drift_of(spec: Spec, generation: generations.Generation, environ: Mapping[str, str]) -> list[str]:
    """How a generation's environment differs from what it was built from (its marker's spec):
    its pins, the frozen packages its guard holds, conflicts; and whether its guard is there."""
    try:
        python = pyenv.built_python(spec.python, (generation.marker or {}).get("spec"), generation.python)
    except ValueError as exc:
        return [f"its {generations.MARKER} does not say what it was built from ({exc})"]
    built = dataclasses.replace(spec, python=python)
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


def refusal(target: generations.Generation, drift: list[str]) -> str:
    """Why rollback does not switch to a generation that drifted from what it was built from."""
    more = f" (and {len(drift) - 4} more)" if len(drift) > 4 else ""
    return (
        f"stackgate rollback: not switching to generation {target.id}: it no longer holds what it was built from: "
        f"{'; '.join(drift[:4])}{more}. `stackgate provision` builds a good generation from the lock; "
        "`stackgate rollback --force` switches to this one anyway"
    )
