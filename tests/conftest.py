"""Fixtures shared by the test modules: real interpreters, isolated installers. The fixtures of
the support modules load as plugins (``pytest_plugins``); their plain helpers are imported."""

from __future__ import annotations

import signal
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any, Iterator

import pytest
from support import CACHE, CPU_TORCH, cached_build

pytest_plugins = ["pkgindex_fixtures"]


@pytest.fixture(scope="session")
def torch_python() -> Path:
    """An interpreter of a venv holding the CPU build of torch, built once and cached.

    Uses the machine's pip configuration on purpose: that is where the CPU wheel is found.
    """

    def build(home: Path) -> None:
        venv.EnvBuilder(with_pip=True).create(home)
        subprocess.run([str(home / "bin" / "python"), "-m", "pip", "install", "-q", CPU_TORCH, "numpy"], check=True)

    name = f"torch-venv-{sys.version_info.major}.{sys.version_info.minor}-{CPU_TORCH.replace('=', '')}"
    return cached_build(CACHE / name, build) / "bin" / "python"


@pytest.fixture(scope="session")
def plain_python() -> Path:
    """An interpreter of an empty venv (no torch), built once and cached."""
    # Not "plain-venv-*": older tests built that in place, and a run of theirs may be using it.
    home = cached_build(
        CACHE / f"empty-venv-{sys.version_info.major}.{sys.version_info.minor}",
        lambda home: venv.EnvBuilder(with_pip=False).create(home),
    )
    return home / "bin" / "python"


@pytest.fixture(autouse=True)
def _runs_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The runs that gate and smoke keep (`invoke report`) go to a folder of each test's own,
    never to the user's state directory; subprocesses inherit it."""
    folder = tmp_path_factory.mktemp("runs")
    monkeypatch.setenv("STACKGATE_HISTORY_DIR", str(folder))
    # The state folder too: what a test's launches record (and a later run reaps) stays its own.
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
    return folder


@pytest.fixture(autouse=True)
def _deep_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The folders the deep runs keep (each run's JSON lines and full log, named in its result)
    go to a folder of each test's own under pytest's temporary base, which pytest prunes, never
    to the system's temp folder; subprocesses inherit it."""
    folder = tmp_path_factory.mktemp("deep")
    monkeypatch.setenv("STACKGATE_DEEP_DIR", str(folder))
    return folder


@pytest.fixture(autouse=True)
def _fake_nvml_reset() -> Iterator[None]:
    """The in-process fake NVML is left as each test found it: a machine one test configured (and a failure
    left configured) is never the next test's, which reads its own from $STACKGATE_FAKE_NVML."""
    yield
    from fakes import fake_nvml

    fake_nvml.configure(None)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Any]:
    """A stand-in SGLang rig (tests/smoke_support.py) in the test's folder; whatever a failed
    test left running is killed afterwards. A module may define its own ``rig`` instead."""
    from smoke_support import Rig, free_port, kill_leftovers

    made = Rig(tmp_path, free_port())
    yield made
    kill_leftovers(made)


@pytest.fixture(scope="session")
def slurm() -> Iterator[Any]:
    """A real Slurm cluster of four idle nodes (tests/slurm_cluster.py), shared by a session's
    tests (each pytest-xdist worker starts its own); a test that changes a node resets it."""
    import slurm_cluster

    why = slurm_cluster.why_no_slurm()
    if why is not None:
        pytest.skip(why)
    cluster = slurm_cluster.start(4)
    try:
        yield cluster
    finally:
        cluster.stop()


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C reaches the tests and their children as it does from a terminal, however the run was started.

    A shell without job control (a script's ``pytest &``, CI's background step) starts its
    children with SIGINT ignored, and an ignored signal stays ignored across exec: Python then
    installs no KeyboardInterrupt handler, so a test that sends SIGINT to itself or to a child
    (the Ctrl-C tests of smoke, gate, verify, provision, upgrade and the fleet) would see nothing
    happen. Python's own handler here is reset to the default at each exec, so every child starts
    as from a terminal. Runs before pytest-xdist starts its workers, and again in each worker.
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that takes the CPU-torch venv is a ``torch`` test whether or not it says so, so
    that ``-m "not torch"`` leaves out every test that needs the 1 GB venv."""
    for item in items:
        if "torch_python" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.torch)
