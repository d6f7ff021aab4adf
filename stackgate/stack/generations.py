"""Each build of the stack's environment is a new generation under ``<root>/generations/<id>/``;
``<root>/current`` is a symlink switched atomically, and only to a generation that passed.

A generation carries ``stackgate-generation.json``: its state ("building" until its checks
pass, then "ready"), what it was built from, when. A generation that is not "ready" was left by an
interrupted or failed run: it was never current, and the next provision removes it and builds
again. One provision at a time: an exclusive ``fcntl`` lock on ``<root>/.provision.lock``, whose
text names the holder; the kernel drops the lock when its holder dies, even by kill -9.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from stackgate.facts.generationstate import MARKER, Generation, RootState, generations_dir, read
from stackgate.models import settings

__all__ = [
    "Busy",
    "Generation",
    "GenerationError",
    "RootState",
    "create",
    "discard_unfinished",
    "exclusive",
    "generations_dir",
    "mark",
    "prune",
    "read",
    "resumable",
    "rollback",
    "rollback_target",
    "sweep",
    "switch",
]

SCHEMA = "stackgate.generation/1"
LOCK_FILE = ".provision.lock"
_REMOVING = ".removing"


class GenerationError(Exception):
    """The root cannot be read or changed as asked."""


class Busy(GenerationError):
    """Another provision holds the root."""


def create(path: Path, about: Mapping[str, Any]) -> Generation:
    """A new, empty generation in state "building" (the plan chose its id: ``RootState.next_id``)."""
    path.mkdir(parents=True)
    marker = {"schema": SCHEMA, "id": path.name, "state": "building", "created": _now(), **about}
    _write_marker(path, marker)
    return Generation(path, marker)


def mark(generation: Generation, state: str, **extra: Any) -> Generation:
    marker = {**(generation.marker or {}), "state": state, **extra}
    if state == "ready":
        marker.setdefault("finished", _now())
    _write_marker(generation.path, marker)
    return Generation(generation.path, marker)


def _write_marker(path: Path, marker: Mapping[str, Any]) -> None:
    part = path / f".{MARKER}.part"
    with open(part, "w") as out:
        json.dump(marker, out, indent=2)
        out.flush()
        os.fsync(out.fileno())
    os.replace(part, path / MARKER)


def switch(root: Path, generation: Generation) -> Generation:
    """Point ``current`` at a ready generation: a new symlink renamed over the old one, so any
    reader sees either the old target or the new one, never neither."""
    if not generation.ready:
        raise GenerationError(f"{generation.describe()} is {generation.state}, not ready: not switching to it")
    link = root / "current"
    part = root / f".current.{os.getpid()}.part"
    part.unlink(missing_ok=True)
    os.symlink(os.path.relpath(generation.path, root), part)
    os.replace(part, link)
    _fsync_dir(root)
    # After the rename: a crash in between costs only this note, never a half switch.
    return mark(generation, "ready", switched_in=_now())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def discard_unfinished(state: RootState, *, on_renamed: Callable[[Path], None] | None = None) -> list[Generation]:
    """Remove generations an interrupted run left (never the current one), and failed ones but
    the newest (kept for inspection). ``on_renamed`` is called between the rename and the
    deletion (provision's fault hook)."""
    removed = []
    for generation in (*state.unfinished, *state.failed[:-1]):
        _remove(generation.path, on_renamed)
        removed.append(generation)
    return removed


def prune(state: RootState, keep: int | None = None) -> list[Generation]:
    """Keep the current generation and the newest ones that were current before it, ``keep`` in
    all (default: $STACKGATE_KEEP_GENERATIONS); the rest go (generations rolled back from, and
    ready ones never switched to); the newest failed generation stays, for inspection."""
    if state.current is None:
        return []
    keep = settings.KEEP_GENERATIONS.value() if keep is None else keep
    kept = {
        state.current.path,
        *(g.path for g in _earlier(state)[-(keep - 1) :] if keep > 1),
        *(g.path for g in state.failed[-1:]),
    }
    removed = [g for g in state.generations if g.path not in kept]
    for generation in removed:
        _remove(generation.path)
    return removed


def _earlier(state: RootState) -> list[Generation]:
    """Ready generations before the current one that were current once and not rolled back
    from, oldest first: the history rollback walks back through."""
    assert state.current is not None
    earlier = [g for g in state.generations if g.ready and g.was_current and g.number < state.current.number]
    return [g for g in earlier if not (g.marker or {}).get("rolled_back")]


def resumable(state: RootState, spec: Mapping[str, Any]) -> Generation | None:
    """A generation an interrupted run built and checked from ``spec`` but never switched to."""
    after = state.current.number if state.current else 0
    found = [
        g
        for g in state.generations
        if g.ready and not g.was_current and g.number > after and g.marker and g.marker.get("spec") == spec
    ]
    return found[-1] if found else None


def _remove(path: Path, on_renamed: Callable[[Path], None] | None = None) -> None:
    # Renamed first, so that a crash half-way leaves a hidden folder (which sweep removes), not
    # a half generation.
    doomed = path.with_name(f".{path.name}{_REMOVING}")
    try:
        os.replace(path, doomed)
    except FileNotFoundError:
        return
    if on_renamed is not None:
        on_renamed(doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def sweep(root: Path) -> list[Path]:
    """Remove what a killed run left half-done under ``root`` and nothing else: generations it
    was removing (``generations/.<id>.removing``, gigabytes with a real torch) and a ``current``
    link it was about to rename (``.current.<pid>.part``). Call it holding :func:`exclusive`."""
    directory = generations_dir(root)
    leftovers = sorted(directory.glob(f".*{_REMOVING}")) if directory.is_dir() else []
    leftovers += sorted(p for p in root.glob(".current.*.part") if p.is_symlink())
    for path in leftovers:
        if path.is_symlink() or not path.is_dir():
            path.unlink(missing_ok=True)
        else:
            shutil.rmtree(path, ignore_errors=True)
    return [p for p in leftovers if not os.path.lexists(p)]


def rollback_target(state: RootState) -> Generation:
    """Where rollback goes: the newest generation before ``current`` that was current once (and
    was not rolled back from)."""
    if state.current is None:
        raise GenerationError(state.current_error or f"nothing to roll back: {state.root / 'current'} does not exist")
    earlier = [g for g in _earlier(state) if g.python.exists()]
    if not earlier:
        raise GenerationError(
            f"no earlier ready generation under {generations_dir(state.root)} to roll back to (current: "
            f"{state.current.id})"
        )
    return earlier[-1]


def rollback(root: Path, target: Generation | None = None) -> tuple[Generation, Generation]:
    """Switch ``current`` to ``target`` (default: :func:`rollback_target`); return (from, to)."""
    state = read(root)
    target = target or rollback_target(state)
    if target.failed:
        failures = "; ".join(str(f) for f in (target.marker or {}).get("failures", [])[:3]) or "no reason recorded"
        raise GenerationError(
            f"{target.describe()} failed its checks ({failures}): it is kept for inspection, never rolled back to"
        )
    assert state.current is not None  # rollback_target refused a root without one
    switched = switch(root, target)
    # The generation left behind was judged bad: never a rollback target or kept again.
    return mark(state.current, "ready", rolled_back=_now()), switched


# --- one provision at a time -------------------------------------------------------------------


@contextlib.contextmanager
def exclusive(
    root: Path,
    *,
    wait: bool,
    command: str | None = None,
    on_wait: Callable[[str], None] | None = None,
    busy_advice: str = "wait for it",
) -> Iterator[None]:
    """Hold the root's provision lock; fail at once naming the holder (and ``busy_advice``: what
    the caller's user can do about it), or wait for it."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise GenerationError(
            f"cannot create or lock {root}: {exc.strerror or exc} (run as a user who may write there, or set "
            "python.root elsewhere)"
        ) from exc
    try:
        if not _try_lock(fd):
            holder = _holder(fd)
            if not wait:
                raise Busy(f"another provision is running on {root}: {holder}; {busy_advice}")
            if on_wait is not None:
                on_wait(f"waiting for the provision holding {root}: {holder}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        _write_holder(fd, command)
        yield
    finally:
        os.close(fd)  # closing drops the lock; the kernel does it too if this process dies


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return False
        raise
    return True


def _write_holder(fd: int, command: str | None) -> None:
    text = json.dumps({"pid": os.getpid(), "started": _now(), "command": command or " ".join(sys.argv)})
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode() + b"\n", 0)


def _holder(fd: int) -> str:
    try:
        data = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        return f"pid {data['pid']}, started {data['started']}, command: {data['command']}"
    except (ValueError, KeyError, TypeError, OSError):
        return "a process that has not written its name yet"


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
