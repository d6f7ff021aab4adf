"""The programs' entry (`invoke` in the checkout, `stackgate`): a reader that stops reading early
is not an error, for any command and for --help; real pipes, closed before the program writes or
after one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {
    "--help verify": (["--help", "verify"], 0),
    "provision --dry-run": (["provision", "--dry-run"], 2),  # this machine has no CUDA 13: the plan is blocked
}


def _run_into_closed_pipe(program: str, args: list[str], *, lines_read: int) -> tuple[int, str]:
    """Run ``python -m program`` with stdout and stderr into a pipe whose reader closes after ``lines_read``
    lines (0: before the program starts); its exit status and what it wrote to stderr."""
    read_end, write_end = os.pipe()
    environ = {**os.environ, "NO_COLOR": "1"}
    environ.pop("STACKGATE_LOCK", None)
    if lines_read == 0:
        os.close(read_end)
    process = subprocess.Popen(
        [sys.executable, "-m", program, *args],
        cwd=ROOT,
        stdout=write_end,
        stderr=subprocess.PIPE,
        env=environ,
        text=True,
    )
    os.close(write_end)
    if lines_read:
        with os.fdopen(read_end, "rb") as reader:
            for _ in range(lines_read):
                reader.readline()
    _, err = process.communicate(timeout=120)
    return process.returncode, err


@pytest.mark.parametrize("program", ["invoke", "stackgate"])
@pytest.mark.parametrize("name", COMMANDS)
def test_a_closed_stdout_ends_the_output_not_the_program(name: str, program: str) -> None:
    args, code = COMMANDS[name]
    for lines_read in (0, 0, 1):
        returncode, err = _run_into_closed_pipe(program, args, lines_read=lines_read)
        assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, (
            lines_read,
            err,
        )
        assert returncode == code, (lines_read, returncode, err)
