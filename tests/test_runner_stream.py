"""runner.stream: long commands into a log file; a child does not outlive a killed parent."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from support import processes_with

from stackgate.edges import runner

ROOT = Path(__file__).resolve().parents[1]


def test_output_goes_to_the_log_and_to_the_caller_line_by_line(tmp_path: Path) -> None:
    seen: list[str] = []
    done = runner.stream(
        ["bash", "-c", "echo one; echo two >&2; exit 3"], log=tmp_path / "a.log", timeout_s=30, on_line=seen.append
    )
    assert (done.returncode, done.stdout, seen) == (3, "one\ntwo\n", ["one", "two"])
    assert done.tail() == ["one", "two"]
    assert (
        (tmp_path / "a.log").read_text() == "$ bash -c 'echo one; echo two >&2; exit 3'\none\ntwo\n"
    )  # the command line as a shell would take it


def test_a_command_past_its_timeout_is_killed(tmp_path: Path) -> None:
    done = runner.stream(["sleep", "30"], log=tmp_path / "b.log", timeout_s=0.5)
    assert done.timed_out and done.returncode is None


def test_a_program_that_cannot_start_reports_127(tmp_path: Path) -> None:
    done = runner.stream([tmp_path / "missing"], log=tmp_path / "c.log", timeout_s=5)
    assert done.returncode == 127 and "cannot run" in done.stderr


_PARENT = """
import os, signal, sys
from pathlib import Path
from stackgate.edges import runner
child = [sys.executable, "-c", "import sys, time; print('started', flush=True); time.sleep(60)", sys.argv[1]]
runner.stream(child, log=Path(sys.argv[2]), timeout_s=120, on_line=lambda line: os.kill(os.getpid(), signal.SIGKILL))
"""


def test_a_child_dies_with_a_parent_killed_by_sigkill(tmp_path: Path) -> None:
    """Like an installer whose provisioner got kill -9: without the parent-death signal the child
    would sleep on for a minute, writing into a generation the next run rebuilds."""
    marker = f"stackgate-orphan-{uuid.uuid4().hex}"
    parent = subprocess.run(
        [sys.executable, "-c", _PARENT, marker, str(tmp_path / "d.log")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert parent.returncode == -9, parent.stderr
    assert "started" in (tmp_path / "d.log").read_text()
    for _ in range(50):  # the kernel delivers the signal asynchronously
        if not processes_with(marker):
            break
        time.sleep(0.1)
    assert processes_with(marker) == []


# --- a command started ahead of its arguments ---------------------------------------------------

#: A stand-in for deepwork.py's ``hold``: says it started (as torch's import would print a warning),
#: reads its remaining arguments as a JSON list on stdin, then prints them and exits with the last.
_HOLDER = (
    "import json, sys, time; print('warming', flush=True); rest = json.loads(sys.stdin.readline() or '[]'); "
    "print('ran', *rest, flush=True); time.sleep(float(rest[1]) if len(rest) > 1 else 0); "
    "sys.exit(int(rest[0]) if rest else 0)"
)


def test_a_held_command_runs_with_the_arguments_it_is_handed(tmp_path: Path) -> None:
    held = runner.Held([sys.executable, "-c", _HOLDER, "hold"])
    done = held.run(["3"], log=tmp_path / "h.log", timeout_s=30)
    assert done.returncode == 3 and done.stdout == "warming\nran 3\n"
    assert done.argv == (sys.executable, "-c", _HOLDER, "3")  # the command line it stood for
    header, ahead, *output = (tmp_path / "h.log").read_text().splitlines()
    assert header.startswith("$ ") and header.endswith(" 3") and ahead.startswith("# started ")
    assert ahead.endswith(" hold") and output == ["warming", "ran 3"]  # what it printed while held comes after


def test_a_held_command_past_its_timeout_is_killed(tmp_path: Path) -> None:
    held = runner.Held([sys.executable, "-c", _HOLDER, "hold"])
    done = held.run(["0", "30"], log=tmp_path / "t.log", timeout_s=0.5)
    assert done.timed_out and "ran 0 30" in (tmp_path / "t.log").read_text()


def test_a_held_command_that_ended_before_its_arguments_reports_how(tmp_path: Path) -> None:
    held = runner.Held([sys.executable, "-c", "import sys; print('broke'); sys.exit(7)", "hold"])
    assert held.process.wait(timeout=30) == 7
    done = held.run(["x"], log=tmp_path / "e.log", timeout_s=30)  # its stdin is closed: no error here
    assert done.returncode == 7 and done.stdout == "broke\n"


def test_a_held_command_never_handed_its_arguments_is_ended_by_close(tmp_path: Path) -> None:
    marker = f"stackgate-held-{uuid.uuid4().hex}"
    held = runner.Held([sys.executable, "-c", "import sys, time; time.sleep(60)", marker, "hold"])
    assert processes_with(marker)
    held.close()
    assert held.process.returncode == -9 and processes_with(marker) == []


def test_nothing_is_held_after_an_interrupt(tmp_path: Path) -> None:
    runner.terminate_all()
    try:
        with pytest.raises(runner.Interrupted):
            runner.Held([sys.executable, "-c", "pass", "hold"])
    finally:
        runner.reopen()
