"""Fixtures shared by the test modules: real interpreters, isolated installers."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("STACKGATE_TEST_CACHE", Path.home() / ".cache" / "stackgate-tests"))
#: The CPU torch wheel that lies on this kind of machine's disk (pip finds it through its config).
CPU_TORCH = os.environ.get("STACKGATE_TEST_TORCH", "torch==2.13.0")


def isolated_environ(**extra: str) -> dict[str, str]:
    """This process's environment without any pip/uv configuration, for a test's own index."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(PIP_CONFIG_FILE=os.devnull, UV_NO_CONFIG="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def torch_python() -> Path:
    """An interpreter of a venv holding the CPU build of torch, built once and cached.

    Uses the machine's pip configuration on purpose: that is where the CPU wheel is found.
    """
    home = CACHE / f"torch-venv-{sys.version_info.major}.{sys.version_info.minor}-{CPU_TORCH.replace('=', '')}"
    python = home / "bin" / "python"
    ready = home / ".stackgate-ready"
    if not ready.exists():
        if home.exists():
            subprocess.run(["rm", "-rf", str(home)], check=True)
        venv.EnvBuilder(with_pip=True).create(home)
        subprocess.run([str(python), "-m", "pip", "install", "-q", CPU_TORCH, "numpy"], check=True)
        ready.write_text(CPU_TORCH + "\n")
    return python


@pytest.fixture(scope="session")
def plain_python() -> Path:
    """An interpreter of an empty venv (no torch), built once and cached."""
    home = CACHE / f"plain-venv-{sys.version_info.major}.{sys.version_info.minor}"
    python = home / "bin" / "python"
    if not python.exists():
        venv.EnvBuilder(with_pip=False).create(home)
    return python


def make_venv(home: Path) -> tuple[Path, Path]:
    """A fresh empty venv: its interpreter and its site-packages."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(home)
    python = home / "bin" / "python"
    site = next((home / "lib").glob("python3*/site-packages"))
    return python, site


def install_dist(site: Path, name: str, version: str, requires: tuple[str, ...] = (), files: dict[str, bytes] | None = None) -> Path:
    """Install a distribution the way an installer leaves it: files, METADATA and RECORD.

    Real metadata, read by importlib.metadata in the target interpreter like any wheel's.
    """
    dist_info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir(parents=True)
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", *(f"Requires-Dist: {r}" for r in requires)]
    (dist_info / "METADATA").write_text("\n".join(metadata) + "\n")
    record = []
    for relative, content in (files or {}).items():
        target = site / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        record.append(f"{relative},,")
    record += [f"{dist_info.name}/METADATA,,", f"{dist_info.name}/RECORD,,"]
    (dist_info / "RECORD").write_text("\n".join(record) + "\n")
    return dist_info


@pytest.fixture(autouse=True)
def _runs_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The runs that gate and smoke keep (`invoke report`) go to a folder of each test's own,
    never to the user's state directory; subprocesses inherit it."""
    folder = tmp_path_factory.mktemp("runs")
    monkeypatch.setenv("STACKGATE_RUNS_DIR", str(folder))
    return folder


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Any]:
    """A stand-in SGLang rig (tests/smoke_support.py) in the test's folder; whatever a failed
    test left running is killed afterwards. A module may define its own ``rig`` instead."""
    from smoke_support import Rig, free_port, kill_leftovers

    made = Rig(tmp_path, free_port())
    yield made
    kill_leftovers(made)


def interpreter_lock(python: Path, packages: str = "", extra: str = "", *, imports: str = '["torch"]', version: str | None = None):
    """A lock for one SM120 GPU whose stack is an existing interpreter of this machine."""
    from stackgate.stack import lock as lockmodel

    version = version or f"{sys.version_info.major}.{sys.version_info.minor}"
    return lockmodel.loads(
        f"""
[stack]
name = "t"
[hardware]
gpu_count = 1
compute_capability = "12.0"
gpu_name = "RTX PRO 6000"
min_driver = "580"
[[toolkit]]
version = "13.0"
prefix = "/usr/local/cuda-13.0"
keep = true
default = true
[python]
version = "{version}"
interpreter = "{python}"
imports = {imports}
[python.packages]
{packages}
{extra}
"""
    )
