"""The evidence sweep: what commonly breaks a GPU stack and is visible from outside it, looked at once a failure's
own output does not say why, and the cause it shows.

It observes (:func:`observe`) the resource limits the stack's processes get, every path-valued variable in play
(existence, type, permission, free space), the integrity of the stack's shared objects (their ELF headers and the
sizes their RECORD gives them) and the kernel's GPU events; it judges (:func:`judge`, pure) those observations with
the failure's own output, whose first real error (:func:`first_error`) it digs out of a build log. What is abnormal
is the cause, with its own fix; when nothing is, :func:`checked` says what was looked at. Every check and run that
fails without a known cause (static, deep, smoke, provision) asks this one module.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from stackgate.edges import elf
from stackgate.facts.values import KernelEvents, Missing, ProbeFacts
from stackgate.models.finding import Evidence, Finding, Fix
from stackgate.models.kernelevents import KernelEvent
from stackgate.models.result import Result, Status

__all__ = [
    "Cause",
    "as_finding",
    "Damage",
    "EvidenceSweep",
    "Limit",
    "PathState",
    "checked",
    "damaged_objects",
    "explain",
    "first_error",
    "judge",
    "observe",
    "path_problem",
    "read_limits",
    "with_cause",
]

UNLIMITED = -1
#: The limits read from ``/proc/<pid>/limits``: its row name, the ulimit flag that sets it, and its systemd key.
_LIMITS = {
    "Max address space": ("address space", "-v", "LimitAS"),
    "Max data size": ("data size", "-d", "LimitDATA"),
    "Max open files": ("open files", "-n", "LimitNOFILE"),
    "Max locked memory": ("locked memory", "-l", "LimitMEMLOCK"),
    "Max stack size": ("stack size", "-s", "LimitSTACK"),
    "Max processes": ("processes", "-u", "LimitNPROC"),
    "Max file size": ("file size", "-f", "LimitFSIZE"),
}
#: The least each limit may be for CUDA, NCCL and the engine (None: it must be unlimited), and what a lower one does.
_NEEDS: dict[str, tuple[int | None, str]] = {
    "address space": (
        None,
        "CUDA reserves far more virtual address space than any GPU's memory at cuInit, which then fails with "
        "'out of memory' (or torch's import, mapping its libraries, with 'cannot allocate memory')",
    ),
    "data size": (None, "CUDA's and torch's allocations count against it: they fail with 'out of memory'"),
    "open files": (
        1024,
        "the CUDA driver, NCCL and the engine each hold many descriptors per GPU; at the limit CUDA says a device is "
        "'busy or unavailable' and NCCL's sockets fail",
    ),
    "stack size": (1 << 20, "threads of torch, NCCL and the engine start with this stack and die on a deep call"),
    "processes": (4096, "torch, NCCL and the engine start many threads, each counted here: they fail to start"),
    "file size": (None, "a JIT module, a cache or a download larger than it is cut short (SIGXFSZ)"),
}
#: Path-valued variables: the kind of path each names ("dir" written to, "toolkit" with bin/nvcc, "tool" run).
_PATHS = {
    "CUDA_HOME": "toolkit",
    "CUDA_PATH": "toolkit",
    "TRITON_PTXAS_PATH": "tool",
    "FLASHINFER_WORKSPACE_BASE": "dir",
    "FLASHINFER_JIT_DIR": "dir",
    "TORCH_EXTENSIONS_DIR": "dir",
    "TRITON_CACHE_DIR": "dir",
    "TRITON_HOME": "dir",
    "TORCHINDUCTOR_CACHE_DIR": "dir",
    "CUDA_CACHE_PATH": "dir",
    "XDG_CACHE_HOME": "dir",
    "HF_HOME": "dir",
    "HF_HUB_CACHE": "dir",
    "TMPDIR": "dir",
}
#: Less free space than this under a folder the stack writes is a full disk to a JIT build or a download.
MIN_FREE = 1 << 30


@dataclass(frozen=True)
class Limit:
    name: str  #: "open files"
    soft: int  #: UNLIMITED or the value (bytes for sizes)
    hard: int
    flag: str  #: the ulimit flag: -n
    unit: str  #: the systemd key: LimitNOFILE


@dataclass(frozen=True)
class PathState:
    variable: str  #: CUDA_HOME, or LD_LIBRARY_PATH[2]
    path: str
    problem: str | None  #: what is wrong with it, None when nothing is


@dataclass(frozen=True)
class Damage:
    path: str
    distribution: str
    version: str
    why: str


@dataclass(frozen=True)
class EvidenceSweep:
    """What the sweep saw: the limits, the paths, the stack's shared objects (how many, which are damaged), the
    kernel's GPU events; each may be Missing with its reason."""

    limits: tuple[Limit, ...] | Missing
    paths: tuple[PathState, ...]
    objects: int | Missing  #: how many shared objects of the stack were checked
    damaged: tuple[Damage, ...]
    kernel: tuple[KernelEvent, ...] | Missing
    python: str = ""  #: the stack's interpreter, for the fixes


@dataclass(frozen=True)
class Cause:
    """What the sweep found abnormal: the fact, and its fix."""

    text: str
    fix: Fix


# --- observation ---------------------------------------------------------------------------------


def read_limits(pid: int | str = "self") -> tuple[Limit, ...] | Missing:
    """The resource limits of a process as the kernel applies them (``/proc/<pid>/limits``): the stack's processes
    inherit stackgate's own, so ``self`` is what they get."""
    try:
        text = Path(f"/proc/{pid}/limits").read_text()
    except OSError as exc:
        return Missing(f"/proc/{pid}/limits is not readable: {exc.strerror}")
    found = []
    for row in text.splitlines()[1:]:
        label = next((k for k in _LIMITS if row.startswith(k)), None)
        fields = row[len(label) :].split() if label else []
        if label is None or len(fields) < 2:
            continue
        name, flag, unit = _LIMITS[label]
        soft, hard = (UNLIMITED if v == "unlimited" else int(v) if v.isdigit() else UNLIMITED for v in fields[:2])
        found.append(Limit(name, soft, hard, flag, unit))
    return tuple(found)


def path_problem(path: Path, kind: str) -> str | None:
    """What is wrong with ``path`` for its use (``dir``: a folder written to, made if absent; ``toolkit``: a CUDA home
    with bin/nvcc; ``tool``: a program; ``libdir``: a folder searched), or None.

    >>> path_problem(Path("/proc/self/status"), "dir")
    'it is a file, not a folder'
    >>> path_problem(Path("/"), "toolkit")
    'it has no bin/nvcc'
    """
    if kind == "toolkit":
        if not path.is_dir():
            return "it does not exist" if not path.exists() else "it is a file, not a folder"
        return None if (path / "bin" / "nvcc").is_file() else "it has no bin/nvcc"
    if kind == "tool":
        if not path.is_file():
            return "it does not exist" if not path.exists() else "it is not a file"
        return None if os.access(path, os.X_OK) else "it is not executable"
    if kind == "libdir":
        return None if path.is_dir() or not path.exists() else "it is a file, not a folder"
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("/"))
    if not existing.is_dir():
        return "it is a file, not a folder" if existing == path else f"{existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{'it' if existing == path else existing} is not writable by this user"
    free = shutil.disk_usage(existing).free
    return f"its filesystem has {free / 2**20:.0f} MiB free" if free < MIN_FREE else None


def _paths(environ: Mapping[str, str]) -> tuple[PathState, ...]:
    found = [
        PathState(name, environ[name], path_problem(Path(environ[name]), kind))
        for name, kind in _PATHS.items()
        if environ.get(name)
    ]
    entries = [e for e in environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if e]
    found += [PathState(f"LD_LIBRARY_PATH[{i}]", e, path_problem(Path(e), "libdir")) for i, e in enumerate(entries)]
    return tuple(found)


def damaged_objects(dists: ProbeFacts) -> tuple[int, tuple[Damage, ...]]:
    """How many shared objects the stack's distributions hold, and those cut short: a size other than their RECORD's,
    or ELF headers that point past their end (the headers are read, not the whole file)."""
    count, found = 0, []
    for dist in dists.distributions.values():
        for path, size in dist.object_sizes.items():
            count += 1
            try:
                actual = os.path.getsize(path)
            except OSError as exc:
                found.append(Damage(path, dist.name, dist.version, f"RECORD lists it but it is gone ({exc.strerror})"))
                continue
            why = (
                f"{actual} bytes where its RECORD says {size}: cut short"
                if size is not None and actual < size
                else elf.damaged(path)
            )
            if why is not None:
                found.append(Damage(path, dist.name, dist.version, why))
    return count, tuple(found)


def observe(
    environ: Mapping[str, str],
    dists: ProbeFacts | Missing,
    kernel: KernelEvents | Missing,
    *,
    python: str = "",
    limits: tuple[Limit, ...] | Missing | None = None,
) -> EvidenceSweep:
    """The sweep's observations, for the environment the stack runs in (``limits``: this process's, passed on)."""
    if isinstance(dists, Missing):
        objects: int | Missing = dists
        damage: tuple[Damage, ...] = ()
    else:
        objects, damage = damaged_objects(dists)
    events = kernel if isinstance(kernel, Missing) else kernel.events
    return EvidenceSweep(read_limits() if limits is None else limits, _paths(environ), objects, damage, events, python)


# --- judgement -----------------------------------------------------------------------------------

#: Lines that are a build's or a run's own error, best first: a missing program, the compiler's error, the step that
#: failed. Ninja prints every command line; these are what is buried among them.
_ERRORS = (
    re.compile(r"(?:^|[\s:])(?P<tool>[\w./+-]+): (?:command )?not found\b"),
    re.compile(r"\bNo such file or directory\b"),
    re.compile(r"\b(?:fatal error|error)\b:", re.IGNORECASE),
    re.compile(r"\bNo space left on device\b|\bPermission denied\b|\bNot a directory\b|\bKilled\b"),
    re.compile(r"^FAILED: "),
)


def first_error(text: str) -> str | None:
    """The first line of ``text`` that is an error of its own (a missing program first), else None.

    >>> first_error("[1/3] c++ -c a.cpp\\n[2/3] /opt/cuda/bin/nvcc -c b.cu\\n/bin/sh: 1: /opt/cuda/bin/nvcc: not "
    ...             "found\\nFAILED: b.cuda.o\\nninja: build stopped: subcommand failed.")
    '/bin/sh: 1: /opt/cuda/bin/nvcc: not found'
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for pattern in _ERRORS:
        hit = next((line for line in lines if pattern.search(line)), None)
        if hit is not None:
            return hit[:300]
    return None


def _size(value: int, name: str) -> str:
    if value == UNLIMITED:
        return "unlimited"
    if name in ("open files", "processes"):
        return str(value)
    return f"{value / 2**20:.0f} MiB" if value >= 2**20 else f"{value / 2**10:.0f} KiB"


def _limit_causes(limits: Iterable[Limit]) -> list[Cause]:
    causes = []
    for limit in limits:
        need, why = _NEEDS.get(limit.name, (0, ""))
        if limit.soft == UNLIMITED or (need is not None and limit.soft >= need):
            continue
        want = "unlimited" if need is None else f"at least {_size(need, limit.name)}"
        raise_to = "unlimited" if need is None else str(need if limit.flag in ("-n", "-u") else need // 1024)
        causes.append(
            Cause(
                f"the {limit.name} limit (ulimit {limit.flag}) the stack runs under is {_size(limit.soft, limit.name)}"
                f" (hard {_size(limit.hard, limit.name)}), where CUDA, NCCL and the engine need {want}: {why}",
                Fix(
                    f"Raise the limit where the stack runs: `ulimit {limit.flag} {raise_to}` in its shell, "
                    f"{limit.unit}=infinity in its systemd unit, or the container's or scheduler's limits.",
                    (f"ulimit {limit.flag} {raise_to}", "cat /proc/self/limits"),
                ),
            )
        )
    return causes


def _path_cause(state: PathState) -> Cause:
    if state.problem == "it has no bin/nvcc":
        fix = Fix(
            f"Point {state.variable} at a CUDA toolkit that has bin/nvcc (or unset it): flashinfer's and sgl-kernel's "
            "JIT run its nvcc.",
            (f"ls {state.path}/bin", "ls -d /usr/local/cuda*/bin/nvcc"),
        )
    elif "MiB free" in (state.problem or ""):
        fix = Fix(
            f"Free space under {state.path}, or point {state.variable} at a filesystem with room.",
            (f"df -h {state.path}",),
        )
    else:
        fix = Fix(
            f"Point {state.variable} at a folder this user can write (or unset it), where the stack runs.",
            (f"ls -ld {state.path}", f"unset {state.variable.split('[')[0]}"),
        )
    return Cause(f"{state.variable}={state.path}: {state.problem}", fix)


def _damage_cause(damage: tuple[Damage, ...], python: str) -> Cause:
    first = damage[0]
    names = dict.fromkeys(f"{d.distribution}=={d.version}" for d in damage)
    more = f" ({len(damage)} shared objects cut short)" if len(damage) > 1 else ""
    reinstall = f"uv pip install --python {python or 'PYTHON'} --reinstall --no-deps {' '.join(names)}"
    return Cause(
        f"{first.path} of {first.distribution} {first.version} is damaged: {first.why}{more}",
        Fix(
            "Reinstall the distribution(s) holding the damaged file(s), after making room if the disk is full: a "
            "killed copy or a full disk leaves a file cut short.",
            (f"df -h {Path(first.path).parent}", reinstall),
        ),
    )


def judge(sweep: EvidenceSweep) -> list[Cause]:
    """Every abnormal observation of the sweep, as a cause with its fix: damaged shared objects, limits below what
    CUDA, NCCL and the engine need, paths in play that cannot serve, GPU events of the kernel."""
    causes = [_damage_cause(sweep.damaged, sweep.python)] if sweep.damaged else []
    if not isinstance(sweep.limits, Missing):
        causes += _limit_causes(sweep.limits)
    causes += [_path_cause(p) for p in sweep.paths if p.problem and "LD_LIBRARY" not in p.variable]
    causes += [_path_cause(p) for p in sweep.paths if p.problem and "LD_LIBRARY" in p.variable]
    failing = [e for e in sweep.kernel if e.severity == "fail"] if not isinstance(sweep.kernel, Missing) else []
    if failing:
        causes.append(
            Cause(
                f"the kernel log holds {len(failing)} GPU failure event(s) this boot, first: {failing[0].text.strip()}",
                Fix(
                    "Read the kernel's GPU events: `stackgate diagnose --kernel` names each one's action.",
                    ("stackgate diagnose --kernel",),
                ),
            )
        )
    return causes


def checked(sweep: EvidenceSweep) -> str:
    """What the sweep looked at, for a failure it found no cause of."""
    if isinstance(sweep.limits, Missing):
        limits = f"the limits ({sweep.limits.reason})"
    else:
        limits = "the limits (" + ", ".join(f"{x.name} {_size(x.soft, x.name)}" for x in sweep.limits) + ")"
    paths = f"{len(sweep.paths)} path(s) in play" + (
        f" ({', '.join(p.variable for p in sweep.paths[:6])}{', ...' if len(sweep.paths) > 6 else ''})"
        if sweep.paths
        else ""
    )
    objects = (
        f"the stack's shared objects ({sweep.objects.reason})"
        if isinstance(sweep.objects, Missing)
        else f"{sweep.objects} shared object(s) of the stack"
    )
    kernel = (
        f"the kernel log ({sweep.kernel.reason})"
        if isinstance(sweep.kernel, Missing)
        else f"the kernel log ({len(sweep.kernel)} GPU event(s))"
    )
    return f"nothing abnormal in {limits}, {paths}, {objects}, {kernel}"


def explain(sweep: EvidenceSweep, output: str = "") -> tuple[str, Fix | None]:
    """The failure's cause as the sweep and its output show it, with the fix; when nothing is abnormal, what was
    checked (and the output's first real error) with no fix of its own."""
    error = first_error(output)
    said = f"; its first error: {error}" if error else ""
    causes = judge(sweep)
    if not causes:
        return f"the cause is not known from this{said}; {checked(sweep)}", None
    first = causes[0]
    also = f" (and {len(causes) - 1} more: {'; '.join(c.text for c in causes[1:3])})" if len(causes) > 1 else ""
    commands = tuple(dict.fromkeys(c for cause in causes for c in cause.fix.commands))
    return f"{first.text}{said}{also}", Fix(" ".join(dict.fromkeys(c.fix.text for c in causes)), commands)


def with_cause(result: Result, sweep: EvidenceSweep, output: str = "") -> Result:
    """``result`` (a failure whose cause its output did not show) with the sweep's cause in its summary and the
    cause's fix in front of its own commands, or with what the sweep checked added to its details (its own fix kept:
    where to look)."""
    if result.status < Status.FAIL:
        return result
    text, fix = explain(sweep, output)
    data = {**result.data, "evidence_sweep": text}
    if fix is None:
        return dataclasses.replace(result, details=(*result.details, f"Evidence sweep: {text}"), data=data)
    commands = tuple(dict.fromkeys((*fix.commands, *(result.fix.commands if result.fix else ()))))
    return dataclasses.replace(
        result, summary=f"{result.summary}: cause: {text}", fix=Fix(fix.text, commands), data=data
    )


def as_finding(sweep: EvidenceSweep, output: str, source: str) -> Finding | None:
    """The sweep's cause as a finding of ``source`` (a failed step's log), beside the knowledge base's; None when
    nothing is abnormal."""
    text, fix = explain(sweep, output)
    if fix is None:
        return None
    error = first_error(output)
    lines = [line for line in output.splitlines() if line.strip()]
    line = next((i for i, t in enumerate(lines, 1) if error and t.strip().startswith(error[:80])), len(lines))
    return Finding(
        "evidence-sweep",
        "found by the evidence sweep",
        "fail",
        "environment",
        text,
        fix,
        "stackgate's evidence sweep (limits, paths, shared objects, kernel events)",
        Evidence(source, max(line, 1), (error,) if error else ()),
    )
