"""Shared by the provision benchmarks: the test stack's index and lock, and a timed provision."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from pkgindex import IndexServer, serve_stack, write_stack_lock  # noqa: E402

__all__ = ["ROOT", "Run", "IndexServer", "environ", "provision", "serve_stack", "write_stack_lock"]

_STEP = re.compile(r"^done in (\d+\.\d+) s: \[\d+/\d+\] (.*)$")


@dataclass(frozen=True)
class Run:
    wall_s: float
    returncode: int
    stdout: str
    stderr: str

    @property
    def steps(self) -> list[tuple[str, float]]:
        """(what, seconds) of each step, from provision's own progress lines."""
        return [(m[2], float(m[1])) for line in self.stderr.splitlines() if (m := _STEP.match(line))]


def environ(caches: Path, **extra: str) -> dict[str, str]:
    """No pip/uv configuration of this machine, caches of our own, this interpreter as the stack's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        UV_NO_CONFIG="1",
        UV_CACHE_DIR=str(caches / "uv"),
        PIP_CACHE_DIR=str(caches / "pip"),
        STACKGATE_BASE_PYTHON=os.path.realpath(getattr(sys, "_base_executable", sys.executable)),
        NO_COLOR="1",
    )
    env.update(extra)
    return env


def provision(spec: Path, env: dict[str, str], *prefix: str) -> Run:
    """`invoke provision --lock LOCK --yes` in its own process, as a person runs it."""
    argv = [*prefix, sys.executable, "-m", "invoke", "provision", "--lock", str(spec), "--yes"]
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    return Run(time.perf_counter() - started, done.returncode, done.stdout, done.stderr)
