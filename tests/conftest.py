"""Fixtures shared by the test modules: real interpreters, isolated installers."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

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
