"""deep.allreduce_fusion: flashinfer's fused all-reduce + RMSNorm runs on these GPUs (its arch gate
read from the installed code) and matches the unfused path; judged from
:class:`~stackgate.facts.deepruns.FusionRun`."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Mapping, Sequence

from stackgate.checks.core import check
from stackgate.checks.deep.attention import _JIT_TIMEOUT_FIX
from stackgate.checks.deep.common import (
    _LOOKS,
    _UNKNOWN,
    FUSION_FLAG,
    JitContext,
    _classified,
    _code,
    _explained,
    _finite,
    _fusion_limit_s,
    _jit_context,
    _jit_line,
    _log_fix,
    _run_output,
    _tail_lines,
    close_enough,
    fusion_atol,
    world_size,
)
from stackgate.checks.fusiongate import (
    engine_refusal,
    fusion_arch_problem,
    gate_evidence,
    gpu_capabilities,
    majors_of,
)
from stackgate.checks.unexplained import looked_up, missing_piece
from stackgate.facts import Facts
from stackgate.facts.deepruns import (
    FusionGate,
    FusionRequest,
    FusionRun,
    flashinfer_env,
    read_gate,
    run_fusion,
)
from stackgate.models import settings
from stackgate.models.finding import Fix
from stackgate.models.result import Result, failed, passed, skipped, warned
from stackgate.models.spec import Spec

__all__ = [
    "allreduce_fusion",
    "fusion_arch_problem",
    "judge_fusion",
    "judge_fusion_gate",
]

# --- deep.allreduce_fusion --------------------------------------------------------------------


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
    evidence = gate_evidence(gate, capabilities, source, arch_list)
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
        absent = "is not installed" in why or missing_piece(why) is not None
        return failed(
            f"flashinfer's allreduce-fusion module cannot be located: {why}",
            [*evidence, *_tail_lines(gate.tail)],
            _GATE_FIX if absent else Fix(_UNKNOWN, ("stackgate verify --check flashinfer.cubin",)),
            data,
        )
    problem = fusion_arch_problem(majors_of(capabilities), supported, arch_list)
    if problem is None:
        return None
    data["defines"] = {"allreduce_fusion": f"no-op: {problem}"}
    data["refused_by"] = "flashinfer"
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


def judge_fusion(run: FusionRun, jit: JitContext, spec: Spec, refusal: str | None = None) -> Result:
    """The fusion verdict, once flashinfer's arch gate passed: a failed or hung run, wrong outputs fail;
    a fused path that the serving engine refuses in production (``refusal``, from
    :func:`~stackgate.checks.fusiongate.engine_refusal`) or that is slower than the unfused one warns;
    else the figures per token count."""
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
        return _fusion_failed(run, spec, data)
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
    data["refused_by"] = "sglang" if refusal else None
    lines = [*_fusion_lines(run), *jit.lines()]
    if refusal is not None:
        return warned(
            f"flashinfer's fused kernel runs here ({_fusion_summary(run, jit)}), but in production {refusal}",
            lines,
            Fix(
                f"Keep {FUSION_FLAG} out of [smoke] flags with this sglang: the gain above needs an sglang whose "
                "gate admits this GPU.",
                ("stackgate verify --check engine.fusion_gate",),
            ),
            data,
        )
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


def _fusion_failed(run: FusionRun, spec: Spec, data: Mapping[str, Any]) -> Result:
    failure = run.failures[0] if run.failures else run.begin
    known = _classified(failure.get("trace") or failure.get("error") or "\n".join(run.tail), spec)
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
def allreduce_fusion(spec: Spec, facts: Facts) -> Result:
    """flashinfer's allreduce + residual + RMSNorm fusion runs on these GPUs, matches NCCL + torch, and pays."""
    if FUSION_FLAG not in spec.smoke.flags:
        return skipped(f"the lock's [smoke] flags do not include {FUSION_FLAG}: no fused path to prove")
    env = flashinfer_env(spec, facts)
    capabilities, source = gpu_capabilities(facts, spec)
    gate = read_gate(spec.python.target, env)
    verdict = judge_fusion_gate(
        gate, capabilities, source, env.get("FLASHINFER_CUDA_ARCH_LIST"), spec.deep.fusion.unsupported
    )
    if verdict is not None:
        return looked_up(verdict, facts, "\n".join(gate.tail), _LOOKS)
    world, wanted = world_size(spec, facts.probe)
    if world < 2:
        return skipped(
            f"{world} rank(s) (the lock's [smoke] tp {wanted}): there is no all-reduce to fuse (SGLang skips the "
            "fusion on one GPU); "
            f"the arch gate passed: {gate.flashinfer.get('supported_majors')}"
        )
    fusion = spec.deep.fusion
    run = run_fusion(
        spec.python.target,
        FusionRequest(world, fusion.hidden, fusion.tokens),
        env,
        fusion.jit_timeout_s + settings.DEEP_TIMEOUT_S.value(),
    )
    refusal = engine_refusal(gate.sglang, majors_of(capabilities))
    result = judge_fusion(run, _jit_context(spec, facts, env, fusion.jit_timeout_s), spec, refusal)
    return looked_up(result, facts, _run_output(run.begin, run.failures, run.tail), _LOOKS)
