"""The checkout's tasks for `invoke`: stackgate's own (stackgate/tasks.py), the ones the
`stackgate` program runs, so `invoke verify` here and `stackgate verify` anywhere are one command."""

from __future__ import annotations

from stackgate import cli
from stackgate.tasks import *  # noqa: F401,F403  (invoke collects the tasks this module holds)

cli.quiet_closed_output()  # invoke's entry here: `invoke ... | head -1` must not end in a traceback
