"""The exit codes every stackgate command returns (the contract CI scripts rely on)."""

from __future__ import annotations

import enum

__all__ = ["ExitCode"]


class ExitCode(enum.IntEnum):
    """What a stackgate command's exit status means.

    >>> int(ExitCode.USAGE)
    2
    """

    PASSED = 0  #: everything passed (warnings allowed unless --strict)
    FAILED = 1  #: the gate failed: a check failed or crashed, or nothing was checked
    USAGE = 2  #: bad usage or a bad lockfile; nothing was changed
    INTERRUPTED = 130  #: interrupted (Ctrl-C, SIGTERM)
