"""The exit codes every stackgate command returns (the contract CI scripts rely on), and the one
error type that means exit 2."""

from __future__ import annotations

import enum

__all__ = ["ExitCode", "UsageError"]


class ExitCode(enum.IntEnum):
    """What a stackgate command's exit status means.

    >>> int(ExitCode.USAGE)
    2
    """

    PASSED = 0  #: everything passed (warnings allowed unless --strict)
    FAILED = 1  #: the gate failed: a check failed or crashed, or nothing was checked
    USAGE = 2  #: bad usage or a bad lockfile; nothing was changed
    INTERRUPTED = 130  #: interrupted (Ctrl-C, SIGTERM)


class UsageError(Exception):
    """Bad usage or a bad input (a lockfile, a log, an option): nothing was changed; exit 2.

    Every command's own usage error is one of these, so the program maps them to
    :attr:`ExitCode.USAGE` in one place (``stackgate.cli.run_command``) and no task has to list them.
    """
