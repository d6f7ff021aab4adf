"""What the deep checks share: the static checks each stands on (:data:`PREREQUISITES`, :func:`not_run`),
what each will start (:func:`launch`), the world size, and what the two flashinfer checks share
(the fusion flag, tolerances, the JIT context, the known failures)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from stackgate.checks.unexplained import missing_piece
from stackgate.facts import Facts, Missing, ProbeFacts
from stackgate.facts.deepruns import (
    FLASHWORK,
    GATE_TIMEOUT_S,
    SCRIPT,
    Launch,
    flashinfer_env,
    jit_workspace,
    launch_env,
)
from stackgate.models import settings
from stackgate.models.finding import Finding, Fix
from stackgate.models.result import NEEDS_GPU, NO_DRIVER, Result, Status
from stackgate.models.spec import MAX_JIT_TIMEOUT_S, Spec

__all__ = [
    "ATTENTION_ATOL",
    "FUSION_FLAG",
    "PEER_FLOOR",
    "PREREQUISITES",
    "RATES",
    "SKIP_PASSES",
    "TOLERANCE",
    "TUNING",
    "close_enough",
    "fusion_atol",
    "JitContext",
    "Known",
    "launch",
    "not_run",
    "world_size",
]

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


def launch(name: str, spec: Spec, facts: Facts) -> Launch | None:
    """What deep check ``name`` will start (interpreter, script, environment), so that verify can start
    it ahead; None when it will most likely start nothing (no GPU, a CPU build of torch or none, no
    flashinfer in the stack, one rank for the fusion)."""
    if isinstance(facts.nvml, Missing) or not facts.nvml.gpus or not _cuda_torch_installed(facts):
        return None
    if name in ("deep.gpu_work", "deep.collective"):
        return Launch(spec.python.target, SCRIPT, launch_env(spec, facts))
    if name == "deep.flashinfer_attention" and _uses_flashinfer(spec):
        return Launch(spec.python.target, FLASHWORK, flashinfer_env(spec, facts))
    if name == "deep.allreduce_fusion" and FUSION_FLAG in spec.smoke.flags and world_size(spec, facts.probe)[0] > 1:
        return Launch(spec.python.target, FLASHWORK, flashinfer_env(spec, facts))
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


def world_size(spec: Spec, probe: ProbeFacts | Missing) -> tuple[int, int]:
    """(ranks to run, ranks wanted): the lock's TP size, capped by the GPUs torch sees."""
    wanted = spec.smoke.tp
    present = probe.torch.get("device_count") if isinstance(probe, ProbeFacts) and probe.torch else None
    return (min(wanted, present) if isinstance(present, int) and present > 0 else wanted), wanted


def _uses_flashinfer(spec: Spec) -> bool:
    return (
        spec.smoke.attention_backend == "flashinfer"
        or spec.python.package("flashinfer-python") is not None
        or FUSION_FLAG in spec.smoke.flags
    )


_UNKNOWN = "The cause is not known from this output: read the full log."
_KILLED = "Read the run's full log; it names the command that ran."
_IMPORT_BY_HAND = "Import flashinfer by hand in the stack's interpreter to see the whole error."
#: The fixes that only say where to look: a result carrying one asks the evidence sweep (checks.unexplained).
_LOOKS = (_UNKNOWN, _KILLED, _IMPORT_BY_HAND)


def _log_fix(log: Path) -> Fix:
    """Where the output does not say why: the log, never a reset or a drain on a guess."""
    return Fix(_UNKNOWN, (f"less {log}", "nvidia-smi -q -d PERFORMANCE,CLOCK"))


def _limit_s() -> float:
    """A deep check's own limit: its run's ($STACKGATE_DEEP_TIMEOUT_S, read when it runs) and a minute to read
    the figures."""
    return settings.DEEP_TIMEOUT_S.value() + 60


def _code(returncode: int | None) -> str:
    return "timed out" if returncode is None else f"exit {returncode}"


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


def _classified(text: str, spec: Spec) -> Known | None:
    from stackgate.models import knowledge  # the knowledge base loads only to explain a failure: a cached verify
    from stackgate.scan import match_first  # skips both

    match = match_first(text, context=knowledge.spec_context(spec))
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


def _jit_context(spec: Spec, facts: Facts, env: Mapping[str, str], timeout_s: float) -> JitContext:
    locked = spec.python.package("flashinfer-jit-cache")
    workspace, origin = jit_workspace(spec, env)
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


def _flashinfer_import_fix(spec: Spec, error: str) -> Fix:
    """An install where the error names a module or library that is not there; else the import by hand (and the
    evidence sweep): a reinstall only on evidence."""
    by_hand = f"{spec.python.target} -c 'import flashinfer'"
    missing = missing_piece(error)
    if missing is None:
        return Fix(_IMPORT_BY_HAND, (by_hand,))
    return Fix(
        f"{missing} is not installed: install flashinfer-python in the stack at the lock's version, with its "
        "dependencies (apache-tvm-ffi, nvidia-cudnn-frontend) and flashinfer-cubin of the same release if any; then "
        "import it by hand to see the whole error.",
        ("stackgate provision --only python", by_hand),
    )


def _run_output(begin: Mapping[str, Any], records: Sequence[Mapping[str, Any]], tail: Sequence[str]) -> str:
    """What a run said of its failure: its start's error and trace, its records' errors, its log's tail."""
    parts = [begin.get("trace") or begin.get("error") or ""]
    parts += [str(r.get("trace") or r.get("error") or "") for r in records]
    return "\n".join([*parts, *tail])
