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
    FAILED = 1  #: it ran and failed: a check failed or crashed, nothing was checked, a step of a change failed
    USAGE = 2  #: refused before changing anything: bad usage, a bad lockfile or input, or a request that cannot apply
    INTERRUPTED = 130  #: interrupted (Ctrl-C, SIGTERM)

    #: A command that refuses to act (a blocked plan, nothing to roll back, a root another provision
    #: holds, a change not confirmed) exits as for bad usage: one code for "nothing was changed".
    REFUSED = 2


class UsageError(Exception):
    """Bad usage or a bad input (a lockfile, a log, an option): nothing was changed; exit 2.

    Every command's usage error is this one type (:class:`~stackgate.models.spec.SpecError` adds the
    lockfile's path and its list of problems; ``LaunchError`` is the one a gate's smoke stage turns into
    a failed result), so the program maps them to :attr:`ExitCode.USAGE` in one place
    (``stackgate.express.outcome``) and no task has to list them. ``hint`` is the fix a user can paste,
    shown on its own line under the message.

    >>> error = UsageError("--tp must be 1 or more, not 0", hint="stackgate smoke --tp 1")
    >>> str(error), error.hint
    ('--tp must be 1 or more, not 0', 'stackgate smoke --tp 1')
    """

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint
