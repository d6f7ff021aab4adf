"""deep.gpu_work: every GPU multiplies bf16/fp32 matrices correctly at its peers' (and its model's)
rate and copies memory; judged from :class:`~stackgate.facts.deepruns.GpuWork`."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any, Mapping, Sequence

from stackgate.checks.core import check
from stackgate.checks.deep.common import _LOOKS, PEER_FLOOR, RATES, TOLERANCE, _code, _limit_s, _log_fix, _tail_lines
from stackgate.checks.unexplained import looked_up
from stackgate.edges.nvml import NvmlSnapshot, command_line
from stackgate.facts import Facts, Missing
from stackgate.facts.deepruns import (
    GpuWork,
    GpuWorkRequest,
    gpu_activity,
    launch_env,
    run_gpu_work,
)
from stackgate.models.finding import Fix
from stackgate.models.result import Result, failed, passed
from stackgate.models.spec import Spec

__all__ = [
    "activity_lines",
    "gpu_work",
    "judge_gpu_work",
    "MODEL_RATES",
    "MODEL_RATES_HOW",
    "model_row",
    "row_named",
    "slow_peers",
    "within_tolerance",
]

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
            hint = (
                " (TF32-sized: is TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 set?)"
                if dtype == "float32" and error < 1e-2
                else ""
            )
            problems.append(
                f"{label}: {dtype} product wrong: relative error {error:.3g} > {tolerance:g} against float64{hint}"
            )
    if not record["copy"]["equal"]:
        problems.append(f"{label}: a device-to-device copy of {record['copy']['bytes']} bytes came back different")
    return problems


#: What an idle GPU of each model (NVML's name) gave, by stackgate's own method: the floor a GPU without peers is
#: judged by (PEER_FLOOR of each rate), and the read bandwidth the bandwidth-bound decode is a fraction of. Each row
#: says how it was measured (MODEL_RATES_HOW); every result judged against a row names it.
MODEL_RATES: dict[str, dict[str, float]] = {
    "NVIDIA H200": {"bfloat16": 781.2, "float32": 51.0, "copy": 4266.0, "read": 4443.0, "decode_fraction": 0.99},
}
MODEL_RATES_HOW: dict[str, str] = {
    "NVIDIA H200": (
        "1x H200, driver 580.159.04, torch 2.11.0+cu130, idle. bfloat16, float32, copy: deep.gpu_work in a warm "
        "stackgate verify --deep, 2026-12-01 (bf16 8192^3 and fp32 4096^3 products, a 2 GiB device-to-device copy "
        "counting read + write; a second run: 786.1, 50.97, 4273). read: deep.flashinfer_attention's read kernel "
        "(a float32 sum over 4 GiB, the mean of 20 after 3 warm-ups), the median of 5 runs of "
        "benchmarks/h200_deep.sh, 2026-12-02 (4434-4463 GB/s). decode_fraction: the bandwidth-bound decode (flashinfer "
        "0.6.4's paged decode on tensor cores, 64 x 16384 KV tokens of 8 heads x 128, bf16: 4 GiB) over that read, "
        "three warm runs of the same script (4410-4415 GB/s); the check's floor is [deep.attention] min_read_fraction"
    ),
}


def model_row(name: str) -> tuple[str, Mapping[str, float]] | None:
    """The MODEL_RATES row a GPU named ``name`` is judged against, by its name.

    >>> model_row("NVIDIA H200")[0], model_row("NVIDIA B200")
    ('NVIDIA H200', None)
    """
    return (name, MODEL_RATES[name]) if name in MODEL_RATES else None


def row_named(name: str) -> str:
    """How a result names the table row it judged against.

    >>> row_named("NVIDIA H200")
    "MODEL_RATES row 'NVIDIA H200'"
    """
    return f"MODEL_RATES row {name!r}"


def _slow_problems(records: Sequence[Mapping[str, Any]]) -> list[str]:
    healthy = [r for r in records if "error" not in r]
    problems, flagged = [], set()
    for part, rate, unit in RATES:
        slow = slow_peers({_label(r): r[part][rate] for r in healthy})
        for label, (have, median) in slow.items():
            flagged.add((label, part))
            problems.append(
                f"{label}: {part} {have:.4g} {unit}, {have / median:.0%} of its peers' median {median:.4g} {unit}"
            )
    for r in healthy:
        for part, rate, unit in RATES:
            idle = MODEL_RATES.get(str(r.get("name")), {}).get(part)
            have = r[part][rate]
            if idle and (_label(r), part) not in flagged and have < PEER_FLOOR * idle:
                problems.append(
                    f"{_label(r)}: {part} {have:.4g} {unit}, {have / idle:.0%} of an idle {r['name']}'s {idle:.4g} "
                    f"{unit} (floor {PEER_FLOOR:.0%}; {row_named(str(r['name']))})"
                )
    return problems


def activity_lines(snap: NvmlSnapshot | Missing | None) -> list[str]:
    """What the GPUs were doing for other processes just before the measurement, by NVML."""
    if snap is None:
        return []
    if isinstance(snap, Missing):
        return [f"before measuring: NVML could not say what else ran on the GPUs ({snap.reason})"]
    lines = []
    for g in snap.gpus:
        busy = f"{g.utilization}% busy" if g.utilization is not None else "busy: not reported"
        commands = {p.pid: p.command for p in g.processes}
        users = [
            f"pid {pid} ({commands.get(pid) or command_line(pid) or 'command not visible here'}) used {sm}% of its SMs"
            for pid, sm in g.process_utilization
            if sm
        ]
        holders = [
            f"pid {p.pid} ({p.command or 'command not visible here'}) holds {(p.used_memory_bytes or 0) / 2**20:.0f} "
            "MiB"
            for p in g.processes
            if p.pid not in dict(g.process_utilization)
        ]
        lines.append(
            f"before measuring: {g.label} was {busy}"
            + (f"; {'; '.join([*users, *holders])}" if users or holders else "; no other process on it")
        )
    return lines


def _others(snap: NvmlSnapshot | Missing | None) -> list[int]:
    """The pids that ran kernels or held memory on a GPU just before the measurement."""
    if snap is None or isinstance(snap, Missing):
        return []
    return sorted(
        {pid for g in snap.gpus for pid, sm in g.process_utilization if sm}
        | {p.pid for g in snap.gpus for p in g.processes}
    )


def _slow_fix(snap: NvmlSnapshot | Missing | None, log: Path) -> Fix:
    pids = _others(snap)
    if pids:
        listed = " ".join(map(str, pids))
        return Fix(
            f"Other processes used the GPU while it was measured (pid {listed}): the figures say how much of it was "
            "left, not how "
            "healthy it is. Stop them, or measure when the GPU is idle.",
            (f"ps -o pid,user,cmd -p {listed}", "stackgate verify --deep --check deep.gpu_work"),
        )
    return Fix(
        "No other process was seen on the GPU, so the cause is not known from these figures: read the log, and the "
        "clocks and "
        "throttle reasons NVIDIA reports.",
        (f"less {log}", "nvidia-smi -q -d PERFORMANCE,CLOCK"),
    )


def _gpu_figures(record: Mapping[str, Any]) -> dict[str, Any]:
    if "error" in record:
        return {"index": record["index"], "error": record["error"]}
    keep = {part: {k: record[part][k] for k in ("n", "ms", "tflops", "rel_err")} for part in ("bfloat16", "float32")}
    copy = {k: record["copy"][k] for k in ("bytes", "ms", "gbs", "equal")}
    return {
        "index": record["index"],
        "name": record["name"],
        "seconds": round(record["seconds"], 3),
        **keep,
        "copy": copy,
    }


def judge_gpu_work(work: GpuWork, activity: NvmlSnapshot | Missing | None = None) -> Result:
    """The per-GPU verdict: a hang, an error, a wrong result or a GPU far slower than its peers or than an idle GPU of
    its model fails by name; ``activity`` (NVML just before the run) says what else was using the GPUs."""
    before = activity_lines(activity)
    data = {
        "before": before,
        "model_rates": {
            str(r.get("name")): MODEL_RATES[str(r.get("name"))]
            for r in work.records
            if str(r.get("name")) in MODEL_RATES
        },
        "model_rates_how": {
            str(r.get("name")): MODEL_RATES_HOW.get(str(r.get("name")))
            for r in work.records
            if str(r.get("name")) in MODEL_RATES
        },
        "gpus": [_gpu_figures(r) for r in work.records],
        "seed": work.begin.get("seed"),
        "torch": work.begin.get("torch"),
        "script_s": round(work.duration_s, 3),
        "log": str(work.log),
        "conventions": {
            "tflops": "2 n^3 per product / time",
            "copy_gbs": "(bytes read + bytes written) / time, 1 GB = 1e9 B",
        },
    }
    if work.returncode is None:
        where = (
            f"GPU {work.running} did not finish its work"
            if work.running is not None
            else "the per-GPU work did not finish"
        )
        return failed(
            f"hang: {where} within {work.timeout_s:g} s",
            _tail_lines(work.tail),
            _log_fix(work.log),
            {**data, "hung": True},
        )
    if work.begin.get("error"):
        return failed(work.begin["error"], work.tail, _log_fix(work.log), data)
    if work.returncode != 0 or work.running is not None or not work.records:
        where = f" on GPU {work.running}" if work.running is not None else ""
        return failed(
            f"the per-GPU work failed{where} ({_code(work.returncode)}): {' / '.join(work.tail[-3:])}",
            work.tail,
            _log_fix(work.log),
            data,
        )
    wrong = [p for r in work.records for p in _device_problems(r)]
    if wrong:
        return failed(
            f"{len(wrong)} GPU problem(s): {wrong[0]}",
            [*wrong, *_slow_problems(work.records), *before],
            _log_fix(work.log),
            data,
        )
    slow = _slow_problems(work.records)
    if slow:
        return failed(f"{len(slow)} GPU problem(s): {slow[0]}", [*slow, *before], _slow_fix(activity, work.log), data)
    rows = _rows_line(work.records)
    return passed(
        _gpu_summary(work.records) + (f"; judged against {rows}" if rows else ""),
        [*(_gpu_line(r) for r in work.records), *_how_lines(work.records), *before],
        data,
    )


def _rows_line(records: Sequence[Mapping[str, Any]]) -> str:
    """The table rows the GPUs were judged against, named; empty when no GPU has one."""
    names = dict.fromkeys(str(r.get("name")) for r in records if model_row(str(r.get("name"))))
    return ", ".join(row_named(name) for name in names)


def _how_lines(records: Sequence[Mapping[str, Any]]) -> list[str]:
    names = dict.fromkeys(str(r.get("name")) for r in records)
    return [
        f"{row_named(name)}: {MODEL_RATES[name]} ({MODEL_RATES_HOW.get(name, 'how: not recorded')})"
        if name in MODEL_RATES
        else f"no MODEL_RATES row for {name}: judged against its peers alone"
        for name in names
    ]


def _gpu_summary(records: Sequence[Mapping[str, Any]]) -> str:
    def span(part: str, rate: str) -> str:
        values = [r[part][rate] for r in records]
        low, high = min(values), max(values)
        return f"{low:.4g}" if math.isclose(low, high, rel_tol=0.005) else f"{low:.4g}-{high:.4g}"

    return (
        f"{len(records)} GPU(s) correct: bf16 {span('bfloat16', 'tflops')} TFLOP/s, fp32 {span('float32', 'tflops')} "
        "TFLOP/s, "
        f"copy {span('copy', 'gbs')} GB/s (read+write)"
    )


def _gpu_line(r: Mapping[str, Any]) -> str:
    return (
        f"{_label(r)}: bf16 {r['bfloat16']['n']}^3 {r['bfloat16']['tflops']:.4g} TFLOP/s (rel err "
        f"{r['bfloat16']['rel_err']:.2g}), "
        f"fp32 {r['float32']['n']}^3 {r['float32']['tflops']:.4g} TFLOP/s (rel err {r['float32']['rel_err']:.2g}), "
        f"copy {r['copy']['bytes'] / 2**30:.3g} GiB {r['copy']['gbs']:.4g} GB/s"
    )


@check("deep.gpu_work", needs=("probe", "env"), timeout_s=_limit_s, slow=True)
def gpu_work(spec: Spec, facts: Facts) -> Result:
    """Every GPU multiplies bf16/fp32 matrices correctly at its peers' (and its model's) rate and copies memory."""
    activity = gpu_activity(facts.nvml_lib)
    work = run_gpu_work(spec.python.target, GpuWorkRequest(), launch_env(spec, facts))
    return looked_up(judge_gpu_work(work, activity), facts, "\n".join(work.tail), _LOOKS)
