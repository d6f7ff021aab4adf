"""The subprocess edge: output, exit codes, timeouts that end the whole process group."""

from __future__ import annotations

import ast
import concurrent.futures
import os
import threading
import time
from pathlib import Path

import pytest

from stackgate.edges import runner


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
    done = runner.run(
        ["sh", "-c", "echo $STACKGATE_X"], timeout_s=10, env={"PATH": os.environ["PATH"], "STACKGATE_X": "42"}
    )
    assert done.stdout == "42\n"


@pytest.fixture
def closed_runner():
    """The runner after an interrupt (terminate_all), opened again for the tests that follow."""
    runner.terminate_all()
    yield
    runner.reopen()


@pytest.mark.parametrize("how", ["run", "stream", "spawn", "start"])
def test_after_terminate_all_nothing_new_starts(tmp_path, closed_runner, how):
    marker = tmp_path / "started"
    argv = ["sh", "-c", f"touch {marker}"]
    start = {
        "run": lambda: runner.run(argv, timeout_s=10),
        "stream": lambda: runner.stream(argv, log=tmp_path / "log", timeout_s=10),
        "spawn": lambda: runner.spawn(argv, log_path=tmp_path / "log"),
        "start": lambda: runner.start(argv),
    }[how]
    with pytest.raises(runner.Interrupted, match="interrupted: not starting sh"):
        start()
    time.sleep(0.2)  # a process that did start would have touched the marker by now
    assert not marker.exists()


def test_an_interrupt_ends_a_worker_that_goes_on_to_its_next_command(tmp_path):
    """A thread of commands one after another (a facts part): the interrupt kills the running
    one, and the next one is refused instead of started."""
    pids = tmp_path / "pids"
    started = threading.Event()

    def worker():
        for _ in range(3):
            started.set()
            runner.run(["sh", "-c", f"echo $$ >> {pids}; exec sleep 600"], timeout_s=600)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(worker)
        started.wait(10)
        while not pids.exists():
            time.sleep(0.02)
        runner.terminate_all()
        try:
            with pytest.raises(runner.Interrupted):
                future.result(timeout=30)  # a started second command would run for 600 s
        finally:
            runner.reopen()
    assert len(pids.read_text().split()) == 1


def test_reopen_lets_commands_start_again(closed_runner):
    runner.reopen()
    assert runner.run(["true"], timeout_s=10).ok


def test_terminate_all_ends_a_started_program_and_a_cleanup_command_still_runs():
    """A scheduler's client (salloc, srun) started through :func:`runner.start` is known to
    terminate_all; what undoes a run's work elsewhere (scancel) runs after it all the same."""
    process = runner.start(["sh", "-c", "sleep 60"], stdin=True)
    try:
        assert process.pid in runner.live()
        runner.terminate_all()
        assert process.wait(10) == -9
        assert runner.run(["sh", "-c", "echo undone"], timeout_s=10, cleanup=True).stdout == "undone\n"
        with pytest.raises(runner.Interrupted):
            runner.run(["sh", "-c", "echo new work"], timeout_s=10)
    finally:
        runner.reopen()
        runner.forget(process)
    assert process.pid not in runner.live()


#: Calls that start a process: only edges/runner.py makes them.
_STARTERS = {
    "subprocess": {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput"},
    "os": {"system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp", "spawnv", "spawnvp", "spawnl"}
    | {"execv", "execve", "execvp", "execvpe", "execl", "execlp"},
    "pty": {"spawn", "fork"},
}


def test_no_module_but_the_runner_starts_a_process():
    """Every process goes through edges/runner.py, so terminate_all knows it (edges/slurm.py's salloc,
    srun, sinfo, scancel and sbcast included)."""
    package = Path(runner.__file__).resolve().parents[1]
    found = []
    for path in sorted(package.rglob("*.py")):
        if path == Path(runner.__file__).resolve():
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.attr in _STARTERS.get(node.func.value.id, ())
            ):
                found.append(f"{path.relative_to(package)}:{node.lineno}: {node.func.value.id}.{node.func.attr}")
    assert found == []
