"""Which processes belong to a launched server, read from /proc.

The engine runs in its own session and process group, and its workers normally stay there; a
worker that moved to a group of its own is still found through its parent, as long as it was seen
once. Every process seen is remembered with its start time, so that a pid the kernel has since
given to an unrelated program is never signalled.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from stackgate.models.secretargs import shown

__all__ = ["HALTED", "ProcStat", "ProcessTree", "describe", "processes", "read_stat"]

_PROC = Path("/proc")
#: The states of a process that cannot answer, as /proc/<pid>/stat writes them.
HALTED = {
    "T": "is stopped (state T: SIGSTOP, or a job-control stop)",
    "t": "is stopped by a debugger (state t)",
    "D": "is in uninterruptible sleep (state D: waiting in the kernel or a driver)",
}


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    pgrp: int
    session: int
    state: str
    starttime: int  #: clock ticks after boot: with the pid, names one process for good

    @property
    def alive(self) -> bool:
        # A zombie has exited and holds nothing (no memory, no GPU context); it waits to be reaped.
        return self.state not in ("Z", "X")


def read_stat(pid: int) -> ProcStat | None:
    """One process's /proc/<pid>/stat, or None when it is gone.

    >>> read_stat(os.getpid()).pid == os.getpid()
    True
    """
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may itself hold spaces or parentheses.
    fields = text[text.rindex(")") + 2 :].split()
    return ProcStat(pid, int(fields[1]), int(fields[2]), int(fields[3]), fields[0], int(fields[19]))


def processes() -> list[ProcStat]:
    """Every process of this machine now (that this user may read)."""
    stats = []
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            stat = read_stat(int(entry.name))
            if stat is not None:
                stats.append(stat)
    return stats


class ProcessTree:
    """The processes of one server: its group, its session, and every descendant ever seen.

    ``on_seen(seen)`` is called whenever a process is seen for the first time (the launch's
    record is kept up to date with it)."""

    def __init__(self, leader: int, on_seen: Callable[[Mapping[int, int]], None] | None = None) -> None:
        self.leader = leader
        self.seen: dict[int, int] = {}  #: pid -> start time
        self.on_seen = on_seen

    def scan(self) -> list[int]:
        """The living members now; each is remembered."""
        stats = processes()
        children: dict[int, list[ProcStat]] = {}
        for stat in stats:
            children.setdefault(stat.ppid, []).append(stat)
        members = {s.pid: s for s in stats if s.pgrp == self.leader or s.session == self.leader}
        queue = [self.leader, *self.seen]
        while queue:
            for child in children.get(queue.pop(), ()):
                if child.pid not in members:
                    members[child.pid] = child
                    queue.append(child.pid)
        new = [stat for stat in members.values() if stat.pid not in self.seen]
        for stat in new:
            self.seen.setdefault(stat.pid, stat.starttime)
        if new and self.on_seen is not None:
            self.on_seen(dict(self.seen))
        return sorted(s.pid for s in members.values() if s.alive)

    def alive(self) -> list[int]:
        """Every process of the server still running: members now, and remembered ones."""
        now = set(self.scan())
        for pid, started in self.seen.items():
            stat = read_stat(pid)
            if stat is not None and stat.starttime == started and stat.alive:
                now.add(pid)
        return sorted(now)

    def halted(self) -> list[str]:
        """The living members that cannot answer now (stopped, or stuck in the kernel), described."""
        found = []
        for pid in self.alive():
            stat = read_stat(pid)
            if stat is not None and stat.state in HALTED:
                found.append(f"process {describe(pid)} {HALTED[stat.state]}")
        return found

    def signal(self, sig: int) -> None:
        """Signal the group, then any remembered process that left it."""
        try:
            os.killpg(self.leader, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in self.alive():
            stat = read_stat(pid)
            if stat is not None and stat.pgrp != self.leader and stat.starttime == self.seen.get(pid):
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass


def describe(pid: int) -> str:
    """``1234 (python -m sglang.launch_server ...)`` for a report; an --api-key's value hidden."""
    try:
        words = (_PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return str(pid)
    text = " ".join(shown([w.decode(errors="replace") for w in words if w]))
    return f"{pid} ({text[:100]})" if text else str(pid)
