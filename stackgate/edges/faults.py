"""Test-only fault hooks: read in this one place, inert unless ``$STACKGATE_FAULT`` is set.

The tests that prove what an interrupted or failing run leaves behind plant a fault at a named
point: ``STACKGATE_FAULT="point[,point...]"``. Nothing outside the tests sets it; unset, every
hook here returns at once and does nothing. The points, by the code that passes them:

- provision: ``before:<step>``, ``during:<step>`` (at the step's first line of output; for
  ``python.discard`` once a generation is renamed for removal and not yet deleted) and
  ``after:<step>``, a step being its action (``python.stack``, ``python.switch`` ...). The
  process is killed there with SIGKILL; ``<point>=SIGINT`` sends it SIGINT instead, as Ctrl-C
  does, and ``<point>=ENOSPC`` raises "No space left on device" there.
- upgrade: ``before:upgrade.build``, ``before:upgrade.verify``, ``before:upgrade.ab``,
  ``before:upgrade.leg<N>`` (the A/B's Nth launch) and ``before:upgrade.switch``; its build runs
  provision's steps, so their points apply there too.
- smoke: ``smoke:ready`` (a server is up and ready, nothing measured yet).
- toolkit installs: ``toolkit:installed`` (the wheels are in staging) and ``toolkit:laid-out``
  (the tree is laid out in staging, not yet moved into place): SIGKILL.
- the deep work, which the target interpreter's ``edges/deepwork.py`` does (it imports nothing of
  stackgate, so :func:`deep_faults` hands them over in its request): ``deep.matmul:<device>``
  negates that device's product, ``deep.wrong:<rank>`` adds 1 to one element of that rank's
  all-reduce contribution, ``deep.hang:<rank>`` makes that rank sleep before its first all-reduce.
"""

from __future__ import annotations

import errno
import os
import signal
from typing import Mapping

from stackgate.models import settings

__all__ = ["DEEP", "deep_faults", "planted", "trip"]

#: The prefix of the points the deep work's script acts on.
DEEP = "deep."


def planted(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The planted points and what each does ("" for the point's own default).

    >>> planted({"STACKGATE_FAULT": "during:python.stack=SIGINT,toolkit:installed"})
    {'during:python.stack': 'SIGINT', 'toolkit:installed': ''}
    >>> planted({})
    {}
    """
    found = {}
    for point in settings.FAULT.value(environ):
        name, _, action = point.partition("=")
        found[name] = action
    return found


def trip(point: str, environ: Mapping[str, str] | None = None) -> None:
    """At ``point``: nothing, unless a fault is planted there (then SIGKILL, SIGINT or ENOSPC)."""
    wanted = planted(environ)
    if point not in wanted:
        return
    action = wanted[point]
    if action == "ENOSPC":
        raise OSError(errno.ENOSPC, f"No space left on device ({settings.FAULT.env}={point}={action})")
    os.kill(os.getpid(), signal.SIGINT if action == "SIGINT" else signal.SIGKILL)


def deep_faults(environ: Mapping[str, str] | None = None) -> list[str]:
    """The deep work's planted points, without their prefix, for its request.

    >>> deep_faults({"STACKGATE_FAULT": "deep.matmul:0,before:python.stack,deep.hang:1"})
    ['matmul:0', 'hang:1']
    """
    return [point[len(DEEP) :] for point in planted(environ) if point.startswith(DEEP)]
