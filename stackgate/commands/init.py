"""`stackgate init`: start a machine's spec, as `uv init` starts a project.

- ``stackgate init``: describe THIS machine (:mod:`stackgate.facts.machine`) as a spec, each value
  with where it came from (:mod:`stackgate.render.spectext`), in ./stackgate.toml (or ``--out``),
  which every command then uses without ``--lock``.
- ``--profile NAME``: copy a shipped profile (and its pylock, when it has one) out of the package
  into the current folder as stackgate.toml, or with ``--system`` into /etc/stackgate/stack.toml.
- ``--list``: the shipped profiles with their one-line descriptions.
- ``--health-units DIR``: the health check's systemd service and timer in DIR (``/etc/systemd/system``),
  running this installed program's ``verify --cached`` on the machine's spec (``--lock``, else
  /etc/stackgate/stack.toml); ``--dry-run`` prints them.

Nothing is overwritten without ``--force``, and nothing is ever written into the package.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from stackgate.edges.files import write_text
from stackgate.facts import Missing
from stackgate.facts.machine import Machine, observe
from stackgate.models import pylock, settings
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.models.spec import DEFAULT_SPEC, LOCAL_SPEC, SYSTEM_SPEC, Spec, is_shipped, load_spec, loads_spec
from stackgate.render.spectext import machine_spec
from stackgate.render.ui import UI
from stackgate.stack import healthunits

__all__ = ["InitRequest", "profiles", "run", "target_path"]


@dataclass(frozen=True, kw_only=True)
class InitRequest:
    out: Path | None = None
    profile: str | None = None
    list_only: bool = False
    system: bool = False
    python: Path | None = None
    force: bool = False
    health_units: Path | None = None  #: write the health check's units into this folder
    spec: Path | None = None  #: with health_units: the spec the health check judges
    dry_run: bool = False  #: with health_units: print the units, write nothing
    environ: Mapping[str, str] | None = field(default=None, compare=False)  #: default: os.environ
    argv0: str | None = field(default=None, compare=False)  #: how this program was started; default: sys.argv[0]


def profiles() -> dict[str, Spec]:
    """The shipped profiles by name (each loads: a shipped profile that does not is a bug)."""
    found = sorted(p for p in DEFAULT_SPEC.parent.glob("*.toml") if not p.name.startswith("pylock."))
    return {path.stem: load_spec(path) for path in found}


def target_path(request: InitRequest, environ: Mapping[str, str]) -> Path:
    """Where the spec goes: --out, else <system dir>/stack.toml with --system, else ./stackgate.toml."""
    if request.out is not None:
        return request.out
    if request.system:
        return settings.SYSTEM_DIR.value(environ) / SYSTEM_SPEC
    return Path.cwd() / LOCAL_SPEC


def run(request: InitRequest, ui: UI) -> ExitCode:
    """The init command."""
    environ = dict(os.environ if request.environ is None else request.environ)
    if request.health_units is not None:
        return _health_units(request, environ, ui)
    if request.spec is not None or request.dry_run:
        raise UsageError("--lock and --dry-run go with --health-units DIR (the health check's units)")
    if request.list_only:
        if request.profile or request.out or request.system or request.python:
            raise UsageError("--list only lists the shipped profiles: it takes no other option")
        return _list(ui)
    target = target_path(request, environ)
    if request.system and request.out is not None:
        raise UsageError("--system writes /etc/stackgate/stack.toml; --out names another file: give one of them")
    if request.profile is not None and request.profile not in profiles():
        raise UsageError(
            f"no shipped profile {request.profile!r}: the profiles are {', '.join(profiles())}",
            hint="stackgate init --list",
        )
    if is_shipped(target):
        raise UsageError(f"{target} is inside the stackgate package: nothing is written there")
    for there in (target, pylock.path_for(target)):  # a pylock beside resolves the spec it was made for
        if there.exists() and not request.force:
            raise UsageError(f"{there} exists: nothing was written (--force replaces it; --out FILE writes elsewhere)")
    if request.profile is not None:
        return _copy_profile(request.profile, target, ui, force=request.force)
    return _describe(request, target, environ, ui)


def _health_units(request: InitRequest, environ: Mapping[str, str], ui: UI) -> ExitCode:
    """Write (or print) the health check's units for this installed program and the machine's spec."""
    assert request.health_units is not None
    if request.profile or request.out or request.system or request.python or request.list_only:
        raise UsageError("--health-units DIR writes the health check's units: it takes only --lock, --dry-run, --force")
    program = healthunits.installed_program(request.argv0 or sys.argv[0], sys.executable)
    spec = _health_spec(request.spec, environ, ui)
    units = {request.health_units / unit.name: unit.text for unit in healthunits.render_units(program, spec)}
    states = {path: _unit_state(path, text) for path, text in units.items()}
    if request.dry_run:
        for path, text in units.items():
            ui.line(f"--- {path} ({_DRY_RUN_STATE[states[path]]})")
            ui.line(text.rstrip("\n"))
        return ExitCode.PASSED
    refused = [str(path) for path, state in states.items() if state == "differs" and not request.force]
    if refused:
        are = "exists and differs" if len(refused) == 1 else "exist and differ"
        raise UsageError(
            f"{' and '.join(refused)} {are} from the units for {program}: nothing was written "
            "(--force replaces them; --dry-run shows what would be written)"
        )
    for path, text in units.items():
        if states[path] != "same":
            _write(path, text)
        ui.line(f"{'unchanged' if states[path] == 'same' else 'wrote'} {path}")
    ui.line(f"the service runs {program} verify --cached on {spec}")
    ui.line("next: systemctl daemon-reload && systemctl enable --now stackgate-health.timer")
    return ExitCode.PASSED


def _health_spec(spec: Path | None, environ: Mapping[str, str], ui: UI) -> Path:
    """The spec the health check judges: --lock made absolute, else the one `init --system` writes.
    One that is there must load (exit 2 now, not a failed unit every minute); one that is not is said."""
    system = settings.SYSTEM_DIR.value(environ) / SYSTEM_SPEC
    spec_path = Path(os.path.abspath(spec)) if spec is not None else system
    if spec_path.exists():
        load_spec(spec_path)
    else:
        writes = "--system" if spec_path == system else f"--out {spec_path}"
        ui.warn(f"{spec_path} does not exist: the timer does nothing until it does (stackgate init {writes} writes it)")
    return spec_path


_DRY_RUN_STATE = {"new": "would write", "same": "unchanged", "differs": "differs: --force would replace it"}


def _unit_state(path: Path, text: str) -> str:
    """``new`` (no file there), ``same`` (the file holds ``text``) or ``differs``."""
    try:
        have = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return "new"
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    return "same" if have == text else "differs"


def _list(ui: UI) -> ExitCode:
    found = profiles()
    width = max(len(name) for name in found)
    for name, spec in found.items():
        default = " (the default)" if spec.path == DEFAULT_SPEC else ""
        has = " [pylock]" if pylock.path_for(spec.path).exists() else ""
        ui.line(f"{name:<{width}}  {spec.stack.description}{default}{has}")
    ui.line("")
    ui.line("copy one out: stackgate init --profile NAME (./stackgate.toml; --system: /etc/stackgate/stack.toml)")
    ui.line("or describe this machine: stackgate init")
    return ExitCode.PASSED


def _copy_profile(name: str, target: Path, ui: UI, *, force: bool) -> ExitCode:
    found = profiles()
    source = found[name].path
    pylock_source, pylock_target = pylock.path_for(source), pylock.path_for(target)
    _write(target, source.read_text(encoding="utf-8"))
    ui.line(f"wrote {target}: a copy of the shipped profile {name} ({found[name].stack.description})")
    if pylock_source.exists():
        _write(pylock_target, pylock_source.read_text(encoding="utf-8"))
        ui.line(f"wrote {pylock_target}: its pylock")
    else:
        _drop_stale_pylock(target, ui)
    _next_steps(target, ui)
    return ExitCode.PASSED


def _describe(request: InitRequest, target: Path, environ: Mapping[str, str], ui: UI) -> ExitCode:
    with ui.progress("looking at this machine: NVML, CUDA toolkits, the interpreter that holds torch"):
        machine = observe(environ, request.python)
    _refuse_without(machine)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = machine_spec(machine, when)
    spec = loads_spec(text, path=target)  # a spec init writes always loads; a failure is a bug, exit 2 names it
    _write(target, text)
    ui.line(f"wrote {target}: this machine as a spec, each value with where it came from")
    _drop_stale_pylock(target, ui)
    for line in _notes(machine, spec, environ):
        ui.warn(line)
    _next_steps(target, ui)
    return ExitCode.PASSED


def _refuse_without(machine: Machine) -> None:
    """init describes a GPU machine with a stack interpreter; without either there is nothing to pin."""
    if isinstance(machine.nvml, Missing) or not machine.nvml.gpus:
        why = machine.nvml.reason if isinstance(machine.nvml, Missing) else "the driver shows no GPU"
        raise UsageError(
            f"no NVIDIA GPU to describe ({why}): pick a shipped profile instead", hint="stackgate init --list"
        )
    if not any(gpu.capability for gpu in machine.nvml.gpus):
        unknown = "; ".join(f"{g.label}: {dict(g.unknown).get('capability')}" for g in machine.nvml.gpus)
        raise UsageError(f"NVML gives no GPU's compute capability ({unknown}): write [hardware] by hand, or --profile")
    if isinstance(machine.python, Missing):
        raise UsageError(machine.python.reason)


def _notes(machine: Machine, spec: Spec, environ: Mapping[str, str]) -> list[str]:
    """What init saw that verify will report: a shell that does not set the spec's [env]."""
    if machine.default is None:
        return [
            "no CUDA toolkit found (searched $CUDA_HOME, $CUDA_PATH, the nvcc on PATH, /usr/local/cuda*): "
            "the spec names none"
        ]
    notes = []
    for name, want in spec.env.items():
        have = environ.get(name)
        if not have or Path(have).resolve() != Path(want).resolve():
            notes.append(
                f"{name} is {have or 'not set'} in this shell: "
                f"export {name}={want} where the stack runs ([env] says so)"
            )
    return notes


def _drop_stale_pylock(target: Path, ui: UI) -> None:
    """Remove the pylock of the spec --force replaced: it resolves that spec, not the new one."""
    stale = pylock.path_for(target)
    if stale.exists():
        try:
            stale.unlink()
        except OSError as exc:
            raise UsageError(f"cannot remove {stale}, the pylock of the replaced spec: {exc.strerror or exc}") from None
        ui.line(f"removed {stale}: it resolved the replaced spec (`stackgate lock` makes this one's)")


def _write(path: Path, text: str) -> None:
    """Write a spec (or its pylock), or stop with why it cannot be written (exit 2)."""
    try:
        write_text(path, text)
    except OSError as exc:
        hint = " (--system writes /etc/stackgate: run it as root)" if path.is_relative_to("/etc") else ""
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}{hint}") from None


def _next_steps(target: Path, ui: UI) -> None:
    here = target.parent.resolve() == Path.cwd().resolve() and target.name == LOCAL_SPEC
    spec = "" if here else f" --lock {target}"
    ui.line(f"next: stackgate verify{spec}   (then: stackgate lock{spec}, stackgate verify --deep{spec})")
