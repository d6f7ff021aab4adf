"""deep.collective: an NCCL all-reduce sweep from 8 KiB to 1 GiB is exact and reaches the locked bus
bandwidth; judged from :class:`~stackgate.facts.deepruns.Sweep`."""

from __future__ import annotations

import statistics
from dataclasses import asdict
from typing import Any, Mapping

from stackgate.checks.core import check
from stackgate.checks.deep.common import (
    _LOOKS,
    TUNING,
    _code,
    _limit_s,
    _log_fix,
    _recognised,
    _tail_lines,
    world_size,
)
from stackgate.checks.unexplained import looked_up
from stackgate.facts import Facts
from stackgate.facts.deepruns import (
    AllReduceRequest,
    SizeFigures,
    Sweep,
    launch_env,
    run_sweep,
)
from stackgate.models.finding import Fix
from stackgate.models.result import Result, failed, passed
from stackgate.models.spec import Spec

__all__ = [
    "collective",
    "judge_collective",
]

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


@check("deep.collective", needs=("probe", "env"), timeout_s=_limit_s, slow=True)
def collective(spec: Spec, facts: Facts) -> Result:
    """An NCCL all-reduce from 8 KiB to 1 GiB is exact and reaches the locked bus bandwidth."""
    world, wanted = world_size(spec, facts.probe)
    sweep = run_sweep(spec.python.target, AllReduceRequest.for_world(world), launch_env(spec, facts))
    return looked_up(judge_collective(sweep, spec.nccl.min_busbw_gbs, wanted), facts, "\n".join(sweep.tail), _LOOKS)
