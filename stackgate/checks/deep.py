"""Deep checks: judge real work on every GPU and an all-reduce sweep, run by the stack's interpreter.

The measuring (launching :mod:`stackgate.edges.deepwork` under the lock's target interpreter and
reading the figures it leaves behind) is :mod:`stackgate.facts.deep`; this module judges them.
Measuring and judging stay apart, so the judgement (tolerances, slow peers, bus bandwidth,
#wrong) is tested with plain numbers.

The deep checks run only after the static checks that they stand on have passed; see
:data:`PREREQUISITES` and :func:`not_run`, which ``verify --deep`` applies.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any, Mapping, Sequence

from stackgate.checks.core import check
from stackgate.facts import Facts, Missing, ProbeFacts
from stackgate.facts.deep import AllReduceRequest, GpuWork, GpuWorkRequest, SizeFigures, Sweep, launch_env, run_gpu_work, run_sweep
from stackgate.models import settings
from stackgate.models.finding import Fix
from stackgate.models.result import Result, Status, failed, passed
from stackgate.models.spec import Lock

__all__ = ["PEER_FLOOR", "PREREQUISITES", "TOLERANCE", "judge_collective", "judge_gpu_work", "not_run", "slow_peers", "within_tolerance", "world_size"]

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


def _tail_lines(tail: Sequence[str]) -> tuple[str, ...]:
    return ("log tail:", *tail) if tail else ("log tail: (the run printed nothing)",)


# --- per-GPU work -----------------------------------------------------------------------------


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


def _limit_s() -> float:
    """A deep check's own limit: its run's ($STACKGATE_DEEP_TIMEOUT_S, read when it runs) and a minute to read the figures."""
    return settings.DEEP_TIMEOUT_S.value() + 60


def _code(returncode: int | None) -> str:
    return "timed out" if returncode is None else f"exit {returncode}"


@check("deep.gpu_work", needs=("probe", "env"), timeout_s=_limit_s, slow=True)
def gpu_work(lock: Lock, facts: Facts) -> Result:
    """Every GPU multiplies bf16/fp32 matrices correctly at its peers' rate and copies memory."""
    work = run_gpu_work(lock.python.target, GpuWorkRequest(), launch_env(lock, facts))
    return judge_gpu_work(work)


# --- the collective ---------------------------------------------------------------------------


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


@check("deep.collective", needs=("probe", "env"), timeout_s=_limit_s, slow=True)
def collective(lock: Lock, facts: Facts) -> Result:
    """An NCCL all-reduce from 8 KiB to 1 GiB is exact and reaches the locked bus bandwidth."""
    world, wanted = world_size(lock, facts.probe)
    sweep = run_sweep(lock.python.target, AllReduceRequest(world), launch_env(lock, facts))
    return judge_collective(sweep, lock.nccl.min_busbw_gbs, wanted)
