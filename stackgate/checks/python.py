"""Checks of the stack's Python environment, from the probe its own interpreter ran."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from stackgate.checks.core import check
from stackgate.checks.unexplained import missing_piece, unexplained
from stackgate.edges.nvml import GpuInfo, NvmlSnapshot
from stackgate.facts import Facts, Missing, ProbeFacts
from stackgate.facts.compare import conflicts, locked_problems, pin_problem
from stackgate.models.finding import Fix
from stackgate.models.pylock import differences, lock_command
from stackgate.models.result import Result, failed, passed, skipped, warned
from stackgate.models.spec import Spec

__all__ = ["hidden_by"]

_PROVISION = "stackgate provision --only python"


def _probe(facts: Facts) -> ProbeFacts | Result:
    probe = facts.probe
    if isinstance(probe, Missing):
        return skipped("no probe of the stack's interpreter (see python.interpreter)", [probe.reason])
    return probe


@check("python.interpreter", needs=("probe",))
def interpreter(spec: Spec, facts: Facts) -> Result:
    """The stack's interpreter runs and is the locked Python version."""
    probe = facts.probe
    if isinstance(probe, Missing):
        commands = ("stackgate provision",) if spec.python.root else ()
        return failed(
            probe.reason,
            fix=Fix(
                "Create the stack's environment."
                if commands
                else "Point python.interpreter at an existing interpreter.",
                commands,
            ),
        )
    have = ".".join(probe.python_version.split(".")[:2])
    data = {"executable": probe.executable, "version": probe.python_version, "probe_s": round(probe.duration_s, 3)}
    if have != spec.python.version:
        return failed(
            f"{probe.executable} is Python {probe.python_version}, the lock wants {spec.python.version}",
            fix=Fix("Rebuild the environment with the locked Python.", ("stackgate provision --only python",)),
            data=data,
        )
    return passed(f"Python {probe.python_version} at {probe.executable}", data=data)


@check("python.pins", needs=("probe",))
def pins(spec: Spec, facts: Facts) -> Result:
    """Every locked package is installed at exactly its locked version."""
    probe = _probe(facts)
    if isinstance(probe, Result):
        return probe
    watched = [p for p in spec.python.packages if p.name not in spec.python.frozen]
    if not watched:
        return skipped(
            "every pinned package is frozen (see python.frozen)" if spec.python.packages else "the lock pins no package"
        )
    wrong = [problem for p in watched if (problem := pin_problem(probe, p))]
    data = {p.name: (dist.version if (dist := probe.dist(p.name)) else None) for p in watched}
    if wrong:
        return failed(
            f"{len(wrong)} of {len(watched)} pinned package(s) differ: {wrong[0]}",
            wrong,
            Fix("Install the locked versions.", (_PROVISION,)),
            data,
        )
    return passed(f"{len(watched)} pinned package(s) at their locked versions", data=data)


@check("python.frozen", needs=("probe",))
def frozen(spec: Spec, facts: Facts) -> Result:
    """The guard's frozen packages (torch and its family) have not moved."""
    probe = _probe(facts)
    if isinstance(probe, Result):
        return probe
    guarded = [p for p in spec.python.packages if p.name in spec.python.frozen]
    if not guarded:
        return skipped("the lock freezes no package")
    moved = [problem for p in guarded if (problem := pin_problem(probe, p))]
    data = {p.name: (dist.version if (dist := probe.dist(p.name)) else None) for p in guarded}
    if moved:
        fix = Fix(
            "Something upgraded a frozen package. Reinstall the lock with the guard in force; "
            "install later packages with the stack's constraints (stackgate.env exports PIP_CONSTRAINT and "
            "UV_CONSTRAINT).",
            (_PROVISION,),
        )
        return failed(f"frozen package(s) moved: {moved[0]}", moved, fix, data)
    return passed("frozen: " + ", ".join(f"{p.name} {data[p.name]}" for p in guarded), data=data)


@check("python.locked", needs=("probe", "pylock"))
def locked(spec: Spec, facts: Facts) -> Result:
    """Every installed distribution is the pylock's: none missing or extra, same version, same file."""
    probe = _probe(facts)
    if isinstance(probe, Result):
        return probe
    resolution = facts.pylock
    if isinstance(resolution, Missing):
        return skipped(resolution.reason)
    problems = locked_problems(probe, resolution)
    data = {
        "pylock": str(resolution.path),
        "sha256": resolution.sha256,
        "locked": len(resolution.packages),
        "distributions": len(probe.distributions),
        "differences": problems,
    }
    if problems:
        return failed(
            f"{len(problems)} difference(s) from {resolution.path.name}: {problems[0]}",
            problems,
            Fix("Install exactly the pylock.", (_PROVISION,)),
            data,
        )
    stale = differences(spec, resolution)
    if stale:
        fix = Fix(
            "The spec changed since the pylock was made: resolve it again, then provision.",
            (lock_command(spec.path), _PROVISION),
        )
        return warned(
            f"installed exactly as {resolution.path.name}, but the pylock no longer matches the spec: {stale[0]}",
            stale,
            fix,
            data,
        )
    return passed(
        f"{len(probe.distributions)} distributions exactly as {resolution.path.name} (sha256 {resolution.sha256[:12]})",
        data=data,
    )


@check("python.consistency", needs=("probe",))
def consistency(spec: Spec, facts: Facts) -> Result:
    """The installed distributions' requirements agree (pip check), apart from declared overrides."""
    probe = _probe(facts)
    if isinstance(probe, Result):
        return probe
    accepted, rejected = [], []
    for conflict in conflicts(probe.distributions, probe.markers):
        override = spec.python.override(conflict.package)
        if override and conflict.installed and override.specifier.contains(conflict.installed, prereleases=True):
            accepted.append(f"accepted override: {conflict} (reason: {override.reason})")
        else:
            rejected.append(str(conflict))
    data = {"accepted": accepted, "conflicts": rejected, "distributions": len(probe.distributions)}
    if rejected:
        return failed(
            f"{len(rejected)} requirement conflict(s): {rejected[0]}",
            rejected + accepted,
            Fix(
                "Install the locked stack with its constraints; add an override to the lock only with a reason.",
                (_PROVISION,),
            ),
            data,
        )
    summary = f"{len(probe.distributions)} distributions consistent"
    return passed(summary + (f", {len(accepted)} accepted override(s)" if accepted else ""), accepted, data)


@check("torch.build", needs=("probe",))
def torch_build(spec: Spec, facts: Facts) -> Result:
    """torch imports and is a CUDA build of the locked CUDA version."""
    probe = _probe(facts)
    if isinstance(probe, Result):
        return probe
    want = spec.python.torch_cuda
    torch = probe.torch
    if torch is None:
        return failed(
            "torch is not installed in the stack's environment", fix=Fix("Install the locked torch.", (_PROVISION,))
        )
    if not torch["imported"]:
        trace = torch.get("traceback", "")
        summary, lines = f"import torch fails: {torch['error']}", trace.strip().splitlines()[-8:]
        missing = missing_piece(trace)
        if missing is not None:
            return failed(summary, lines, Fix(f"{missing} is not installed: install the locked torch.", (_PROVISION,)))
        by_hand = Fix(_TORCH_BY_HAND, (f"{spec.python.target} -c 'import torch'",))
        return unexplained(failed(summary, lines, by_hand), facts, trace)
    data = {"version": torch["version"], "cuda": torch["cuda"], "hip": torch["hip"], "want_cuda": want}
    fix = Fix(
        f"Install torch from the CUDA {want} index the lock names (the plain PyPI wheel may be another CUDA build).",
        (_PROVISION,),
    )
    if torch["hip"]:
        return failed(
            f"torch {torch['version']} is a ROCm build (HIP {torch['hip']}), not CUDA {want}", fix=fix, data=data
        )
    if not torch["cuda"]:
        return failed(
            f"torch {torch['version']} is a CPU build: it has no CUDA (the lock wants CUDA {want})", fix=fix, data=data
        )
    if want and torch["cuda"] != want:
        return failed(
            f"torch {torch['version']} is a CUDA {torch['cuda']} build, the lock wants CUDA {want}", fix=fix, data=data
        )
    return passed(f"torch {torch['version']} is a CUDA {torch['cuda']} build", data=data)


@check("torch.arch", needs=("probe", "nvml", "env"))
def torch_arch(spec: Spec, facts: Facts) -> Result:
    """torch sees the GPUs NVML lists and carries kernels for every GPU's compute capability."""
    probe = _probe(facts)
    if isinstance(probe, Result):
        return probe
    torch = probe.torch
    if not torch or not torch["imported"] or not torch["cuda"]:
        return skipped("torch is not an importable CUDA build (see torch.build)")
    snap = facts.nvml
    visible = facts.env.environ.get("CUDA_VISIBLE_DEVICES")
    hidden = _unseen(torch, snap, visible, spec)
    if hidden is not None:
        said = f"{torch.get('device_count')} {torch.get('cuda_available')}"
        return hidden if visible is not None else unexplained(hidden, facts, said)
    arch_list = torch["arch_list"]
    if isinstance(arch_list, dict):
        return failed(f"torch cannot list its architectures: {arch_list['error']}")
    wanted = sorted({g.capability for g in snap.gpus if g.capability}) if not isinstance(snap, Missing) else []
    if not arch_list:
        return _no_arch_list(torch, len(snap.gpus) if not isinstance(snap, Missing) else 0)
    source = "the GPUs" if wanted else "the lock (no GPU visible)"
    wanted = wanted or [(spec.hardware.compute_capability.major, spec.hardware.compute_capability.minor)]
    coverage = {f"{m}.{n}": _covered(arch_list, m, n) for m, n in wanted}
    data = {"arch_list": arch_list, "coverage": coverage}
    missing = [cc for cc, how in coverage.items() if how is None]
    if missing:
        fix = Fix(
            f"Install a torch build whose arch list includes sm_{missing[0].replace('.', '')} (the cu128/cu130 "
            "builds carry sm_120).",
            (_PROVISION,),
        )
        carries = " ".join(arch_list) or "no arch at all"
        return failed(
            f"torch {torch['version']} has no kernels for compute capability {', '.join(missing)} ({source}); it "
            f"carries {carries}",
            fix=fix,
            data=data,
        )
    covered = {cc: how for cc, how in coverage.items() if how is not None}
    jit = [cc for cc, how in covered.items() if how.startswith("compute_")]
    if jit:
        return warned(
            f"compute capability {', '.join(jit)} runs only through PTX JIT ({', '.join(covered[c] for c in jit)}): "
            "slow first launches",
            data=data,
        )
    return passed(f"torch covers {', '.join(f'{cc} ({how})' for cc, how in covered.items())} from {source}", data=data)


_TORCH_BY_HAND = "Import torch by hand in the stack's interpreter to see the whole error."


def hidden_by(value: str, gpus: Sequence[GpuInfo]) -> tuple[int, str]:
    """How many of ``gpus`` CUDA_VISIBLE_DEVICES=``value`` hides, and what it names that is not there.

    CUDA reads the list up to the first entry that names no GPU, so an index past the last GPU ends it.

    >>> from types import SimpleNamespace as GPU
    >>> gpus = [GPU(index=0, uuid="GPU-aa"), GPU(index=1, uuid="GPU-bb")]
    >>> hidden_by("", gpus), hidden_by("3", gpus), hidden_by("1,3,0", gpus), hidden_by("GPU-bb", gpus)
    ((2, ''), (2, '3'), (1, '3'), (1, ''))
    """
    seen: set[int] = set()
    for entry in (e.strip() for e in value.split(",") if e.strip()):
        found = next(
            (
                g.index
                for g in gpus
                if (entry.isdigit() and int(entry) == g.index) or (len(entry) > 4 and g.uuid.startswith(entry))
            ),
            None,
        )
        if found is None:
            return len(gpus) - len(seen), entry
        seen.add(found)
    return len(gpus) - len(seen), ""


def _unseen(torch: Mapping[str, Any], snap: NvmlSnapshot | Missing, visible: str | None, spec: Spec) -> Result | None:
    """The FAIL when torch sees none of the GPUs NVML lists (its arch list is then empty: nothing to judge), naming
    CUDA_VISIBLE_DEVICES when it hides them; None when torch sees a GPU or NVML lists none."""
    count = torch.get("device_count")
    # device_count can come from NVML while CUDA itself cannot start (an address-space limit did that on an H200:
    # device_count 1, is_available() False): such a torch sees no GPU either.
    usable = isinstance(count, int) and count > 0 and torch.get("cuda_available") is not False
    if isinstance(snap, Missing) or not snap.gpus or usable:
        return None
    total = len(snap.gpus)
    data = {"device_count": count, "nvml_gpus": total, "CUDA_VISIBLE_DEVICES": visible}
    judged = "torch's arch list is judged only when torch sees the GPUs"
    if visible is not None:
        hides, missing = hidden_by(visible, snap.gpus)
        named = (
            f": it names {missing}, which is not a GPU here (NVML lists {', '.join(str(g.index) for g in snap.gpus)})"
            if missing
            else ""
        )
        summary = (
            f"torch sees no GPU: CUDA_VISIBLE_DEVICES={visible!r} hides {hides} of the {total} GPU(s) NVML "
            f"lists{named}; {judged}"
        )
        fix = Fix(
            "Unset CUDA_VISIBLE_DEVICES, or set it to GPU indices or UUIDs that exist, in the shell or unit that runs "
            "the stack.",
            ("nvidia-smi -L",),
        )
        return failed(summary, fix=fix, data=data)
    why = torch.get("cuda_available")
    said = (
        f" (torch.cuda.device_count() said {count!r})"
        if isinstance(count, dict)
        else f" (torch.cuda.device_count() is {count}, torch.cuda.is_available() is False)"
        if isinstance(count, int) and count > 0
        else ""
    )
    summary = (
        f"torch sees none of the {total} GPU(s) NVML lists{said}, and CUDA_VISIBLE_DEVICES is not set: the cause is "
        f"not known from this; {judged}"
    )
    command = f"{spec.python.target} -c 'import torch; torch.cuda.init()'"
    return failed(
        summary,
        fix=Fix("Initialise CUDA by hand in the stack's interpreter: its error names the cause.", (command,)),
        data={**data, "cuda_available": why},
    )


def _no_arch_list(torch: Mapping[str, Any], nvml_gpus: int) -> Result:
    """torch.cuda.get_arch_list() is empty whenever torch sees no GPU: nothing to judge from it."""
    seen = f"torch.cuda.is_available() is {torch.get('cuda_available')}"
    data: dict[str, Any] = {"arch_list": [], "cuda_available": torch.get("cuda_available"), "nvml_gpus": nvml_gpus}
    if not nvml_gpus:
        return skipped(
            f"torch {torch['version']} lists no architectures: it sees no GPU ({seen}) and NVML lists none", data=data
        )
    fix = Fix("Make the GPUs visible to torch (see CUDA_VISIBLE_DEVICES and `nvidia-smi`), then verify again.", ())
    why = f"torch {torch['version']} sees none of the {nvml_gpus} GPU(s) NVML lists ({seen})"
    return failed(f"{why}, so its arch list is empty and its kernels cannot be judged", fix=fix, data=data)


def _covered(arch_list: list[str], major: int, minor: int) -> str | None:
    """The arch-list entry that runs on a GPU of capability major.minor, if any.

    >>> _covered(["sm_90", "sm_120", "compute_120"], 12, 0)
    'sm_120'
    >>> _covered(["sm_80", "compute_80"], 9, 0)
    'compute_80'
    >>> _covered(["sm_80", "sm_90"], 12, 0) is None
    True
    """
    for entry in arch_list:
        kind, _, number = entry.partition("_")
        number = number.rstrip("af")
        if kind == "sm" and number.isdigit() and int(number) // 10 == major and int(number) % 10 <= minor:
            return entry
    for entry in arch_list:
        kind, _, number = entry.partition("_")
        if kind == "compute" and number.isdigit() and int(number) <= major * 10 + minor:
            return entry
    return None


@check("flashinfer.cubin", needs=("probe",))
def flashinfer_cubin(spec: Spec, facts: Facts) -> Result:
    """flashinfer-cubin (and flashinfer-jit-cache) match flashinfer-python's version."""
    probe = _probe(facts)
    if isinstance(probe, Result):
        return probe
    python = probe.dist("flashinfer-python")
    if python is None:
        return skipped("flashinfer-python is not installed")
    cubin, jit = probe.dist("flashinfer-cubin"), probe.dist("flashinfer-jit-cache")
    data = {
        "flashinfer-python": python.version,
        "flashinfer-cubin": cubin.version if cubin else None,
        "flashinfer-jit-cache": jit.version if jit else None,
    }
    problems = []
    if cubin and cubin.version != python.version:
        problems.append(
            f"flashinfer-cubin {cubin.version} != flashinfer-python {python.version}: import flashinfer raises "
            "RuntimeError"
        )
    if jit and not jit.version.startswith(python.version):
        problems.append(f"flashinfer-jit-cache {jit.version} is not a build of flashinfer-python {python.version}")
    if problems:
        return failed(
            problems[0],
            problems,
            Fix("Install flashinfer-cubin (and flashinfer-jit-cache) at flashinfer-python's version.", (_PROVISION,)),
            data,
        )
    return passed(
        f"flashinfer-python {python.version}"
        + "".join(f", {k} {v}" for k, v in data.items() if v and k != "flashinfer-python"),
        data=data,
    )
