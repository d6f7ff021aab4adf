"""Turn stackgate's domain errors into invoke exits with the documented codes, and keep a reader
that stops reading (``invoke provision | head -1``) from turning into a traceback."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any, Callable, TextIO

from invoke.exceptions import Exit

from stackgate.checks.core import CheckError
from stackgate.edges import runner
from stackgate.models import settings
from stackgate.models.exitcodes import ExitCode
from stackgate.models.redact import redact_text
from stackgate.models.spec import LockError

__all__ = ["USAGE_ERRORS", "quiet_closed_output", "run_command"]

#: Errors that mean "bad usage or bad lockfile: nothing was changed".
USAGE_ERRORS: tuple[type[Exception], ...] = (LockError, CheckError, settings.SettingError)


def run_command(command: Callable[[], ExitCode], usage_errors: tuple[type[Exception], ...] = ()) -> None:
    """Run a command; exit with its code, 2 for a usage error, 130 when interrupted."""
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM tears down like Ctrl-C
    try:
        settings.report()  # every STACKGATE_* variable parses, or exit 2 before anything is touched
        code = command()
    except USAGE_ERRORS + usage_errors as exc:
        raise Exit(f"stackgate: {redact_text(str(exc))}", code=ExitCode.USAGE) from None
    except KeyboardInterrupt:
        runner.terminate_all()
        raise Exit("stackgate: interrupted", code=ExitCode.INTERRUPTED) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    if code != ExitCode.PASSED:
        raise Exit(code=int(code))


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def quiet_closed_output() -> None:
    """From now on, output whose reader has gone is dropped, not an error.

    Called once where the program starts (tasks.py, before invoke prints anything, --help
    included). Python ignores SIGPIPE, so a write to a closed pipe raises BrokenPipeError, at
    whatever print the command was at, or at exit while flushing ("Exception ignored ...", exit
    120). Restoring SIGPIPE's default would instead kill the process for a write to any closed
    pipe or socket (a server that went away), so the two standard streams are wrapped: the first
    EPIPE points the stream's descriptor at /dev/null and the command goes on to its own exit code.
    """
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _ReaderMayLeave):
            setattr(sys, name, _ReaderMayLeave(stream))


class _ReaderMayLeave:
    """A text stream whose writes after its reader left go to /dev/null."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._drop()
            return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._drop()

    def _drop(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)
        try:
            self._stream.flush()  # what was buffered for the gone reader goes to /dev/null now
        except OSError:
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
