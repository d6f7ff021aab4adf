"""What stackgate launched, recorded so that a run killed outright leaves nothing running.

A server is launched to die with stackgate (a parent-death signal), but that holds for its main
process only: an engine whose workers set no parent-death signal of their own leaves them running
when stackgate is killed with SIGKILL, and a SIGKILLed process runs no cleanup. So each launch is
recorded under the state folder (``<state>/launched/<pgid>-<pid>.json``): who launched it (pid and
start time), its process group, and every process of it seen, each with its start time. The record
grows as processes appear and is removed once teardown has ended them all.

Every command that launches first calls :func:`reap`: a record whose launcher is no longer running
belongs to a dead run, and each of its processes still running *with the recorded start time* is
SIGKILLed (a pid the kernel has since given to another program has another start time and is left
alone). While a recorded process is still in the group, the group's id was never given to another
group, so every member of it is the dead run's too (workers it started after the last look).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from stackgate.models import settings
from stackgate.models.secretargs import shown
from stackgate.serve.procs import describe, processes, read_stat

__all__ = ["SCHEMA", "Reaped", "Record", "folder", "reap", "reap_and_tell", "reaped_lines"]

SCHEMA = "stackgate.launched/1"
#: How long a reap waits for what it SIGKILLed to be gone.
REAP_WAIT_S = 5.0
_POLL_S = 0.05


def folder(environ: Mapping[str, str] | None = None) -> Path:
    """Where launches are recorded."""
    return settings.state_home(environ) / "launched"


class Record:
    """One launch's record file, kept up to date as its processes are seen; best effort: a state
    folder that cannot be written is told (``error``), never a reason not to launch."""

    def __init__(self, pgid: int, argv: Sequence[str], *, environ: Mapping[str, str] | None = None) -> None:
        me = read_stat(os.getpid())
        self.path = folder(environ) / f"{pgid}-{os.getpid()}.json"
        self.error: str | None = None
        self._guard = threading.Lock()
        self._body: dict[str, Any] = {
            "schema": SCHEMA,
            "launcher": {"pid": os.getpid(), "starttime": me.starttime if me else None, "command": _own_command()},
            "launched_at": time.time(),
            "pgid": pgid,
            "argv": list(shown(argv)),
            "processes": {},
        }

    def update(self, seen: Mapping[int, int]) -> None:
        """Write the record with every process seen so far (pid -> start time)."""
        with self._guard:
            self._body["processes"] = {str(pid): start for pid, start in sorted(seen.items())}
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                partial = self.path.with_name(f".{self.path.name}.{threading.get_ident()}")
                partial.write_text(json.dumps(self._body, indent=1))
                os.replace(partial, self.path)
            except OSError as exc:
                self.error = f"cannot record the launch in {self.path.parent}: {exc.strerror or exc}"

    def forget(self) -> None:
        """Everything launched has ended (or was left running on purpose): no record."""
        with self._guard:
            with contextlib.suppress(OSError):
                self.path.unlink()


def _own_command() -> str:
    try:
        words = Path("/proc/self/cmdline").read_bytes().split(b"\0")
    except OSError:
        return ""
    return " ".join(shown([w.decode(errors="replace") for w in words if w]))[:200]


@dataclass(frozen=True)
class Reaped:
    """What a dead run left running, and was ended."""

    launcher: str  #: ``pid 1234 (python -m stackgate smoke ...)``
    launched_at: float
    ended: tuple[str, ...]  #: each process, described
    left: tuple[str, ...] = ()  #: still alive after SIGKILL and the wait (should be empty)


def reap(environ: Mapping[str, str] | None = None, wait_s: float = REAP_WAIT_S) -> list[Reaped]:
    """End what the launches of dead runs left running; remove their records. The records of
    running launchers are left alone."""
    found = []
    for path in sorted(folder(environ).glob("*.json")):
        body = _read(path)
        if body is not None and _running(body["launcher"]):
            continue
        ended = _end(body, wait_s) if body is not None else None
        with contextlib.suppress(OSError):
            path.unlink()
        if ended is not None:
            found.append(ended)
    return found


def _end(body: Mapping[str, Any], wait_s: float) -> Reaped | None:
    """SIGKILL what one dead run's record names; what was ended, None when nothing was left."""
    victims = _victims(body)
    if not victims:
        return None
    described = tuple(describe(pid) for pid in victims)
    for pid in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    left = tuple(describe(pid) for pid in _wait_gone(victims, wait_s))
    who = body["launcher"]
    launcher = f"pid {who['pid']} ({who.get('command') or 'unknown command'})"
    return Reaped(launcher, float(body.get("launched_at") or 0.0), described, left)


def reap_and_tell(tell: Callable[[str], object], environ: Mapping[str, str] | None = None) -> list[Reaped]:
    """:func:`reap`, each line of what was ended given to ``tell`` (a command's warning line)."""
    reaped = reap(environ)
    for line in reaped_lines(reaped):
        tell(line)
    return reaped


def reaped_lines(reaped: Sequence[Reaped]) -> list[str]:
    """What a command says about what it ended, one line per dead run, then each process."""
    lines = []
    for item in reaped:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(item.launched_at))
        what = f"ended {len(item.ended)} process(es) that a dead stackgate run left running"
        lines.append(f"{what} (launched {when} by {item.launcher}):")
        lines += [f"  {text}" for text in item.ended]
        lines += [f"  still alive after SIGKILL: {text}" for text in item.left]
    return lines


def _read(path: Path) -> dict[str, Any] | None:
    """A record, or None when it is not one (it is then removed: it cannot name a process)."""
    try:
        body = json.loads(path.read_text())
        launcher = body["launcher"]
        body["processes"] = {int(pid): int(start) for pid, start in body["processes"].items()}
        body["pgid"] = int(body["pgid"])
        int(launcher["pid"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return body if isinstance(body, dict) else None


def _running(launcher: Mapping[str, Any]) -> bool:
    stat = read_stat(int(launcher["pid"]))
    return stat is not None and stat.alive and stat.starttime == launcher.get("starttime")


def _victims(body: Mapping[str, Any]) -> list[int]:
    """The recorded processes still running as themselves, and, while one of them keeps the group
    (or session) alive, every other member of it."""
    pgid = body["pgid"]
    alive = {}
    for pid, start in body["processes"].items():
        stat = read_stat(pid)
        if stat is not None and stat.alive and stat.starttime == start:
            alive[pid] = stat
    if any(pgid in (s.pgrp, s.session) for s in alive.values()):
        alive.update({s.pid: s for s in processes() if s.alive and pgid in (s.pgrp, s.session)})
    return sorted(alive)


def _wait_gone(pids: Sequence[int], limit_s: float) -> list[int]:
    deadline = time.monotonic() + limit_s
    while True:
        left = [pid for pid in pids if (stat := read_stat(pid)) is not None and stat.alive]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(_POLL_S)
