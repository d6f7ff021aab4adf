"""The fact parts provision plans from: an interpreter of the locked version, and the installed
distributions (without importing torch)."""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
from pathlib import Path

import pytest

from stackgate.facts import BasePython, Missing, gather
from stackgate.models.spec import Spec, load_spec

RUNNING = ".".join(platform.python_version_tuple()[:2])
REAL = Path(os.path.realpath(sys.executable))


def _lock(version: str = RUNNING, interpreter: Path | None = None) -> Spec:
    spec = load_spec()
    python = dataclasses.replace(spec.python, version=version)
    if interpreter is not None:
        python = dataclasses.replace(python, interpreter=interpreter, root=None)
    return dataclasses.replace(spec, python=python)


def _base(spec: Spec, environ: dict[str, str]) -> BasePython | Missing:
    facts = gather(spec, ["base_python"], environ=environ)
    try:
        return facts.base_python
    finally:
        facts.close()


def test_stackgate_python_names_the_interpreter(tmp_path: Path) -> None:
    found = _base(_lock(), {"STACKGATE_BASE_PYTHON": str(REAL), "PATH": ""})
    assert isinstance(found, BasePython)
    assert (found.path, found.version, found.found_by) == (
        REAL,
        platform.python_version(),
        "environment $STACKGATE_BASE_PYTHON",
    )


def test_a_python_of_the_locked_version_is_found_on_path_and_a_broken_shim_is_skipped(tmp_path: Path) -> None:
    shims, bin_dir = tmp_path / "shims", tmp_path / "bin"
    shims.mkdir()
    bin_dir.mkdir()
    shim = shims / f"python{RUNNING}"
    shim.write_text(f"#!/bin/sh\necho 'pyenv: python{RUNNING}: command not found' >&2\nexit 127\n")
    shim.chmod(0o755)
    (bin_dir / f"python{RUNNING}").symlink_to(REAL)
    found = _base(_lock(), {"PATH": f"{shims}:{bin_dir}", "HOME": str(tmp_path)})
    assert isinstance(found, BasePython), found
    assert found.found_by == f"python{RUNNING} on PATH ({bin_dir})"


def test_pyenv_installs_are_found_without_their_shims(tmp_path: Path) -> None:
    home = tmp_path / "pyenv" / "versions" / f"{platform.python_version()}" / "bin"
    home.mkdir(parents=True)
    (home / f"python{RUNNING}").symlink_to(REAL)
    found = _base(_lock(), {"PATH": "", "PYENV_ROOT": str(tmp_path / "pyenv"), "HOME": str(tmp_path)})
    assert isinstance(found, BasePython), found
    assert found.found_by.startswith("pyenv (")


def test_no_python_of_the_locked_version_is_a_clear_missing_fact(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python3.99").symlink_to(REAL)  # answers, but with another version
    found = _base(_lock("3.99"), {"PATH": str(tmp_path / "bin"), "HOME": str(tmp_path)})
    assert isinstance(found, Missing)
    assert found.reason.startswith(
        "no Python 3.99 on this machine (searched $STACKGATE_BASE_PYTHON, python3.99 on PATH"
    )
    assert f"rejected: python3.99 on PATH ({tmp_path / 'bin'}): is Python {platform.python_version()}" in found.reason
    assert "uv cannot download Python here: install Python 3.99 (e.g. `pyenv install 3.99`" in found.reason


@pytest.mark.torch
def test_dists_lists_the_environment_without_importing_torch(torch_python: Path) -> None:
    spec = _lock(interpreter=torch_python)
    facts = gather(spec, ["dists"])
    try:
        dists = facts.dists
    finally:
        facts.close()
    assert not isinstance(dists, Missing), dists
    assert dists.dist("torch") is not None
    assert dists.torch is None  # not imported: that is what keeps a no-op provision fast
