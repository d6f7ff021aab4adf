"""The one edge through which stackgate runs other programs.

Every subprocess runs in its own process group so that a timeout or an interrupt can end the
whole tree it started, never just its leader. Once :func:`terminate_all` has run (Ctrl-C or
SIGTERM), nothing new starts: a worker thread that goes on to its next command (a facts part's
next probe, say) gets :class:`Interrupted` instead of a process the interpreter would wait for
at exit.
"""

from __future__ import annotations

import collections
import ctypes
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Mapping, Sequence

__all__ = [
    "Completed",
    "Held",
    "Interrupted",
    "call_forked",
    "forget",
    "kill_group",
    "live",
    "reopen",
    "run",
    "run_logged",
    "spawn",
    "start",
    "stream",
    "terminate_all",
]

# Process groups of the commands running now, so that an interrupt can end them all: worker
# threads never see KeyboardInterrupt, and the interpreter waits for them at exit.
_LIVE: set[int] = set()
_LIVE_GUARD = threading.Lock()
#: Set by terminate_all: the run was interrupted, so no command may start any more.
_CLOSED = threading.Event()


class Interrupted(KeyboardInterrupt):
    """A command asked to start after :func:`terminate_all`: the run is being interrupted.

    A KeyboardInterrupt, so that it ends whatever asked (a check, a facts part, a stage) the
    way Ctrl-C does, and is never mistaken for the command's own failure.
    """

    def __init__(self, argv: Sequence[str]) -> None:
        super().__init__(f"interrupted: not starting {argv[0] if argv else 'a command'}")


@dataclass(frozen=True)
class Completed:
    """How a command ended. ``returncode`` is None when it was killed for its timeout."""

    argv: tuple[str, ...]
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    @property
    def ended(self) -> str:
        """How it ended, for a message: ``exit 2``, or ``timed out``."""
        return "timed out" if self.timed_out else f"exit {self.returncode}"

    def tail(self, lines: int = 12) -> list[str]:
        """The last lines of stderr (stdout when stderr is empty)."""
        text = self.stderr.strip() or self.stdout.strip()
        return text.splitlines()[-lines:]


def run(
    argv: Sequence[str | Path],
    *,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    stdin: str | None = None,
    cleanup: bool = False,
) -> Completed:
    """Run a command to completion, capturing its output as text.

    A program that cannot be started reports 127 and the OS error, as a shell would. A ``cleanup``
    command (one that undoes what this run started elsewhere: ``scancel`` of its own job) runs
    even after :func:`terminate_all`.
    """
    args = tuple(str(a) for a in argv)
    if not cleanup:
        _refuse_if_closed(args)
    started = time.monotonic()
    try:
        process = _start_piped(
            args,
            env,
            cwd,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            die_with_parent=False,
        )
    except OSError as exc:
        return Completed(args, 127, "", f"{CANNOT_RUN}{args[0]}: {exc.strerror or exc}", 0.0)
    if cleanup:
        with _LIVE_GUARD:
            _LIVE.add(process.pid)
    else:
        _register(process, args)
    try:
        stdout, stderr = process.communicate(stdin, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(process.pid)
        stdout, stderr = process.communicate()
        return Completed(args, None, stdout, stderr, time.monotonic() - started)
    except BaseException:
        kill_group(process.pid)
        process.wait()
        raise
    finally:
        with _LIVE_GUARD:
            _LIVE.discard(process.pid)
    return Completed(args, process.returncode, stdout, stderr, time.monotonic() - started)


#: How :func:`run`'s stderr begins when the program could not be started at all (exit 127).
CANNOT_RUN = "cannot run "


def start(
    argv: Sequence[str | Path],
    *,
    env: Mapping[str, str] | None = None,
    stdin: bool = False,
    stdout: bool = True,
) -> subprocess.Popen[bytes]:
    """Start a program in its own session (so a Ctrl-C at the terminal is this process's to handle),
    its output on byte pipes (stdout on /dev/null unless ``stdout``), its input a pipe when ``stdin``
    (else /dev/null); tracked for :func:`terminate_all` until :func:`forget`. The caller reads its
    pipes and owns its lifetime (a scheduler's client: salloc, srun). Raises OSError when it cannot
    be started, :class:`Interrupted` after :func:`terminate_all`."""
    args = tuple(str(a) for a in argv)
    _refuse_if_closed(args)
    process = subprocess.Popen(
        args,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE if stdout else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=dict(env) if env is not None else None,
        start_new_session=True,
    )
    _register(process, args)
    return process


def forget(process: subprocess.Popen[Any]) -> None:
    """A command from :func:`start` that has ended (or is ended by its caller): no longer tracked."""
    with _LIVE_GUARD:
        _LIVE.discard(process.pid)


def live() -> frozenset[int]:
    """The process groups :func:`terminate_all` would end now."""
    with _LIVE_GUARD:
        return frozenset(_LIVE)


def terminate_all() -> None:
    """Kill the process group of every command still running (on Ctrl-C or SIGTERM), and refuse
    every command asked for from now on (:class:`Interrupted`) until :func:`reopen`."""
    with _LIVE_GUARD:
        _CLOSED.set()
        groups = list(_LIVE)
    for pgid in groups:
        kill_group(pgid)


def reopen() -> None:
    """Let commands start again after :func:`terminate_all`: for a process that begins another
    run after an interrupted one (a library caller, the tests). The command line never does."""
    _CLOSED.clear()


def _refuse_if_closed(args: Sequence[str]) -> None:
    if _CLOSED.is_set():
        raise Interrupted(args)


def _register(process: subprocess.Popen[Any], args: Sequence[str]) -> None:
    """Track a started command for terminate_all. One started while terminate_all ran (it was
    past the check above but not yet tracked) is killed here, so it cannot slip through."""
    with _LIVE_GUARD:
        if not _CLOSED.is_set():
            _LIVE.add(process.pid)
            return
    kill_group(process.pid)
    process.wait()
    raise Interrupted(args)


def spawn(
    argv: Sequence[str | Path],
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    die_with_parent: bool = True,
) -> subprocess.Popen[bytes]:
    """Start a long-running program in its own session (so its own process group), stdout and
    stderr appended to ``log_path``; the caller owns its lifetime (see :func:`kill_group`).

    With ``die_with_parent`` Linux SIGKILLs it if this process dies, even by SIGKILL (a server
    left up on purpose is started without). Raises OSError when the program cannot be started.
    """
    _refuse_if_closed([str(a) for a in argv])
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # O_APPEND: the program's stdout and stderr (and its children's) interleave without overwriting.
    # 0600: the log is the program's raw output (a server echoes its --api-key, a URL's password):
    # readable by its owner only, an existing file too; never written through a planted link.
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with open(fd, "ab", buffering=0) as log:
        os.fchmod(log.fileno(), 0o600)
        return subprocess.Popen(
            [str(a) for a in argv],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_die_with_parent() if die_with_parent else None,
        )


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Signal a whole process group; a group that is already gone is fine."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


#: How much of a streamed command's output is kept in memory (all of it goes to the log).
_KEEP_CHARS = 1 << 20


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> Callable[[], None] | None:
    """A pre-exec hook asking Linux to SIGKILL the child when its parent dies, so that a killed
    provisioner's installer cannot go on writing into a generation the next run rebuilds."""
    if not sys.platform.startswith("linux"):
        return None
    # Resolved before the fork: the child must not load libraries between fork and exec.
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    return hook


def stream(
    argv: Sequence[str | Path],
    *,
    log: Path,
    timeout_s: float | None,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    on_line: Callable[[str], None] | None = None,
) -> Completed:
    """Run a long command, appending its merged stdout and stderr to ``log`` line by line.

    ``on_line`` sees each line as it comes (for progress). The returned ``stdout`` holds the
    output (its last megabyte); ``stderr`` is empty because both streams are merged.
    """
    args = tuple(str(a) for a in argv)
    _refuse_if_closed(args)
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log, "a", encoding="utf-8", errors="replace") as sink:
        sink.write(f"$ {shlex.join(args)}\n")
        sink.flush()
        try:
            process = _start_piped(args, env, cwd, stdin=subprocess.DEVNULL)
        except OSError as exc:
            message = f"{CANNOT_RUN}{args[0]}: {exc.strerror or exc}"
            sink.write(message + "\n")
            return Completed(args, 127, "", message, 0.0)
        _register(process, args)
        return _follow(process, args, sink, timeout_s, on_line, started)


def _start_piped(
    args: Sequence[str],
    env: Mapping[str, str] | None,
    cwd: Path | str | None,
    *,
    stdin: int,
    stderr: int = subprocess.STDOUT,
    die_with_parent: bool = True,
) -> subprocess.Popen[str]:
    """A command in its own session, its output as text on a pipe (stderr merged into it unless
    given its own; raises OSError)."""
    return subprocess.Popen(
        args,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=stderr,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        text=True,
        errors="replace",
        start_new_session=True,
        preexec_fn=_die_with_parent() if die_with_parent else None,
    )


def _follow(
    process: subprocess.Popen[str],
    args: Sequence[str],
    sink: IO[str],
    timeout_s: float | None,
    on_line: Callable[[str], None] | None,
    started: float,
) -> Completed:
    """Copy a started command's output into ``sink`` until it ends, killing its group past ``timeout_s``."""
    expired = threading.Event()
    timer = threading.Timer(timeout_s if timeout_s is not None else 1e9, _expire, (expired, process.pid))
    timer.daemon = True
    timer.start()
    try:
        kept = _pump(process, sink, on_line)
        returncode = process.wait()
    except BaseException:
        kill_group(process.pid)
        process.wait()
        raise
    finally:
        timer.cancel()
        with _LIVE_GUARD:
            _LIVE.discard(process.pid)
    return Completed(tuple(args), None if expired.is_set() else returncode, kept, "", time.monotonic() - started)


class Held:
    """A command started before it is needed, so that its start (an interpreter, its imports) overlaps
    other work: it waits for one line on its standard input, its remaining arguments as a JSON list,
    and then runs as :func:`stream` would have run the whole command line.

    Started from a thread that outlives its use: Linux kills it when the thread that started it ends.
    """

    def __init__(self, argv: Sequence[str | Path], *, env: Mapping[str, str] | None = None) -> None:
        """Start ``argv`` (raises OSError when it cannot be started, Interrupted after :func:`terminate_all`)."""
        self.argv = tuple(str(a) for a in argv)
        _refuse_if_closed(self.argv)
        self.started = time.monotonic()
        self.process = _start_piped(self.argv, env, None, stdin=subprocess.PIPE)
        _register(self.process, self.argv)

    def run(self, rest: Sequence[str | Path], *, log: Path, timeout_s: float | None) -> Completed:
        """Hand the command its remaining arguments and follow it to its end, as :func:`stream` does."""
        args = (*self.argv[:-1], *(str(a) for a in rest))
        log.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with open(log, "a", encoding="utf-8", errors="replace") as sink:
            ahead = started - self.started
            sink.write(f"$ {shlex.join(args)}\n# started {ahead:.1f} s ahead, as {shlex.join(self.argv)}\n")
            sink.flush()
            self._hand(rest)
            return _follow(self.process, args, sink, timeout_s, None, started)

    def _hand(self, rest: Sequence[str | Path]) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps([str(a) for a in rest]) + "\n")
            self.process.stdin.close()
        except OSError:  # it ended before it was asked: its output and exit status say how
            pass

    def close(self) -> None:
        """End it if it was never handed its arguments (or is still running)."""
        kill_group(self.process.pid)
        self.process.wait()
        for stream_ in (self.process.stdin, self.process.stdout):
            if stream_ is not None:
                try:
                    stream_.close()
                except OSError:
                    pass
        with _LIVE_GUARD:
            _LIVE.discard(self.process.pid)


def _expire(expired: threading.Event, pid: int) -> None:
    """A timeout's action: note that it expired, then kill the process group."""
    expired.set()
    kill_group(pid)


def _pump(process: subprocess.Popen[str], sink: IO[str], on_line: Callable[[str], None] | None) -> str:
    """Copy the child's output to the log as it comes; keep its last megabyte for the caller."""
    kept: collections.deque[str] = collections.deque()
    size = 0
    assert process.stdout is not None
    for line in process.stdout:
        sink.write(line)
        sink.flush()
        kept.append(line)
        size += len(line)
        while size > _KEEP_CHARS and len(kept) > 1:
            size -= len(kept.popleft())
        if on_line is not None:
            on_line(line.rstrip("\n"))
    return "".join(kept)


def run_logged(
    argv: Sequence[str | Path],
    log: Path,
    *,
    timeout_s: float | None,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
) -> Completed:
    """:func:`stream` without a line callback: a long command (an installer, a GPU run) into ``log``."""
    return stream(argv, log=log, timeout_s=timeout_s, env=env, cwd=cwd)


def call_forked(function: Callable[[], int], *, timeout_s: float, output: Path) -> Completed:
    """``function()`` in a forked child in its own process group, its output into ``output``,
    its return value the exit status; past ``timeout_s`` the group is killed (``returncode``
    None). One Python start fewer than running the program again: what a check every minute
    (slurm-health's verify) is made of."""
    started = time.monotonic()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's code
        code = 3
        try:
            os.setpgid(0, 0)
            sink = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(sink, 1)
            os.dup2(sink, 2)
            sys.stdout = sys.stderr = open(sink, "w", buffering=1, closefd=False)  # whatever they were bound to
            code = function()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    try:
        os.setpgid(pid, pid)  # here too: a kill must not find the child before it made its group
    except OSError:
        pass
    return _reap(pid, started, timeout_s, output)


def _reap(pid: int, started: float, timeout_s: float, output: Path) -> Completed:
    status: int | None = None
    try:
        while status is None:
            done, raw = os.waitpid(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(raw)
            elif time.monotonic() - started > timeout_s:
                kill_group(pid)
                os.waitpid(pid, 0)
                break
            else:
                time.sleep(0.005)
    except BaseException:
        kill_group(pid)
        os.waitpid(pid, 0)
        raise
    text = output.read_text(errors="replace") if output.exists() else ""
    return Completed(("(forked)",), status, "", text, time.monotonic() - started)
