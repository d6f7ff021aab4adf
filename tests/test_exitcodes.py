"""The exit codes: docs/cli.md's table is models/exitcodes.py's ExitCode, and real command lines exit
with the code the table gives for what happened to them (a refusal is one code, whatever its reason)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from specs import minimal_spec
from support import ROOT

from stackgate.models.exitcodes import ExitCode

KEPT_MISSING = '[[toolkit]]\nversion = "13.0"\nprefix = "/nonexistent/cuda-13.0"\nkeep = true\ndefault = true\n'
CUDART = "ImportError: libcudart.so.12: cannot open shared object file: No such file or directory\n"


def _table() -> dict[int, tuple[str, str]]:
    """docs/cli.md's exit-code table: code -> (name, the rest of its row)."""
    text = (ROOT / "docs" / "cli.md").read_text()
    rows = re.findall(r"^\| (\d+) \| `(\w+)`([^\n]*)\|$", text, re.MULTILINE)
    return {int(code): (name, rest) for code, name, rest in rows}


def stackgate(*args: str, cwd: Path, stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "STACKGATE_LOCK"}
    environ.update(NO_COLOR="1", PYTHONPATH=str(ROOT), HOME=str(cwd))
    return subprocess.run(
        [sys.executable, "-m", "stackgate", *args],
        cwd=cwd,
        env=environ,
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_docs_table_is_the_exit_code_enum() -> None:
    table = _table()
    assert {code: name for code, (name, _) in table.items()} == {int(code): code.name for code in ExitCode}
    for alias, code in ExitCode.__members__.items():  # REFUSED is USAGE's other name: its row says so
        assert f"`{alias}`" in f"`{table[int(code)][0]}`{table[int(code)][1]}", alias


def _spec(tmp_path: Path, **fields: str) -> Path:
    spec = tmp_path / "spec.toml"
    spec.write_text(minimal_spec(root=tmp_path / "root", **fields))
    return spec


@pytest.mark.parametrize(
    "case",
    ["passed", "failed", "bad usage", "nothing to roll back", "a blocked plan"],
)
def test_a_command_exits_with_the_code_the_table_gives(case: str, tmp_path: Path) -> None:
    if case == "passed":
        done, code = stackgate("verify", "--list", cwd=tmp_path), ExitCode.PASSED
    elif case == "failed":  # an error-level finding
        (tmp_path / "install.log").write_text(CUDART)
        done, code = stackgate("diagnose", "install.log", cwd=tmp_path), ExitCode.FAILED
    elif case == "bad usage":
        done, code = stackgate("verify", "--chek", "gpu.*", cwd=tmp_path), ExitCode.USAGE
    elif case == "nothing to roll back":
        done, code = stackgate("rollback", "--lock", str(_spec(tmp_path)), cwd=tmp_path), ExitCode.REFUSED
        assert "nothing to roll back" in done.stderr, done.stderr
    else:  # a fact of the machine, not of the spec, blocks the plan: the kept CUDA toolkit is not there
        spec = _spec(tmp_path, version=f"{sys.version_info[0]}.{sys.version_info[1]}", toolkits=KEPT_MISSING)
        locked = stackgate("lock", "--lock", str(spec), cwd=tmp_path)  # no package: nothing to download
        assert locked.returncode == ExitCode.PASSED, locked.stderr
        done, code = stackgate("provision", "--dry-run", "--lock", str(spec), cwd=tmp_path), ExitCode.REFUSED
        assert "cannot apply: CUDA 13.0 at /nonexistent/cuda-13.0 is kept (keep = true) but missing" in done.stdout
        assert done.stdout.count("cannot apply") == 1, done.stdout
    assert done.returncode == code, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "root").exists()  # a refusal changes nothing


def test_an_interrupted_command_exits_130(tmp_path: Path) -> None:
    """diagnose reading a pipe that stays open: once it has said it is scanning, Ctrl-C."""
    environ = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}
    process = subprocess.Popen(
        [sys.executable, "-m", "stackgate", "diagnose", "-"],
        cwd=tmp_path,
        env=environ,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    said: list[str] = []
    scanning = threading.Event()

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            said.append(line)
            if "known failures" in line:
                scanning.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert scanning.wait(120), said
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=120) == ExitCode.INTERRUPTED, said
    finally:
        process.kill()
        process.wait()
        assert process.stdin is not None
        process.stdin.close()
        reader.join(timeout=30)
    assert "stackgate: interrupted\n" in said and not any("Traceback" in line for line in said)
