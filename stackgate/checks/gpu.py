"""Checks of the driver and the GPUs, from one NVML snapshot."""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from stackgate.checks.core import check
from stackgate.edges.nvml import GpuInfo, NvmlSnapshot, ProcessInfo
from stackgate.facts import Facts, Missing
from stackgate.models import engines, kernelevents
from stackgate.models.finding import Fix
from stackgate.models.result import NEEDS_GPU, NO_DRIVER, Result, failed, passed, skipped, warned
from stackgate.models.spec import Spec

__all__ = ["ENGINE_FRACTION", "engine_fraction"]

_DRIVER_FIX = "Install an NVIDIA driver of at least {want} (CUDA 13 needs the 580 series), then reboot."
_NO_NVML = "Install the NVIDIA driver (it provides libnvidia-ml.so.1) and check `nvidia-smi` works."


def _snapshot(facts: Facts) -> NvmlSnapshot | Result:
    """The NVML snapshot, or the SKIP that points at gpu.driver (which owns that failure)."""
    snap = facts.nvml
    if isinstance(snap, Missing):
        return skipped(f"no NVIDIA driver answers (see gpu.driver): {snap.reason}", data={NEEDS_GPU: True})
    return snap


@check("gpu.driver", needs=("nvml",))
def driver(spec: Spec, facts: Facts) -> Result:
    """The NVIDIA driver is present and at least the locked minimum."""
    snap = facts.nvml
    if isinstance(snap, Missing):
        fix = Fix(_NO_NVML, ("nvidia-smi",))
        return failed(f"no NVIDIA driver answers: {snap.reason}", fix=fix, data={NO_DRIVER: snap.reason})
    want = spec.hardware.min_driver
    try:
        have = Version(snap.driver_version)
    except InvalidVersion:
        return failed(f"the driver reports an unreadable version {snap.driver_version!r}")
    data = {"driver": snap.driver_version, "min_driver": str(want)}
    if have < want:
        return failed(
            f"driver {snap.driver_version} is older than the locked minimum {want}",
            fix=Fix(_DRIVER_FIX.format(want=want)),
            data=data,
        )
    return passed(f"driver {snap.driver_version} (>= {want})", data=data)


@check("gpu.driver_cuda", needs=("nvml",))
def driver_cuda(spec: Spec, facts: Facts) -> Result:
    """The driver supports the CUDA release of every toolkit."""
    snap = _snapshot(facts)
    if isinstance(snap, Result):
        return snap
    if snap.cuda_driver_version is None:
        return skipped("the driver does not report the CUDA version it supports")
    major, minor = snap.cuda_driver_version
    have = f"{major}.{minor}"
    data = {"driver_cuda": have}
    too_new = [t for t in spec.toolkits if (t.version.major, t.version.minor) > (major, minor)]
    if too_new:
        names = ", ".join(f"CUDA {t.version}" for t in too_new)
        return failed(
            f"driver {snap.driver_version} supports CUDA {have}, older than {names}",
            fix=Fix(_DRIVER_FIX.format(want=spec.hardware.min_driver)),
            data=data,
        )
    return passed(
        f"driver supports CUDA {have}, covering {', '.join(t.release for t in spec.toolkits) or 'no toolkit'}",
        data=data,
    )


@check("gpu.count", needs=("nvml",))
def count(spec: Spec, facts: Facts) -> Result:
    """The locked number of GPUs of the locked model is present."""
    snap = _snapshot(facts)
    if isinstance(snap, Result):
        return snap
    want, name = spec.hardware.gpu_count, spec.hardware.gpu_name
    others = [g for g in snap.gpus if name.lower() not in g.name.lower()]
    data = {"gpus": [g.name for g in snap.gpus], "want": want}
    details = [f"{g.label}: not a {name}" for g in others]
    if len(snap.gpus) != want:
        return failed(
            f"{len(snap.gpus)} GPU(s) visible, the lock wants {want}",
            details,
            Fix(
                "Check that every GPU is seated and powered, and that CUDA_VISIBLE_DEVICES hides none.",
                ("nvidia-smi -L",),
            ),
            data,
        )
    if others:
        return failed(
            f"{len(others)} of {want} GPU(s) are not a {name}",
            details,
            Fix(f"This lock is for {name}; use the lock of this machine's GPUs (--lock)."),
            data,
        )
    return passed(f"{want} x {snap.gpus[0].name}" if snap.gpus else "no GPU wanted", data=data)


@check("gpu.capability", needs=("nvml",))
def capability(spec: Spec, facts: Facts) -> Result:
    """Every GPU has the locked compute capability."""
    snap = _snapshot(facts)
    if isinstance(snap, Result):
        return snap
    want = spec.hardware.compute_capability
    wrong = [g for g in snap.gpus if g.capability != (want.major, want.minor)]
    data = {"want": str(want), "gpus": {g.index: _cc(g.capability) for g in snap.gpus}}
    if not snap.gpus:
        return failed("no GPU visible to check", data=data)
    if wrong:
        details = [f"{g.label}: compute capability {_cc(g.capability)}, the lock wants {want}" for g in wrong]
        summary = f"{len(wrong)} of {len(snap.gpus)} GPU(s) are not compute capability {want}: " + ", ".join(
            f"{g.name} is {_cc(g.capability)}" for g in wrong[:3]
        )
        return failed(
            summary,
            details,
            Fix(
                f"This lock is for compute capability {want} ({spec.hardware.arch}); run with the lock for this "
                "machine's GPUs (--lock)."
            ),
            data,
        )
    return passed(f"all {len(snap.gpus)} GPU(s) are compute capability {want}", data=data)


@check("gpu.pcie", needs=("nvml",))
def pcie(spec: Spec, facts: Facts) -> Result:
    """No GPU's PCIe link is narrower or slower than the GPU and slot allow."""
    snap = _snapshot(facts)
    if isinstance(snap, Result):
        return snap
    problems, unknown = [], []
    for g in snap.gpus:
        if g.pcie_width is None or g.pcie_width_max is None:
            unknown.append(g.label)
            continue
        if g.pcie_width < g.pcie_width_max:
            problems.append(f"{g.label}: link width x{g.pcie_width}, the link can do x{g.pcie_width_max}")
        if g.pcie_gen_gpu_max and g.pcie_gen_max and g.pcie_gen_max < g.pcie_gen_gpu_max:
            problems.append(
                f"{g.label}: the slot limits the link to Gen{g.pcie_gen_max}; the GPU can do Gen{g.pcie_gen_gpu_max}"
            )
    data = {
        str(g.index): {
            "gen": g.pcie_gen,
            "gen_max": g.pcie_gen_max,
            "width": g.pcie_width,
            "width_max": g.pcie_width_max,
        }
        for g in snap.gpus
    }
    if problems:
        fix = Fix(
            "Reseat the GPU or move it to a full x16 Gen5 slot; check the BIOS PCIe settings and risers.",
            ("nvidia-smi -q -d PCIE",),
        )
        return failed(f"{len(problems)} PCIe link problem(s)", problems, fix, data)
    if len(unknown) == len(snap.gpus):
        return skipped("NVML does not report PCIe links here", data=data)
    # The current generation drops at idle to save power, so only the width and the slot's
    # maximum say that a link trained down.
    return passed(
        f"{len(snap.gpus) - len(unknown)} PCIe link(s) at full width",
        [f"{u}: link not reported" for u in unknown],
        data,
    )


@check("gpu.ecc", needs=("nvml",))
def ecc(spec: Spec, facts: Facts) -> Result:
    """No GPU has uncorrectable ECC errors since the driver loaded."""
    snap = _snapshot(facts)
    if isinstance(snap, Result):
        return snap
    counted = [g for g in snap.gpus if g.ecc_uncorrected_volatile is not None]
    bad = [g for g in counted if g.ecc_uncorrected_volatile]
    data = {
        str(g.index): {"volatile": g.ecc_uncorrected_volatile, "aggregate": g.ecc_uncorrected_aggregate}
        for g in snap.gpus
    }
    if bad:
        details = [f"{g.label}: {g.ecc_uncorrected_volatile} uncorrectable ECC error(s)" for g in bad]
        fix = Fix(
            "Drain the node, reset the GPU (or reboot) and watch the count; replace a GPU that keeps counting.",
            tuple(f"nvidia-smi -r -i {g.index}" for g in bad),
        )
        return failed(f"{len(bad)} GPU(s) with uncorrectable ECC errors", details, fix, data)
    if not counted:
        return skipped("no GPU reports ECC counters (ECC off or not supported)", data=data)
    return passed(f"no uncorrectable ECC errors on {len(counted)} GPU(s)", data=data)


#: The share of each GPU's memory the engine is assumed to take when the lock's [smoke] flags do not set
#: its engine's memory flag (SGLang's --mem-fraction-static, vLLM's --gpu-memory-utilization): below SGLang
#: 0.5.9's own default on a large GPU ((total - reserved) / total, about 0.9 on an H200 at TP 1) and vLLM's 0.9,
#: so the check fails only where the engine cannot fit.
ENGINE_FRACTION = 0.8


def engine_fraction(spec: Spec) -> tuple[float, str]:
    """The share of a GPU's memory the lock's engine takes, and where that came from.

    >>> from types import SimpleNamespace as NS
    >>> engine_fraction(NS(smoke=NS(flags=("--tp-size", "1", "--mem-fraction-static", "0.6"))))
    (0.6, '[smoke] flags --mem-fraction-static 0.6')
    >>> engine_fraction(NS(smoke=NS(flags=("--mem-fraction-static=0.7",))))[0]
    0.7
    >>> engine_fraction(NS(smoke=NS(flags=())))[0]
    0.8
    >>> engine_fraction(NS(smoke=NS(engine="vllm", flags=("--gpu-memory-utilization", "0.5"))))
    (0.5, '[smoke] flags --gpu-memory-utilization 0.5')
    """
    memory_flag = engines.get(getattr(spec.smoke, "engine", "sglang")).memory_flag
    flags = list(spec.smoke.flags)
    for i, flag in enumerate(flags):
        name, _, value = flag.partition("=")
        if name == memory_flag:
            value = value or (flags[i + 1] if i + 1 < len(flags) else "")
            try:
                fraction = float(value)
            except ValueError:
                break
            if 0 < fraction <= 1:
                return fraction, f"[smoke] flags {memory_flag} {value}"
    return ENGINE_FRACTION, f"{memory_flag} not in [smoke] flags: assumed {ENGINE_FRACTION:g}"


def _holder(p: ProcessInfo) -> str:
    return f"pid {p.pid} ({p.command or 'command not visible here'}) holds {_mib(p.used_memory_bytes)}"


def _short_gpus(snap: NvmlSnapshot, fraction: float) -> list[tuple[GpuInfo, int, int]]:
    """(GPU, free bytes, bytes the engine takes) for each GPU whose free memory is below the engine's share."""
    short = []
    for g in snap.gpus:
        free = g.memory_free_bytes
        if free is not None and g.memory_total_bytes and free < fraction * g.memory_total_bytes:
            short.append((g, free, int(fraction * g.memory_total_bytes)))
    return short


@check("gpu.processes", needs=("nvml",))
def processes(spec: Spec, facts: Facts) -> Result:
    """No GPU lacks the memory the engine takes; no other process holds GPU memory (warning)."""
    snap = _snapshot(facts)
    if isinstance(snap, Result):
        return snap
    fraction, source = engine_fraction(spec)
    held = [(g, p) for g in snap.gpus for p in g.processes]
    data = {
        "processes": [
            {"gpu": g.index, "pid": p.pid, "used_bytes": p.used_memory_bytes, "command": p.command} for g, p in held
        ],
        "engine_fraction": fraction,
        "engine_fraction_from": source,
        "free_bytes": {str(g.index): g.memory_free_bytes for g in snap.gpus},
    }
    details = [f"{g.label}: {_holder(p)}" for g, p in held]
    pids = " ".join(sorted({str(p.pid) for _, p in held}))
    look = (
        (f"ps -o pid,user,cmd -p {pids}",)
        if pids
        else ("nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv",)
    )
    short = _short_gpus(snap, fraction)
    if short:
        g, free, need = short[0]
        who = "; ".join(_holder(p) for p in g.processes) or "no process NVML lists holds it"
        summary = (
            f"{g.label} has {_mib(free)} free, the engine takes {_mib(need)} ({fraction:g} of "
            f"{_mib(g.memory_total_bytes)}): {who}"
        )
        lines = [
            f"{gpu.label}: {_mib(f)} free of {_mib(gpu.memory_total_bytes)}, the engine takes {_mib(n)}"
            for gpu, f, n in short
        ]
        fix = Fix(
            f"Stop the process(es) holding the memory, or lower {engines.get(spec.smoke.engine).memory_flag} in the "
            "lock's [smoke] flags "
            f"({source}).",
            look,
        )
        return failed(summary, [*lines, *details], fix, data)
    if held:
        return warned(
            f"{len(held)} process(es) hold GPU memory",
            details,
            Fix("Stop them before serving: they take memory the engine expects.", look),
            data,
        )
    return passed("no process holds GPU memory", data=data)


@check("gpu.kernel_events", needs=("kernel", "nvml"))
def kernel_events(spec: Spec, facts: Facts) -> Result:
    """No Xid, PCIe AER or NVRM error on this boot (fail on GPU faults, warn on application ones)."""
    log = facts.kernel
    if isinstance(log, Missing):
        return skipped(f"the kernel log cannot be read: {log.reason}")
    snap = facts.nvml
    gpus = (
        {}
        if isinstance(snap, Missing)
        else {kernelevents.normalize_bus(g.bus_id): g.index for g in snap.gpus if g.bus_id}
    )
    found = kernelevents.findings(log.events, gpus, log.source)
    data = {"source": log.source, "lines": log.lines, "events": [f.to_dict() for f in found]}
    if not found:
        return passed(f"no GPU event in {log.lines} lines of `{log.source}`", data=data)
    details = [f"{f.title}{f' (x{f.evidence.count})' if f.evidence.count > 1 else ''}: {f.fix.text}" for f in found]
    worst = found[0]
    summary = f"{len(found)} kind(s) of GPU event on this boot, first: {worst.title}"
    fix = Fix(worst.fix.text + " `stackgate diagnose --kernel` explains each event.", worst.fix.commands)
    if any(f.severity == "fail" for f in found):
        return failed(summary, details, fix, data)
    return warned(summary, details, fix, data)


def _cc(capability: tuple[int, int] | None) -> str:
    return "unknown" if capability is None else f"{capability[0]}.{capability[1]}"


def _mib(value: int | None) -> str:
    return "an unknown amount" if value is None else f"{value / 2**20:.0f} MiB"
