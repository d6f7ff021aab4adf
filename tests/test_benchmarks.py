"""The benchmarks run with what the README installs (`pip install .`: no pytest): each one that drives the
test stack's package index starts with pytest unimportable, as on a machine without it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Run a benchmark's ``--help`` as ``python benchmarks/NAME.py --help`` runs it, with ``import pytest`` failing.
WITHOUT_PYTEST = (
    "import runpy, sys; sys.modules['pytest'] = None; sys.path.insert(0, 'benchmarks'); "
    "sys.argv = [sys.argv[1], '--help']; runpy.run_path(sys.argv[0], run_name='__main__')"
)


@pytest.mark.parametrize("name", ["lock_speed", "install_speed", "provision_noop"])
def test_a_benchmark_of_the_package_index_runs_without_pytest(name: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_PYTEST, f"benchmarks/{name}.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.startswith("usage: "), done.stderr
