"""The one edge through which stackgate runs other programs.

Every subprocess runs in its own process group so that a timeout or an interrupt can end the
whole tree it started, never just its leader.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

__all__ = ["Completed", "kill_group", "run", "run_logged", "terminate_all"]

# Process groups of the commands running now, so that an interrupt can end them all: worker
# threads never see KeyboardInterrupt, and the interpreter waits for them at exit.
_LIVE: set[int] = set()
_LIVE_GUARD = threading.Lock()


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
) -> Completed:
    """Run a command to completion, capturing its output as text.

    A program that cannot be started reports 127 and the OS error, as a shell would.
    """
    args = tuple(str(a) for a in argv)
    started = time.monotonic()
    try:
        process = subprocess.Popen(
            args,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError as exc:
        return Completed(args, 127, "", f"cannot run {args[0]}: {exc.strerror or exc}", 0.0)
    with _LIVE_GUARD:
        _LIVE.add(process.pid)
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


def terminate_all() -> None:
    """Kill the process group of every command still running (on Ctrl-C or SIGTERM)."""
    with _LIVE_GUARD:
        groups = list(_LIVE)
    for pgid in groups:
        kill_group(pgid)


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Signal a whole process group; a group that is already gone is fine."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_logged(
    argv: Sequence[str | Path],
    log: Path,
    *,
    timeout_s: float | None,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    tail_bytes: int = 16384,
) -> Completed:
    """Run a long command (an installer) with its stdout and stderr appended to ``log``.

    The log gets the command line first. ``stdout`` of the result holds the end of what the
    command wrote, so that ``tail()`` works as for :func:`run`. The child is killed when this
    process dies, even by SIGKILL, so that an interrupted provision leaves no installer running.
    """
    args = tuple(str(a) for a in argv)
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log, "ab") as sink:
        sink.write(f"$ {shlex.join(args)}\n".encode())
        sink.flush()
        start = sink.tell()
        try:
            process = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True, preexec_fn=_die_with_parent(),
            )
        except OSError as exc:
            message = f"cannot run {args[0]}: {exc.strerror or exc}"
            sink.write(f"{message}\n".encode())
            return Completed(args, 127, "", message, 0.0)
        with _LIVE_GUARD:
            _LIVE.add(process.pid)
        try:
            code = _wait(process, timeout_s)
        finally:
            with _LIVE_GUARD:
                _LIVE.discard(process.pid)
    return Completed(args, code, _read_tail(log, start, tail_bytes), "", time.monotonic() - started)


def _wait(process: subprocess.Popen[bytes], timeout_s: float | None) -> int | None:
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(process.pid)
        process.wait()
        return None
    except BaseException:
        kill_group(process.pid)
        process.wait()
        raise


def _read_tail(log: Path, start: int, limit: int) -> str:
    with open(log, "rb") as source:
        size = source.seek(0, os.SEEK_END)
        source.seek(max(start, size - limit))
        return source.read().decode("utf-8", "replace")


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> Callable[[], None] | None:
    """A pre-exec hook asking Linux to SIGKILL the child when its parent dies."""
    if not sys.platform.startswith("linux"):
        return None
    # Resolved before the fork: the child must not load libraries between fork and exec.
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    return hook
