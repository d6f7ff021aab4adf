"""Fingerprints of kept toolkits: a fast, stable summary of a tree (paths, types, modes, owners, sizes,
mtimes, link targets, and content hashes of ``bin/*``), the named differences between two, and
:func:`kept_untouched`, which fails naming what changed in a toolkit stackgate must never touch.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

from stackgate.edges import fetch
from stackgate.models.spec import Toolkit
from stackgate.stack.toolkittree import ToolkitError

__all__ = [
    "Fingerprint",
    "fingerprint",
    "fingerprint_diff",
    "kept_untouched",
    "take_fingerprint",
]

# --- fingerprints of kept toolkits --------------------------------------------------------------

_HASHED_DIRS = ("bin", "nvvm/bin")


@dataclass(frozen=True)
class Fingerprint:
    """What a tree looks like: one entry per path, relative to the prefix."""

    prefix: Path
    entries: Mapping[str, tuple[object, ...]]

    @property
    def digest(self) -> str:
        text = "\n".join(f"{path}\t{entry!r}" for path, entry in sorted(self.entries.items()))
        return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def take_fingerprint(prefix: Path) -> Fingerprint:
    """Paths, types, modes, owners, sizes, mtimes and link targets; content hashes of bin/*."""
    entries: dict[str, tuple[object, ...]] = {}
    if prefix.is_symlink():
        entries["."] = ("link", os.readlink(prefix))
    if not prefix.exists():
        entries.setdefault(".", ("absent",))
        return Fingerprint(prefix, entries)
    root = prefix.resolve()
    for path, info in _walk(root):
        relative = path.relative_to(root).as_posix()
        entries[relative] = _entry(path, info, relative)
    return Fingerprint(prefix, entries)


def _walk(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    stack = [root]
    while stack:
        directory = stack.pop()
        with os.scandir(directory) as scan:
            for item in scan:
                info = item.stat(follow_symlinks=False)
                yield Path(item.path), info
                if stat.S_ISDIR(info.st_mode):
                    stack.append(Path(item.path))


def _entry(path: Path, info: os.stat_result, relative: str) -> tuple[object, ...]:
    owner = (oct(stat.S_IMODE(info.st_mode)), info.st_uid, info.st_gid)
    if stat.S_ISLNK(info.st_mode):
        return ("link", os.readlink(path))
    if stat.S_ISDIR(info.st_mode):
        return ("dir", *owner)  # no mtime: an added or removed entry shows up by itself
    content = (
        fetch.sha256_file(path) if stat.S_ISREG(info.st_mode) and relative.rpartition("/")[0] in _HASHED_DIRS else ""
    )
    return ("file", *owner, info.st_size, info.st_mtime_ns, content)


_FIELDS = {
    "file": ("type", "mode", "owner", "group", "size", "mtime", "content"),
    "dir": ("type", "mode", "owner", "group"),
    "link": ("type", "target"),
    "absent": ("type",),
}


def fingerprint(prefix: Path) -> str:
    """A stable sha256 of :func:`take_fingerprint`: equal digests, untouched tree."""
    return take_fingerprint(prefix).digest


def fingerprint_diff(before: Fingerprint, after: Fingerprint, limit: int = 20) -> list[str]:
    """What changed between two fingerprints of one tree, named path by path.

    >>> a = Fingerprint(Path("/t"), {"bin/x": ("file", "0o755", 0, 0, 3, 1, "aa")})
    >>> fingerprint_diff(a, Fingerprint(Path("/t"), {"bin/x": ("file", "0o755", 0, 0, 4, 2, "bb")}))
    ['changed: bin/x (size, mtime, content)']
    """
    changes = [f"removed: {p}" for p in sorted(before.entries.keys() - after.entries.keys())]
    changes += [f"added: {p}" for p in sorted(after.entries.keys() - before.entries.keys())]
    for path in sorted(before.entries.keys() & after.entries.keys()):
        old, new = before.entries[path], after.entries[path]
        if old != new:
            changes.append(f"changed: {path} ({_changed_fields(old, new)})")
    return changes[:limit] + ([f"... and {len(changes) - limit} more"] if len(changes) > limit else [])


def _changed_fields(old: tuple[object, ...], new: tuple[object, ...]) -> str:
    if old[0] != new[0]:
        return f"was a {old[0]}, now a {new[0]}"
    names = _FIELDS.get(str(old[0]), ())
    return ", ".join(name for name, a, b in zip(names, old, new, strict=False) if a != b)


@contextlib.contextmanager
def kept_untouched(toolkits: Iterable[Toolkit]) -> Iterator[dict[Path, Fingerprint]]:
    """Fingerprint every kept toolkit; on leaving, raise naming what changed in any of them."""
    kept = [t for t in toolkits if t.keep]
    before = {t.prefix: take_fingerprint(t.prefix) for t in kept}
    try:
        yield before
    finally:
        _check_kept(kept, before)


def _check_kept(kept: Sequence[Toolkit], before: Mapping[Path, Fingerprint]) -> None:
    for toolkit in kept:
        changes = fingerprint_diff(before[toolkit.prefix], take_fingerprint(toolkit.prefix))
        if changes:
            raise ToolkitError(
                f"{toolkit.label} is kept (keep = true) but changed during provisioning:\n"
                + "\n".join(f"  {c}" for c in changes)
            )
