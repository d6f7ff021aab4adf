"""The program's standard streams: output whose reader has gone is dropped, not an error.

Free of the command-line framework: the express lane (stackgate.express) and the program
(stackgate.program) both start here.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

__all__ = ["quiet_closed_output"]


def quiet_closed_output() -> None:
    """From now on, output whose reader has gone is dropped, not an error.

    Called once where a program starts, before it prints anything (--help included): in
    stackgate.main.run for `stackgate`, in the checkout's tasks.py for `invoke`. Python ignores
    SIGPIPE, so a write to a closed pipe raises BrokenPipeError, at whatever print the command was
    at, or at exit while flushing ("Exception ignored ...", exit 120). Restoring SIGPIPE's default
    would instead kill the process for a write to any closed pipe or socket (a server that went
    away), so the two standard streams are wrapped: the first EPIPE points the stream's
    descriptor at /dev/null and the command goes on to its own exit code.
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
