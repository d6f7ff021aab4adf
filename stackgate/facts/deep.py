"""The deep checks' measurement: real work on every GPU and an all-reduce sweep, run by the stack's
interpreter, read back as figures.

stackgate never imports torch: the work is done by :mod:`stackgate.edges.deepwork` (run as a
file) under the lock's target interpreter, through the runner (its own process group, killed
whole on timeout, its output in a log file as it is written); this module reads the JSON lines
it leaves behind and aggregates them (per-size means, bus bandwidth). Judging the figures is
:mod:`stackgate.checks.deep`'s, so the judgement is tested with plain numbers.
"""

from __future__ import annotations

import json
import re
import secrets
import statistics
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from stackgate.edges import runner
from stackgate.facts.collect import Facts
from stackgate.models import faults, settings
from stackgate.models.spec import Lock

__all__ = [
    "REQUIRED_ENV",
    "SCRIPT",
    "AllReduceRequest",
    "GpuWork",
    "GpuWorkRequest",
    "SizeFigures",
    "Sweep",
    "aggregate",
    "bus_bandwidth",
    "launch_env",
    "nccl_variables",
    "run_gpu_work",
    "run_sweep",
]

SCRIPT = Path(__file__).resolve().parents[1] / "edges" / "deepwork.py"  # run by the target interpreter, as a file
#: Set in every environment the deep checks launch, whatever the shell says: the GPU machines
#: here require NVLink multicast off, and no PCIe box has multicast anyway.
REQUIRED_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
_TRANSPORT = re.compile(r"NCCL INFO Channel \d+(?:/\d+)? ?: .* via (\S+)")
_CHANNELS = re.compile(r"NCCL INFO (\d+) coll channels")


def launch_env(lock: Lock, facts: Facts) -> dict[str, str]:
    """The stack's environment, the serving engine's [smoke.env] (its NCCL tuning), the required
    multicast switches, and an NCCL_DEBUG=INFO log on stdout.

    The INFO log is always on rather than asked for on a re-run: NCCL logs at set-up, not per
    operation, so it costs nothing measurable, and a hang may not come back on a second run.
    """
    env = dict(facts.env.environ)
    env.update(lock.smoke.env)
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


# --- per-GPU work -----------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuWorkRequest:
    """What deepwork.py's ``gpu`` mode is asked to do on each device."""

    device: str = "cuda"  #: "cpu" in the tests
    bf16_n: int = 8192  #: ~1.4 ms a product on an H200 (~790 TFLOP/s): far past launch overhead
    fp32_n: int = 4096  #: IEEE fp32 runs on CUDA cores (~50 TFLOP/s): ~3 ms a product
    copy_bytes: int = 2 << 30  #: ~1 ms a copy at 4.3 TB/s read+write
    warmup: int = 3
    iters: int = 20
    sample: int = 64  #: rows and columns of each product checked against float64 on the CPU
    seed: int = field(default_factory=_new_seed)


@dataclass(frozen=True)
class GpuWork:
    """What the per-GPU run left behind."""

    begin: Mapping[str, Any]  #: torch version, device count, seed, or the error that stopped it
    records: tuple[Mapping[str, Any], ...]  #: one per device finished
    running: int | None  #: the device started and never finished (a hang), if any
    returncode: int | None  #: None: killed at the timeout
    timeout_s: float
    tail: tuple[str, ...]
    log: Path
    duration_s: float


def run_gpu_work(python: Path, request: GpuWorkRequest, env: Mapping[str, str], timeout_s: float | None = None) -> GpuWork:
    """Run deepwork.py's per-GPU work under ``python`` (for ``timeout_s``, default $STACKGATE_DEEP_TIMEOUT_S);
    never raises for what happens there."""
    timeout_s = settings.DEEP_TIMEOUT_S.value() if timeout_s is None else timeout_s
    workdir = Path(tempfile.mkdtemp(prefix="stackgate-gpu-work-", dir=_work_dir()))
    out = workdir / "gpu.jsonl"
    log = workdir / "gpu-work.log"
    done = runner.run_logged([python, SCRIPT, "gpu", out, json.dumps({**asdict(request), "faults": faults.deep_faults()})], log, timeout_s=timeout_s, env=env)
    lines = _read_lines(out)
    begin = next((r for r in lines if r.get("event") == "begin"), {})
    records = tuple(r for r in lines if r.get("event") == "done")
    started = [r["index"] for r in lines if r.get("event") == "start"]
    running = started[-1] if len(started) > len(records) else None
    return GpuWork(begin, records, running, done.returncode, timeout_s, _tail(done), log, done.duration_s)


# --- the collective ---------------------------------------------------------------------------


@dataclass(frozen=True)
class AllReduceRequest:
    """What deepwork.py's ``allreduce`` mode is asked to do; defaults are all_reduce_perf's
    ``-b 8K -e 1G -f 2`` with its own -w 5 -n 20, on float32 sums."""

    world: int
    backend: str = "nccl"  #: "gloo" in the tests
    device: str = "cuda"  #: "cpu" in the tests
    min_bytes: int = 8 << 10
    max_bytes: int = 1 << 30
    warmup: int = 5
    iters: int = 20
    seed: int = field(default_factory=_new_seed)

    def sizes(self) -> list[int]:
        """Doubling from min_bytes to max_bytes.

        >>> AllReduceRequest(2, min_bytes=8 << 10, max_bytes=64 << 10).sizes()
        [8192, 16384, 32768, 65536]
        """
        sizes, size = [], self.min_bytes
        while size <= self.max_bytes:
            sizes.append(size)
            size *= 2
        return sizes

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "sizes": self.sizes()}


@dataclass(frozen=True)
class SizeFigures:
    """One message size, as all_reduce_perf prints it (its in-place columns)."""

    bytes: int
    time_us: float  #: per operation, the mean over ranks (all_reduce_perf's default -a 1)
    algbw_gbs: float  #: bytes / time, 1 GB = 1e9 B
    busbw_gbs: float | None  #: algbw x 2(n-1)/n; None for one rank, where it is not defined
    wrong: int  #: elements that differ from the exact sum, over all ranks
    timing: str = "eager"  #: "cuda-graph": ops replayed from a captured graph (the GPUs' time)
    eager_us: float | None = None  #: per op launched one by one from Python (host overhead included)


@dataclass(frozen=True)
class Sweep:
    """What the all-reduce run left behind."""

    request: AllReduceRequest
    sizes: tuple[SizeFigures, ...]  #: the sizes every rank finished
    progress: Mapping[int, int]  #: rank -> sizes finished (-1: still warming up); absent: never set up
    pids: tuple[int, ...]
    nccl_version: str | None
    returncode: int | None  #: None: killed at the timeout
    timeout_s: float
    tail: tuple[str, ...]
    log: Path
    nccl_env: Mapping[str, str]
    transports: Mapping[str, int]  #: "P2P/CUMEM/read": channels, from the INFO log
    channels: int | None
    duration_s: float

    @property
    def world(self) -> int:
        return self.request.world


def bus_bandwidth(algbw_gbs: float, world: int) -> float | None:
    """nccl-tests' all-reduce bus bandwidth: algbw x 2(n-1)/n; not defined for one rank.

    >>> bus_bandwidth(100.0, 8)
    175.0
    >>> bus_bandwidth(100.0, 1) is None
    True
    """
    return algbw_gbs * 2 * (world - 1) / world if world > 1 else None


def aggregate(world: int, per_rank: Mapping[int, Sequence[Mapping[str, Any]]]) -> list[SizeFigures]:
    """Per-size figures from every rank's "size" lines, for the sizes all ``world`` ranks finished."""
    by_size: dict[int, list[Mapping[str, Any]]] = {}
    for lines in per_rank.values():
        for line in lines:
            if line.get("event") == "size":
                by_size.setdefault(line["bytes"], []).append(line)
    figures = []
    for size in sorted(by_size):
        lines = by_size[size]
        if len(lines) < world:
            continue
        time_us = statistics.fmean(line["us"] for line in lines)
        algbw = size / (time_us * 1e-6) / 1e9
        timing = "cuda-graph" if all(line.get("timing") == "cuda-graph" for line in lines) else "eager"
        eager = [line["eager_us"] for line in lines if "eager_us" in line]
        eager_us = statistics.fmean(eager) if len(eager) == len(lines) else None
        figures.append(SizeFigures(size, time_us, algbw, bus_bandwidth(algbw, world), sum(line["wrong"] for line in lines), timing, eager_us))
    return figures


def run_sweep(python: Path, request: AllReduceRequest, env: Mapping[str, str], timeout_s: float | None = None) -> Sweep:
    """Run deepwork.py's all-reduce sweep under ``python`` (for ``timeout_s``, default
    $STACKGATE_DEEP_TIMEOUT_S); never raises for what happens there."""
    timeout_s = settings.DEEP_TIMEOUT_S.value() if timeout_s is None else timeout_s
    workdir = Path(tempfile.mkdtemp(prefix="stackgate-allreduce-", dir=_work_dir()))
    argv = [python, SCRIPT, "allreduce", workdir, json.dumps({**request.to_json(), "faults": faults.deep_faults()})]
    log = workdir / "allreduce.log"
    # Into a file as it is written (NCCL flushes each line), so a hang's log survives the kill.
    done = runner.run_logged(argv, log, timeout_s=timeout_s, env=env)
    text = log.read_text(errors="replace")
    per_rank = {rank: _read_lines(workdir / f"rank{rank}.jsonl") for rank in range(request.world)}
    inits = [line for lines in per_rank.values() for line in lines if line.get("event") == "init"]
    nccl = next((".".join(map(str, i["nccl"])) for i in inits if i.get("nccl")), None)
    channels = [int(m[1]) for m in _CHANNELS.finditer(text)]
    return Sweep(
        request, tuple(aggregate(request.world, per_rank)), _progress(per_rank), tuple(i["pid"] for i in inits), nccl,
        done.returncode, timeout_s, _tail(done), log, nccl_variables(env),
        dict(Counter(m[1] for m in _TRANSPORT.finditer(text))), max(channels) if channels else None, done.duration_s,
    )  # fmt: skip


def _progress(per_rank: Mapping[int, Sequence[Mapping[str, Any]]]) -> dict[int, int]:
    """How far each rank that set up got: -1 in the warm-up, else the number of sizes finished."""
    progress = {}
    for rank, lines in per_rank.items():
        events = [line.get("event") for line in lines]
        if "init" in events:
            progress[rank] = events.count("size") if "warm" in events else -1
    return progress
