"""The generations under a stack root, read without changing them: which exist, in what state,
and which one ``<root>/current`` points at.

Observation only (a peer of the other facts); :mod:`stackgate.stack.generations` creates,
switches, prunes and rolls back generations, and reads them through this module.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

__all__ = ["MARKER", "Generation", "RootState", "generations_dir", "read"]

#: The file each generation carries: its state, what it was built from, when.
MARKER = "stackgate-generation.json"
_ID = re.compile(r"^(\d{4,})-")


@dataclass(frozen=True)
class Generation:
    path: Path
    marker: Mapping[str, Any] | None  #: None when the marker is missing or unreadable

    @property
    def id(self) -> str:
        return self.path.name

    @property
    def number(self) -> int:
        match = _ID.match(self.path.name)
        return int(match[1]) if match else -1

    @property
    def state(self) -> str:
        return str(self.marker.get("state", "unknown")) if self.marker else "unknown"

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    @property
    def failed(self) -> bool:
        """Built, then failed its checks (or an upgrade's verify): kept for inspection, never
        switched or rolled back to."""
        return self.state == "failed"

    @property
    def was_current(self) -> bool:
        """Whether ``current`` ever pointed here (rollback only goes back to such a generation)."""
        return bool(self.marker and self.marker.get("switched_in"))

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def describe(self) -> str:
        built = self.marker.get("finished") or self.marker.get("created") if self.marker else None
        spec = self.marker.get("lock", {}) if self.marker else {}
        parts = [f"built {built}" if built else self.state, f"from {spec.get('path')}" if spec.get("path") else ""]
        return f"generation {self.id} ({', '.join(p for p in parts if p)})"


@dataclass(frozen=True)
class RootState:
    """What is under a root: its generations, oldest first, and the one ``current`` points to."""

    root: Path
    generations: tuple[Generation, ...]
    current: Generation | None
    current_error: str | None = None  #: why ``current`` exists but is not a usable generation

    @property
    def next_id(self) -> str:
        number = max((g.number for g in self.generations), default=0) + 1
        return f"{number:04d}-{time.strftime('%Y%m%dT%H%M%S')}"

    @property
    def unfinished(self) -> tuple[Generation, ...]:
        current = self.current.path if self.current else None
        return tuple(g for g in self.generations if not g.ready and not g.failed and g.path != current)

    @property
    def failed(self) -> tuple[Generation, ...]:
        """Generations that failed their checks, oldest first (the newest is kept for inspection)."""
        return tuple(g for g in self.generations if g.failed)


def generations_dir(root: Path) -> Path:
    return root / "generations"


def read(root: Path) -> RootState:
    """Read a root without changing it (a root that does not exist yet is empty)."""
    found = []
    directory = generations_dir(root)
    if directory.is_dir():
        for path in sorted(directory.iterdir(), key=lambda p: (Generation(p, None).number, p.name)):
            if path.is_dir() and not path.name.startswith("."):
                found.append(Generation(path, _read_marker(path)))
    current, error = _current(root, found)
    return RootState(root, tuple(found), current, error)


def _current(root: Path, found: list[Generation]) -> tuple[Generation | None, str | None]:
    link = root / "current"
    if not link.is_symlink():
        return None, (f"{link} is not a symlink" if link.exists() else None)
    target = (link.parent / os.readlink(link)).resolve()
    match = next((g for g in found if g.path.resolve() == target), None)
    if match is None:
        return None, f"{link} points at {target}, which is not a generation of {root}"
    return match, None


def _read_marker(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
