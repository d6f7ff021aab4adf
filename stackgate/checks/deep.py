"""Deep checks: judge real work on every GPU and an all-reduce sweep, run by the stack's interpreter.

The measuring (launching :mod:`stackgate.edges.deepwork` under the lock's target interpreter and
reading the figures it leaves behind) is :mod:`stackgate.facts.deepruns`; this module judges them.
Measuring and judging stay apart, so the judgement (tolerances, slow peers, bus bandwidth,
#wrong) is tested with plain numbers.

The deep checks run only after the static checks that they stand on have passed; see
:data:`PREREQUISITES` and :func:`not_run`, which ``verify --deep`` applies.
"""

from __future__ import annotations

import math
import signal
import statistics
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from stackgate.checks.core import check
from stackgate.edges.nvml import NvmlSnapshot, command_line
from stackgate.facts import Facts, Missing, ProbeFacts
from stackgate.facts.deepruns import (
    ATTENTION_RTOL,
    FLASHWORK,
    GATE_TIMEOUT_S,
    SCRIPT,
    AllReduceRequest,
    AttentionRequest,
    AttentionRun,
    FusionGate,
    FusionRequest,
    FusionRun,
    GpuWork,
    GpuWorkRequest,
    Launch,
    SizeFigures,
    Sweep,
    flashinfer_env,
    gpu_activity,
    jit_workspace,
    launch_env,
    read_gate,
    run_attention,
    run_fusion,
    run_gpu_work,
    run_sweep,
)
from stackgate.models import settings
from stackgate.models.finding import Finding, Fix
from stackgate.models.result import NEEDS_GPU, NO_DRIVER, Result, Status, failed, passed, skipped, warned
from stackgate.models.spec import MAX_JIT_TIMEOUT_S, Spec

__all__ = [
    "ATTENTION_ATOL",
    "FUSION_FLAG",
    "MODEL_RATES",
    "PEER_FLOOR",
    "PREREQUISITES",
    "TOLERANCE",
    "JitContext",
    "Known",
    "activity_lines",
    "signal_name",
    "close_enough",
    "fusion_arch_problem",
    "fusion_atol",
    "judge_attention",
    "judge_collective",
    "judge_fusion",
    "judge_fusion_gate",
    "launch",
    "judge_gpu_work",
    "not_run",
    "slow_peers",
    "within_tolerance",
    "world_size",
]

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
#: flashinfer.cubin - flashinfer-python and its cubin (and JIT cache) are one release, else
#: `import flashinfer` raises; a SKIP there (flashinfer-python not installed) does not block:
#: the flashinfer checks then fail themselves, saying so (see SKIP_PASSES).
PREREQUISITES: dict[str, tuple[str, ...]] = {
    "deep.gpu_work": ("gpu.driver", "gpu.count", "gpu.capability", "torch.build", "torch.arch"),
    "deep.collective": ("gpu.driver", "gpu.count", "gpu.capability", "torch.build", "torch.arch", "nccl.version"),
    "deep.flashinfer_attention": (
        "gpu.driver",
        "gpu.count",
        "gpu.capability",
        "torch.build",
        "torch.arch",
        "flashinfer.cubin",
    ),
    "deep.allreduce_fusion": (
        "gpu.driver",
        "gpu.count",
        "gpu.capability",
        "torch.build",
        "torch.arch",
        "nccl.version",
        "flashinfer.cubin",
    ),
}
#: Prerequisites whose SKIP counts as passed: a stack without flashinfer is what the flashinfer
#: checks exist to report, as a failure with its fix, not as a quiet "not run".
SKIP_PASSES = frozenset({"flashinfer.cubin"})
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
        elif result.status not in (Status.PASS, Status.WARN) and not (
            result.status == Status.SKIP and needed in SKIP_PASSES
        ):
            reasons.append(f"{needed} {_VERBS[result.status]}: {result.summary}")
    earlier = by_name.get("deep.gpu_work")
    if name != "deep.gpu_work" and earlier is not None and earlier.data.get("hung"):
        reasons.append("a GPU hung in deep.gpu_work: this work would hang too")
    if not reasons:
        return None
    driver = by_name.get("gpu.driver")
    no_driver = driver is not None and NO_DRIVER in driver.data
    data = {"not_run": reasons, **({NEEDS_GPU: True} if no_driver else {})}
    return Result(name, Status.SKIP, f"not run: {reasons[0]}", tuple(reasons), data=data)


def launch(name: str, lock: Spec, facts: Facts) -> Launch | None:
    """What deep check ``name`` will start (interpreter, script, environment), so that verify can start
    it ahead; None when it will most likely start nothing (no GPU, a CPU build of torch or none, no
    flashinfer in the stack, one rank for the fusion)."""
    if isinstance(facts.nvml, Missing) or not facts.nvml.gpus or not _cuda_torch_installed(facts):
        return None
    if name in ("deep.gpu_work", "deep.collective"):
        return Launch(lock.python.target, SCRIPT, launch_env(lock, facts))
    if name == "deep.flashinfer_attention" and _uses_flashinfer(lock):
        return Launch(lock.python.target, FLASHWORK, flashinfer_env(lock, facts))
    if name == "deep.allreduce_fusion" and FUSION_FLAG in lock.smoke.flags and world_size(lock, facts.probe)[0] > 1:
        return Launch(lock.python.target, FLASHWORK, flashinfer_env(lock, facts))
    return None


def _cuda_torch_installed(facts: Facts) -> bool:
    """Whether the stack's torch is installed and not a CPU build, by its installed version alone (no
    import: the distributions' probe answers in a Python start): what is worth starting ahead. torch.build
    decides for real; a wrong guess here only starts a run that is ended unused, or starts none."""
    found = facts.dists
    torch = found.dist("torch") if isinstance(found, ProbeFacts) else None
    return torch is not None and not torch.version.endswith("+cpu")


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


#: What deep.gpu_work measured on an idle GPU of each model (NVML's name), by its own method: the floor a GPU
#: without peers is judged by (PEER_FLOOR of these). NVIDIA H200: stackgate verify --deep, warm, 1x H200,
#: driver 580.159.04, torch 2.11.0+cu130, 2026-12-01 (a second run: 786.1, 50.97, 4273).
MODEL_RATES: dict[str, dict[str, float]] = {"NVIDIA H200": {"bfloat16": 781.2, "float32": 51.0, "copy": 4266.0}}


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
                    f"{unit} (floor {PEER_FLOOR:.0%})"
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
    return passed(_gpu_summary(work.records), [*(_gpu_line(r) for r in work.records), *before], data)


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


def _log_fix(log: Path) -> Fix:
    """Where the output does not say why: the log, never a reset or a drain on a guess."""
    return Fix(
        "The cause is not known from this output: read the full log.",
        (f"less {log}", "nvidia-smi -q -d PERFORMANCE,CLOCK"),
    )


def _limit_s() -> float:
    """A deep check's own limit: its run's ($STACKGATE_DEEP_TIMEOUT_S, read when it runs) and a minute to read
    the figures."""
    return settings.DEEP_TIMEOUT_S.value() + 60


def _code(returncode: int | None) -> str:
    return "timed out" if returncode is None else f"exit {returncode}"


@check("deep.gpu_work", needs=("probe", "env"), timeout_s=_limit_s, slow=True)
def gpu_work(lock: Spec, facts: Facts) -> Result:
    """Every GPU multiplies bf16/fp32 matrices correctly at its peers' (and its model's) rate and copies memory."""
    activity = gpu_activity(facts.nvml_lib)
    work = run_gpu_work(lock.python.target, GpuWorkRequest(), launch_env(lock, facts))
    return judge_gpu_work(work, activity)


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
        "method": "in-place all_reduce (sum, float32), nccl-tests' all_reduce_perf sweep: "
        f"{sweep.request.warmup} warm-up ops at the largest and smallest size, then per size {sweep.request.iters} "
        "ops; "
        f"on GPUs the {sweep.request.iters} ops are captured in one CUDA graph and replayed {sweep.request.replays} "
        "times, "
        "each replay after the buffer's reset and a captured 1-element all-reduce that aligns the ranks, bracketed "
        "by CUDA events; "
        "time_us is the mean over ranks of each rank's median replay, min_us the fastest replay; eager_us times the "
        "ops "
        "launched one by one from Python (torch's per-call host overhead included), after the graph",
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
    notes = (
        [f"{wanted} rank(s) wanted, only {sweep.world} GPU(s) present: ran {sweep.world}"]
        if wanted and wanted > sweep.world
        else []
    )
    if sweep.returncode is None:
        return failed(
            _hang_summary(sweep),
            (*_hang_details(sweep), *_tail_lines(sweep.tail)),
            _nccl_fix(sweep),
            {**data, "hung": True},
        )
    if sweep.returncode != 0 or len(sweep.sizes) < len(sweep.request.sizes()):
        reason = sweep.tail[-1] if sweep.tail else "no output"
        socket = _socket_problem(sweep)
        if socket is not None:
            return failed(
                f"the all-reduce failed ({_code(sweep.returncode)}): {socket[0]}",
                _tail_lines(sweep.tail),
                socket[1],
                data,
            )
        return failed(
            f"the all-reduce failed ({_code(sweep.returncode)}): {reason}",
            _tail_lines(sweep.tail),
            _log_fix(sweep.log),
            data,
        )
    wrong = [s for s in sweep.sizes if s.wrong]
    if wrong:
        details = [f"{_size(s.bytes)}: #wrong {s.wrong}" for s in wrong]
        return failed(
            f"all-reduce results wrong at {len(wrong)} of {len(sweep.sizes)} sizes (#wrong {data['wrong_total']})",
            details,
            _wrong_fix(sweep),
            data,
        )
    if sweep.world < 2:
        return passed(_one_rank_summary(sweep, min_busbw), [*notes, *_size_lines(sweep)], data)
    if min_busbw is not None and data["peak_busbw_gbs"] < min_busbw:
        return failed(
            _slow_summary(sweep, data, min_busbw), [*_size_lines(sweep), *_env_lines(sweep)], _nccl_fix(sweep), data
        )
    floor = f" (>= {min_busbw:g} GB/s)" if min_busbw is not None else ""
    summary = (
        f"{sweep.world} ranks, {_library(sweep)}: peak busbw {data['peak_busbw_gbs']:.4g} GB/s at "
        f"{_size(data['peak_bytes'])}{floor}, #wrong 0 at {len(sweep.sizes)} sizes"
    )
    return passed(summary, [*notes, *_size_lines(sweep)], data)


#: The knowledge base's entry for a bootstrap without an interface: it recognises the failure here as in a pasted log.
NO_SOCKET_INTERFACE = "nccl-no-socket-interface"


def _socket_problem(sweep: Sweep) -> tuple[str, Fix] | None:
    """NCCL's bootstrap found no network interface to use (as the knowledge base recognises it): the variable
    that chose none, and the host's interfaces."""
    if _recognised("\n".join(sweep.tail), NO_SOCKET_INTERFACE) is None:
        return None
    have = ", ".join(sweep.interfaces) or "none that /sys/class/net lists"
    chosen = sweep.nccl_env.get("NCCL_SOCKET_IFNAME")
    if chosen is None:
        summary = (
            f"NCCL's bootstrap found no socket interface (NCCL_SOCKET_IFNAME is not set; this host has {have}): the "
            "cause is not known from this"
        )
        return summary, Fix(
            "Read the NCCL INFO lines of the log: they name the interfaces NCCL looked at.",
            (f"grep -E 'NET|Bootstrap|NCCL WARN' {sweep.log}",),
        )
    summary = (
        f"NCCL's bootstrap found no socket interface: NCCL_SOCKET_IFNAME={chosen} matches none of this host's "
        f"interfaces ({have})"
    )
    fix = Fix(
        f"Unset NCCL_SOCKET_IFNAME, or set it to interfaces this host has ({have}; a name is a prefix, '=' matches "
        "exactly, '^' excludes) "
        "where the stack runs (the lock's [smoke.env] or the shell).",
        ("ip -brief link", "stackgate verify --deep --check deep.collective"),
    )
    return summary, fix


def _library(sweep: Sweep) -> str:
    return f"NCCL {sweep.nccl_version}" if sweep.nccl_version else sweep.request.backend


def _one_rank_summary(sweep: Sweep, min_busbw: float | None) -> str:
    first, last = sweep.request.sizes()[0], sweep.request.sizes()[-1]
    floor = f"; min_busbw_gbs {min_busbw:g} not judged" if min_busbw is not None else ""
    return (
        f"1 rank, {_library(sweep)}: all-reduce exact at {len(sweep.sizes)} sizes ({_size(first)}-{_size(last)}); "
        f"bus bandwidth is not defined for one rank (2(n-1)/n = 0): a correctness pass, not timed{floor}"
    )


def _slow_summary(sweep: Sweep, data: Mapping[str, Any], min_busbw: float) -> str:
    tuning = ", ".join(f"{k}={sweep.nccl_env.get(k, 'unset')}" for k in TUNING)
    return (
        f"peak busbw {data['peak_busbw_gbs']:.4g} GB/s at {_size(data['peak_bytes'])} is below the lock's "
        f"{min_busbw:g} GB/s ({_library(sweep)}, {sweep.world} ranks; {tuning})"
    )


def _size_lines(sweep: Sweep) -> list[str]:
    def bus(s: SizeFigures) -> str:
        return f"busbw {s.busbw_gbs:8.2f} GB/s" if s.busbw_gbs is not None else "busbw n/a (1 rank)"

    def fastest(s: SizeFigures) -> str:
        return f" (min {s.min_us:.1f})" if s.min_us is not None else ""

    def eager(s: SizeFigures) -> str:
        return (
            f"  (launched one by one: {s.eager_us:.1f} us)"
            if s.timing == "cuda-graph" and s.eager_us is not None
            else ""
        )

    return [
        f"{_size(s.bytes):>8}: {s.time_us:10.1f} us{fastest(s)}  algbw {s.algbw_gbs:8.2f} GB/s  {bus(s)}  #wrong "
        f"{s.wrong}{eager(s)}"
        for s in sweep.sizes
    ]


def _env_lines(sweep: Sweep) -> list[str]:
    lines = [f"NCCL variables in force: {' '.join(f'{k}={v}' for k, v in sweep.nccl_env.items())}"]
    if sweep.transports:
        lines.append(
            "transports in the INFO log: " + ", ".join(f"{t} x{n}" for t, n in sorted(sweep.transports.items()))
        )
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
    return (
        f"hang: {where} did not finish within {sweep.timeout_s:g} s ({len(sweep.progress)} of {sweep.world} rank(s) "
        "set up)"
    )


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
        "On PCIe-only hosts NCCL_P2P_LEVEL=SYS and NCCL_MIN_NCHANNELS=8 in the lock's [smoke.env] raised ~22 to "
        "37-41 GB/s; "
        "check ACS/IOMMU settings when P2P is refused.",
        ("nvidia-smi topo -m", f"grep -E 'via|channels|NCCL WARN' {sweep.log}"),
    )


def _wrong_fix(sweep: Sweep) -> Fix:
    return Fix(
        "Wrong sums are data corruption between GPUs: drain the node. To find the path, rerun with P2P off "
        "(NCCL_P2P_DISABLE=1) and look for ECC and PCIe AER errors.",
        ("nvidia-smi -q -d ECC", "journalctl -k | grep -iE 'AER|Xid'", f"less {sweep.log}"),
    )


def world_size(lock: Spec, probe: ProbeFacts | Missing) -> tuple[int, int]:
    """(ranks to run, ranks wanted): the lock's TP size, capped by the GPUs torch sees."""
    wanted = lock.smoke.tp
    present = probe.torch.get("device_count") if isinstance(probe, ProbeFacts) and probe.torch else None
    return (min(wanted, present) if isinstance(present, int) and present > 0 else wanted), wanted


@check("deep.collective", needs=("probe", "env"), timeout_s=_limit_s, slow=True)
def collective(lock: Spec, facts: Facts) -> Result:
    """An NCCL all-reduce from 8 KiB to 1 GiB is exact and reaches the locked bus bandwidth."""
    world, wanted = world_size(lock, facts.probe)
    sweep = run_sweep(lock.python.target, AllReduceRequest.for_world(world), launch_env(lock, facts))
    return judge_collective(sweep, lock.nccl.min_busbw_gbs, wanted)


# --- flashinfer: what it shares -------------------------------------------------------------

#: The flag whose code path deep.allreduce_fusion proves (SGLang 0.5.9's spelling).
FUSION_FLAG = "--enable-flashinfer-allreduce-fusion"
#: The absolute part of attention's tolerance ``|a - b| <= atol + rtol * |ref|`` (rtol: facts.deep).
#: Outputs of softmax over thousands of random keys are small (|o| ~ 0.01-0.1), so the absolute
#: part decides: 2e-3 is ~4x the largest error measured on an H200 (4.5e-4, paged decode) and
#: ~5x below what a kernel that dropped half the KV would show (~0.01).
ATTENTION_ATOL = 2e-3


def _flashinfer_limit_s() -> float:
    """A flashinfer check's own limit: its run's timeout (the lock's JIT timeout, at most
    MAX_JIT_TIMEOUT_S, plus the deep run's own, read when it runs) and a minute to read what it left."""
    return settings.DEEP_TIMEOUT_S.value() + MAX_JIT_TIMEOUT_S + 60


def _fusion_limit_s() -> float:
    """The fusion check's: a flashinfer check's, and the arch gate's reading before it."""
    return _flashinfer_limit_s() + GATE_TIMEOUT_S


def fusion_atol(world: int) -> float:
    """The absolute part of the fusion's tolerance: half a bf16 ulp of the partial sums (|s| < 8:
    2^-6) for each of the reduction's world - 1 additions, whose order the fused kernel and NCCL
    may choose differently (values near zero have no relative tolerance to speak of).

    >>> fusion_atol(2), fusion_atol(8)
    (0.015625, 0.109375)
    """
    return 2.0**-6 * max(1, world - 1)


def close_enough(worst: Sequence[float], atol: float, rtol: float) -> bool:
    """``|a - b| <= atol + rtol * |ref|`` for the worst element ``(|a - b|, |ref|)``; NaN is not.

    >>> close_enough((0.0625, 12.0), 2.0**-6, 2.0**-7), close_enough((0.5, 1.0), 2e-3, 2.0**-7), close_enough(
    ...     (float("nan"), 1.0), 1.0, 1.0
    ... )
    (True, False, False)
    """
    error, scale = worst
    return math.isfinite(error) and error <= atol + rtol * scale


def _finite(value: Any) -> Any:
    """A figure for the JSON report: non-finite numbers (a NaN error) become None."""
    return value if not isinstance(value, float) or math.isfinite(value) else None


@dataclass(frozen=True)
class Known:
    """What the knowledge base says of a failure's output."""

    title: str
    cause: str
    fix: Fix


def _classified(text: str, lock: Spec) -> Known | None:
    from stackgate.models import knowledge  # the knowledge base loads only to explain a failure: a cached verify
    from stackgate.scan import match_first  # skips both

    match = match_first(text, context=knowledge.lock_context(lock))
    return None if match is None else Known(match.title, match.cause, match.fix)


def _recognised(text: str, entry: str) -> Finding | None:
    """The knowledge base's one entry, if it recognises the text."""
    from stackgate.models import knowledge  # loaded only to explain a failure, as in _classified
    from stackgate.scan import match_first

    return match_first(text, signatures=[s for s in knowledge.load() if s.id == entry])


def _explained(error: str, known: Known | None) -> str:
    return f"{error} -> {known.title}" if known else error


@dataclass(frozen=True)
class JitContext:
    """Where flashinfer's kernels come from for this stack, and the JIT's allowance."""

    workspace: str  #: FLASHINFER_WORKSPACE_BASE of the run
    workspace_from: str
    timeout_s: float  #: the lock's jit_timeout_s
    jit_cache_locked: str | None  #: the lock's flashinfer-jit-cache pin, if any
    jit_cache: str | None  #: flashinfer-jit-cache installed (its precompiled kernels), if any
    cubin: str | None  #: flashinfer-cubin installed, if any

    def kernels_from(self) -> str:
        """What the fingerprint says of where the kernels come from (stable from run to run)."""
        if self.jit_cache:
            return f"precompiled: flashinfer-jit-cache {self.jit_cache}"
        return f"JIT-compiled (no flashinfer-jit-cache{'; flashinfer-cubin ' + self.cubin if self.cubin else ''})"

    def lines(self) -> list[str]:
        locked = (
            f"the lock pins flashinfer-jit-cache {self.jit_cache_locked}"
            if self.jit_cache_locked
            else "the lock ships no flashinfer-jit-cache"
        )
        return [
            f"kernels: {self.kernels_from()}; {locked}",
            f"JIT cache: {self.workspace} (from {self.workspace_from})",
        ]


def _installed(facts: Facts, name: str) -> str | None:
    probe = facts.probe
    dist = probe.dist(name) if isinstance(probe, ProbeFacts) else None
    return dist.version if dist else None


def _jit_context(lock: Spec, facts: Facts, env: Mapping[str, str], timeout_s: float) -> JitContext:
    locked = lock.python.package("flashinfer-jit-cache")
    workspace, origin = jit_workspace(lock, env)
    return JitContext(
        str(workspace),
        origin,
        timeout_s,
        locked.requirement if locked else None,
        _installed(facts, "flashinfer-jit-cache"),
        _installed(facts, "flashinfer-cubin"),
    )


def _jit_line(seconds: float, compiled: int, jit: JitContext) -> str:
    """``JIT (cold) took 70 s of the 600 s allowed (4 modules compiled)``, or the warm case."""
    if compiled:
        return (
            f"JIT (cold) took {seconds:.0f} s of the {jit.timeout_s:g} s allowed ({compiled} module(s) compiled into "
            f"{jit.workspace})"
        )
    return (
        f"no JIT: every module came from {'flashinfer-jit-cache' if jit.jit_cache else 'the JIT cache'} (first calls "
        f"{seconds:.1f} s)"
    )


def _flashinfer_import_fix(lock: Spec) -> Fix:
    return Fix(
        "Install flashinfer-python in the stack at the lock's version, with its dependencies (apache-tvm-ffi, "
        "nvidia-cudnn-frontend) "
        "and flashinfer-cubin of the same release if any; then import it by hand to see the whole error.",
        ("stackgate provision --only python", f"{lock.python.target} -c 'import flashinfer'"),
    )


# --- deep.flashinfer_attention ----------------------------------------------------------------

#: What each kernel's figure is called in the report and in `report A B`.
ATTENTION_FIGURES = {
    "decode": ("decode GB/s", "gbs"),
    "decode_tensor_cores": ("decode (tensor cores) GB/s", "gbs"),
    "paged_decode": ("paged decode GB/s", "gbs"),
    "prefill": ("prefill TFLOP/s", "tflops"),
}


def _kernel_label(record: Mapping[str, Any]) -> str:
    return f"GPU {record['index']} {record['kind']}"


def _kernel_problem(record: Mapping[str, Any], lock: Spec) -> tuple[str, Known | None] | None:
    """What is wrong with one kernel's record: an error (classified), or a result out of tolerance."""
    if "error" in record:
        known = _classified(record.get("trace") or record["error"], lock)
        return f"{_kernel_label(record)}: {_explained(record['error'], known)}", known
    worst = record["worst"]
    if not close_enough(worst, ATTENTION_ATOL, ATTENTION_RTOL):
        limit = ATTENTION_ATOL + ATTENTION_RTOL * worst[1]
        return (
            f"{_kernel_label(record)}: wrong: error {worst[0]:.3g} where |ref| is {worst[1]:.3g} (allowed "
            f"{limit:.3g}; max abs error {record['max_abs_err']:.3g}) against float32",
            None,
        )
    return None


def _attention_figures(kernels: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Each kernel's rate, the mean over GPUs (the figures `report A B` compares)."""
    figures = {}
    for kind, (name, key) in ATTENTION_FIGURES.items():
        values = [k[key] for k in kernels if k.get("kind") == kind and isinstance(k.get(key), (int, float))]
        if values:
            figures[name] = round(statistics.fmean(values), 3)
    return figures


def _attention_data(run: AttentionRun, jit: JitContext) -> dict[str, Any]:
    kernels = [{k: _finite(v) for k, v in record.items() if k not in ("event", "trace")} for record in run.kernels]
    first = [k for k in run.kernels if k.get("index") == 0]
    return {
        "flashinfer": run.begin.get("flashinfer"),
        "torch": run.begin.get("torch"),
        "shapes": {k: v for k, v in asdict(run.request).items() if k not in ("rtol", "warmup", "iters", "seed")},
        "seed": run.request.seed,
        "kernels": kernels,
        "figures": _attention_figures(run.kernels),
        "tolerance": {
            "atol": ATTENTION_ATOL,
            "rtol": run.request.rtol,
            "rule": "|out - ref| <= atol + rtol * |ref|, ref in float32 from the same bf16 inputs",
        },
        "jit": {
            **asdict(jit),
            "first_calls_s": round(sum(k.get("first_call_s") or 0.0 for k in first), 3),
            "compiled": sum(k.get("compiled") or 0 for k in first),
        },
        "script_s": round(run.duration_s, 3),
        "log": str(run.log),
    }


def judge_attention(run: AttentionRun, jit: JitContext, lock: Spec) -> Result:
    """The attention verdict: flashinfer that does not import, a kernel that errors, times out in
    its JIT or computes wrong fails, with the cause and fix the knowledge base knows."""
    data = _attention_data(run, jit)
    if run.returncode is None:
        return failed(
            _attention_timeout(run, jit),
            _tail_lines(run.tail),
            Fix(_JIT_TIMEOUT_FIX, (f"less {run.log}",)),
            {**data, "hung": True},
        )
    if run.begin.get("error"):
        known = _classified(run.begin.get("trace") or run.begin["error"], lock)
        causes = [known.cause] if known else []
        return failed(
            _explained(run.begin["error"], known),
            [*causes, *jit.lines(), *_tail_lines(run.tail)],
            known.fix if known else _flashinfer_import_fix(lock),
            data,
        )
    if run.returncode is not None and run.returncode < 0:
        return _killed(run, jit, data)
    full = _out_of_space(run, jit, data)
    if full is not None:
        return full
    if run.returncode != 0 or not run.kernels:
        return failed(
            f"the attention run failed ({_code(run.returncode)}): {' / '.join(run.tail[-3:])}",
            _tail_lines(run.tail),
            _log_fix(run.log),
            data,
        )
    problems = [p for p in (_kernel_problem(k, lock) for k in run.kernels) if p is not None]
    if problems:
        known = next((k for _, k in problems if k is not None), None)
        details = [text for text, _ in problems] + ([known.cause] if known else [])
        return failed(
            f"{len(problems)} kernel problem(s): {problems[0][0]}",
            details,
            known.fix if known else _log_fix(run.log),
            data,
        )
    kinds = ", ".join(dict.fromkeys(str(k["kind"]) for k in run.kernels))
    data["defines"] = {"flashinfer_attention": f"{kinds} correct against float32; {jit.kernels_from()}"}
    return passed(_attention_summary(run, data, jit), [*_attention_lines(run), *jit.lines()], data)


#: What a cold build of the four attention modules left in flashinfer's JIT cache on an H200 (flashinfer 0.6.4,
#: sm_90a; `du -sh` of the cache): about what the build needs there, the compiler's objects more while it runs.
JIT_BUILD_BYTES = 19 << 20
_NO_SPACE = "No space left on device"
#: The knowledge base's entry for a full filesystem: a JIT build's output is read for it as a pasted log is.
DISK_FULL = "disk-full"


def signal_name(returncode: int) -> str:
    """The signal a negative exit status means.

    >>> signal_name(-7), signal_name(-9), signal_name(-99)
    ('SIGBUS', 'SIGKILL', 'signal 99')
    """
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def _killed(run: AttentionRun, jit: JitContext, data: Mapping[str, Any]) -> Result:
    """A run killed by a signal: the damaged modules of the JIT cache when there are any (a module cut short dies of
    SIGBUS when mapped), else the signal and what it was running, with the cause left open."""
    rc = run.returncode or 0
    where = f" while GPU {run.running[0]} ran its {run.running[1]} kernel" if run.running else ""
    killed = f"the attention run was killed by {signal_name(rc)} (exit {rc}){where}"
    details = [f"{d['file']}: {d['why']}" for d in run.damaged]
    data = {**data, "signal": signal_name(rc), "damaged": list(run.damaged)}
    if run.damaged:
        first = run.damaged[0]
        fix = Fix(
            "Remove the damaged module from the JIT cache (its folder): flashinfer builds it again on the next run.",
            (
                *(f"rm -r {Path(d['file']).parent}" for d in run.damaged),
                "stackgate verify --deep --check deep.flashinfer_attention",
            ),
        )
        return failed(
            f"{killed}: {len(run.damaged)} module(s) of flashinfer's JIT cache are cut short, first {first['file']} "
            f"({first['why']})",
            details,
            fix,
            data,
        )
    unknown = f"{killed}; no module of the JIT cache {jit.workspace} is cut short, so the cause is not known from this"
    return failed(
        unknown,
        _tail_lines(run.tail),
        Fix("Read the run's full log; it names the command that ran.", (f"less {run.log}",)),
        data,
    )


def _out_of_space(run: AttentionRun, jit: JitContext, data: Mapping[str, Any]) -> Result | None:
    """The JIT cache's filesystem full (ninja's pages of output hide "No space left on device"), or None."""
    texts = [str(k.get("error", "")) + str(k.get("trace", "")) for k in run.kernels] + [
        str(run.begin.get("error", "")),
        *run.tail,
    ]
    hit = [t for t in texts if _recognised(t, DISK_FULL) is not None]
    if not hit:
        return None
    free = "an unknown amount" if run.cache_free_bytes is None else f"{run.cache_free_bytes / 2**20:.1f} MiB"
    failed_kernels = [
        _kernel_label(k)
        for k in run.kernels
        if _recognised(str(k.get("error", "")) + str(k.get("trace", "")), DISK_FULL) is not None
    ]
    summary = (
        f"flashinfer's JIT cache {jit.workspace} is out of space ({_NO_SPACE}): its filesystem has {free} free, and a "
        "cold build of "
        f"these kernels takes about {JIT_BUILD_BYTES >> 20} MiB there; {len(failed_kernels) or 'the'} kernel(s) could "
        "not be built"
    )
    found = _recognised(hit[0], DISK_FULL)
    line = found.evidence.lines[-1].strip() if found is not None and found.evidence.lines else _NO_SPACE
    fix = Fix(
        "Free space on that filesystem, or point the JIT cache at one with room: FLASHINFER_WORKSPACE_BASE in the "
        "lock's [env] "
        "(so the server shares the cache) or in the shell.",
        (
            f"df -h {jit.workspace}",
            "FLASHINFER_WORKSPACE_BASE=/a/folder/with/room stackgate verify --deep --check deep.flashinfer_attention",
        ),
    )
    return failed(
        summary,
        [*failed_kernels, f"first: {line}"],
        fix,
        {**data, "out_of_space": True, "cache_free_bytes": run.cache_free_bytes},
    )


_JIT_TIMEOUT_FIX = (
    "A cold JIT compiles each kernel with nvcc (49 s for the prefill kernel on a 16-core H200): raise "
    "[deep.attention] jit_timeout_s "
    "(or [deep.fusion]) on a machine with fewer cores, or install flashinfer-jit-cache (precompiled kernels). A "
    "kernel that hangs "
    "after its JIT needs the log."
)


def _attention_timeout(run: AttentionRun, jit: JitContext) -> str:
    where = f"GPU {run.running[0]}'s {run.running[1]} kernel" if run.running else "the attention run"
    if run.running and run.running[0] == 0 and not any(k.get("kind") == run.running[1] for k in run.kernels):
        return (
            f"{where} did not finish within {run.timeout_s:g} s: its first call JIT-compiles (cold) with the lock's "
            f"jit_timeout_s {jit.timeout_s:g} s allowed"
        )
    return f"hang: {where} did not finish within {run.timeout_s:g} s"


def _attention_summary(run: AttentionRun, data: Mapping[str, Any], jit: JitContext) -> str:
    rates = ", ".join(f"{name} {value:.4g}" for name, value in data["figures"].items())
    worst = max((k["max_abs_err"] for k in run.kernels), default=0.0)
    gpus = len({k["index"] for k in run.kernels})
    return (
        f"flashinfer {run.begin.get('flashinfer')} on {gpus} GPU(s): {rates}; max abs error {worst:.2g}; "
        f"{_jit_line(data['jit']['first_calls_s'], data['jit']['compiled'], jit)}"
    )


def _attention_lines(run: AttentionRun) -> list[str]:
    lines = []
    for k in run.kernels:
        rate = f"{k['gbs']:.4g} GB/s" if "gbs" in k else f"{k['tflops']:.4g} TFLOP/s (causal)"
        lines.append(
            f"{_kernel_label(k)}: {k['us']:.1f} us, {rate}, max abs error {k['max_abs_err']:.2g}, first call "
            f"{k['first_call_s']:.1f} s ({k['compiled']} module(s) compiled)"
        )
    return lines


def _uses_flashinfer(lock: Spec) -> bool:
    return (
        lock.smoke.attention_backend == "flashinfer"
        or lock.python.package("flashinfer-python") is not None
        or FUSION_FLAG in lock.smoke.flags
    )


@check("deep.flashinfer_attention", needs=("probe", "env"), timeout_s=_flashinfer_limit_s, slow=True)
def flashinfer_attention(lock: Spec, facts: Facts) -> Result:
    """flashinfer's decode, prefill and paged attention run on every GPU and match float32."""
    if not _uses_flashinfer(lock):
        return skipped(
            f"the lock's stack does not use flashinfer (attention backend {lock.smoke.attention_backend}, no "
            "flashinfer-python pin)"
        )
    env = flashinfer_env(lock, facts)
    shapes = lock.deep.attention
    run = run_attention(
        lock.python.target,
        AttentionRequest.from_lock(shapes),
        env,
        shapes.jit_timeout_s + settings.DEEP_TIMEOUT_S.value(),
    )
    return judge_attention(run, _jit_context(lock, facts, env, shapes.jit_timeout_s), lock)


# --- deep.allreduce_fusion --------------------------------------------------------------------


def _majors(text: str) -> set[int]:
    """The compute capability majors of FLASHINFER_CUDA_ARCH_LIST, split as flashinfer splits it.

    >>> sorted(_majors("12.0a 9.0"))
    [9, 12]
    """
    return {int(arch.split(".")[0]) for arch in text.split(" ") if arch.split(".")[0].isdigit()}


def fusion_arch_problem(gpu_majors: set[int], supported: Sequence[int], arch_list: str | None) -> str | None:
    """Why the fused path cannot run on these GPUs, or None.

    >>> fusion_arch_problem({12}, [9, 10], None)
    'compute capability major 12 is not among the majors flashinfer builds the fusion module for ([9, 10])'
    >>> print(fusion_arch_problem({9}, [9, 10], "12.0a"))  # doctest: +NORMALIZE_WHITESPACE
    FLASHINFER_CUDA_ARCH_LIST=12.0a names no major flashinfer builds the fusion module for ([9, 10]):
    its JIT would raise
    >>> fusion_arch_problem({9}, [9, 10], None) is None
    True
    """
    missing = sorted(gpu_majors - set(supported))
    if missing:
        return (
            f"compute capability major {', '.join(map(str, missing))} is not among the majors flashinfer builds the "
            f"fusion module for ({list(supported)})"
        )
    if arch_list and not _majors(arch_list) & set(supported):
        return (
            f"FLASHINFER_CUDA_ARCH_LIST={arch_list} names no major flashinfer builds the fusion module for "
            f"({list(supported)}): its JIT would raise"
        )
    return None


def _gpu_capabilities(facts: Facts, lock: Spec) -> tuple[list[str], str]:
    """Each GPU's compute capability ("12.0"), and where it was read."""
    snapshot = facts.nvml
    if isinstance(snapshot, Missing) or not snapshot.gpus:
        return [
            str(lock.hardware.compute_capability)
        ] * lock.hardware.gpu_count, "the lock's [hardware] (NVML gave none)"
    return ["{}.{}".format(*gpu.capability) if gpu.capability else "unknown" for gpu in snapshot.gpus], "NVML"


def _gate_evidence(gate: FusionGate, capabilities: Sequence[str], source: str, arch_list: str | None) -> list[str]:
    fi = gate.flashinfer
    counts = ", ".join(f"{n} x {cc}" for cc, n in sorted(Counter(capabilities).items()))
    lines = [
        f"GPUs: compute capability {counts} (from {source})",
        f"flashinfer {fi.get('version')}: {fi.get('function')}() builds for "
        f"supported_major_versions={fi.get('supported_majors')} (read from {fi.get('file')})",
    ]
    sglang = gate.sglang
    if sglang and "supported_majors" in sglang:
        lines.append(
            f"sglang {sglang.get('version')}: {sglang.get('function')}() admits majors {sglang['supported_majors']} "
            f"(read from {sglang.get('file')} and {sglang.get('helpers')})"
        )
    elif sglang:
        lines.append(f"sglang {sglang.get('version')}: its gate could not be read: {sglang.get('error')}")
    lines.append(
        f"FLASHINFER_CUDA_ARCH_LIST={arch_list} (flashinfer compiles for these archs, not the GPUs')"
        if arch_list
        else "FLASHINFER_CUDA_ARCH_LIST unset: flashinfer compiles for the GPUs' own archs"
    )
    return lines


_NO_COMPILE = (
    "no compile was tried: flashinfer's JIT filters its target archs by these majors and raises "
    "`No supported CUDA architectures found for major versions [...]` before nvcc runs "
    "(flashinfer/compilation_context.py; sglang issue 15650)"
)


def judge_fusion_gate(
    gate: FusionGate, capabilities: Sequence[str], source: str, arch_list: str | None, severity: str
) -> Result | None:
    """The verdict when the fused path cannot run here (or cannot be located), else None: the arch
    gate, read from the installed flashinfer's own code, against each GPU's major."""
    evidence = _gate_evidence(gate, capabilities, source, arch_list)
    supported = gate.flashinfer.get("supported_majors")
    data: dict[str, Any] = {
        "gate": dict(gate.flashinfer),
        "sglang_gate": dict(gate.sglang) if gate.sglang else None,
        "capabilities": list(capabilities),
        "arch_list": arch_list,
        "runs": False,
    }
    if not isinstance(supported, list):
        why = gate.flashinfer.get("error", "no supported majors found")
        return failed(
            f"flashinfer's allreduce-fusion module cannot be located: {why}",
            [*evidence, *_tail_lines(gate.tail)],
            _GATE_FIX,
            data,
        )
    majors = {int(cc.split(".")[0]) for cc in capabilities if cc.split(".")[0].isdigit()}
    problem = fusion_arch_problem(majors, supported, arch_list)
    if problem is None:
        return None
    data["defines"] = {"allreduce_fusion": f"no-op: {problem}"}
    summary = f"the fused path cannot run here: {problem}: {FUSION_FLAG} is a no-op on this machine"
    fix = Fix(
        f"Drop {FUSION_FLAG} from [smoke] flags for this hardware (the TP all-reduce then runs on NCCL, as it "
        "already does), "
        'or keep it knowingly with [deep.fusion] unsupported = "warn". Only a flashinfer whose comm module builds '
        "for this arch makes it real.",
        ("stackgate verify --deep --check deep.allreduce_fusion",),
    )
    return (warned if severity == "warn" else failed)(summary, [*evidence, _NO_COMPILE], fix, data)


_GATE_FIX = Fix(
    "Install flashinfer-python in the stack (its flashinfer/jit/comm.py holds the fusion module's arch list).",
    ("stackgate provision --only python", "stackgate verify --check flashinfer.cubin"),
)


def _fusion_data(run: FusionRun, atol: float) -> dict[str, Any]:
    tokens = []
    for t in run.tokens:
        tokens.append(
            {
                **{k: _finite(v) for k, v in asdict(t).items() if k not in ("residual", "norm", "max_abs_err")},
                "speedup": t.speedup,
                "max_abs_err": {k: _finite(v) for k, v in t.max_abs_err.items()},
                "worst": {"residual": [_finite(v) for v in t.residual], "norm": [_finite(v) for v in t.norm]},
            }
        )
    return {
        "world": run.request.world,
        "hidden": run.request.hidden,
        "flashinfer": run.begin.get("flashinfer"),
        "tokens": tokens,
        "figures": {f"fused speedup at {t.tokens} tokens": round(t.speedup, 3) for t in run.tokens if t.speedup},
        "workspace_s": {str(rank): round(s, 3) for rank, s in sorted(run.workspace_s.items())},
        "compiled": run.compiled,
        "progress": {str(rank): where for rank, where in run.progress.items()},
        "tolerance": {
            "atol": atol,
            "rtol": run.request.rtol,
            "rule": (
                "|out - ref| <= atol + rtol * |ref|; ref: NCCL's all-reduce of the same bf16 inputs, then the "
                "residual add and RMSNorm in float32"
            ),
        },
        "method": (
            f"per token count: {run.request.iters} calls captured in one CUDA graph, {run.request.replays} "
            "timed replays after a 1-element all-reduce that aligns the ranks; each rank's median, the mean over "
            "ranks. unfused: NCCL all-reduce, then torch's add and RMSNorm ops (several kernels; SGLang's own "
            "unfused path runs one fused add+RMSNorm kernel there, so its speedup is smaller)"
        ),
        "seed": run.request.seed,
        "script_s": round(run.duration_s, 3),
        "log": str(run.log),
        "runs": True,
    }


def _fusion_wrong(run: FusionRun, atol: float) -> list[str]:
    wrong = []
    for t in run.tokens:
        for part in ("residual", "norm"):
            worst = getattr(t, part)
            if not close_enough(worst, atol, run.request.rtol):
                wrong.append(
                    f"{t.tokens} token(s): {part} wrong: error {worst[0]:.3g} where |ref| is {worst[1]:.3g} (allowed "
                    f"{atol + run.request.rtol * worst[1]:.3g})"
                )
    return wrong


def judge_fusion(run: FusionRun, jit: JitContext, lock: Spec) -> Result:
    """The fusion verdict, once the arch gate passed: a failed or hung run, wrong outputs fail;
    a fused path slower than the unfused one warns; else the figures per token count."""
    atol = fusion_atol(run.request.world)
    data = _fusion_data(run, atol)
    if run.returncode is None:
        return failed(
            _fusion_timeout(run, jit),
            [*(f"rank {r}: last {w}" for r, w in sorted(run.progress.items())), *_tail_lines(run.tail)],
            Fix(_JIT_TIMEOUT_FIX, (f"less {run.log}",)),
            {**data, "hung": True},
        )
    if run.begin.get("error") or run.failures or run.returncode != 0 or len(run.tokens) < len(run.request.tokens):
        return _fusion_failed(run, lock, data)
    wrong = _fusion_wrong(run, atol)
    if wrong:
        return failed(
            f"the fused outputs differ from NCCL + residual + RMSNorm at {len(wrong)} point(s): {wrong[0]}",
            wrong,
            _log_fix(run.log),
            data,
        )
    data["defines"] = {
        "allreduce_fusion": f"runs on {run.request.world} ranks: fused outputs match NCCL + residual + RMSNorm"
    }
    lines = [*_fusion_lines(run), *jit.lines()]
    slower = [t for t in run.tokens if t.speedup is not None and t.speedup < 1]
    if slower:
        return warned(
            f"the fused path is slower than the unfused one at {', '.join(str(t.tokens) for t in slower)} token(s): "
            f"{_fusion_summary(run, jit)}",
            lines,
            None,
            data,
        )
    return passed(_fusion_summary(run, jit), lines, data)


def _fusion_failed(run: FusionRun, lock: Spec, data: Mapping[str, Any]) -> Result:
    failure = run.failures[0] if run.failures else run.begin
    known = _classified(failure.get("trace") or failure.get("error") or "\n".join(run.tail), lock)
    where = f"rank {failure['rank']} ({failure.get('stage')}): " if "rank" in failure else ""
    cause = _explained(f"{where}{failure.get('error') or ' / '.join(run.tail[-3:])}", known)
    details = [*([known.cause] if known else []), *_tail_lines(run.tail)]
    return failed(
        f"the allreduce fusion failed ({_code(run.returncode)}): {cause}",
        details,
        known.fix if known else _log_fix(run.log),
        data,
    )


def _fusion_timeout(run: FusionRun, jit: JitContext) -> str:
    if not run.workspace_s:
        return (
            "the IPC workspace (its first creation JIT-compiles the comm module, cold) was not ready within "
            f"{run.timeout_s:g} s (the lock's jit_timeout_s {jit.timeout_s:g} s included)"
        )
    return (
        f"hang: the fusion run did not finish within {run.timeout_s:g} s "
        f"({', '.join(f'rank {r}: {w}' for r, w in sorted(run.progress.items()))})"
    )


def _fusion_summary(run: FusionRun, jit: JitContext) -> str:
    timed = [t for t in run.tokens if t.speedup is not None]
    worst = max((t.max_abs_err["norm"] for t in run.tokens), default=0.0)
    speed = (
        ", ".join(f"{t.tokens}: {t.fused_us:.1f} vs {t.unfused_us:.1f} us ({t.speedup:.1f}x)" for t in timed)
        or "not timed (no CUDA graph)"
    )
    workspace = max(run.workspace_s.values(), default=0.0)
    return (
        f"{run.request.world} ranks, hidden {run.request.hidden}: fused = NCCL + residual + RMSNorm (max abs error "
        f"norm {worst:.2g}); "
        f"fused vs unfused, graph-captured, per token count: {speed}; workspace "
        f"{_jit_line(workspace, run.compiled, jit)}"
    )


def _fusion_lines(run: FusionRun) -> list[str]:
    def us(value: float | None) -> str:
        return f"{value:8.1f} us" if value is not None else "    n/a   "

    lines = [
        f"{t.tokens:>5} token(s): fused {us(t.fused_us)} unfused {us(t.unfused_us)} (eager: {us(t.fused_eager_us)} "
        f"vs {us(t.unfused_eager_us)}); "
        f"max abs error residual {t.max_abs_err['residual']:.2g}, norm {t.max_abs_err['norm']:.2g}"
        + (f"; {t.graph_error}" if t.graph_error else "")
        for t in run.tokens
    ]
    return [*lines, *(f"rank {rank}: IPC workspace {s:.1f} s" for rank, s in sorted(run.workspace_s.items()))]


@check("deep.allreduce_fusion", needs=("probe", "env", "nvml"), timeout_s=_fusion_limit_s, slow=True)
def allreduce_fusion(lock: Spec, facts: Facts) -> Result:
    """flashinfer's allreduce + residual + RMSNorm fusion runs on these GPUs, matches NCCL + torch, and pays."""
    if FUSION_FLAG not in lock.smoke.flags:
        return skipped(f"the lock's [smoke] flags do not include {FUSION_FLAG}: no fused path to prove")
    env = flashinfer_env(lock, facts)
    capabilities, source = _gpu_capabilities(facts, lock)
    gate = read_gate(lock.python.target, env)
    verdict = judge_fusion_gate(
        gate, capabilities, source, env.get("FLASHINFER_CUDA_ARCH_LIST"), lock.deep.fusion.unsupported
    )
    if verdict is not None:
        return verdict
    world, wanted = world_size(lock, facts.probe)
    if world < 2:
        return skipped(
            f"{world} rank(s) (the lock's [smoke] tp {wanted}): there is no all-reduce to fuse (SGLang skips the "
            "fusion on one GPU); "
            f"the arch gate passed: {gate.flashinfer.get('supported_majors')}"
        )
    fusion = lock.deep.fusion
    run = run_fusion(
        lock.python.target,
        FusionRequest(world, fusion.hidden, fusion.tokens),
        env,
        fusion.jit_timeout_s + settings.DEEP_TIMEOUT_S.value(),
    )
    return judge_fusion(run, _jit_context(lock, facts, env, fusion.jit_timeout_s), lock)
