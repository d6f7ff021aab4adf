"""The subprocess edge: output, exit codes, timeouts that end the whole process group."""

from __future__ import annotations

import os
import time
from pathlib import Path

from stackgate import runner


def test_output_and_exit_code():
    done = runner.run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout_s=10)
    assert (done.returncode, done.stdout, done.stderr, done.ok) == (3, "out\n", "err\n", False)
    assert done.tail() == ["err"]


def test_a_program_that_does_not_exist_reports_127():
    done = runner.run(["/nonexistent/tool", "--version"], timeout_s=10)
    assert done.returncode == 127 and "cannot run /nonexistent/tool" in done.stderr


def test_a_timeout_kills_the_children_too(tmp_path):
    pidfile = tmp_path / "child.pid"
    done = runner.run(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"], timeout_s=0.5)
    assert done.timed_out and done.returncode is None
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists()


def test_the_environment_is_the_one_given():
    done = runner.run(["sh", "-c", "echo $STACKGATE_X"], timeout_s=10, env={"PATH": os.environ["PATH"], "STACKGATE_X": "42"})
    assert done.stdout == "42\n"
