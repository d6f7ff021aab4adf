"""Which processes belong to a launched server, read from /proc.

The engine runs in its own session and process group, and its workers normally stay there; a
worker that moved to a group of its own is still found through its parent, as long as it was seen
once. Every process seen is remembered with its start time, so that a pid the kernel has since
given to an unrelated program is never signalled.
"""

from __future__ import annotations

import ipaddress
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from stackgate.models.secretargs import shown

__all__ = [
    "HALTED",
    "Listener",
    "ProcStat",
    "ProcessTree",
    "describe",
    "ignores",
    "listeners",
    "one_line",
    "processes",
    "read_stat",
    "socket_holder",
    "socket_inodes",
]

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
    """``1234 (python -m sglang.launch_server ...)`` for a report, on one line; an --api-key's value hidden."""
    try:
        words = (_PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return str(pid)
    text = one_line(" ".join(shown([w.decode(errors="replace") for w in words if w])))
    return f"{pid} ({text[:100]})" if text else str(pid)


def one_line(text: str) -> str:
    r"""``text`` on one line: a line break or any other control character written as its escape.

    A command line may hold a whole script (``python -c "..."``); printed raw, its line breaks
    would start lines of their own in a console message.

    >>> one_line("python -c 'import os\nos.sleep(1)'\t\x1b[2J")
    "python -c 'import os\\nos.sleep(1)'\\t\\x1b[2J"
    """
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def ignores(pid: int, sig: int = signal.SIGTERM) -> bool:
    """Whether the process ignores ``sig`` (its /proc/<pid>/status SigIgn mask).

    >>> ignores(os.getpid())
    False
    """
    try:
        status = (_PROC / str(pid) / "status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


# --- listening sockets ------------------------------------------------------------------------

_LISTEN = "0A"  #: TCP_LISTEN in /proc/net/tcp's st column


@dataclass(frozen=True)
class Listener:
    """A listening TCP socket, as /proc/net/tcp{,6} shows it."""

    address: str
    port: int
    uid: int
    inode: int


def listeners(port: int) -> list[Listener]:
    """The sockets listening on ``port`` (this network namespace), IPv4 and IPv6."""
    found = []
    for name in ("tcp", "tcp6"):
        try:
            rows = (_PROC / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            address, _, hexport = fields[1].partition(":")
            if int(hexport, 16) == port:
                found.append(Listener(_address(address), port, int(fields[7]), int(fields[9])))
    return found


def _address(text: str) -> str:
    """/proc/net/tcp's hex address (32-bit words in host order, little-endian here) as an IP.

    >>> _address("0100007F"), _address("00000000000000000000000000000000"), _address("0000000000000000FFFF00000100007F")
    ('127.0.0.1', '::', '127.0.0.1')
    """
    raw = b"".join(int(text[i : i + 8], 16).to_bytes(4, "little") for i in range(0, len(text), 8))
    address = ipaddress.ip_address(raw)
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return str(mapped or address)


def socket_inodes(pid: int) -> set[int]:
    """The socket inodes among a process's open files (empty when they cannot be read)."""
    inodes: set[int] = set()
    try:
        entries = list((_PROC / str(pid) / "fd").iterdir())
    except OSError:
        return inodes
    for entry in entries:
        try:
            target = os.readlink(entry)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def socket_holder(inode: int) -> int | None:
    """The pid of a process holding the socket, among those this user may inspect; None if none."""
    for stat in processes():
        if inode in socket_inodes(stat.pid):
            return stat.pid
    return None
