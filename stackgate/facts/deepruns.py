"""The deep checks' measurement: real work on every GPU and an all-reduce sweep, run by the stack's
interpreter, read back as figures.

stackgate never imports torch: the work is done by :mod:`stackgate.edges.deepwork` (run as a
file) under the lock's target interpreter, through the runner (its own process group, killed
whole on timeout, its output in a log file as it is written); this module reads the JSON lines
it leaves behind and aggregates them (per-size means, bus bandwidth). Judging the figures is
:mod:`stackgate.checks.deep`'s, so the judgement is tested with plain numbers.

How every deep run starts (ahead of its check, too) is :mod:`stackgate.facts.deeplaunch`'s; flashinfer's
runs are :mod:`stackgate.facts.flashruns`'. This module re-exports their names, where its users read them.
"""

from __future__ import annotations

import json
import re
import statistics
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from stackgate.edges import faults
from stackgate.facts.deeplaunch import (
    FLASHWORK,
    REQUIRED_ENV,
    SCRIPT,
    Ahead,
    Launch,
    _finished,
    _launch,
    _new_seed,
    _read_lines,
    _tail,
    _work_dir,
    ahead,
    gpu_activity,
    launch_env,
    nccl_variables,
)
from stackgate.facts.flashruns import (
    ATTENTION_RTOL,
    FUSION_RTOL,
    GATE_TIMEOUT_S,
    AttentionRequest,
    AttentionRun,
    FusionGate,
    FusionRequest,
    FusionRun,
    FusionTokens,
    aggregate_fusion,
    damaged_modules,
    flashinfer_env,
    free_bytes,
    jit_workspace,
    read_gate,
    run_attention,
    run_fusion,
)
from stackgate.models import settings

__all__ = [
    "ATTENTION_RTOL",
    "FLASHWORK",
    "FUSION_RTOL",
    "GATE_TIMEOUT_S",
    "REQUIRED_ENV",
    "SCRIPT",
    "Ahead",
    "AllReduceRequest",
    "AttentionRequest",
    "AttentionRun",
    "FusionGate",
    "FusionRequest",
    "FusionRun",
    "FusionTokens",
    "GpuWork",
    "GpuWorkRequest",
    "SizeFigures",
    "Sweep",
    "aggregate",
    "aggregate_fusion",
    "bus_bandwidth",
    "damaged_modules",
    "free_bytes",
    "flashinfer_env",
    "gpu_activity",
    "host_interfaces",
    "Launch",
    "ahead",
    "jit_workspace",
    "launch_env",
    "nccl_variables",
    "read_gate",
    "run_attention",
    "run_fusion",
    "run_gpu_work",
    "run_sweep",
]

_TRANSPORT = re.compile(r"NCCL INFO Channel \d+(?:/\d+)? ?: .* via (\S+)")
_CHANNELS = re.compile(r"NCCL INFO (\d+) coll channels")


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


def run_gpu_work(
    python: Path, request: GpuWorkRequest, env: Mapping[str, str], timeout_s: float | None = None
) -> GpuWork:
    """Run deepwork.py's per-GPU work under ``python`` (for ``timeout_s``, default $STACKGATE_DEEP_TIMEOUT_S);
    never raises for what happens there."""
    timeout_s = settings.DEEP_TIMEOUT_S.value() if timeout_s is None else timeout_s
    workdir = Path(tempfile.mkdtemp(prefix="stackgate-gpu-work-", dir=_work_dir()))
    out = workdir / "gpu.jsonl"
    log = workdir / "gpu-work.log"
    request_json = json.dumps({**asdict(request), "faults": faults.deep_faults()})
    done = _launch(Launch(python, SCRIPT, env), ["gpu", out, request_json], log, timeout_s)
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
    replays: int = 5  #: timed replays of the captured ``iters`` ops; each rank's figure is their median
    seed: int = field(default_factory=_new_seed)
    graphs: bool = True  #: time from captured CUDA graphs (False: eager only, as one rank's correctness pass)

    @classmethod
    def for_world(cls, world: int) -> AllReduceRequest:
        """The sweep for ``world`` ranks: one rank has no bus bandwidth to measure (2(n-1)/n = 0), so it gets a
        correctness pass over the same sizes (one warm-up and two ops each, no graphs) instead of the timed sweep."""
        return cls(world) if world > 1 else cls(world, warmup=1, iters=2, replays=1, graphs=False)

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
    time_us: float  #: per operation: each rank's median replay, the mean over ranks (all_reduce_perf's -a 1)
    algbw_gbs: float  #: bytes / time, 1 GB = 1e9 B
    busbw_gbs: float | None  #: algbw x 2(n-1)/n; None for one rank, where it is not defined
    wrong: int  #: elements that differ from the exact sum, over all ranks
    timing: str = "eager"  #: "cuda-graph": ops replayed from a captured graph (the GPUs' time)
    eager_us: float | None = None  #: per op launched one by one from Python (host overhead included)
    min_us: float | None = None  #: the fastest replay of any rank (cuda-graph timing only)


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
    interfaces: tuple[
        str, ...
    ] = ()  #: this host's network interfaces (/sys/class/net), for a bootstrap that found none

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
    figures = []
    for size, lines in _finished(per_rank, "size", "bytes", world):
        time_us = statistics.fmean(line["us"] for line in lines)
        algbw = size / (time_us * 1e-6) / 1e9
        timing = "cuda-graph" if all(line.get("timing") == "cuda-graph" for line in lines) else "eager"
        eager = [line["eager_us"] for line in lines if "eager_us" in line]
        eager_us = statistics.fmean(eager) if len(eager) == len(lines) else None
        fastest = [line["us_min"] for line in lines if "us_min" in line]
        min_us = min(fastest) if timing == "cuda-graph" and len(fastest) == len(lines) else None
        figures.append(
            SizeFigures(
                size,
                time_us,
                algbw,
                bus_bandwidth(algbw, world),
                sum(line["wrong"] for line in lines),
                timing,
                eager_us,
                min_us,
            )
        )
    return figures


def run_sweep(python: Path, request: AllReduceRequest, env: Mapping[str, str], timeout_s: float | None = None) -> Sweep:
    """Run deepwork.py's all-reduce sweep under ``python`` (for ``timeout_s``, default
    $STACKGATE_DEEP_TIMEOUT_S); never raises for what happens there."""
    timeout_s = settings.DEEP_TIMEOUT_S.value() if timeout_s is None else timeout_s
    workdir = Path(tempfile.mkdtemp(prefix="stackgate-allreduce-", dir=_work_dir()))
    rest: list[str | Path] = ["allreduce", workdir, json.dumps({**request.to_json(), "faults": faults.deep_faults()})]
    log = workdir / "allreduce.log"
    # Into a file as it is written (NCCL flushes each line), so a hang's log survives the kill.
    done = _launch(Launch(python, SCRIPT, env), rest, log, timeout_s)
    text = log.read_text(errors="replace")
    per_rank = {rank: _read_lines(workdir / f"rank{rank}.jsonl") for rank in range(request.world)}
    inits = [line for lines in per_rank.values() for line in lines if line.get("event") == "init"]
    nccl = next((".".join(map(str, i["nccl"])) for i in inits if i.get("nccl")), None)
    channels = [int(m[1]) for m in _CHANNELS.finditer(text)]
    return Sweep(
        request,
        tuple(aggregate(request.world, per_rank)),
        _progress(per_rank),
        tuple(i["pid"] for i in inits),
        nccl,
        done.returncode,
        timeout_s,
        _tail(done),
        log,
        nccl_variables(env),
        dict(Counter(m[1] for m in _TRANSPORT.finditer(text))),
        max(channels) if channels else None,
        done.duration_s,
        host_interfaces(),
    )


def host_interfaces(root: Path = Path("/sys/class/net")) -> tuple[str, ...]:
    """The host's network interfaces, as NCCL's socket bootstrap chooses among them."""
    try:
        return tuple(sorted(entry.name for entry in root.iterdir()))
    except OSError:
        return ()


def _progress(per_rank: Mapping[int, Sequence[Mapping[str, Any]]]) -> dict[int, int]:
    """How far each rank that set up got: -1 in the warm-up, else the number of sizes finished."""
    progress = {}
    for rank, lines in per_rank.items():
        events = [line.get("event") for line in lines]
        if "init" in events:
            progress[rank] = events.count("size") if "warm" in events else -1
    return progress
