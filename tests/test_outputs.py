"""Report paths, in every command that writes one: ``-`` is standard output (the console then goes
to standard error, so the report can be piped), and a path that cannot be written (a folder, a
place under a file, a folder this user cannot write) is refused before anything runs, exit 2.
Real programs in subprocesses, run from an empty folder."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support import run_program

from stackgate.edges.files import unwritable
from stackgate.models.exitcodes import ExitCode

ROOT = Path(__file__).resolve().parents[1]
HEALTHY = ROOT / "tests" / "data" / "sglang-0.5.9-tp8-healthy.log"


def stackgate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_program(*args, cwd=cwd, env={"STACKGATE_HISTORY_DIR": str(cwd / "runs")}, timeout=240)


@pytest.mark.parametrize(
    "args",
    [["verify", "--check", "gpu.*"], ["diagnose", str(HEALTHY)]],
    ids=["verify", "diagnose"],
)
def test_json_dash_is_standard_output_and_no_file_named_dash(tmp_path: Path, args: list[str]) -> None:
    done = stackgate(*args, "--json", "-", cwd=tmp_path)
    assert "Traceback" not in done.stderr
    doc = json.loads(done.stdout)  # the whole of stdout is the report: the console went to stderr
    assert doc["command"] == args[0] and doc["exit_code"] == done.returncode
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("option", ["--json", "--prom", "--junit"])
def test_verify_refuses_a_report_path_that_is_a_folder_before_any_check(tmp_path: Path, option: str) -> None:
    done = stackgate("verify", option, str(tmp_path), cwd=tmp_path)
    assert done.returncode == ExitCode.USAGE, done.stdout + done.stderr
    assert f"{option} {tmp_path}: is a directory" in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""  # no check ran: nothing was reported


def test_smoke_and_diagnose_refuse_an_unwritable_json_path_up_front(tmp_path: Path) -> None:
    under_a_file = tmp_path / "file"
    under_a_file.write_text("")
    for args in (
        ["smoke", "--json", str(under_a_file / "r.json")],
        ["diagnose", str(HEALTHY), "--json", str(tmp_path)],
    ):
        done = stackgate(*args, cwd=tmp_path)
        assert done.returncode == ExitCode.USAGE and "--json " in done.stderr and "Traceback" not in done.stderr, (
            done.stderr
        )


def test_one_check_serves_every_command(tmp_path: Path) -> None:
    file = tmp_path / "file"
    file.write_text("")
    assert unwritable({"--json": tmp_path / "a" / "r.json", "--prom": Path("-")}) is None
    assert unwritable({"--json": tmp_path}) == f"--json {tmp_path}: is a directory"
    assert (
        unwritable({"--json": file / "r.json"})
        == f"--json {file / 'r.json'}: cannot write there ({file} is not a writable folder)"
    )
    assert (
        unwritable({"--json": Path("-"), "--prom": Path("-")})
        == "--json and --prom: only one report can go to standard output (-)"
    )


def test_a_report_folder_that_does_not_exist_is_made_and_said_so(tmp_path: Path) -> None:
    report = tmp_path / "typo" / "dir" / "x.json"
    done = stackgate("diagnose", str(HEALTHY), "--json", str(report), cwd=tmp_path)
    assert done.returncode == ExitCode.PASSED, done.stderr
    assert json.loads(report.read_text())["schema"].startswith("stackgate.diagnose/")
    said = f"stackgate: --json {report}: made the folder {tmp_path / 'typo'}, which did not exist"
    assert said in done.stderr.splitlines()
    again = stackgate("diagnose", str(HEALTHY), "--json", str(report), cwd=tmp_path)
    assert again.returncode == ExitCode.PASSED and "made the folder" not in again.stderr
