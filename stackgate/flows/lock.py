"""The lock flow: the spec's pylock (the current one when it matches the spec and nothing is to
move, else resolved now with uv), what moved shown, then a wheelhouse filled from it if asked."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from stackgate.flows.stages import Stage, run_stages
from stackgate.models import pylock
from stackgate.models.spec import Spec
from stackgate.render.locklines import UNCHANGED, outcome_lines, size, wheelhouse_lines
from stackgate.render.ui import UI
from stackgate.stack import resolve

__all__ = ["STAGES", "Locking", "current", "run_lock"]


@dataclass
class Locking:
    """One `stackgate lock` under way: what its stages read and fill."""

    spec: Spec
    uv: str
    environ: Mapping[str, str]
    ui: UI
    upgrade: tuple[str, ...] = ()
    refresh: bool = False
    wheelhouse: Path | None = None
    resolution: pylock.Resolution | None = None
    outcome: resolve.Outcome | None = None  #: None when the current pylock is the answer


def current(spec: Spec, wheelhouse: Path | None = None) -> pylock.Resolution | None:
    """The spec's pylock when it is readable and matches the spec, else None (resolve again). With a
    wheelhouse, whose files would be fetched from it, a pylock that does not validate is refused
    (PylockError: exit 2), never resolved around."""
    try:
        resolution, differences = resolve.current(spec, wheelhouse)
    except pylock.PylockError:
        if wheelhouse is not None:
            raise
        return None
    return resolution if resolution is not None and not differences else None


def _resolve(run: Locking) -> None:
    """The pylock to use: the current one when it matches the spec and nothing is to move (no
    --upgrade-package, no --refresh), else resolved now."""
    spec, ui = run.spec, run.ui
    if not run.upgrade and not run.refresh:
        found = current(spec, run.wheelhouse)
        if found is not None and run.wheelhouse is not None:
            ui.line(f"{found.path.name} matches {spec.path.name}: its files go into {run.wheelhouse}")
        elif found is not None:
            ui.line(f"unchanged: {found.path} matches {spec.path.name} ({size(found)})")
            ui.line(f"  {UNCHANGED}")
        if found is not None:
            run.resolution = found
            return
    about = f"resolving {spec.name} with uv for Python {spec.python.version} on {spec.python.platform}"
    with ui.activity(about) as activity:
        run.outcome = resolve.resolve(
            spec, uv=run.uv, environ=run.environ, upgrade=run.upgrade, on_line=activity.update
        )
    run.resolution = run.outcome.resolution


def _report(run: Locking) -> None:
    """What the resolution wrote and moved, and the sha256 taken on first use."""
    if run.outcome is not None:
        outcome_lines(run.outcome, run.upgrade, run.ui)


def _fill(run: Locking) -> None:
    """Every file of the pylock in the wheelhouse, hash-checked."""
    if run.wheelhouse is None:
        return
    resolution, wheelhouse, fresh = run.resolution, run.wheelhouse, []
    assert resolution is not None
    with run.ui.activity(f"filling {wheelhouse} with the {len(resolution.files)} locked files") as activity:

        def on_file(name: str, downloaded: bool) -> None:
            activity.update(name)
            if downloaded:
                fresh.append(name)

        resolve.download(resolution, wheelhouse, on_file=on_file)
    wheelhouse_lines(resolution, wheelhouse, len(fresh), run.ui)


STAGES: tuple[Stage[Locking], ...] = (Stage("resolve", _resolve), Stage("report", _report), Stage("wheelhouse", _fill))


def run_lock(run: Locking) -> Locking:
    """Run the lock's stages (a ResolveError stops them: the pylock is left as it was)."""
    run_stages(STAGES, run)
    return run
