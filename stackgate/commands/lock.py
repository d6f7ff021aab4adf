"""`stackgate lock`: resolve a stack spec into its pylock, check that the pylock is current, fill a
wheelhouse.

- ``stackgate lock``: resolve (uv, against the spec's indexes) and write ``pylock.<name>.toml``;
  what moved since the last pylock is shown, and a URL wheel's sha256 taken on first use is
  printed for review. When the pylock already matches the spec's inputs (the offline ``--check``
  comparison) and nothing is to be upgraded, that pylock is the answer: no index is asked.
- ``--refresh``: resolve against the indexes even when the pylock matches the spec (a newer
  release of an unpinned dependency, a yanked file).
- ``--check``: offline; exit 1 naming every difference when the spec changed since the pylock
  was made (``--all``: every shipped spec that has a pylock).
- ``--upgrade-package NAME``: resolve again moving only NAME (and what it drags), refusing when
  a frozen package would move.
- ``--wheelhouse DIR``: every file of the (current) pylock in DIR, hash-checked, for
  ``stackgate provision --wheelhouse DIR`` on nodes without an index.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from packaging.utils import canonicalize_name

from stackgate.edges import fetch
from stackgate.flows.lock import Locking, current, run_lock
from stackgate.models import pylock
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.models.spec import DEFAULT_SPEC, Spec, load_spec, read_only_problem
from stackgate.render.locklines import size
from stackgate.render.ui import UI
from stackgate.stack import pyenv, resolve

__all__ = ["LockRequest", "fix_command", "run", "shipped_specs"]


@dataclass(frozen=True, kw_only=True)
class LockRequest:
    spec_path: Path | None = None
    check: bool = False
    all_specs: bool = False  #: --check every shipped spec that has a pylock
    upgrade: tuple[str, ...] = ()
    wheelhouse: Path | None = None
    refresh: bool = False  #: ask the indexes even when the pylock matches the spec
    environ: Mapping[str, str] | None = field(default=None, compare=False)  #: default: os.environ


def fix_command(spec: Spec) -> str:
    """The command that makes (or remakes) a spec's pylock."""
    return pylock.lock_command(spec.path)


def shipped_specs() -> list[Path]:
    """The specs shipped beside the default one (pylock files are not specs)."""
    return sorted(p for p in DEFAULT_SPEC.parent.glob("*.toml") if not p.name.startswith("pylock."))


def run(request: LockRequest, ui: UI) -> ExitCode:
    """The lock command."""
    if request.all_specs and not request.check:
        raise UsageError(
            "--all goes with --up-to-date (--check): each spec is resolved on its own (stackgate lock --lock SPEC)"
        )
    if request.check and (request.upgrade or request.wheelhouse or request.refresh):
        raise UsageError("--check only reads: it takes no --upgrade-package, --wheelhouse or --refresh")
    if request.check:
        specs: list[Path | None] = (
            [*shipped_specs()] if request.all_specs else [request.spec_path]
        )  # None: the default lock
        return max(
            (_check(load_spec(path), ui, quiet_missing=request.all_specs) for path in specs), default=ExitCode.PASSED
        )
    spec = load_spec(request.spec_path)
    _check_upgrade_names(spec, request.upgrade)
    writes = bool(request.upgrade or request.refresh) or current(spec, request.wheelhouse) is None  # else the pylock
    action = f"`stackgate lock` (its {pylock.path_for(spec.path).name})"
    read_only = read_only_problem(spec.path, action) if writes else None
    if read_only is not None:
        raise UsageError(read_only)
    environ = dict(os.environ if request.environ is None else request.environ)
    uv = pyenv.find_uv()
    if uv is None:
        raise UsageError("uv is not installed: `stackgate lock` resolves with it", hint="python3 -m pip install uv")
    locking = Locking(
        spec, uv, environ, ui, upgrade=request.upgrade, refresh=request.refresh, wheelhouse=request.wheelhouse
    )
    try:
        run_lock(locking)
    except resolve.ResolveError as exc:
        if isinstance(exc.__cause__, fetch.PartRefused):  # a file planted in the wheelhouse: hostile input
            raise UsageError(f"{exc}; the pylock was left as it was") from exc
        ui.tail(f"stackgate lock: {exc}", exc.log, exc.tail)
        target = pylock.path_for(spec.path)
        left = f"{target} was left as it was" if target.exists() else f"no pylock was written ({target} does not exist)"
        ui.error(left)
        return ExitCode.FAILED
    return ExitCode.PASSED


def _check_upgrade_names(spec: Spec, names: tuple[str, ...]) -> None:
    """Refuse an --upgrade-package name that neither the pylock locks nor the spec pins, naming the
    closest ones: a misspelt name would move nothing."""
    if not names:
        return
    locked = resolve.previous(pylock.path_for(spec.path))
    known = sorted({*(locked.packages if locked is not None else ()), *(p.name for p in spec.python.packages)})
    pins = f"{spec.path.name}'s pins"
    where = f"{pylock.path_for(spec.path).name} or {pins}" if locked is not None else pins
    unknown = [name for name in names if canonicalize_name(name) not in known]
    if unknown:
        lines = [f"--upgrade-package {name}: not in {where}{_closest(name, known)}" for name in unknown]
        raise UsageError("\n".join(lines))


def _closest(name: str, known: list[str]) -> str:
    """
    >>> _closest("antropic", ["anthropic", "anyio", "torch"])
    ' (closest: anthropic)'
    """
    close = difflib.get_close_matches(canonicalize_name(name), known, n=3, cutoff=0.6)
    return f" (closest: {', '.join(close)})" if close else ""


def _check(spec: Spec, ui: UI, *, quiet_missing: bool = False) -> ExitCode:
    resolution, differences = resolve.current(spec)
    where = pylock.path_for(spec.path)
    if resolution is None:
        if quiet_missing:
            ui.line(f"{spec.path.name}: no pylock ({where.name}); not checked")
            return ExitCode.PASSED
        ui.error(f"stackgate lock --check: {spec.path.name} has no pylock: {where} does not exist")
        ui.error(f"  fix: {fix_command(spec)}")
        return ExitCode.FAILED
    if differences:
        ui.error(f"stackgate lock --check: {where} does not match {spec.path.name}:")
        for line in differences:
            ui.error(f"  {line}")
        ui.error(f"  fix: {fix_command(spec)}")
        return ExitCode.FAILED
    assert resolution is not None
    ui.line(f"{where.name} matches {spec.path.name}: {size(resolution)}")
    return ExitCode.PASSED
