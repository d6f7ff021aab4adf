"""What stackgate launched, recorded so that a run killed outright leaves nothing running.

A server is launched to die with stackgate (a parent-death signal), but that holds for its main
process only: an engine whose workers set no parent-death signal of their own leaves them running
when stackgate is killed with SIGKILL, and a SIGKILLed process runs no cleanup. So each launch is
recorded under the state folder (``<state>/launched/<pgid>-<pid>.json``): who launched it (pid and
start time), this machine (host name, boot id, pid namespace), its process group, the sha256 of its
command line, the token of its launch marker, and every process of it seen, each with its start
time. The record grows as processes appear and is removed once teardown has ended them all.

Every command that launches first calls :func:`reap`. A record is state on disk and is trusted
only as this user's own: the folder must be a real folder (never a symbolic link: every look and
removal goes through one descriptor of it) owned by the effective user, that no one else may write
(made 0700; one that others may only read is made private), and each record a regular file of the
same user that no one else may write. A record whose launcher is no longer running belongs to a
dead run; before anything of it is killed, each process is proven to be the server it launched:

- it runs with the recorded start time, in this boot (``/proc/sys/kernel/random/boot_id``) and pid
  namespace (a record of another machine sharing the folder, or of another namespace, is left
  alone; one of an earlier boot of this host names nothing and is removed);
- the launch itself (the leader of the group and session it made) runs the recorded command line
  (its /proc cmdline's sha256) and carries the launch marker, ``STACKGATE_LAUNCH_ID=<token>``, in its
  environment: a variable only a launch sets, with a token only this record holds;
- a worker either carries the marker too or is in the launch's proven group or session (an engine
  that retitles its workers with setproctitle overwrites their environment's copy in /proc);
- a group or session is proven only when its id is the recorded launch's pid, greater than 1, not
  stackgate's own group or session, its leader (while alive) is the proven launch, and one of its
  recorded processes carries the marker; then every member is the dead run's too (workers the last
  look missed: the kernel never reuses the id while a member lives).

Each proven process is SIGKILLed through a pidfd opened before its start time is read again, never
a whole group at once. A record that names anything it cannot prove is removed, its processes left
alone, and the refusal said.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from stackgate.edges import owned
from stackgate.models import settings
from stackgate.models.secretargs import shown
from stackgate.serve.procs import ProcStat, describe, one_line, processes, read_stat

__all__ = [
    "MARKER",
    "SCHEMA",
    "Reaped",
    "Record",
    "command_sha256",
    "folder",
    "new_token",
    "reap",
    "reap_and_tell",
    "reaped_lines",
    "this_machine",
]

SCHEMA = "stackgate.launched/2"
#: The variable a launch sets in its server's environment; its value is the launch's token.
MARKER = settings.LAUNCH_MARKER
#: How long a reap waits for what it SIGKILLed to be gone.
REAP_WAIT_S = 5.0
_POLL_S = 0.05
MAX_RECORD_BYTES = 1 << 20
_PROC = Path("/proc")


def folder(environ: Mapping[str, str] | None = None) -> Path:
    """Where launches are recorded."""
    return settings.state_home(environ) / "launched"


def new_token() -> str:
    """A launch's token: the marker's value in its server's environment, and in its record."""
    return secrets.token_hex(16)


def command_sha256(argv: Sequence[str]) -> str:
    """The sha256 of a command line as /proc/<pid>/cmdline holds it (NUL-separated words)."""
    return hashlib.sha256("\0".join(argv).encode(errors="surrogateescape")).hexdigest()


def this_machine() -> dict[str, str]:
    """What binds a record to the processes it names: host name, boot id, pid namespace."""
    machine = {"host": socket.gethostname(), "boot_id": "", "pid_ns": ""}
    with contextlib.suppress(OSError):
        machine["boot_id"] = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    with contextlib.suppress(OSError):
        machine["pid_ns"] = os.readlink("/proc/self/ns/pid")
    return machine


class Record:
    """One launch's record file, kept up to date as its processes are seen; best effort: a state
    folder that cannot be written (or is not this user's own) is told (``error``), never a reason not
    to launch."""

    def __init__(self, pgid: int, argv: Sequence[str], token: str, *, environ: Mapping[str, str] | None = None) -> None:
        me = read_stat(os.getpid())
        self.folder = folder(environ)
        self.name = f"{pgid}-{os.getpid()}.json"
        self.path = self.folder / self.name
        self.error: str | None = None
        self._guard = threading.Lock()
        self._body: dict[str, Any] = {
            "schema": SCHEMA,
            "launcher": {"pid": os.getpid(), "starttime": me.starttime if me else None, "command": _own_command()},
            "launched_at": time.time(),
            **this_machine(),
            "pgid": pgid,
            "argv": list(shown(argv)),
            "command_sha256": command_sha256(argv),
            "token": token,
            "processes": {},
        }

    def update(self, seen: Mapping[int, int]) -> None:
        """Write the record with every process seen so far (pid -> start time)."""
        with self._guard:
            self._body["processes"] = {str(pid): start for pid, start in sorted(seen.items())}
            try:
                fd = owned.private_folder(self.folder)
                try:
                    owned.replace_owned(self.name, json.dumps(self._body, indent=1).encode(), dir_fd=fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                self.error = f"cannot record the launch in {self.folder}: {exc.strerror or exc}"

    def forget(self) -> None:
        """Everything launched has ended (or was left running on purpose): no record."""
        with self._guard, contextlib.suppress(OSError):
            fd = owned.private_folder(self.folder)
            try:
                os.unlink(self.name, dir_fd=fd)
            finally:
                os.close(fd)


def _own_command() -> str:
    try:
        words = Path("/proc/self/cmdline").read_bytes().split(b"\0")
    except OSError:
        return ""
    return " ".join(shown([w.decode(errors="replace") for w in words if w]))[:200]


@dataclass(frozen=True)
class Reaped:
    """What a dead run left running, and was ended; or a record (or the folder) refused."""

    launcher: str  #: ``pid 1234 (python -m stackgate smoke ...)``
    launched_at: float
    ended: tuple[str, ...]  #: each process, described
    left: tuple[str, ...] = ()  #: still alive after SIGKILL and the wait (should be empty)
    refused: str | None = None  #: why a record or the folder was not obeyed (nothing was signalled)
    spared: tuple[str, ...] = ()  #: processes a refused record named, left running, described


def reap(environ: Mapping[str, str] | None = None, wait_s: float = REAP_WAIT_S) -> list[Reaped]:
    """End what the launches of dead runs left running, each process proven to be one (see the
    module's docstring); remove their records. The records of running launchers, and of other hosts
    or pid namespaces, are left alone; what cannot be proven is refused and said."""
    where = folder(environ)
    if not os.path.lexists(where):
        return []
    try:
        fd = owned.private_folder(where)
    except OSError as exc:
        return [_refusal(f"the launch records in {where} are not read: {exc.strerror or exc}")]
    found = []
    try:
        for name in sorted(n for n in os.listdir(fd) if n.endswith(".json") and not n.startswith(".")):
            outcome = _reap_one(fd, where / name, name, wait_s)
            if outcome is not None:
                found.append(outcome)
    finally:
        os.close(fd)
    return found


def _reap_one(fd: int, path: Path, name: str, wait_s: float) -> Reaped | None:
    """One record: what was ended or refused, None when there was nothing to say."""
    try:
        raw = owned.read_owned(name, MAX_RECORD_BYTES, dir_fd=fd)
    except OSError as exc:  # not this user's own (or not a file): not obeyed, not removed
        return _refusal(f"the launch record {path} is refused: {exc.strerror or exc}")
    body = _parse(raw)
    here = _here(body) if body is not None else False
    if here is None:
        return None  # another machine's (a shared home) or another container's: not for this one to judge
    if here and body is not None and _running(body["launcher"]):
        return None
    try:
        return _end(body, path, wait_s) if here and body is not None else None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=fd)


def _here(body: Mapping[str, Any]) -> bool | None:
    """True: the record is of this boot of this machine, in this pid namespace (its pids name
    processes here); False: of an earlier boot of this host (it names nothing any more); None: of
    another machine sharing the folder, or of another pid namespace (a container) of this boot."""
    machine = this_machine()
    if body["boot_id"] == machine["boot_id"]:
        return True if body["pid_ns"] == machine["pid_ns"] else None
    return False if body["host"] == machine["host"] else None


def _refusal(why: str, spared: tuple[str, ...] = ()) -> Reaped:
    return Reaped("", 0.0, (), refused=why, spared=spared)


def _end(body: Mapping[str, Any], path: Path, wait_s: float) -> Reaped | None:
    """SIGKILL what one dead run's record names and is proven its own; None when nothing was left."""
    victims, spared, why = _victims(body)
    refused = f"the launch record {one_line(str(path))} is refused: {why}" if why is not None else None
    if not victims:
        return _refusal(refused, tuple(describe(p) for p in spared)) if refused is not None else None
    described = tuple(describe(pid) for pid in victims)
    for pid, start in victims.items():
        _kill(pid, start)
    left = tuple(describe(pid) for pid in _wait_gone(list(victims), wait_s))
    who = body["launcher"]
    launcher = f"pid {who['pid']} ({one_line(str(who.get('command') or 'unknown command'))})"
    return Reaped(
        launcher, float(body.get("launched_at") or 0.0), described, left, refused, tuple(describe(p) for p in spared)
    )


def reap_and_tell(tell: Callable[[str], object], environ: Mapping[str, str] | None = None) -> list[Reaped]:
    """:func:`reap`, each line of what was ended (or refused) given to ``tell`` (a command's warning line)."""
    reaped = reap(environ)
    for line in reaped_lines(reaped):
        tell(line)
    return reaped


def reaped_lines(reaped: Sequence[Reaped]) -> list[str]:
    """What a command says about what it ended, one line per dead run, then each process."""
    lines = []
    for item in reaped:
        if item.ended:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(item.launched_at))
            what = f"ended {len(item.ended)} process(es) that a dead stackgate run left running"
            lines.append(f"{what} (launched {when} by {item.launcher}):")
            lines += [f"  {text}" for text in item.ended]
            lines += [f"  still alive after SIGKILL: {text}" for text in item.left]
        if item.refused is not None:
            lines.append(f"{item.refused}; {'they were not' if item.spared else 'nothing was'} signalled")
            lines += [f"  left running: {text}" for text in item.spared]
    return lines


def _parse(raw: bytes) -> dict[str, Any] | None:
    """A record of this schema, its fields typed; None when it is not one (it names no process)."""
    try:
        body = json.loads(raw)
        if not isinstance(body, dict) or body.get("schema") != SCHEMA:
            return None
        body["processes"] = {int(pid): int(start) for pid, start in body["processes"].items()}
        body["pgid"] = int(body["pgid"])
        int(body["launcher"]["pid"])
        strings = ("host", "boot_id", "pid_ns", "command_sha256", "token")
        if not all(isinstance(body[key], str) and body[key] for key in strings):
            return None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return body


def _running(launcher: Mapping[str, Any]) -> bool:
    stat = read_stat(int(launcher["pid"]))
    return stat is not None and stat.alive and stat.starttime == launcher.get("starttime")


def _victims(body: Mapping[str, Any]) -> tuple[dict[int, int], list[int], str | None]:
    """The processes of a dead run proven its own (pid -> start time); the living processes it
    names that are not, and why."""
    pgid, token = body["pgid"], body["token"]
    alive = {}
    for pid, start in body["processes"].items():
        found = read_stat(pid)
        if found is not None and found.alive and found.starttime == start:
            alive[pid] = found
    if not alive:
        return {}, [], None  # everything it named has ended (or the pid names another program now)
    named = sorted(alive)
    if pgid <= 1 or pgid in (os.getpgrp(), os.getsid(0)) or any(pid <= 1 or pid == os.getpid() for pid in alive):
        return {}, named, f"it names process group {pgid} and processes {named}: init's or this stackgate's own"
    leader = alive.get(pgid)
    if leader is not None and not _is_launch(leader, body):
        return {}, named, f"its process {pgid} does not run the recorded command line with the launch marker"
    marked = {pid for pid in alive if _marked(pid, token)}
    in_group = leader is not None or any(pgid in (alive[pid].pgrp, alive[pid].session) for pid in marked)
    proven = {pid: s for pid, s in alive.items() if pid in marked or (in_group and pgid in (s.pgrp, s.session))}
    if in_group:  # the group's members the last look missed
        proven.update({s.pid: s for s in processes() if s.alive and pgid in (s.pgrp, s.session)})
    proven = {pid: s for pid, s in proven.items() if pid > 1 and pid != os.getpid()}
    spared = sorted(set(alive) - set(proven))
    why = "it names processes that carry no marker of its launch and are not in its process group" if spared else None
    return {pid: s.starttime for pid, s in sorted(proven.items())}, spared, why


def _is_launch(leader: ProcStat, body: Mapping[str, Any]) -> bool:
    """The leader runs the recorded command line and carries the launch's marker."""
    try:
        cmdline = (_PROC / str(leader.pid) / "cmdline").read_bytes()
    except OSError:
        return False
    same = hashlib.sha256(cmdline.rstrip(b"\0")).hexdigest() == body["command_sha256"]
    return same and leader.session == leader.pid == leader.pgrp and _marked(leader.pid, body["token"])


def _marked(pid: int, token: str) -> bool:
    """Whether the process's environment carries the launch marker with this token."""
    try:
        entries = (_PROC / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"{MARKER}={token}".encode() in entries


def _kill(pid: int, start: int) -> None:
    """SIGKILL ``pid`` if it is still the process that started at ``start`` (through a pidfd, so a
    pid reused between the look and the signal is never hit)."""
    try:
        handle = os.pidfd_open(pid)
    except (AttributeError, OSError):
        handle = None
    try:
        now = read_stat(pid)
        if now is None or now.starttime != start:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            if handle is not None:
                signal.pidfd_send_signal(handle, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
    finally:
        if handle is not None:
            os.close(handle)


def _wait_gone(pids: Sequence[int], limit_s: float) -> list[int]:
    deadline = time.monotonic() + limit_s
    while True:
        left = [pid for pid in pids if (stat := read_stat(pid)) is not None and stat.alive]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(_POLL_S)
