"""How the deep checks' runs start and end: the stack's interpreter running a script of edges/ (deepwork.py,
flashwork.py) through the runner, each in a fresh folder; runs started ahead of their checks (:func:`ahead`);
the environment they get (:func:`launch_env`), and the JSON lines they leave behind.

Shared by :mod:`stackgate.facts.deepruns` (the per-GPU work, the all-reduce sweep) and
:mod:`stackgate.facts.flashruns` (flashinfer's kernels).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator, Mapping, Sequence

from stackgate.edges import nvml, runner
from stackgate.facts.collect import Facts
from stackgate.facts.values import Missing
from stackgate.models import settings
from stackgate.models.spec import Spec

__all__ = [
    "FLASHWORK",
    "REQUIRED_ENV",
    "SCRIPT",
    "Ahead",
    "gpu_activity",
    "Launch",
    "ahead",
    "launch_env",
    "nccl_variables",
]

SCRIPT = Path(__file__).resolve().parents[1] / "edges" / "deepwork.py"  # run by the target interpreter, as a file
FLASHWORK = SCRIPT.with_name("flashwork.py")  # flashinfer's kernels, run the same way
#: Set in every environment the deep checks launch, whatever the shell says: the GPU machines
#: here require NVLink multicast off, and no PCIe box has multicast anyway.
REQUIRED_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def launch_env(spec: Spec, facts: Facts) -> dict[str, str]:
    """The stack's environment, the serving engine's [smoke.env] (its NCCL tuning), the required
    multicast switches, and an NCCL_DEBUG=INFO log on stdout.

    The INFO log is always on rather than asked for on a re-run: NCCL logs at set-up, not per
    operation, so it costs nothing measurable, and a hang may not come back on a second run.
    """
    env = dict(facts.env.environ)
    env.update(spec.smoke.env)
    env.update(REQUIRED_ENV)
    env["NCCL_DEBUG"] = "INFO"
    env.pop("NCCL_DEBUG_FILE", None)  # keep the log in our capture, where its tail is reported
    return env


def nccl_variables(env: Mapping[str, str]) -> dict[str, str]:
    """The NCCL settings in force in ``env``.

    >>> nccl_variables({"NCCL_P2P_LEVEL": "SYS", "PATH": "/bin", "TORCH_NCCL_BLOCKING_WAIT": "1"})
    {'NCCL_P2P_LEVEL': 'SYS', 'TORCH_NCCL_BLOCKING_WAIT': '1'}
    """
    return {k: env[k] for k in sorted(env) if k.startswith(("NCCL_", "TORCH_NCCL_"))}


# --- runs started ahead of their checks -----------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """What a deep run starts: the stack's interpreter running one of the work scripts, in an environment."""

    python: Path
    script: Path
    env: Mapping[str, str]


class Ahead:
    """Deep runs started ahead of their checks, so that each run's interpreter start and torch import
    (seconds with a CUDA build) overlap the work before it (:class:`runner.Held`); a run whose launch
    matches one held here takes it, any other starts as it always did. What is never taken is killed
    by :meth:`close`."""

    def __init__(self) -> None:
        self._held: list[tuple[Launch, runner.Held]] = []
        self._guard = threading.Lock()
        self.started = 0
        self.taken = 0

    def start(self, launch: Launch) -> None:
        """Start ``launch``'s script waiting for its arguments; one that cannot start is left to its run to report."""
        try:
            held = runner.Held([launch.python, launch.script, "hold"], env=launch.env)
        except OSError:
            return
        with self._guard:
            self._held.append((launch, held))
            self.started += 1

    def take(self, launch: Launch) -> runner.Held | None:
        """The run started ahead for exactly this launch (interpreter, script, environment), if any."""
        with self._guard:
            for index, (held_for, held) in enumerate(self._held):
                if held_for == launch:
                    del self._held[index]
                    self.taken += 1
                    return held
        return None

    def close(self) -> None:
        """End every run started ahead and never taken."""
        with self._guard:
            left, self._held = self._held, []
        for _, held in left:
            held.close()


_AHEAD: list[Ahead] = []  #: the pool the deep runs take from now (verify --deep's), innermost last


@contextlib.contextmanager
def ahead() -> Iterator[Ahead]:
    """A pool of runs started ahead, in force for the deep runs until the block ends (then the rest is killed)."""
    pool = Ahead()
    _AHEAD.append(pool)
    try:
        yield pool
    finally:
        _AHEAD.remove(pool)
        pool.close()


def _launch(
    launch: Launch, rest: Sequence[str | Path], log: Path, timeout_s: float | None, *, held: bool = True
) -> runner.Completed:
    """Run ``launch``'s script with ``rest``: on the run started ahead for it when there is one, else started now."""
    waiting = _AHEAD[-1].take(launch) if held and _AHEAD else None
    if waiting is None:
        return runner.run_logged([launch.python, launch.script, *rest], log, timeout_s=timeout_s, env=launch.env)
    return waiting.run(rest, log=log, timeout_s=timeout_s)


def _work_dir() -> Path | None:
    """Where each run's folder (its JSON lines and full log) is made; kept after the run, named in the result."""
    where = settings.DEEP_DIR.value()
    if where is not None:
        where.mkdir(parents=True, exist_ok=True)
    return where


def _new_seed() -> int:
    return secrets.randbits(24)  # deepwork.py's integer data stays exact below 2^24


def _read_lines(path: Path) -> list[dict[str, Any]]:
    """JSON lines; a last line cut short by a kill is dropped."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def _tail(done: runner.Completed, lines: int = 20) -> tuple[str, ...]:
    """The last lines of the run's log: NCCL's INFO lines and Python's, in the order written."""
    return tuple([line for line in done.stdout.splitlines() if line.strip()][-lines:])


def gpu_activity(lib: ModuleType | None = None) -> nvml.NvmlSnapshot | Missing:
    """NVML now, just before a measurement: what other processes are doing on the GPUs."""
    try:
        return nvml.snapshot(lib)
    except nvml.NvmlError as exc:
        return Missing(str(exc))


def _finished(
    per_rank: Mapping[int, Sequence[Mapping[str, Any]]], event: str, key: str, world: int
) -> list[tuple[int, list[Mapping[str, Any]]]]:
    """(value of ``key``, its lines) of every rank's ``event`` lines, in order, where all ``world`` ranks wrote one.

    >>> size = lambda n: {"event": "size", "bytes": n}
    >>> events = {0: [size(8), size(16)], 1: [size(8)]}
    >>> _finished(events, "size", "bytes", 2)
    [(8, [{'event': 'size', 'bytes': 8}, {'event': 'size', 'bytes': 8}])]
    """
    found: dict[int, list[Mapping[str, Any]]] = {}
    for lines in per_rank.values():
        for line in lines:
            if line.get("event") == event:
                found.setdefault(line[key], []).append(line)
    return [(value, found[value]) for value in sorted(found) if len(found[value]) >= world]
