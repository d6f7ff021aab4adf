"""Deep checks: real work on every GPU and an all-reduce sweep, run by the stack's interpreter.

stackgate never imports torch: the work is done by ``deepwork.py`` under the lock's target
interpreter, through the runner (its own process group, killed whole on timeout, its output
in a log file as it is written), and this
module judges the JSON lines it leaves behind. Measuring and judging stay apart, so the
judgement (tolerances, slow peers, bus bandwidth, #wrong) is tested with plain numbers.

The deep checks run only after the static checks that they stand on have passed; see
:data:`PREREQUISITES` and :func:`not_run`, which ``verify --deep`` applies.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import statistics
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from stackgate.edges import runner
from stackgate.models.finding import Fix
from stackgate.models.result import Result, Status, failed, passed
from stackgate.checks.core import check
from stackgate.checks.facts import Facts, Missing, ProbeFacts
from stackgate.models.spec import Lock

__all__ = [
    "PEER_FLOOR",
    "PREREQUISITES",
    "REQUIRED_ENV",
    "TOLERANCE",
    "AllReduceRequest",
    "GpuWork",
    "GpuWorkRequest",
    "SizeFigures",
    "Sweep",
    "aggregate",
    "bus_bandwidth",
    "judge_collective",
    "judge_gpu_work",
    "launch_env",
    "not_run",
    "run_gpu_work",
    "run_sweep",
    "slow_peers",
    "within_tolerance",
]

SCRIPT = Path(__file__).resolve().parents[1] / "edges" / "deepwork.py"  # run by the target interpreter, as a file
#: How long each deep run may take before it counts as a hang (torch import and NCCL set-up included).
TIMEOUT_S = float(os.environ.get("STACKGATE_DEEP_TIMEOUT_S", "300"))
#: Where each run's folder (its JSON lines and full log) is made; kept after the run, named in the result.
WORK_DIR = os.environ.get("STACKGATE_DEEP_DIR") or None
#: Set in every environment the deep checks launch, whatever the shell says: the GPU machines
#: here require NVLink multicast off, and no PCIe box has multicast anyway.
REQUIRED_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
#: Largest max-norm relative error of a product against float64. bf16 output rounding alone is
#: up to 2^-9 (~0.002); IEEE fp32 with fp32 accumulation stays near 1e-6 (TF32 would be ~1e-3).
TOLERANCE = {"bfloat16": 1e-2, "float32": 1e-4}
#: A GPU below this fraction of the median of its peers is "far slower" (thermal or power
#: throttling, a bad HBM stack, a link trained down); healthy twins differ by a few percent.
PEER_FLOOR = 0.7
#: The figures compared between peers: (part of a GPU's record, rate field, unit).
RATES = (("bfloat16", "tflops", "TFLOP/s"), ("float32", "tflops", "TFLOP/s"), ("copy", "gbs", "GB/s"))
#: The static checks each deep check stands on; PASS or WARN counts as passed. Why each:
#: gpu.driver - no driver, no CUDA work; gpu.count and gpu.capability - the machine is the one
#: the lock describes, so the GPUs' figures are judged against the right peers and torch's
#: kernels exist for them; torch.build - torch imports and is a CUDA build of the locked CUDA;
#: torch.arch - it carries kernels for these GPUs (else the deep run only repeats "no kernel
#: image"); nccl.version - for the collective, torch loads a usable NCCL. Left out on purpose:
#: gpu.pcie and gpu.ecc (the deep figures are how their harm shows), gpu.processes (a warning),
#: the toolkit and package pins (torch's matmul and NCCL do not use the CUDA toolkit).
PREREQUISITES: dict[str, tuple[str, ...]] = {
    "deep.gpu_work": ("gpu.driver", "gpu.count", "gpu.capability", "torch.build", "torch.arch"),
    "deep.collective": ("gpu.driver", "gpu.count", "gpu.capability", "torch.build", "torch.arch", "nccl.version"),
}
#: The NCCL tuning knobs that mattered on PCIe boxes; named in a slow result even when unset.
TUNING = ("NCCL_P2P_LEVEL", "NCCL_MIN_NCHANNELS", "NCCL_ALGO", "NCCL_PROTO")
_VERBS = {Status.SKIP: "was skipped", Status.FAIL: "failed", Status.ERROR: "crashed"}
_TRANSPORT = re.compile(r"NCCL INFO Channel \d+(?:/\d+)? ?: .* via (\S+)")
_CHANNELS = re.compile(r"NCCL INFO (\d+) coll channels")


def not_run(name: str, results: Sequence[Result]) -> Result | None:
    """The SKIP for deep check ``name`` when what it stands on did not pass, else None."""
    by_name = {r.check: r for r in results}
    reasons = []
    for needed in PREREQUISITES.get(name, ()):
        result = by_name.get(needed)
        if result is None:
            reasons.append(f"{needed} was not run")
        elif result.status not in (Status.PASS, Status.WARN):
            reasons.append(f"{needed} {_VERBS[result.status]}: {result.summary}")
    earlier = by_name.get("deep.gpu_work")
    if name == "deep.collective" and earlier is not None and earlier.data.get("hung"):
        reasons.append("a GPU hung in deep.gpu_work: the all-reduce would hang too")
    if not reasons:
        return None
    return Result(name, Status.SKIP, f"not run: {reasons[0]}", tuple(reasons), data={"not_run": reasons})


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


def _work_dir() -> str | None:
    if WORK_DIR:
        Path(WORK_DIR).mkdir(parents=True, exist_ok=True)
    return WORK_DIR


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


def _tail_lines(tail: Sequence[str]) -> tuple[str, ...]:
    return ("log tail:", *tail) if tail else ("log tail: (the run printed nothing)",)


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


def run_gpu_work(python: Path, request: GpuWorkRequest, env: Mapping[str, str], timeout_s: float = TIMEOUT_S) -> GpuWork:
    """Run deepwork.py's per-GPU work under ``python``; never raises for what happens there."""
    workdir = Path(tempfile.mkdtemp(prefix="stackgate-gpu-work-", dir=_work_dir()))
    out = workdir / "gpu.jsonl"
    log = workdir / "gpu-work.log"
    done = runner.run_logged([python, SCRIPT, "gpu", out, json.dumps(asdict(request))], log, timeout_s=timeout_s, env=env)
    lines = _read_lines(out)
    begin = next((r for r in lines if r.get("event") == "begin"), {})
    records = tuple(r for r in lines if r.get("event") == "done")
    started = [r["index"] for r in lines if r.get("event") == "start"]
    running = started[-1] if len(started) > len(records) else None
    return GpuWork(begin, records, running, done.returncode, timeout_s, _tail(done), log, done.duration_s)


def within_tolerance(error: float, tolerance: float) -> bool:
    """A relative error that is a number no larger than the tolerance (NaN and inf are not).

    >>> within_tolerance(0.002, 1e-2), within_tolerance(float("nan"), 1e-2), within_tolerance(2.0, 1e-2)
    (True, False, False)
    """
    return math.isfinite(error) and error <= tolerance


def slow_peers(rates: Mapping[str, float], floor: float = PEER_FLOOR) -> dict[str, tuple[float, float]]:
    """Who runs below ``floor`` x the median of the OTHERS' rates: {name: (rate, others' median)}.

    Comparing with the others (not with a median that includes the GPU itself) still flags the
    slow one of two. One GPU has no peers: nothing to flag.

    >>> slow_peers({"GPU 0": 790.0, "GPU 1": 785.0, "GPU 2": 400.0})
    {'GPU 2': (400.0, 787.5)}
    >>> slow_peers({"GPU 0": 790.0})
    {}
    """
    slow = {}
    for name, rate in rates.items():
        others = [r for n, r in rates.items() if n != name]
        if others and rate < floor * statistics.median(others):
            slow[name] = (rate, statistics.median(others))
    return slow


def _label(record: Mapping[str, Any]) -> str:
    return f"GPU {record['index']} ({record.get('name', 'unknown')})"


def _device_problems(record: Mapping[str, Any]) -> list[str]:
    """What is wrong with one device's results: an error, a wrong product, a damaged copy."""
    label = _label(record)
    if "error" in record:
        return [f"{label}: {record['error']}"]
    problems = []
    for dtype, tolerance in TOLERANCE.items():
        error = record[dtype]["rel_err"]
        if not within_tolerance(error, tolerance):
            # An fp32 error of TF32's size (~1e-3) is not a broken GPU but TF32 forced on.
            hint = " (TF32-sized: is TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 set?)" if dtype == "float32" and error < 1e-2 else ""
            problems.append(f"{label}: {dtype} product wrong: relative error {error:.3g} > {tolerance:g} against float64{hint}")
    if not record["copy"]["equal"]:
        problems.append(f"{label}: a device-to-device copy of {record['copy']['bytes']} bytes came back different")
    return problems


def _slow_problems(records: Sequence[Mapping[str, Any]]) -> list[str]:
    healthy = [r for r in records if "error" not in r]
    problems = []
    for part, rate, unit in RATES:
        slow = slow_peers({_label(r): r[part][rate] for r in healthy})
        for label, (have, median) in slow.items():
            problems.append(f"{label}: {part} {have:.4g} {unit}, {have / median:.0%} of its peers' median {median:.4g} {unit}")
    return problems


def _gpu_figures(record: Mapping[str, Any]) -> dict[str, Any]:
    if "error" in record:
        return {"index": record["index"], "error": record["error"]}
    keep = {part: {k: record[part][k] for k in ("n", "ms", "tflops", "rel_err")} for part in ("bfloat16", "float32")}
    copy = {k: record["copy"][k] for k in ("bytes", "ms", "gbs", "equal")}
    return {"index": record["index"], "name": record["name"], "seconds": round(record["seconds"], 3), **keep, "copy": copy}


def judge_gpu_work(work: GpuWork) -> Result:
    """The per-GPU verdict: a hang, an error, a wrong result or a far slower GPU fails by name."""
    data = {
        "gpus": [_gpu_figures(r) for r in work.records],
        "seed": work.begin.get("seed"),
        "torch": work.begin.get("torch"),
        "script_s": round(work.duration_s, 3),
        "log": str(work.log),
        "conventions": {"tflops": "2 n^3 per product / time", "copy_gbs": "(bytes read + bytes written) / time, 1 GB = 1e9 B"},
    }
    if work.returncode is None:
        where = f"GPU {work.running} did not finish its work" if work.running is not None else "the per-GPU work did not finish"
        return failed(f"hang: {where} within {work.timeout_s:g} s", _tail_lines(work.tail), _log_fix(work.log), {**data, "hung": True})
    if work.begin.get("error"):
        return failed(work.begin["error"], work.tail, _log_fix(work.log), data)
    if work.returncode != 0 or work.running is not None or not work.records:
        where = f" on GPU {work.running}" if work.running is not None else ""
        return failed(f"the per-GPU work failed{where} ({_code(work.returncode)}): {' / '.join(work.tail[-3:])}", work.tail, _log_fix(work.log), data)
    problems = [p for r in work.records for p in _device_problems(r)] + _slow_problems(work.records)
    if problems:
        return failed(f"{len(problems)} GPU problem(s): {problems[0]}", problems, _log_fix(work.log), data)
    return passed(_gpu_summary(work.records), [_gpu_line(r) for r in work.records], data)


def _gpu_summary(records: Sequence[Mapping[str, Any]]) -> str:
    def span(part: str, rate: str) -> str:
        values = [r[part][rate] for r in records]
        low, high = min(values), max(values)
        return f"{low:.4g}" if math.isclose(low, high, rel_tol=0.005) else f"{low:.4g}-{high:.4g}"

    return (
        f"{len(records)} GPU(s) correct: bf16 {span('bfloat16', 'tflops')} TFLOP/s, fp32 {span('float32', 'tflops')} TFLOP/s, "
        f"copy {span('copy', 'gbs')} GB/s (read+write)"
    )


def _gpu_line(r: Mapping[str, Any]) -> str:
    return (
        f"{_label(r)}: bf16 {r['bfloat16']['n']}^3 {r['bfloat16']['tflops']:.4g} TFLOP/s (rel err {r['bfloat16']['rel_err']:.2g}), "
        f"fp32 {r['float32']['n']}^3 {r['float32']['tflops']:.4g} TFLOP/s (rel err {r['float32']['rel_err']:.2g}), "
        f"copy {r['copy']['bytes'] / 2**30:.3g} GiB {r['copy']['gbs']:.4g} GB/s"
    )


def _log_fix(log: Path) -> Fix:
    return Fix("Read the full log; a GPU that errors or hangs alone needs a reset (or its node drained).", (f"less {log}", "nvidia-smi -q -d PERFORMANCE,CLOCK"))


def _code(returncode: int | None) -> str:
    return "timed out" if returncode is None else f"exit {returncode}"


@check("deep.gpu_work", needs=("probe", "env"), timeout_s=TIMEOUT_S + 60, slow=True)
def gpu_work(lock: Lock, facts: Facts) -> Result:
    """Every GPU multiplies bf16/fp32 matrices correctly at its peers' rate and copies memory."""
    work = run_gpu_work(lock.python.target, GpuWorkRequest(), launch_env(lock, facts))
    return judge_gpu_work(work)


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


def run_sweep(python: Path, request: AllReduceRequest, env: Mapping[str, str], timeout_s: float = TIMEOUT_S) -> Sweep:
    """Run deepwork.py's all-reduce sweep under ``python``; never raises for what happens there."""
    workdir = Path(tempfile.mkdtemp(prefix="stackgate-allreduce-", dir=_work_dir()))
    argv = [python, SCRIPT, "allreduce", workdir, json.dumps(request.to_json())]
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


def _size(n: int) -> str:
    """
    >>> _size(8192), _size(1 << 30), _size(3000)
    ('8 KiB', '1 GiB', '3000 B')
    """
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def _sweep_data(sweep: Sweep, min_busbw: float | None) -> dict[str, Any]:
    measured = [s.busbw_gbs for s in sweep.sizes if s.busbw_gbs is not None]
    peak = max(sweep.sizes, key=lambda s: s.busbw_gbs or 0.0) if measured else None
    return {
        "world": sweep.world,
        "backend": sweep.request.backend,
        "nccl_version": sweep.nccl_version,
        "sizes": [asdict(s) for s in sweep.sizes],
        "peak_busbw_gbs": peak.busbw_gbs if peak else None,
        "peak_bytes": peak.bytes if peak else None,
        "avg_busbw_gbs": statistics.fmean(measured) if measured else None,
        "wrong_total": sum(s.wrong for s in sweep.sizes),
        "min_busbw_gbs": min_busbw,
        "busbw_judged": bool(measured) and min_busbw is not None,
        "busbw_note": None if measured else _ONE_RANK_NOTE,
        "nccl_env": dict(sweep.nccl_env),
        "transports": dict(sweep.transports),
        "channels": sweep.channels,
        "progress": {str(rank): done for rank, done in sweep.progress.items()},
        "script_s": round(sweep.duration_s, 3),
        "log": str(sweep.log),
        "timing": _timing(sweep),
        "method": "in-place all_reduce (sum, float32); per size 1 untimed op then "
        f"{sweep.request.iters} timed ops bracketed by CUDA events, mean over ranks; "
        f"{sweep.request.warmup} warm-up ops at the largest and smallest size first (nccl-tests' all_reduce_perf); "
        "on GPUs the timed ops are captured in a CUDA graph and replayed, so that torch's per-call host overhead "
        "is not measured (eager_us keeps the op launched one by one)",
    }


def _timing(sweep: Sweep) -> str | None:
    kinds = {s.timing for s in sweep.sizes}
    return kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else None)


_ONE_RANK_NOTE = (
    "bus bandwidth is not defined for one rank: 2(n-1)/n = 0 (nccl-tests prints 0); with one rank an in-place "
    "all-reduce moves no data, so algbw measures the per-operation overhead, not a link"
)


def judge_collective(sweep: Sweep, min_busbw: float | None, wanted: int | None = None) -> Result:
    """The collective verdict: a hang, a crash, any wrong element, or a bus bandwidth below the floor fails."""
    data = _sweep_data(sweep, min_busbw)
    notes = [f"{wanted} rank(s) wanted, only {sweep.world} GPU(s) present: ran {sweep.world}"] if wanted and wanted > sweep.world else []
    if sweep.returncode is None:
        return failed(_hang_summary(sweep), (*_hang_details(sweep), *_tail_lines(sweep.tail)), _nccl_fix(sweep), {**data, "hung": True})
    if sweep.returncode != 0 or len(sweep.sizes) < len(sweep.request.sizes()):
        reason = sweep.tail[-1] if sweep.tail else "no output"
        return failed(f"the all-reduce failed ({_code(sweep.returncode)}): {reason}", _tail_lines(sweep.tail), _nccl_fix(sweep), data)
    wrong = [s for s in sweep.sizes if s.wrong]
    if wrong:
        details = [f"{_size(s.bytes)}: #wrong {s.wrong}" for s in wrong]
        return failed(f"all-reduce results wrong at {len(wrong)} of {len(sweep.sizes)} sizes (#wrong {data['wrong_total']})", details, _wrong_fix(sweep), data)
    if sweep.world < 2:
        return passed(_one_rank_summary(sweep, min_busbw), [*notes, *_size_lines(sweep)], data)
    if min_busbw is not None and data["peak_busbw_gbs"] < min_busbw:
        return failed(_slow_summary(sweep, data, min_busbw), [*_size_lines(sweep), *_env_lines(sweep)], _nccl_fix(sweep), data)
    floor = f" (>= {min_busbw:g} GB/s)" if min_busbw is not None else ""
    summary = f"{sweep.world} ranks, {_library(sweep)}: peak busbw {data['peak_busbw_gbs']:.4g} GB/s at {_size(data['peak_bytes'])}{floor}, #wrong 0 at {len(sweep.sizes)} sizes"
    return passed(summary, [*notes, *_size_lines(sweep)], data)


def _library(sweep: Sweep) -> str:
    return f"NCCL {sweep.nccl_version}" if sweep.nccl_version else sweep.request.backend


def _one_rank_summary(sweep: Sweep, min_busbw: float | None) -> str:
    first, last = sweep.request.sizes()[0], sweep.request.sizes()[-1]
    floor = f"; min_busbw_gbs {min_busbw:g} not judged" if min_busbw is not None else ""
    return (
        f"1 rank, {_library(sweep)}: all-reduce exact at {len(sweep.sizes)} sizes ({_size(first)}-{_size(last)}); "
        f"bus bandwidth is not defined for one rank (2(n-1)/n = 0){floor}"
    )


def _slow_summary(sweep: Sweep, data: Mapping[str, Any], min_busbw: float) -> str:
    tuning = ", ".join(f"{k}={sweep.nccl_env.get(k, 'unset')}" for k in TUNING)
    return f"peak busbw {data['peak_busbw_gbs']:.4g} GB/s at {_size(data['peak_bytes'])} is below the lock's {min_busbw:g} GB/s ({_library(sweep)}, {sweep.world} ranks; {tuning})"


def _size_lines(sweep: Sweep) -> list[str]:
    def bus(s: SizeFigures) -> str:
        return f"busbw {s.busbw_gbs:8.2f} GB/s" if s.busbw_gbs is not None else "busbw n/a (1 rank)"

    def eager(s: SizeFigures) -> str:
        return f"  (launched one by one: {s.eager_us:.1f} us)" if s.timing == "cuda-graph" and s.eager_us is not None else ""

    return [f"{_size(s.bytes):>8}: {s.time_us:10.1f} us  algbw {s.algbw_gbs:8.2f} GB/s  {bus(s)}  #wrong {s.wrong}{eager(s)}" for s in sweep.sizes]


def _env_lines(sweep: Sweep) -> list[str]:
    lines = [f"NCCL variables in force: {' '.join(f'{k}={v}' for k, v in sweep.nccl_env.items())}"]
    if sweep.transports:
        lines.append("transports in the INFO log: " + ", ".join(f"{t} x{n}" for t, n in sorted(sweep.transports.items())))
    if sweep.channels is not None:
        lines.append(f"NCCL set up {sweep.channels} collective channel(s)")
    return lines


def _stage(sweep: Sweep, position: int) -> str:
    sizes = sweep.request.sizes()
    if position < 0:
        return "the warm-up all-reduces"
    return f"the all-reduce of {_size(sizes[position])}" if position < len(sizes) else "shutting down"


def _hang_summary(sweep: Sweep) -> str:
    if not sweep.progress:
        return f"hang: no rank finished setting up within {sweep.timeout_s:g} s (the process group never formed)"
    where = _stage(sweep, min(sweep.progress.values()))
    return f"hang: {where} did not finish within {sweep.timeout_s:g} s ({len(sweep.progress)} of {sweep.world} rank(s) set up)"


def _hang_details(sweep: Sweep) -> list[str]:
    lines = []
    for rank in range(sweep.world):
        position = sweep.progress.get(rank)
        where = "never finished setting up" if position is None else f"stopped in {_stage(sweep, position)}"
        lines.append(f"rank {rank}: {where}")
    return [*lines, *_env_lines(sweep)]


def _nccl_fix(sweep: Sweep) -> Fix:
    return Fix(
        "Look at the topology NCCL found and the transports it chose (P2P, not SHM or NET, between GPUs of one host). "
        "On PCIe-only hosts NCCL_P2P_LEVEL=SYS and NCCL_MIN_NCHANNELS=8 in the lock's [smoke.env] raised ~22 to 37-41 GB/s; "
        "check ACS/IOMMU settings when P2P is refused.",
        ("nvidia-smi topo -m", f"grep -E 'via|channels|NCCL WARN' {sweep.log}"),
    )


def _wrong_fix(sweep: Sweep) -> Fix:
    return Fix(
        "Wrong sums are data corruption between GPUs: drain the node. To find the path, rerun with P2P off "
        "(NCCL_P2P_DISABLE=1) and look for ECC and PCIe AER errors.",
        ("nvidia-smi -q -d ECC", "journalctl -k | grep -iE 'AER|Xid'", f"less {sweep.log}"),
    )


def world_size(lock: Lock, probe: ProbeFacts | Missing) -> tuple[int, int]:
    """(ranks to run, ranks wanted): the lock's TP size, capped by the GPUs torch sees."""
    wanted = lock.smoke.tp
    present = probe.torch.get("device_count") if isinstance(probe, ProbeFacts) and probe.torch else None
    return (min(wanted, present) if isinstance(present, int) and present > 0 else wanted), wanted


@check("deep.collective", needs=("probe", "env"), timeout_s=TIMEOUT_S + 60, slow=True)
def collective(lock: Lock, facts: Facts) -> Result:
    """An NCCL all-reduce from 8 KiB to 1 GiB is exact and reaches the locked bus bandwidth."""
    world, wanted = world_size(lock, facts.probe)
    sweep = run_sweep(lock.python.target, AllReduceRequest(world), launch_env(lock, facts))
    return judge_collective(sweep, lock.nccl.min_busbw_gbs, wanted)
