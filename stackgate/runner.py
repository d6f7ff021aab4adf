"""The one edge through which stackgate runs other programs.

Every subprocess runs in its own process group so that a timeout or an interrupt can end the
whole tree it started, never just its leader.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

__all__ = ["Completed", "kill_group", "run", "terminate_all"]

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
