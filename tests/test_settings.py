"""Every STACKGATE_* setting: its default, an override, its source, a bad value, the old names,
read when used; -v shows them; docs/settings.md's table is the declarations'; nothing else reads them."""

from __future__ import annotations

import ast
import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stackgate.commands import verify
from stackgate.edges import faults
from stackgate.models import settings
from stackgate.models.exitcodes import UsageError
from stackgate.models.settings import SETTINGS
from stackgate.models.spec import default_spec_path
from stackgate.render.ui import UI, render_settings

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "stackgate"

#: Each setting's default, written out again: a changed default is a decision, not an accident.
DEFAULTS: dict[str, Any] = {
    "STACKGATE_LOCK": None,
    "STACKGATE_SYSTEM_DIR": Path("/etc/stackgate"),
    "STACKGATE_NVML_MODULE": "pynvml",
    "STACKGATE_PROBE_TIMEOUT_S": 180.0,
    "STACKGATE_IMPORT_TIMEOUT_S": 180.0,
    "STACKGATE_DEEP_TIMEOUT_S": 300.0,
    "STACKGATE_DEEP_DIR": None,
    "STACKGATE_DEEP_AHEAD": True,
    "STACKGATE_BASE_PYTHON": None,
    "STACKGATE_PYTHON_INSTALL_TIMEOUT_S": 3600.0,
    "STACKGATE_DOWNLOAD_TIMEOUT_S": 60.0,
    "STACKGATE_KEEP_GENERATIONS": 3,
    "STACKGATE_TOOLKIT_INDEX_URL": "https://pypi.org/simple",
    "STACKGATE_TOOLKIT_INSTALLER": "uv",
    "STACKGATE_TOOLKIT_INSTALL_TIMEOUT_S": 3600.0,
    "STACKGATE_RUNFILE_CACHE": None,
    "STACKGATE_KMSG": Path("/dev/kmsg"),
    "STACKGATE_LOG_DIR": Path("reports"),
    "STACKGATE_HISTORY_DIR": None,
    "STACKGATE_HISTORY_INDEX": True,
    "STACKGATE_FAULT": (),
}
#: A text each setting takes, and the value it gives.
GOOD: dict[str, tuple[str, Any]] = {
    "STACKGATE_LOCK": ("/etc/stackgate/h200.toml", Path("/etc/stackgate/h200.toml")),
    "STACKGATE_SYSTEM_DIR": ("/srv/stackgate", Path("/srv/stackgate")),
    "STACKGATE_NVML_MODULE": ("fakes.fake_nvml", "fakes.fake_nvml"),
    "STACKGATE_PROBE_TIMEOUT_S": ("30", 30.0),
    "STACKGATE_IMPORT_TIMEOUT_S": ("2.5", 2.5),
    "STACKGATE_DEEP_TIMEOUT_S": ("600", 600.0),
    "STACKGATE_DEEP_DIR": ("/scratch/deep", Path("/scratch/deep")),
    "STACKGATE_DEEP_AHEAD": ("off", False),
    "STACKGATE_BASE_PYTHON": ("/usr/bin/python3.12", Path("/usr/bin/python3.12")),
    "STACKGATE_PYTHON_INSTALL_TIMEOUT_S": ("7200", 7200.0),
    "STACKGATE_DOWNLOAD_TIMEOUT_S": ("5", 5.0),
    "STACKGATE_KEEP_GENERATIONS": ("1", 1),
    "STACKGATE_TOOLKIT_INDEX_URL": ("http://127.0.0.1:8080/simple", "http://127.0.0.1:8080/simple"),
    "STACKGATE_TOOLKIT_INSTALLER": ("pip", "pip"),
    "STACKGATE_TOOLKIT_INSTALL_TIMEOUT_S": ("60", 60.0),
    "STACKGATE_RUNFILE_CACHE": ("~/runfiles", Path.home() / "runfiles"),
    "STACKGATE_KMSG": ("/var/kmsg", Path("/var/kmsg")),
    "STACKGATE_LOG_DIR": ("/var/log/stackgate", Path("/var/log/stackgate")),
    "STACKGATE_HISTORY_DIR": ("/srv/runs", Path("/srv/runs")),
    "STACKGATE_HISTORY_INDEX": ("off", False),
    "STACKGATE_FAULT": ("before:python.stack,deep.hang:1", ("before:python.stack", "deep.hang:1")),
}
#: A text each refusing setting refuses, and the reason it gives.
BAD: dict[str, tuple[str, str]] = {
    "STACKGATE_NVML_MODULE": ("fakes/fake_nvml.py", "not a module name (e.g. pynvml, or fakes.fake_nvml)"),
    "STACKGATE_PROBE_TIMEOUT_S": ("abc", "not a number of seconds"),
    "STACKGATE_IMPORT_TIMEOUT_S": ("-1", "must be a number of seconds above 0"),
    "STACKGATE_DEEP_TIMEOUT_S": ("abc", "not a number of seconds"),
    "STACKGATE_PYTHON_INSTALL_TIMEOUT_S": ("inf", "must be a number of seconds above 0"),
    "STACKGATE_DOWNLOAD_TIMEOUT_S": ("nan", "must be a number of seconds above 0"),
    "STACKGATE_KEEP_GENERATIONS": ("0", "must be a whole number of at least 1"),
    "STACKGATE_TOOLKIT_INDEX_URL": ("pypi.org/simple", "not an http(s) URL with a host"),
    "STACKGATE_TOOLKIT_INSTALLER": ("conda", "must be uv or pip"),
    "STACKGATE_TOOLKIT_INSTALL_TIMEOUT_S": ("1h", "not a number of seconds"),
    "STACKGATE_HISTORY_INDEX": ("maybe", "must be on or off"),
}
RENAMED = {
    "STACKGATE_RUN_DIR": "STACKGATE_LOG_DIR",
    "STACKGATE_RUNS_DIR": "STACKGATE_HISTORY_DIR",
    "STACKGATE_PYTHON": "STACKGATE_BASE_PYTHON",
    "STACKGATE_INSTALL_TIMEOUT_S": "STACKGATE_PYTHON_INSTALL_TIMEOUT_S",
    "STACKGATE_TOOLKIT_TIMEOUT_S": "STACKGATE_TOOLKIT_INSTALL_TIMEOUT_S",
}


@pytest.fixture(autouse=True)
def _no_settings_from_this_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in os.environ:
        if name.startswith("STACKGATE_"):
            monkeypatch.delenv(name)
    monkeypatch.setattr(settings, "_WARNED", set())


def test_the_tables_here_cover_every_declared_setting() -> None:
    assert list(SETTINGS) == list(DEFAULTS) == list(GOOD)
    assert set(BAD) <= set(SETTINGS) and {settings.SETTINGS[new].old for new in RENAMED.values()} == set(RENAMED)


@pytest.mark.parametrize("env", SETTINGS)
def test_unset_or_empty_a_setting_is_its_default(env: str) -> None:
    for environ in ({}, {env: ""}):
        found = SETTINGS[env].lookup(environ)
        assert (found.value, found.source, found.is_default) == (DEFAULTS[env], "default", True)


@pytest.mark.parametrize("env", SETTINGS)
def test_a_variable_overrides_the_default_and_says_so(env: str) -> None:
    text, value = GOOD[env]
    found = SETTINGS[env].lookup({env: text})
    assert (found.value, found.source, found.is_default) == (value, f"environment ${env}", False)


@pytest.mark.parametrize("env", BAD)
def test_a_bad_value_is_an_error_naming_the_variable(env: str) -> None:
    text, reason = BAD[env]
    with pytest.raises(UsageError) as caught:
        SETTINGS[env].value({env: text})
    assert str(caught.value).startswith(f"${env}={text!r}: {reason}; unset, it is ")


def test_every_bad_value_is_named_at_once() -> None:
    with pytest.raises(UsageError) as caught:
        settings.report(
            {"STACKGATE_DEEP_TIMEOUT_S": "abc", "STACKGATE_KEEP_GENERATIONS": "0", "STACKGATE_LOG_DIR": "/tmp/x"}
        )
    assert str(caught.value) == (
        "2 bad settings in the environment:\n"
        "  $STACKGATE_DEEP_TIMEOUT_S='abc': not a number of seconds; unset, it is 300\n"
        "  $STACKGATE_KEEP_GENERATIONS='0': must be a whole number of at least 1; unset, it is 3"
    )


def test_a_flag_a_command_was_given_wins_and_is_named() -> None:
    environ = {"STACKGATE_LOCK": "/from/env.toml"}
    assert settings.LOCK.lookup(environ, ("--lock", Path("/from/flag.toml"))).source == "flag --lock"
    assert settings.LOCK.lookup(environ, ("--lock", None)).source == "environment $STACKGATE_LOCK"  # a flag not given


@pytest.mark.parametrize("old", RENAMED)
def test_an_old_name_still_works_once_warned_and_the_new_one_wins(old: str, capsys: pytest.CaptureFixture[str]) -> None:
    new = RENAMED[old]
    text, value = GOOD[new]
    found = SETTINGS[new].lookup({old: text})
    assert (found.value, found.source) == (value, f"environment ${old}, the old name of ${new}")
    SETTINGS[new].value({old: text})
    assert (
        capsys.readouterr().err == f"stackgate: ${old} is deprecated and goes in the next release; set ${new} instead\n"
    )  # once
    assert SETTINGS[new].lookup({old: "/elsewhere", new: text}).source == f"environment ${new}"


def test_settings_are_read_when_used_not_when_imported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from stackgate.facts import deepruns
    from stackgate.runs import history
    from stackgate.stack import toolkitsources

    monkeypatch.setenv("STACKGATE_LOCK", str(tmp_path / "l.toml"))
    monkeypatch.setenv("STACKGATE_HISTORY_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("STACKGATE_DEEP_DIR", str(tmp_path / "deep"))
    monkeypatch.setenv("STACKGATE_RUNFILE_CACHE", str(tmp_path / "runfiles"))
    assert default_spec_path() == tmp_path / "l.toml"
    assert history.runs_dir(None) == tmp_path / "runs"
    assert deepruns._work_dir() == tmp_path / "deep" and (tmp_path / "deep").is_dir()
    assert toolkitsources._runfile_cache() == tmp_path / "runfiles"
    monkeypatch.setenv("STACKGATE_DEEP_TIMEOUT_S", "abc")
    with pytest.raises(UsageError, match=r"^\$STACKGATE_DEEP_TIMEOUT_S='abc'"):
        deepruns.run_gpu_work(Path("/nonexistent/python"), deepruns.GpuWorkRequest(device="cpu"), {})


def test_v_shows_the_settings_not_at_their_defaults_and_vv_all(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STACKGATE_DEEP_TIMEOUT_S", "600")
    monkeypatch.setenv("NO_COLOR", "1")
    spec = ROOT / "lockfiles" / "hopper-sm90-cu130.toml"
    for verbose in (0, 1, 2):
        assert (
            verify.run(verify.VerifyRequest(spec_path=spec, list_only=True), UI(verbose=verbose, stream=io.StringIO()))
            == 0
        )
        err = capsys.readouterr().err.splitlines()
        assert err[: 1 if verbose else 0] == {
            1: ["settings: 2 of 21 not at their default (-vv lists all)"],
            2: ["settings (21):"],
        }.get(verbose, [])
        if verbose:
            assert ["STACKGATE_DEEP_TIMEOUT_S", "600", "(environment", "$STACKGATE_DEEP_TIMEOUT_S)"] in [
                line.split() for line in err
            ]
            assert ["STACKGATE_LOCK", str(spec), "(flag", "--lock)"] in [line.split() for line in err]
        assert sum("(default)" in line for line in err) == (19 if verbose == 2 else 0)


def test_the_settings_shown_hide_a_secret_in_a_value() -> None:
    values = settings.report({"STACKGATE_TOOLKIT_INDEX_URL": "https://user:s3cretpassw0rd@index.example/simple"})
    lines = render_settings(values, verbose=1)
    assert "s3cretpassw0rd" not in "\n".join(lines) and "index.example/simple" in lines[1]


def test_a_bad_setting_exits_2_naming_it_before_any_command_runs(tmp_path: Path) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("STACKGATE_")}
    for args, variable in (
        (["verify", "--list"], "STACKGATE_DEEP_TIMEOUT_S=abc"),
        (["report"], "STACKGATE_KEEP_GENERATIONS=0"),
    ):
        name, _, text = variable.partition("=")
        env = {**environ, name: text, "STACKGATE_HISTORY_DIR": str(tmp_path), "NO_COLOR": "1"}
        done = subprocess.run(
            [sys.executable, "-m", "invoke", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.startswith(f"stackgate: ${name}={text!r}: ") and "Traceback" not in done.stderr, done.stderr
        assert done.stdout == ""


def test_the_docs_table_is_the_declarations() -> None:
    table = settings.markdown_table()
    stale = "docs/settings.md's table is stale: paste `python -m stackgate.models.settings`"
    assert table in (ROOT / "docs" / "settings.md").read_text(), stale
    assert len(table.splitlines()) == 2 + len(SETTINGS)


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of a module and its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                found.add(id(first.value))
    return found


def test_no_module_but_settings_names_a_stackgate_variable() -> None:
    """Only models/settings.py spells a STACKGATE_* name in code (docstrings may mention them).
    The target interpreter's scripts (edges/probe.py, edges/deepwork.py) read none: what they need
    comes in their request."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "models" / "settings.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in skip
                and "STACKGATE_" in node.value
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:60]!r}")
    assert offenders == []


def test_the_target_scripts_read_no_environment() -> None:
    for script in ("probe.py", "deepwork.py"):
        source = (PACKAGE / "edges" / script).read_text()
        assert "os.environ" not in source and "getenv" not in source, script


# --- the fault hooks ---------------------------------------------------------------------------


def test_fault_hooks_are_inert_unless_set() -> None:
    assert faults.planted({}) == {} and faults.deep_faults({}) == []
    faults.trip("before:python.stack", {})  # returns: no signal, no error
    faults.trip("before:python.stack", {"STACKGATE_FAULT": "after:python.stack=ENOSPC"})  # another point


def test_a_planted_enospc_raises_there() -> None:
    with pytest.raises(OSError, match=r"No space left on device \(STACKGATE_FAULT=during:python.stack=ENOSPC\)"):
        faults.trip("during:python.stack", {"STACKGATE_FAULT": "toolkit:installed, during:python.stack=ENOSPC"})


def test_the_deep_points_go_to_deepwork_in_its_request(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from stackgate.facts import deepruns

    monkeypatch.setenv("STACKGATE_FAULT", "deep.matmul:0,before:python.stack,deep.hang:1")
    seen = tmp_path / "argv.txt"
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nprintf '%s' \"$4\" > {seen}\n")
    python.chmod(0o755)
    deepruns.run_gpu_work(python, deepruns.GpuWorkRequest(device="cpu"), {"PATH": os.environ["PATH"]}, timeout_s=30)
    assert '"faults": ["matmul:0", "hang:1"]' in seen.read_text()
