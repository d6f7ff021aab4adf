"""The command line's rules, shared by every task: one short flag per long flag, the same in every
task (``SHORT_FLAGS``, through :func:`task`); domain errors into invoke exits with the documented
codes (:func:`run_command`); and a reader that stops reading (``stackgate provision | head -1``)
is not turned into a traceback."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any, Callable, Mapping, TextIO

import invoke
from invoke.exceptions import Exit

from stackgate.edges import runner
from stackgate.models import settings
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.models.redact import redact_text

__all__ = ["SHORT_FLAGS", "Task", "quiet_closed_output", "run_command", "task"]

#: Every short flag of every task, by long flag: a letter means the same in every task that has
#: it, and a flag not named here has none (invoke would give a flag its first free letter, in
#: order of the signature, and a --hosts flag would take -h, which stays --help's). -v counts
#: (-vv) wherever --verbose is.
SHORT_FLAGS: Mapping[str, str] = {
    "lock": "l",
    "model": "m",
    "json": "j",
    "verbose": "v",
    "strict": "s",
    "check": "c",
    "deep": "d",
    "dry_run": "n",
    "yes": "y",
    "only": "o",
    "wait": "w",
    "force": "f",
    "benchmark": "b",
    "tp": "t",
    "run": "r",
    "path": "p",
}


class Task(invoke.Task):
    """An invoke task whose short flags come from :data:`SHORT_FLAGS`, never from a guess.

    ``rest`` names the argument that gathers a task's bare words (``stackgate diagnose a.log
    b.log``): invoke gives a positional argument one word, so the program (stackgate.main) turns
    each bare word after such a task into that flag.
    """

    def __init__(self, *args: Any, rest: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "auto_shortflags": False})
        self.rest = rest

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[invoke.parser.Argument]:
        # invoke pops each flag's help text off self.help as it builds the arguments: a second
        # parse of the same task (the program reads its flags before parsing) would lose them all.
        kept = dict(self.help)
        try:
            return super().get_arguments(ignore_unknown_help)
        finally:
            self.help = kept

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict[str, Any]:
        opts = super().arg_opts(name, default, taken_names)
        if name in SHORT_FLAGS:
            opts["names"] = [*opts["names"], SHORT_FLAGS[name]]
        return opts


def task(*args: Any, **kwargs: Any) -> Any:
    """``invoke.task`` making a :class:`Task`: ``@task(help={...})``, ``@task(rest="path")``."""
    return invoke.task(*args, klass=Task, **kwargs)


def run_command(command: Callable[[], ExitCode]) -> None:
    """Run a command; exit with its code, 2 for a usage error, 130 when interrupted."""
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM tears down like Ctrl-C
    try:
        settings.report()  # every STACKGATE_* variable parses, or exit 2 before anything is touched
        code = command()
    except UsageError as exc:  # every command's bad usage, bad lockfile or unreadable input
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
