"""engine.fusion_gate: before any launch, whether the fused all-reduce that [smoke] flags ask for is
admitted here, by flashinfer (the majors its comm module builds for) and by the serving engine (the
majors its own runtime gate admits, and how it refuses the others: silently, or with an error at
start-up). Both gates are read from the installed code (:mod:`stackgate.edges.flashgate`); the GPUs'
compute capability from NVML. ``deep.allreduce_fusion`` runs the fused kernel; this check says, without
a GPU's work, which component refuses the fused path in production, if any."""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping, Sequence

from stackgate.checks.core import check
from stackgate.facts import Facts, Missing
from stackgate.facts.flashruns import FusionGate, read_gate
from stackgate.models.finding import Fix
from stackgate.models.result import Result, failed, passed, skipped, warned
from stackgate.models.spec import Spec

__all__ = ["engine_refusal", "fusion_arch_problem", "fusion_gate", "gate_evidence", "gpu_capabilities", "majors_of"]


def _majors(text: str) -> set[int]:
    """The compute capability majors of FLASHINFER_CUDA_ARCH_LIST, split as flashinfer splits it.

    >>> sorted(_majors("12.0a 9.0"))
    [9, 12]
    """
    return {int(arch.split(".")[0]) for arch in text.split(" ") if arch.split(".")[0].isdigit()}


def majors_of(capabilities: Sequence[str]) -> set[int]:
    """The majors of capabilities written "12.0" ("unknown" ones left out).

    >>> sorted(majors_of(["12.0", "12.0", "9.0", "unknown"]))
    [9, 12]
    """
    return {int(cc.split(".")[0]) for cc in capabilities if cc.split(".")[0].isdigit()}


def fusion_arch_problem(gpu_majors: set[int], supported: Sequence[int], arch_list: str | None) -> str | None:
    """Why flashinfer's fused path cannot run on these GPUs, or None.

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


def engine_refusal(sglang: Mapping[str, Any] | None, gpu_majors: set[int]) -> str | None:
    """Why the installed sglang refuses the fused path on GPUs of these majors, or None (it admits
    them, or its gate could not be read: nothing is assumed).

    >>> gate = {"version": "0.5.23", "function": "_resolve_backend", "supported_majors": [9, 10],
    ...         "refusal": "raises", "message": "ValueError: needs SM90 or SM10X"}
    >>> print(engine_refusal(gate, {12}))  # doctest: +NORMALIZE_WHITESPACE
    sglang 0.5.23 admits the fused all-reduce on majors [9, 10] only (its _resolve_backend()):
    on major 12 its start-up raises ValueError: needs SM90 or SM10X
    >>> engine_refusal(gate, {9}) is None, engine_refusal({"error": "no gate"}, {12}) is None
    (True, True)
    """
    supported = sglang.get("supported_majors") if sglang else None
    if sglang is None or not isinstance(supported, list):
        return None
    outside = sorted(gpu_majors - set(supported))
    if not outside:
        return None
    how = (
        f"its start-up raises {sglang.get('message')}"
        if sglang.get("refusal") == "raises"
        else str(sglang.get("message") or "the flag is a no-op")
    )
    return (
        f"sglang {sglang.get('version')} admits the fused all-reduce on majors {supported} only "
        f"(its {sglang.get('function')}()): on major {', '.join(map(str, outside))} {how}"
    )


def gpu_capabilities(facts: Facts, spec: Spec) -> tuple[list[str], str]:
    """Each GPU's compute capability ("12.0"), and where it was read."""
    snapshot = facts.nvml
    if isinstance(snapshot, Missing) or not snapshot.gpus:
        return [
            str(spec.hardware.compute_capability)
        ] * spec.hardware.gpu_count, "the lock's [hardware] (NVML gave none)"
    return ["{}.{}".format(*gpu.capability) if gpu.capability else "unknown" for gpu in snapshot.gpus], "NVML"


def gate_evidence(gate: FusionGate, capabilities: Sequence[str], source: str, arch_list: str | None) -> list[str]:
    """The lines that show both gates: the GPUs, what flashinfer builds for, what sglang admits, the arch list."""
    fi = gate.flashinfer
    counts = ", ".join(f"{n} x {cc}" for cc, n in sorted(Counter(capabilities).items()))
    lines = [
        f"GPUs: compute capability {counts} (from {source})",
        f"flashinfer {fi.get('version')}: {fi.get('function')}() builds for "
        f"supported_major_versions={fi.get('supported_majors')} (read from {fi.get('file')})",
    ]
    sglang = gate.sglang
    if sglang and "supported_majors" in sglang:
        refuses = "raises at start-up" if sglang.get("refusal") == "raises" else "is a no-op"
        lines.append(
            f"sglang {sglang.get('version')}: {sglang.get('function')}() admits majors {sglang['supported_majors']}, "
            f"elsewhere the flag {refuses} (read from {sglang.get('file')} and {sglang.get('helpers')})"
        )
    elif sglang:
        lines.append(f"sglang {sglang.get('version')}: its gate could not be read: {sglang.get('error')}")
    lines.append(
        f"FLASHINFER_CUDA_ARCH_LIST={arch_list} (flashinfer compiles for these archs, not the GPUs')"
        if arch_list
        else "FLASHINFER_CUDA_ARCH_LIST unset: flashinfer compiles for the GPUs' own archs"
    )
    return lines


def _fix(flag: str) -> Fix:
    return Fix(
        f"Drop {flag} from [smoke] flags for this hardware (the TP all-reduce then runs on NCCL), or install a "
        "flashinfer and an sglang whose gates admit this GPU's major.",
        ("stackgate verify --check engine.fusion_gate", "stackgate verify --deep --check deep.allreduce_fusion"),
    )


@check("engine.fusion_gate", needs=("env", "nvml"))
def fusion_gate(spec: Spec, facts: Facts) -> Result:
    """The fused all-reduce [smoke] flags ask for is admitted on these GPUs by flashinfer and by sglang."""
    engine = spec.smoke.serving
    if not engine.fusion_asked(spec.smoke.flags) or engine.name != "sglang":
        return skipped("the lock's [smoke] flags ask for no fused all-reduce of sglang's")
    python = spec.python.target
    if not python.exists():
        return skipped(f"the stack's interpreter {python} does not exist: no installed code to read the gates from")
    gate = read_gate(python, facts.env.environ)
    if not isinstance(gate.flashinfer.get("supported_majors"), list):
        return skipped(
            f"flashinfer's gate could not be read ({gate.flashinfer.get('error')}): deep.allreduce_fusion says why"
        )
    capabilities, source = gpu_capabilities(facts, spec)
    arch_list = facts.env.environ.get("FLASHINFER_CUDA_ARCH_LIST")
    majors = majors_of(capabilities)
    evidence = gate_evidence(gate, capabilities, source, arch_list)
    flashinfer = fusion_arch_problem(majors, gate.flashinfer["supported_majors"], arch_list)
    refusal = engine_refusal(gate.sglang, majors)
    data: dict[str, Any] = {
        "flashinfer_gate": dict(gate.flashinfer),
        "sglang_gate": dict(gate.sglang) if gate.sglang else None,
        "refused_by": [name for name, why in (("sglang", refusal), ("flashinfer", flashinfer)) if why],
    }
    if refusal is not None:
        alone = (
            f"flashinfer {gate.flashinfer.get('version')} alone would allow it (its comm module builds for majors "
            f"{gate.flashinfer['supported_majors']})"
            if flashinfer is None
            else f"flashinfer refuses too: {flashinfer}"
        )
        if gate.sglang and gate.sglang.get("refusal") == "raises":
            summary = f"{refusal}: `stackgate smoke` with {engine.fusion_flag} will fail at start-up; {alone}"
            return failed(summary, evidence, _fix(engine.fusion_flag), data)
        return warned(
            f"{refusal}: {engine.fusion_flag} is a no-op on this machine; {alone}",
            evidence,
            _fix(engine.fusion_flag),
            data,
        )
    if flashinfer is not None:
        return warned(
            f"flashinfer refuses the fused path: {flashinfer}: {engine.fusion_flag} is a no-op",
            evidence,
            _fix(engine.fusion_flag),
            data,
        )
    if not gate.sglang or "supported_majors" not in gate.sglang:
        why = f"its gate could not be read: {gate.sglang.get('error')}" if gate.sglang else "it is not installed"
        return skipped(f"flashinfer admits major {', '.join(map(str, sorted(majors)))}; sglang: {why}", evidence)
    return passed(
        f"flashinfer {gate.flashinfer.get('version')} and sglang {gate.sglang.get('version')} both admit the fused "
        f"all-reduce on compute capability major {', '.join(map(str, sorted(majors)))}: `verify --deep` runs it",
        evidence,
        data,
    )
