"""The `stackgate` program's entry: the console script (``[project.scripts] stackgate``) and
``python -m stackgate``. A command of the express lane (stackgate.express: the health check's
`verify --cached`) runs without the command-line framework; every other goes to the program
(stackgate.program)."""

from __future__ import annotations

import sys

from stackgate import express
from stackgate.streams import quiet_closed_output

__all__ = ["run"]


def run() -> None:
    """Run the command line in ``sys.argv``; exit with its code."""
    quiet_closed_output()  # before anything is printed: `stackgate ... | head -1` ends quietly
    code = express.health(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    from stackgate.program import program

    program.run()
