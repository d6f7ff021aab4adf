"""The console lines of `stackgate lock`: what a resolution wrote and moved, a wheelhouse filled."""

from __future__ import annotations

from pathlib import Path

from stackgate.models import pylock
from stackgate.render.ui import UI
from stackgate.stack import resolve

__all__ = ["UNCHANGED", "outcome_lines", "size", "wheelhouse_lines"]

#: What a lock of an unchanged spec says under its answer.
UNCHANGED = (
    "the spec's inputs have not changed since it was resolved; `stackgate lock --refresh` asks the indexes again"
)


def size(resolution: pylock.Resolution) -> str:
    return f"{len(resolution.packages)} distributions, {len(resolution.files)} files, each with its sha256"


def outcome_lines(outcome: resolve.Outcome, upgrade: tuple[str, ...], ui: UI) -> None:
    verb = "wrote" if outcome.changed else "unchanged:"
    ui.line(f"{verb} {outcome.path} ({size(outcome.resolution)})")
    if outcome.moved and outcome.replaced:
        ui.table(
            "what moved",
            ("package", "before", "now"),
            [(m.name, m.old or "(none)", m.new or "(none)") for m in outcome.moved],
            align="lll",
        )
    elif upgrade:
        ui.line(f"--upgrade-package {', '.join(upgrade)}: nothing moved")
    for taken in outcome.first_use:
        ui.warn(
            f"{taken.name}: sha256 {taken.sha256} of {taken.url} was recorded on first use: nothing but this download "
            f"vouches for those bytes. Compare it with the publisher's, then pin it in the spec: "
            f'python.packages.{taken.name} = {{ ..., sha256 = "{taken.sha256}" }}'
        )


def wheelhouse_lines(resolution: pylock.Resolution, wheelhouse: Path, downloaded: int, ui: UI) -> None:
    kept = len(resolution.files) - downloaded
    ui.line(
        f"wheelhouse {wheelhouse}: {len(resolution.files)} files, each checked against its sha256 "
        f"({downloaded} downloaded, {kept} already there)"
    )
    ui.line(f"  install from it with no index: stackgate provision --wheelhouse {wheelhouse}")
