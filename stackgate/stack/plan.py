"""Desired (the lock) against actual (the facts, the root's generations) -> ordered steps.

Planning changes nothing, so ``--dry-run`` is free and a second provision right after a good one
finds nothing to do without a download. The Python environment is rebuilt as a whole, in a new
generation, whenever it differs from the lock (a changed pin, a moved torch, a conflict): a
generation is complete and checked before ``current`` points at it, or it is never used. Only the
environment file and patches are brought up to date in place.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from stackgate.edges import libc
from stackgate.facts import BasePython, Facts, Missing
from stackgate.facts.compare import environment_drift, environment_spec, spec_changes
from stackgate.facts.patchstate import patch_state
from stackgate.models import pylock, settings
from stackgate.models.finding import Fix
from stackgate.models.spec import Patch, Spec, patch_location_problem
from stackgate.stack import coherence, floors, generations, guard, pyenv
from stackgate.stack.patching import PatchError, check_patch_file
from stackgate.stack.toolkit import cuda_link_state, install_command, toolkit_state

__all__ = ["AREAS", "Blocker", "Plan", "Step", "cache_dir", "plan"]

AREAS = ("toolkit", "python", "patches")
_REBUILD = "stackgate provision --only python"


@dataclass(frozen=True)
class Step:
    """One change: what it does, why it is needed, and the exact commands it runs."""

    area: str
    action: str  #: what provision dispatches on, e.g. "python.stack"
    what: str
    why: str
    runs: tuple[pyenv.Command, ...] = ()
    shown: tuple[str, ...] = ()  #: commands as text, when the step runs no Command of its own
    subject: Any = None  #: the Toolkit, Package or Patch the step is about

    @property
    def commands(self) -> tuple[str, ...]:
        return self.shown or tuple(c.display for c in self.runs)


@dataclass(frozen=True)
class Blocker:
    """Why the plan cannot be applied; nothing is touched."""

    message: str
    fix: Fix | None = None
    usage: bool = False  #: a problem of the lockfile (exit 2), not of the machine (exit 1)


@dataclass(frozen=True)
class Plan:
    spec: Spec
    steps: tuple[Step, ...]
    blockers: tuple[Blocker, ...]
    in_place: tuple[str, ...]  #: what already matches the lock
    generation: Path | None = None  #: the generation a build creates (or resumes)
    base_python: BasePython | None = None
    resume: bool = False  #: the generation exists: an interrupted run built and checked it

    @property
    def empty(self) -> bool:
        return not self.steps and not self.blockers

    @property
    def areas(self) -> tuple[str, ...]:
        return tuple(a for a in AREAS if any(s.area == a for s in self.steps))

    def lines(self) -> list[str]:
        """The plan as a person reads it (and --dry-run prints it)."""
        root = self.spec.python.root
        lines = [f"plan for {self.spec.name} (root {root}): {_count(len(self.steps), 'step')}"]
        for number, step in enumerate(self.steps, 1):
            lines.append(f"  {number}. [{step.area}] {step.what}")
            lines.append(f"       why: {step.why}")
            lines.extend(f"       $ {command}" for command in step.commands)
        if self.in_place:
            lines.append("already as locked:")
            lines.extend(f"  {line}" for line in self.in_place)
        for blocker in self.blockers:
            lines.append(f"cannot apply: {blocker.message}")
            if blocker.fix is not None:
                lines.append(f"  fix: {blocker.fix.text}")
                lines.extend(f"  $ {command}" for command in blocker.fix.commands)
        return lines


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def cache_dir(spec: Spec) -> Path:
    """Where checked URL wheels (and toolkit downloads) are kept between generations."""
    assert spec.python.root is not None
    return spec.python.root / "cache"


@dataclass
class _Draft:
    steps: list[Step] = field(default_factory=list)
    blockers: list[Blocker] = field(default_factory=list)
    in_place: list[str] = field(default_factory=list)
    generation: Path | None = None
    base_python: BasePython | None = None
    resume: bool = False


def plan(
    spec: Spec,
    facts: Facts,
    state: generations.RootState,
    *,
    only: str | None = None,
    uv: str | None = None,
    wheelhouse: Path | None = None,
) -> Plan:
    """The steps that bring this machine to the lock, in order; ``only`` limits them to one area,
    ``wheelhouse`` names the folder a new environment is installed from with no index."""
    areas = (only,) if only else AREAS
    draft = _Draft()
    if "toolkit" in areas:
        _toolkits(spec, facts, draft)
    rebuild = _python_drift(spec, facts, state) if "python" in areas else []
    resume = generations.resumable(state, environment_spec(spec)) if rebuild else None
    if resume is not None:
        _resume(state, resume, rebuild, draft)
    elif rebuild:
        _build(spec, facts, state, rebuild, _Install(uv, wheelhouse), draft)
    else:
        if "python" in areas:
            draft.in_place.append(
                f"Python stack: {state.root / 'current'} -> {state.current.id if state.current else '?'} "
                f"matches the lock ({_count(len(spec.python.packages), 'pin')}, guard: "
                f"{', '.join(guard.constraints(spec)) or 'none'})"
            )
            _env_file(spec, state, draft)
        if "patches" in areas:
            _patches(spec, facts, state, draft)
    return Plan(
        spec,
        tuple(draft.steps),
        tuple(draft.blockers),
        tuple(draft.in_place),
        draft.generation,
        draft.base_python,
        draft.resume,
    )


# --- CUDA toolkits -----------------------------------------------------------------------------


def _toolkits(spec: Spec, facts: Facts, draft: _Draft) -> None:
    for found in facts.toolkits:
        toolkit = found.toolkit
        if toolkit.keep:
            if found.exists:
                draft.in_place.append(f"{toolkit.label}: kept, present (never written to)")
            else:
                fix = Fix(
                    f"Restore CUDA {toolkit.version} with its own installer (runfile or apt), or drop it from the lock."
                )
                draft.blockers.append(
                    Blocker(
                        f"{toolkit.label} is kept (keep = true) but missing: stackgate never installs a kept toolkit",
                        fix,
                    )
                )
            continue
        reason = toolkit_state(toolkit, found)
        if reason is None:
            draft.in_place.append(f"{toolkit.label}: installed as locked")
        else:
            command = shlex.join(install_command(toolkit, cache=cache_dir(spec) / "toolkits"))
            draft.steps.append(
                Step(
                    "toolkit",
                    "toolkit.install",
                    f"install {toolkit.label} from {toolkit.source}",
                    reason,
                    shown=(command,),
                    subject=toolkit,
                )
            )
    _cuda_link(spec, facts, draft)


def _cuda_link(spec: Spec, facts: Facts, draft: _Draft) -> None:
    default = spec.default_toolkit
    if spec.stack.cuda_link != "default" or default is None:
        return  # "leave": /usr/local/cuda is not stackgate's to change
    why = cuda_link_state(spec.stack.cuda_link, default)
    if why is None:
        draft.in_place.append(f"/usr/local/cuda -> {default.prefix}")
        return
    draft.steps.append(
        Step(
            "toolkit",
            "toolkit.link",
            f"point /usr/local/cuda at {default.prefix}",
            why,
            shown=(f"ln -sfn {default.prefix} /usr/local/cuda",),
            subject=default,
        )
    )


# --- the Python stack --------------------------------------------------------------------------


def _python_drift(spec: Spec, facts: Facts, state: generations.RootState) -> list[str]:
    """Why the live environment is not the lock's (empty: it is)."""
    current = state.current
    if current is None:
        return [state.current_error or f"no environment at {state.root / 'current'} yet"]
    if current.marker is None:
        return [f"generation {current.id} has no readable {generations.MARKER}"]
    changes = spec_changes(current.marker.get("spec", {}), environment_spec(spec))
    if changes:
        more = f" (and {len(changes) - 4} more)" if len(changes) > 4 else ""
        return [
            f"the lock's Python stack changed since generation {current.id} was built: {'; '.join(changes[:4])}{more}"
        ]
    dists = facts.dists
    if isinstance(dists, Missing):
        return [dists.reason]
    resolution = facts.pylock
    return environment_drift(spec, dists, None if isinstance(resolution, Missing) else resolution)


@dataclass(frozen=True)
class _Install:
    uv: str | None
    wheelhouse: Path | None  #: install every file from this folder, with no index


def _build(
    spec: Spec, facts: Facts, state: generations.RootState, reasons: Sequence[str], install: _Install, draft: _Draft
) -> None:
    """A new generation: what can fail without installing first (sources answer, URL wheels
    download and match), then create, install exactly the pylock, patches, environment file,
    checks, switch."""
    # The steps are drafted even when something blocks them, so that --dry-run shows them all.
    resolution = _resolution(spec, facts, install, draft)
    if (found := _base_to_build(spec, facts, install.uv, draft)) is not None:
        draft.base_python = found
    base = draft.base_python or BasePython(Path(f"<no python{spec.python.version}>"), spec.python.version, "not found")
    uv = install.uv or ("uv" if spec.python.installer == "uv" else None)
    home = generations.generations_dir(state.root) / state.next_id
    draft.generation = home
    steps = draft.steps
    if state.unfinished:
        ids = ", ".join(g.id for g in state.unfinished)
        steps.append(
            Step(
                "python",
                "python.discard",
                f"remove unfinished generation(s) {ids}",
                "an interrupted or failed run left them; they were never current",
            )
        )
    why = "; ".join(reasons[:3]) + (f" (and {len(reasons) - 3} more)" if len(reasons) > 3 else "")
    if resolution is not None:
        _installable(spec, facts, resolution, draft)
        _preflight(spec, resolution, install.wheelhouse, steps)
    steps.append(
        Step(
            "python",
            "python.venv",
            f"create generation {home.name} with Python {base.version} (found: {base.found_by})",
            why,
            tuple(pyenv.venv_commands(spec, base.path, home, uv, base.bundled_pip)),
        )
    )
    pins = guard.constraints(spec)
    steps.append(
        Step(
            "python",
            "python.guard",
            f"write the guard and the pylock into {home.name}: constraints {', '.join(pins) or '(none)'}",
            "what people install later is held by these constraints; the installer reads the generation's copy of "
            "the pylock",
            subject=resolution,
        )
    )
    installing = (
        f"the pylock's {_count(len(resolution.packages), 'distribution')} ({_count(len(resolution.files), 'file')}, "
        "each checked against its sha256)"
        if resolution
        else "the pylock"
    )
    sources = (
        pyenv.sources(spec, resolution)
        if resolution
        else [spec.python.default_index, *(i.url for i in spec.python.indexes)]
    )
    where = f"from {install.wheelhouse}, with no index" if install.wheelhouse else f"from {', '.join(sources)}"
    overrides = "; ".join(f"override {o.package}{o.specifier}: {o.reason}" for o in spec.python.overrides)
    steps.append(
        Step(
            "python",
            "python.stack",
            f"install {installing} {where}",
            "exactly the pylock: nothing missing, nothing extra"
            + (f" (resolved with {overrides})" if overrides else "")
            + _shared_folders(resolution),
            tuple(pyenv.install_commands(spec, home, uv, wheelhouse=install.wheelhouse, bundled_pip=base.bundled_pip)),
        )
    )
    for patch in spec.patches:
        steps.append(
            Step(
                "patches",
                "patches.apply",
                f"apply {patch.file.name} to {patch.package} {patch.version}",
                patch.reason,
                subject=patch,
            )
        )
    steps.append(
        Step(
            "python",
            "python.envfile",
            f"write {home.name}/stackgate.env, activate and pip.conf",
            "stackgate.env exports CUDA_HOME, PATH, TRITON_PTXAS_PATH, PIP_CONSTRAINT, UV_CONSTRAINT, VIRTUAL_ENV "
            "and the lock's [env]; pip.conf holds its pip to the guard, activated or not",
        )
    )
    steps.append(
        Step(
            "python",
            "python.check",
            f"check generation {home.name}: exactly the pylock, pins, guard, consistency, torch build"
            + (", patches" if spec.patches else ""),
            "a generation that fails its checks is never switched to",
        )
    )
    steps.append(
        Step(
            "python",
            "python.switch",
            f"switch {state.root / 'current'} to {home.name}; keep {settings.KEEP_GENERATIONS.value()} generations",
            "atomically (a new symlink renamed over the old one), only now that the generation passed",
        )
    )


def _shared_folders(resolution: pylock.Resolution | None) -> str:
    """What the install step checks after it ran: the shared folders the pylock fills."""
    folders = [
        folder
        for folder, names in coherence.SHARED_FOLDERS.items()
        if resolution is not None and any(resolution.package(name) for name in names)
    ]
    return "".join(f"; then {folder}/ holds exactly its owner's RECORD" for folder in folders)


def _resolution(spec: Spec, facts: Facts, install: _Install, draft: _Draft) -> pylock.Resolution | None:
    """The pylock to install, when there is a current one; else a blocker with the command that
    makes it (a stale pylock would install what the spec no longer says)."""
    resolution = facts.pylock
    again = pylock.lock_command(spec.path)
    fix = Fix(
        "Resolve the spec into its pylock where its indexes and URLs are reachable, then provision again.", (again,)
    )
    if isinstance(resolution, Missing):
        draft.blockers.append(Blocker(resolution.reason, fix, usage=True))
        return None
    stale = pylock.differences(spec, resolution)
    if stale:
        more = f" (and {len(stale) - 3} more)" if len(stale) > 3 else ""
        draft.blockers.append(
            Blocker(f"{resolution.path.name} does not match the spec: {'; '.join(stale[:3])}{more}", fix, usage=True)
        )
        return None
    if install.wheelhouse is not None and not install.wheelhouse.is_dir():
        draft.blockers.append(
            Blocker(
                f"--wheelhouse {install.wheelhouse}: no such folder",
                Fix(
                    "Fill it where the indexes are reachable, then bring it here.",
                    (f"{again} --wheelhouse {install.wheelhouse}",),
                ),
                usage=True,
            )
        )
    return resolution


def _installable(spec: Spec, facts: Facts, resolution: pylock.Resolution, draft: _Draft) -> None:
    """Block a pylock that must not be installed (two kernels in sgl_kernel/, a cubin of another
    version: the spec's to fix, exit 2) and a host below its floors (Python, glibc, driver)."""
    for refusal in coherence.refusals(resolution, pylock.lock_command(spec.path)):
        draft.blockers.append(Blocker(refusal.message, refusal.fix, usage=True))
    base, gpus = facts.base_python, facts.nvml
    host = floors.Host(
        python=None if isinstance(base, Missing) else base.version,
        glibc=libc.glibc_version(),
        driver=None if isinstance(gpus, Missing) else gpus.driver_version,
        arch=spec.python.platform.split("-", 1)[0],
    )
    for floor in floors.refusals(resolution, host, spec.name):
        draft.blockers.append(Blocker(floor.message, floor.fix))
    needed = floors.driver_floor(resolution)
    if needed is not None and host.driver is None:
        reason = gpus.reason if isinstance(gpus, Missing) else "no driver version"
        draft.in_place.append(
            f"driver floor not judged: {needed[0]} needs NVIDIA driver >= {needed[1]} and this machine's driver "
            f"cannot be read ({reason}); the stack installs, and runs once the driver is there"
        )


def _preflight(spec: Spec, resolution: pylock.Resolution, wheelhouse: Path | None, steps: list[Step]) -> None:
    """What can fail without installing, before anything is created: the sources answer (or the
    wheelhouse holds every file, with its sha256), URL wheels download and match."""
    if wheelhouse is not None:
        steps.append(
            Step(
                "python",
                "python.preflight",
                f"check that {wheelhouse} holds all {_count(len(resolution.files), 'locked file')}, each with its "
                "sha256",
                "nothing is created before every file is known to be there and right",
                subject=(resolution, wheelhouse),
            )
        )
        return
    sources = pyenv.sources(spec, resolution)
    verb = "answers" if len(sources) == 1 else "answer"
    steps.append(
        Step(
            "python",
            "python.preflight",
            f"check that {', '.join(sources)} {verb}",
            "nothing is created before the files' sources are known to answer",
            subject=(resolution, None),
        )
    )
    for package in resolution.packages.values():
        if package.archive is None:
            continue
        steps.append(
            Step(
                "python",
                "python.fetch",
                f"download {package.name} from {package.archive.url}",
                f"installed only after its sha256 matches the pylock ({package.archive.sha256})",
                subject=(package.name, package.archive),
            )
        )


def _resume(
    state: generations.RootState, generation: generations.Generation, reasons: Sequence[str], draft: _Draft
) -> None:
    """Finish what an interrupted run left: a generation built and checked, never switched to."""
    draft.generation, draft.resume = generation.path, True
    steps = draft.steps
    if state.unfinished:
        steps.append(
            Step(
                "python",
                "python.discard",
                f"remove unfinished generation(s) {', '.join(g.id for g in state.unfinished)}",
                "an interrupted or failed run left them; they were never current",
            )
        )
    why = (
        f"{reasons[0]}; generation {generation.id} was built and checked from this lock by a run that stopped before "
        "switching"
    )
    steps.append(Step("python", "python.envfile", f"write {generation.id}/stackgate.env, activate and pip.conf", why))
    steps.append(
        Step(
            "python",
            "python.check",
            f"check generation {generation.id} again: pins, guard, consistency, torch build",
            "a generation that fails its checks is never switched to",
        )
    )
    steps.append(
        Step(
            "python",
            "python.switch",
            f"switch {state.root / 'current'} to {generation.id}; keep {settings.KEEP_GENERATIONS.value()} generations",
            "atomically (a new symlink renamed over the old one), only now that the generation passed",
        )
    )


def _base_to_build(spec: Spec, facts: Facts, uv: str | None, draft: _Draft) -> BasePython | None:
    """Note what blocks a build; the base interpreter to build from (None: there is none)."""
    blockers = draft.blockers
    for i, patch in enumerate(spec.patches):
        pinned = spec.python.package(patch.package)
        if pinned is not None and not pinned.specifier.contains(str(patch.version), prereleases=True):
            blockers.append(
                Blocker(
                    f"patch {patch.file.name} is for {patch.package} {patch.version}, but the lock pins "
                    f"{patch.package}{pinned.specifier}",
                    usage=True,
                )
            )
        _check_patch_file(spec, i, patch, blockers)
    if spec.python.installer == "uv" and uv is None:
        blockers.append(
            Blocker(
                'uv is not installed (python.installer = "uv")',
                Fix('Install uv, or set python.installer = "pip" in the lock.', ("python3 -m pip install uv",)),
            )
        )
    base = facts.base_python
    if isinstance(base, Missing):
        blockers.append(
            Blocker(
                base.reason,
                Fix(
                    f"Install Python {spec.python.version} beside the system one, then run provision again.",
                    (f"pyenv install {spec.python.version}",),
                ),
            )
        )
    return base if isinstance(base, BasePython) else None


def _env_file(spec: Spec, state: generations.RootState, draft: _Draft) -> None:
    current = state.current
    assert current is not None
    path = current.path / pyenv.ENV_FILE
    try:
        have = path.read_text(encoding="utf-8")
    except OSError:
        have = None
    guarded = (current.path / guard.PIP_CONF).is_file()
    if (
        have == pyenv.environment_text(spec, current.path, state.root)
        and (current.path / pyenv.ACTIVATE).is_file()
        and guarded
    ):
        draft.in_place.append(f"{state.root / 'current' / pyenv.ENV_FILE}: as the lock says")
        return
    why = "it is missing" if have is None else "the lock's [env] or default toolkit changed"
    if have is not None and not guarded:
        why = (
            f"{guard.PIP_CONF} is missing (built by an older stackgate): its pip is not guarded outside an activated "
            "shell"
        )
    draft.steps.append(
        Step("python", "python.envfile.current", f"rewrite {current.id}/stackgate.env, activate and pip.conf", why)
    )


def _patches(spec: Spec, facts: Facts, state: generations.RootState, draft: _Draft) -> None:
    if not spec.patches:
        return
    dists = facts.dists
    if isinstance(dists, Missing):
        draft.blockers.append(
            Blocker(f"no environment to patch: {dists.reason}", Fix("Build the Python stack first.", (_REBUILD,)))
        )
        return
    for i, patch in enumerate(spec.patches):
        dist = dists.dist(patch.package)
        if dist is None or dist.version != str(patch.version):
            draft.blockers.append(
                Blocker(
                    f"patch {patch.file.name} is for {patch.package} {patch.version}; the environment has "
                    f"{dist.version if dist else 'none'}",
                    Fix("Rebuild the Python stack from the lock.", (_REBUILD,)),
                )
            )
            continue
        reason = patch_state(patch, Path(dist.location))
        if reason is None:
            draft.in_place.append(f"patch {patch.file.name}: applied to {patch.package} {patch.version}")
        elif _check_patch_file(spec, i, patch, draft.blockers):
            draft.steps.append(
                Step(
                    "patches",
                    "patches.apply",
                    f"apply {patch.file.name} to {patch.package} {patch.version} in "
                    f"{state.current.id if state.current else '?'}",
                    f"{reason} ({patch.reason})",
                    subject=patch,
                )
            )


def _check_patch_file(spec: Spec, index: int, patch: Patch, blockers: list[Blocker]) -> bool:
    """A patch is planned only when its file can be applied as far as reading tells (it exists
    inside the lock's checkout, has the locked sha256, is a diff): else it blocks, as a lockfile
    problem, before anything is touched."""
    problem = patch_location_problem(spec, patch) or _patch_file_problem(patch)
    if problem:
        blockers.append(
            Blocker(
                f"patch[{index}].file: {problem}",
                Fix(
                    "Point the lock's [[patch]] file at the patch, with its sha256 (sha256sum FILE).",
                    (f"sha256sum {_quote(str(patch.file))}",),
                ),
                usage=True,
            )
        )
    return problem is None


def _patch_file_problem(patch: Patch) -> str | None:
    """None when the patch file reads, has the locked sha256 and is a diff, else why not."""
    try:
        check_patch_file(patch)
    except PatchError as exc:
        return str(exc)
    return None


def _quote(word: str) -> str:
    """One shell word in single quotes, whatever it holds.

    >>> print(_quote("https://h/x'$(id)'.whl"))
    'https://h/x'"'"'$(id)'"'"'.whl'
    """
    return "'" + word.replace("'", "'\"'\"'") + "'"
