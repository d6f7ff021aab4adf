"""The suite started in the background: from a shell without job control (a script's ``pytest &``,
a CI step), every child starts with SIGINT ignored. The Ctrl-C tests still interrupt what they
start (tests/conftest.py's ``pytest_configure`` gives the run Python's own SIGINT handler back),
in a child process and in the test's own process."""

from __future__ import annotations

import subprocess
import sys

from support import ROOT

#: One Ctrl-C test that interrupts a child (`verify`, exit 130) and one that interrupts its own process.
CTRL_C_TESTS = (
    "tests/test_verify.py::test_ctrl_c_exits_130_and_leaves_no_process",
    "tests/test_smoke_parts.py::test_an_interrupt_during_the_grace_period_goes_straight_to_sigkill",
)


def test_the_ctrl_c_tests_pass_in_a_run_started_with_sigint_ignored(tmp_path):
    pytest_argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q"]
    pytest_argv += ["--basetemp", str(tmp_path / "inner"), *CTRL_C_TESTS]
    # As `pytest &` in a script: the shell ignores SIGINT and its child inherits that through exec.
    script = 'trap "" INT; grep "^SigIgn:" /proc/self/status; exec "$@"'
    done = subprocess.run(
        ["bash", "-c", script, "bash", *pytest_argv], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    sig_ign = int(done.stdout.split()[1], 16)
    assert sig_ign & 1 << (2 - 1), done.stdout  # SIGINT (2) is ignored where the run starts
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
