"""deep.flashinfer_attention: flashinfer's decode, prefill and paged attention run on every GPU and
match float32; judged from :class:`~stackgate.facts.deepruns.AttentionRun`."""

from __future__ import annotations

import math
import signal
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from stackgate.checks.core import check
from stackgate.checks.deep.common import (
    _KILLED,
    _LOOKS,
    ATTENTION_ATOL,
    JitContext,
    Known,
    _classified,
    _code,
    _explained,
    _finite,
    _flashinfer_import_fix,
    _flashinfer_limit_s,
    _jit_context,
    _jit_line,
    _log_fix,
    _recognised,
    _run_output,
    _tail_lines,
    _uses_flashinfer,
    close_enough,
)
from stackgate.checks.deep.gpuwork import model_row, row_named
from stackgate.checks.unexplained import looked_up
from stackgate.facts import Facts
from stackgate.facts.deepruns import (
    ATTENTION_RTOL,
    AttentionRequest,
    AttentionRun,
    flashinfer_env,
    run_attention,
)
from stackgate.models import settings
from stackgate.models.finding import Fix
from stackgate.models.result import Result, failed, passed, skipped
from stackgate.models.spec import Spec

__all__ = [
    "ATTENTION_FIGURES",
    "JIT_BUILD_BYTES",
    "flashinfer_attention",
    "judge_attention",
    "read_fractions",
    "ReadFraction",
    "signal_name",
]

# --- deep.flashinfer_attention ----------------------------------------------------------------

#: What each kernel's figure is called in the report and in `report A B`.
ATTENTION_FIGURES = {
    "decode": ("decode GB/s", "gbs"),
    "decode_tensor_cores": ("decode (tensor cores) GB/s", "gbs"),
    "paged_decode": ("paged decode GB/s", "gbs"),
    "prefill": ("prefill TFLOP/s", "tflops"),
    "bandwidth_decode": ("bandwidth decode GB/s", "gbs"),
}


@dataclass(frozen=True)
class ReadFraction:
    """One GPU's bandwidth-bound decode against its read bandwidth: the larger of what this run's read kernel gave
    and what an idle GPU of its model gave (its MODEL_RATES row), so that memory that is slow or shared (both
    figures of this run low) still fails, and a GPU with no row is judged by this run's read alone."""

    index: int
    name: str
    decode_gbs: float
    read_gbs: float  #: this run's read kernel, on this GPU
    idle_read_gbs: float | None  #: the GPU's MODEL_RATES row's read, if it has one
    floor: float

    @property
    def reference_gbs(self) -> float:
        return max(self.read_gbs, self.idle_read_gbs or 0.0)

    @property
    def fraction(self) -> float:
        """
        >>> ReadFraction(0, "NVIDIA H200", 3600.0, 4000.0, 4300.0, 0.6).fraction  # the row's read is larger
        0.8372093023255814
        >>> ReadFraction(0, "GPU X", 1800.0, 2000.0, None, 0.6).fraction  # no row: this run's read alone
        0.9
        """
        return self.decode_gbs / self.reference_gbs if self.reference_gbs > 0 else 0.0

    @property
    def passes(self) -> bool:
        return math.isfinite(self.fraction) and self.fraction >= self.floor

    def against(self) -> str:
        """What the fraction is of, the table row named."""
        run = f"this run's read {self.read_gbs:.4g} GB/s"
        if self.idle_read_gbs is None:
            return f"{run}; no MODEL_RATES row for {self.name}"
        idle = f"an idle {self.name}'s {self.idle_read_gbs:.4g} GB/s, {row_named(self.name)}"
        return f"{idle}; {run}" if self.idle_read_gbs >= self.read_gbs else f"{run}; {idle}"

    def line(self) -> str:
        return (
            f"GPU {self.index} ({self.name}) bandwidth decode {self.decode_gbs:.4g} GB/s = {self.fraction:.2f} of "
            f"{self.reference_gbs:.4g} GB/s read ({self.against()}); floor {self.floor:g}"
        )


def read_fractions(
    kernels: Sequence[Mapping[str, Any]], reads: Sequence[Mapping[str, Any]], floor: float
) -> tuple[list[ReadFraction], list[str]]:
    """Each GPU's :class:`ReadFraction`, and what could not be judged (a read or a decode that gave no figure).

    >>> from stackgate.checks.deep.gpuwork import MODEL_RATES
    >>> [f], missing = read_fractions(
    ...     [{"index": 0, "kind": "bandwidth_decode", "name": "NVIDIA H200", "gbs": 3500.0}],
    ...     [{"index": 0, "name": "NVIDIA H200", "gbs": 1900.0}],
    ...     0.6,
    ... )
    >>> f.reference_gbs == MODEL_RATES["NVIDIA H200"].get("read", 1900.0), missing
    (True, [])
    """
    decodes = {k["index"]: k for k in kernels if k.get("kind") == "bandwidth_decode" and "gbs" in k}
    fractions, missing = [], []
    for read in reads:
        index, name = read["index"], str(read.get("name"))
        if "gbs" not in read:
            missing.append(f"GPU {index} ({name}): the read-bandwidth kernel failed: {read.get('error')}")
            continue
        if index not in decodes:
            continue  # the decode's own error is a kernel problem already
        row = model_row(name)
        idle = row[1].get("read") if row else None
        fractions.append(ReadFraction(index, name, decodes[index]["gbs"], read["gbs"], idle, floor))
    return fractions, missing


def _kernel_label(record: Mapping[str, Any]) -> str:
    return f"GPU {record['index']} {record['kind']}"


def _kernel_problem(record: Mapping[str, Any], spec: Spec) -> tuple[str, Known | None] | None:
    """What is wrong with one kernel's record: an error (classified), or a result out of tolerance."""
    if "error" in record:
        known = _classified(record.get("trace") or record["error"], spec)
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


def _attention_data(run: AttentionRun, jit: JitContext, floor: float) -> dict[str, Any]:
    kernels = [{k: _finite(v) for k, v in record.items() if k not in ("event", "trace")} for record in run.kernels]
    first = [k for k in run.kernels if k.get("index") == 0]
    fractions, _ = read_fractions(run.kernels, run.reads, floor)
    figures = _attention_figures(run.kernels)
    reads = [r["gbs"] for r in run.reads if isinstance(r.get("gbs"), (int, float))]
    if reads:
        figures["read GB/s"] = round(statistics.fmean(reads), 3)
    if fractions:
        figures["bandwidth decode read fraction"] = round(min(f.fraction for f in fractions), 4)
    prebuild = dict(run.prebuild) if run.prebuild else None
    return {
        "flashinfer": run.begin.get("flashinfer"),
        "torch": run.begin.get("torch"),
        "shapes": {k: v for k, v in asdict(run.request).items() if k not in ("rtol", "warmup", "iters", "seed")},
        "seed": run.request.seed,
        "kernels": kernels,
        "figures": figures,
        "reads": [{k: _finite(v) for k, v in r.items() if k not in ("event", "trace")} for r in run.reads],
        "read_fraction": {
            "floor": floor,
            "gpus": [
                {
                    "index": f.index,
                    "model_row": row_named(f.name) if f.idle_read_gbs is not None else None,
                    "decode_gbs": round(f.decode_gbs, 3),
                    "read_gbs": round(f.read_gbs, 3),
                    "idle_read_gbs": f.idle_read_gbs,
                    "reference_gbs": round(f.reference_gbs, 3),
                    "fraction": round(f.fraction, 4),
                    "passes": f.passes,
                }
                for f in fractions
            ],
            "rule": (
                "bandwidth decode KV GB/s / max(this run's read GB/s, the GPU's MODEL_RATES row's read GB/s) >= floor"
            ),
        },
        "tolerance": {
            "atol": ATTENTION_ATOL,
            "rtol": run.request.rtol,
            "rule": "|out - ref| <= atol + rtol * |ref|, ref in float32 from the same bf16 inputs",
        },
        "jit": {
            **asdict(jit),
            "first_calls_s": round(sum(k.get("first_call_s") or 0.0 for k in first), 3),
            "compiled": sum(k.get("compiled") or 0 for k in first) + int((prebuild or {}).get("compiled") or 0),
            "prebuild": prebuild,
        },
        "script_s": round(run.duration_s, 3),
        "log": str(run.log),
    }


def judge_attention(run: AttentionRun, jit: JitContext, spec: Spec) -> Result:
    """The attention verdict: flashinfer that does not import, a kernel that errors, times out in
    its JIT or computes wrong fails, with the cause and fix the knowledge base knows."""
    floor = spec.deep.attention.min_read_fraction
    data = _attention_data(run, jit, floor)
    if run.returncode is None:
        return failed(
            _attention_timeout(run, jit),
            _tail_lines(run.tail),
            Fix(_JIT_TIMEOUT_FIX, (f"less {run.log}",)),
            {**data, "hung": True},
        )
    if run.begin.get("error"):
        known = _classified(run.begin.get("trace") or run.begin["error"], spec)
        causes = [known.cause] if known else []
        return failed(
            _explained(run.begin["error"], known),
            [*causes, *jit.lines(), *_tail_lines(run.tail)],
            known.fix if known else _flashinfer_import_fix(spec, run.begin.get("trace") or run.begin["error"]),
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
    problems = [p for p in (_kernel_problem(k, spec) for k in run.kernels) if p is not None]
    if problems:
        known = next((k for _, k in problems if k is not None), None)
        details = [text for text, _ in problems] + ([known.cause] if known else [])
        return failed(
            f"{len(problems)} kernel problem(s): {problems[0][0]}",
            details,
            known.fix if known else _log_fix(run.log),
            data,
        )
    fractions, missing = read_fractions(run.kernels, run.reads, floor)
    slow = [f for f in fractions if not f.passes]
    if missing or slow or not fractions:
        lines = [*missing, *(f.line() for f in fractions)] or ["no GPU gave both a read and a bandwidth decode figure"]
        first = (
            f"GPU {slow[0].index} ({slow[0].name}): the bandwidth-bound decode reads its KV at "
            f"{slow[0].decode_gbs:.4g} GB/s, {slow[0].fraction:.2f} of the GPU's read bandwidth "
            f"{slow[0].reference_gbs:.4g} GB/s ({slow[0].against()}), below the floor {floor:g}"
            if slow
            else lines[0]
        )
        return failed(first, [*lines, *_attention_lines(run)], _BANDWIDTH_FIX, data)
    kinds = ", ".join(dict.fromkeys(str(k["kind"]) for k in run.kernels))
    data["defines"] = {"flashinfer_attention": f"{kinds} correct against float32; {jit.kernels_from()}"}
    return passed(
        _attention_summary(run, data, jit, fractions),
        [*(f.line() for f in fractions), *_attention_lines(run), *_prebuild_lines(run), *jit.lines()],
        data,
    )


_BANDWIDTH_FIX = Fix(
    "The GPU's memory gave the decode less than the floor of its read bandwidth: another process sharing the GPU, "
    "clocks held down, or memory slower than an idle GPU of this model. See who else runs on it and its clocks and "
    "throttle reasons; [deep.attention] min_read_fraction sets the floor.",
    (
        "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv",
        "nvidia-smi -q -d PERFORMANCE,CLOCK",
        "stackgate verify --deep --check deep.flashinfer_attention",
    ),
)


def _prebuild_lines(run: AttentionRun) -> list[str]:
    """What was built before the first kernel ran, and how."""
    pre = run.prebuild
    if pre is None:
        return []
    if "error" in pre:
        return [f"the modules could not be built up front ({pre['error']}): each kernel's first call built its own"]
    lines = [
        f"modules: {len(pre.get('prebuilt', []))} prebuilt (flashinfer-jit-cache), {len(pre.get('cached', []))} in "
        f"the JIT cache, {len(pre.get('build', []))} built side by side, one ninja each with -j {pre.get('jobs')} "
        f"(from {'MAX_JOBS' if pre.get('jobs_from') == 'MAX_JOBS' else 'the ' + str(pre.get('cores')) + ' cores'}), "
        f"in {float(pre.get('seconds') or 0.0):.1f} s"
    ]
    lines += [f"building {name} failed: {error}" for name, error in (pre.get("errors") or {}).items()]
    return lines


#: What a cold build of the attention modules left in flashinfer's JIT cache on an H200 (flashinfer 0.6.4, sm_90a;
#: `du -sh` of the cache): 26 MiB for the default four, 32 MiB with the fa3 prefill; the compiler's objects more
#: while it runs.
JIT_BUILD_BYTES = 32 << 20
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
        Fix(_KILLED, (f"less {run.log}",)),
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
    "A cold JIT compiles each module with nvcc (on a 16-core H200, 25 s for the default modules side by side, 102 "
    "s with the fa3 prefill): raise "
    "[deep.attention] jit_timeout_s "
    "(or [deep.fusion]) on a machine with fewer cores, or install flashinfer-jit-cache (precompiled kernels). A "
    "kernel that hangs "
    "after its JIT needs the log."
)


def _attention_timeout(run: AttentionRun, jit: JitContext) -> str:
    if run.building:
        return (
            f"flashinfer's JIT build of the attention modules (side by side) did not finish within {run.timeout_s:g} s "
            f"(the lock's jit_timeout_s {jit.timeout_s:g} s included)"
        )
    where = f"GPU {run.running[0]}'s {run.running[1]} kernel" if run.running else "the attention run"
    if run.running and run.running[0] == 0 and not any(k.get("kind") == run.running[1] for k in run.kernels):
        return (
            f"{where} did not finish within {run.timeout_s:g} s: its first call JIT-compiles (cold) with the lock's "
            f"jit_timeout_s {jit.timeout_s:g} s allowed"
        )
    return f"hang: {where} did not finish within {run.timeout_s:g} s"


def _attention_summary(
    run: AttentionRun, data: Mapping[str, Any], jit: JitContext, fractions: Sequence[ReadFraction]
) -> str:
    rates = ", ".join(f"{name} {value:.4g}" for name, value in data["figures"].items() if name in _KERNEL_FIGURES)
    worst = max((k["max_abs_err"] for k in run.kernels), default=0.0)
    gpus = len({k["index"] for k in run.kernels})
    low = min(fractions, key=lambda f: f.fraction)
    rows = dict.fromkeys(row_named(f.name) for f in fractions if f.idle_read_gbs is not None)
    return (
        f"flashinfer {run.begin.get('flashinfer')} on {gpus} GPU(s): {rates}; max abs error {worst:.2g}; bandwidth "
        f"decode {low.fraction:.2f} of read {low.reference_gbs:.4g} GB/s (floor {low.floor:g}; "
        f"{', '.join(rows) or 'this run read alone: no MODEL_RATES row'}); "
        f"{_attention_jit(run, data, jit)}"
    )


_KERNEL_FIGURES = frozenset(name for name, _ in ATTENTION_FIGURES.values())


def _attention_jit(run: AttentionRun, data: Mapping[str, Any], jit: JitContext) -> str:
    """The JIT part of the summary: the modules built up front (side by side), or the first calls' own JIT."""
    pre = run.prebuild or {}
    if pre.get("compiled"):
        return (
            f"JIT (cold): {pre['compiled']} module(s) built side by side in {float(pre.get('seconds') or 0):.0f} s "
            f"of the {jit.timeout_s:g} s allowed (ninja -j {pre.get('jobs')} each, {pre.get('cores')} cores) into "
            f"{jit.workspace}; first calls {data['jit']['first_calls_s']:.1f} s"
        )
    return _jit_line(data["jit"]["first_calls_s"], data["jit"]["compiled"], jit)


def _attention_lines(run: AttentionRun) -> list[str]:
    lines = []
    for k in run.kernels:
        rate = f"{k['gbs']:.4g} GB/s" if "gbs" in k else f"{k['tflops']:.4g} TFLOP/s (causal)"
        if "batch" in k:
            cores = ", tensor cores" if k.get("tensor_cores") else ""
            rate += f" ({k['batch']} x {k['kv_len']} KV tokens, {k.get('kv_bytes', 0) / 2**30:.3g} GiB{cores})"
        if "backend" in k:
            rate += f" (backend {k['backend']})"
        lines.append(
            f"{_kernel_label(k)}: {k['us']:.1f} us, {rate}, max abs error {k['max_abs_err']:.2g}, first call "
            f"{k['first_call_s']:.1f} s ({k['compiled']} module(s) compiled)"
        )
    return lines


@check("deep.flashinfer_attention", needs=("probe", "env"), timeout_s=_flashinfer_limit_s, slow=True)
def flashinfer_attention(spec: Spec, facts: Facts) -> Result:
    """flashinfer's decode, prefill and paged attention run on every GPU and match float32."""
    if not _uses_flashinfer(spec):
        return skipped(
            f"the lock's stack does not use flashinfer (attention backend {spec.smoke.attention_backend}, no "
            "flashinfer-python pin)"
        )
    env = flashinfer_env(spec, facts)
    shapes = spec.deep.attention
    run = run_attention(
        spec.python.target,
        AttentionRequest.from_lock(shapes),
        env,
        shapes.jit_timeout_s + settings.DEEP_TIMEOUT_S.value(),
    )
    result = judge_attention(run, _jit_context(spec, facts, env, shapes.jit_timeout_s), spec)
    return looked_up(result, facts, _run_output(run.begin, run.kernels, run.tail), _LOOKS)
