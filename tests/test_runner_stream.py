"""runner.stream: long commands into a log file; a child does not outlive a killed parent."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

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


def _running_with(marker: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                found.append(str(cmdline.parent.name))
        except OSError:
            continue
    return found


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
        if not _running_with(marker):
            break
        time.sleep(0.1)
    assert _running_with(marker) == []
