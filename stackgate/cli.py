"""Turn stackgate's domain errors into invoke exits with the documented codes."""

from __future__ import annotations

import signal
from typing import Callable

from invoke.exceptions import Exit

from stackgate import runner
from stackgate.checks.core import CheckError
from stackgate.exitcodes import ExitCode
from stackgate.redact import redact_text
from stackgate.stack.lock import LockError

__all__ = ["USAGE_ERRORS", "run_command"]

#: Errors that mean "bad usage or bad lockfile: nothing was changed".
USAGE_ERRORS: tuple[type[Exception], ...] = (LockError, CheckError)


def run_command(command: Callable[[], ExitCode], usage_errors: tuple[type[Exception], ...] = ()) -> None:
    """Run a command; exit with its code, 2 for a usage error, 130 when interrupted."""
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM tears down like Ctrl-C
    try:
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
