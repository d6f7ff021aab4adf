"""`python -m stackgate`: the `stackgate` program."""

from __future__ import annotations

from stackgate.main import run

run()
