"""The flashinfer deep runs' measurement: the fusion's arch gate read from the installed code, flashinfer's
attention kernels and its fused all-reduce + RMSNorm, run by :mod:`stackgate.edges.flashwork` under the
stack's interpreter (started as :mod:`stackgate.facts.deeplaunch` starts every deep run) and read back
as figures. Judging them is :mod:`stackgate.checks.deep`'s (attention.py, fusion.py).
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from stackgate.edges import elf, runner
from stackgate.facts.collect import Facts
from stackgate.facts.deeplaunch import (
    FLASHWORK,
    Launch,
    _finished,
    _launch,
    _new_seed,
    _read_lines,
    _tail,
    _work_dir,
    launch_env,
)
from stackgate.models.spec import DeepAttention, Spec

__all__ = [
    "ATTENTION_RTOL",
    "FUSION_RTOL",
    "GATE_TIMEOUT_S",
    "aggregate_fusion",
    "AttentionRequest",
    "AttentionRun",
    "damaged_modules",
    "flashinfer_env",
    "free_bytes",
    "FusionGate",
    "FusionRequest",
    "FusionRun",
    "FusionTokens",
    "jit_workspace",
    "read_gate",
    "run_attention",
    "run_fusion",
]

# --- flashinfer: the fusion's arch gate, attention, the allreduce fusion ----------------------

#: The relative part of the tolerance ``|a - b| <= atol + rtol * |ref|`` that the flashinfer
#: checks judge by; the target script picks each output's worst element by it (the element whose
#: error exceeds rtol * |ref| most), and checks/deep/common.py holds the atol. 2^-7 is two roundings
#: to bf16 (8 significant bits: half an ulp is at most 2^-8 of |x|).
ATTENTION_RTOL = 2.0**-7
FUSION_RTOL = 2.0**-7
#: How long reading the gate from the installed code may take (a Python start and two files).
GATE_TIMEOUT_S = 120.0


def jit_workspace(spec: Spec, environ: Mapping[str, str]) -> tuple[Path, str]:
    """FLASHINFER_WORKSPACE_BASE for the deep runs, and where it came from: the environment's
    (the live stackgate.env, from the lock's [env], or the shell), else ``<python.root>/cache/flashinfer``
    (beside the stack it compiles for), else ``$XDG_CACHE_HOME/stackgate/flashinfer`` for a lock
    that names an existing interpreter.

    >>> from types import SimpleNamespace
    >>> jit_workspace(SimpleNamespace(python=SimpleNamespace(root=Path("/opt/sg"))), {})
    (PosixPath('/opt/sg/cache/flashinfer'), "the stack's root")
    >>> jit_workspace(SimpleNamespace(python=SimpleNamespace(root=None)), {"HOME": "/h"})[0]
    PosixPath('/h/.cache/stackgate/flashinfer')
    """
    if environ.get("FLASHINFER_WORKSPACE_BASE"):
        return Path(environ["FLASHINFER_WORKSPACE_BASE"]), "FLASHINFER_WORKSPACE_BASE"
    if spec.python.root is not None:
        return spec.python.root / "cache" / "flashinfer", "the stack's root"
    cache = (
        Path(environ["XDG_CACHE_HOME"])
        if environ.get("XDG_CACHE_HOME")
        else Path(environ.get("HOME") or Path.home()) / ".cache"
    )
    return cache / "stackgate" / "flashinfer", "the user's cache (the lock names an existing interpreter)"


def flashinfer_env(spec: Spec, facts: Facts) -> dict[str, str]:
    """:func:`launch_env` with flashinfer's JIT cache where :func:`jit_workspace` says."""
    env = launch_env(spec, facts)
    workspace, _ = jit_workspace(spec, env)
    env["FLASHINFER_WORKSPACE_BASE"] = str(workspace)
    return env


def _run_script(
    kind: str,
    mode: str,
    out: str,
    request: Mapping[str, Any],
    env: Mapping[str, str],
    python: Path,
    timeout_s: float,
    *,
    held: bool = True,
) -> tuple[Path, runner.Completed]:
    """flashwork.py ``mode`` under ``python`` in a fresh folder: (the folder, how it ended)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"stackgate-{kind}-", dir=_work_dir()))
    target = workdir / out if out else workdir
    # Into a file as it is written, so a run killed in a JIT compile keeps its log.
    rest: list[str | Path] = [mode, target, json.dumps(dict(request))]
    done = _launch(Launch(python, FLASHWORK, env), rest, workdir / f"{kind}.log", timeout_s, held=held)
    return workdir, done


@dataclass(frozen=True)
class FusionGate:
    """What the installed code says about the fused path's archs (flashwork.py ``gate``)."""

    flashinfer: Mapping[str, Any]  #: version, file, function, supported_majors; or error
    #: the same for sglang's runtime gate, with how it refuses (refusal "silent" or "raises", message); None: no
    #: sglang there
    sglang: Mapping[str, Any] | None
    returncode: int | None
    tail: tuple[str, ...]  #: the run's last lines (its folder is removed: the result holds what it said)


def read_gate(python: Path, env: Mapping[str, str], timeout_s: float = GATE_TIMEOUT_S) -> FusionGate:
    """Read the fused path's gate from the code installed for ``python``; never raises for what happens there."""
    # Never on a run started ahead: that one imported torch, which reading the gate refuses to (it is seconds).
    workdir, done = _run_script("fusion-gate", "gate", "gate.jsonl", {}, env, python, timeout_s, held=False)
    line = next((r for r in _read_lines(workdir / "gate.jsonl") if r.get("event") == "gate"), {})
    shutil.rmtree(workdir, ignore_errors=True)  # read at once, named in no result: nothing to keep
    found: Mapping[str, Any] = (
        line["flashinfer"]
        if isinstance(line.get("flashinfer"), Mapping)
        else {"error": f"the gate was not read ({_ended(done)})"}
    )
    sglang: Mapping[str, Any] | None = line["sglang"] if isinstance(line.get("sglang"), Mapping) else None
    return FusionGate(found, sglang, done.returncode, _tail(done))


def _ended(done: runner.Completed) -> str:
    return f"timed out after {done.duration_s:.0f} s" if done.returncode is None else f"exit {done.returncode}"


@dataclass(frozen=True)
class AttentionRequest:
    """What flashwork.py's ``attention`` mode runs on each GPU (the lock's [deep.attention])."""

    q_heads: int = DeepAttention.q_heads
    kv_heads: int = DeepAttention.kv_heads
    head_dim: int = DeepAttention.head_dim
    kv_len: int = DeepAttention.kv_len
    prefill_len: int = DeepAttention.prefill_len
    page_size: int = DeepAttention.page_size
    batch: int = DeepAttention.batch
    bandwidth_batch: int = DeepAttention.bandwidth_batch
    bandwidth_kv_len: int = DeepAttention.bandwidth_kv_len
    prefill_backend: str = DeepAttention.prefill_backend
    read_bytes: int = 4 << 30  #: the read-bandwidth kernel's tensor: far beyond any GPU's L2
    rtol: float = ATTENTION_RTOL
    warmup: int = 3
    iters: int = 20
    seed: int = field(default_factory=_new_seed)

    @classmethod
    def from_lock(cls, shapes: DeepAttention) -> AttentionRequest:
        names = (
            "q_heads",
            "kv_heads",
            "head_dim",
            "kv_len",
            "prefill_len",
            "page_size",
            "batch",
            "bandwidth_batch",
            "bandwidth_kv_len",
            "prefill_backend",
        )
        return cls(**{name: getattr(shapes, name) for name in names})


@dataclass(frozen=True)
class AttentionRun:
    """What the attention run left behind."""

    request: AttentionRequest
    begin: Mapping[str, Any]  #: flashinfer's and torch's versions, or the error that stopped it
    kernels: tuple[Mapping[str, Any], ...]  #: one per (GPU, kernel) finished, in order
    running: tuple[int, str] | None  #: (GPU, kernel) started and never finished: a hang or a JIT past the timeout
    returncode: int | None  #: None: killed at the timeout
    timeout_s: float
    tail: tuple[str, ...]
    log: Path
    duration_s: float
    damaged: tuple[
        Mapping[str, Any], ...
    ] = ()  #: modules of the JIT cache cut short, when the run was killed by a signal
    cache_free_bytes: int | None = None  #: free space on the JIT cache's filesystem after the run
    reads: tuple[Mapping[str, Any], ...] = ()  #: each GPU's read bandwidth (or its error)
    prebuild: Mapping[str, Any] | None = None  #: the modules built up front: the plan, the time, any errors
    building: bool = False  #: the up-front build started and never finished (a hang, or a JIT past the timeout)


def run_attention(python: Path, request: AttentionRequest, env: Mapping[str, str], timeout_s: float) -> AttentionRun:
    """Run flashwork.py's attention kernels under ``python``; never raises for what happens there."""
    workdir, done = _run_script("attention", "attention", "attention.jsonl", asdict(request), env, python, timeout_s)
    lines = _read_lines(workdir / "attention.jsonl")
    begin = next((r for r in lines if r.get("event") == "begin"), {})
    kernels = tuple(r for r in lines if r.get("event") == "kernel")
    started = [(r["index"], r["kind"]) for r in lines if r.get("event") == "start"]
    running = started[-1] if len(started) > len(kernels) else None
    killed = done.returncode is not None and done.returncode < 0
    damaged = (
        damaged_modules(Path(env["FLASHINFER_WORKSPACE_BASE"]))
        if killed and env.get("FLASHINFER_WORKSPACE_BASE")
        else ()
    )
    free = free_bytes(Path(env.get("FLASHINFER_WORKSPACE_BASE") or workdir))
    prebuild = next((r for r in lines if r.get("event") == "prebuild"), None)
    building = prebuild is None and any(r.get("event") == "prebuild-start" for r in lines)
    return AttentionRun(
        request,
        begin,
        kernels,
        running,
        done.returncode,
        timeout_s,
        _tail(done),
        workdir / "attention.log",
        done.duration_s,
        damaged,
        free,
        tuple(r for r in lines if r.get("event") == "read"),
        prebuild,
        building,
    )


def damaged_modules(workspace: Path) -> tuple[dict[str, Any], ...]:
    """The compiled modules in flashinfer's JIT cache under ``workspace`` that are cut short: a process that maps one
    dies of SIGBUS when it touches the missing pages. Reading their headers takes milliseconds."""
    found = []
    for module in sorted((workspace / ".cache" / "flashinfer").rglob("*.so")):
        why = elf.damaged(module)
        if why is not None:
            found.append({"file": str(module), "bytes": module.stat().st_size, "why": why})
    return tuple(found)


def free_bytes(path: Path) -> int | None:
    """Free space on the filesystem that holds ``path`` (or its nearest existing parent)."""
    for where in (path, *path.parents):
        try:
            return shutil.disk_usage(where).free
        except OSError:
            continue
    return None


@dataclass(frozen=True)
class FusionRequest:
    """What flashwork.py's ``fusion`` mode runs on each rank (the lock's [deep.fusion])."""

    world: int
    hidden: int
    tokens: tuple[int, ...]
    eps: float = 1e-6  #: RMSNorm's epsilon, as SGLang's models pass it
    rtol: float = FUSION_RTOL
    warmup: int = 3
    iters: int = 20  #: ops captured per graph
    replays: int = 5  #: timed replays; each rank's figure is their median
    seed: int = field(default_factory=_new_seed)


@dataclass(frozen=True)
class FusionTokens:
    """One token count, over all ranks."""

    tokens: int
    residual: tuple[float, float]  #: the worst element over ranks: (|fused - reference|, |reference|)
    norm: tuple[float, float]
    max_abs_err: Mapping[str, float]  #: "residual", "norm": the largest absolute error over ranks
    fused_us: float | None  #: each rank's median graph replay per op, the mean over ranks
    unfused_us: float | None
    fused_eager_us: float | None
    unfused_eager_us: float | None
    graph_error: str | None = None  #: why a path could not be timed from a graph

    @property
    def speedup(self) -> float | None:
        return self.unfused_us / self.fused_us if self.fused_us and self.unfused_us else None


@dataclass(frozen=True)
class FusionRun:
    """What the fusion run left behind."""

    request: FusionRequest
    begin: Mapping[str, Any]  #: versions and the JIT folder, or the error that stopped it
    tokens: tuple[FusionTokens, ...]  #: the token counts every rank finished
    workspace_s: Mapping[int, float]  #: rank -> seconds to create the IPC workspace (the comm JIT, when cold)
    compiled: int  #: modules the workspace's creation compiled (0: the JIT cache was warm)
    failures: tuple[Mapping[str, Any], ...]  #: the "failed" lines: rank, stage, error, trace
    progress: Mapping[int, str]  #: rank -> how far it got
    returncode: int | None
    timeout_s: float
    tail: tuple[str, ...]
    log: Path
    duration_s: float


def run_fusion(python: Path, request: FusionRequest, env: Mapping[str, str], timeout_s: float) -> FusionRun:
    """Run flashwork.py's fusion ranks under ``python``; never raises for what happens there."""
    workdir, done = _run_script("fusion", "fusion", "", asdict(request), env, python, timeout_s)
    begin = next((r for r in _read_lines(workdir / "fusion.jsonl") if r.get("event") == "begin"), {})
    per_rank = {rank: _read_lines(workdir / f"fusion{rank}.jsonl") for rank in range(request.world)}
    lines = [line for rank_lines in per_rank.values() for line in rank_lines]
    workspaces = {line["rank"]: float(line["seconds"]) for line in lines if line.get("event") == "workspace"}
    compiled = max((int(line.get("compiled", 0)) for line in lines if line.get("event") == "workspace"), default=0)
    failures = tuple(line for line in lines if line.get("event") == "failed")
    return FusionRun(
        request,
        begin,
        tuple(aggregate_fusion(request, per_rank)),
        workspaces,
        compiled,
        failures,
        _fusion_progress(per_rank),
        done.returncode,
        timeout_s,
        _tail(done),
        workdir / "fusion.log",
        done.duration_s,
    )


def aggregate_fusion(request: FusionRequest, per_rank: Mapping[int, Sequence[Mapping[str, Any]]]) -> list[FusionTokens]:
    """Per token count, the figures of every rank's "tokens" line, for the counts all ranks finished."""
    found = []
    for tokens, lines in _finished(per_rank, "tokens", "tokens", request.world):
        worst = {
            part: max((tuple(line[part]["worst"]) for line in lines), key=lambda e: e[0] - request.rtol * e[1])
            for part in ("residual", "norm")
        }
        largest = {part: max(line[part]["max_abs_err"] for line in lines) for part in ("residual", "norm")}
        graphs = [
            line[path].get("graph_error")
            for line in lines
            for path in ("fused", "unfused")
            if line[path].get("graph_error")
        ]
        times = {
            f"{path}_{key}": _mean(lines, path, key) for path in ("fused", "unfused") for key in ("us", "eager_us")
        }
        found.append(
            FusionTokens(
                tokens, worst["residual"], worst["norm"], largest, **times, graph_error=graphs[0] if graphs else None
            )
        )
    return found


def _mean(lines: Sequence[Mapping[str, Any]], path: str, key: str) -> float | None:
    values = [line[path][key] for line in lines if line[path].get(key) is not None]
    return statistics.fmean(values) if len(values) == len(lines) else None


def _fusion_progress(per_rank: Mapping[int, Sequence[Mapping[str, Any]]]) -> dict[int, str]:
    """How far each rank that set up got: its last event, with the token count where it has one."""
    progress = {}
    for rank, lines in per_rank.items():
        if lines:
            last = lines[-1]
            progress[rank] = f"tokens {last['tokens']}" if last.get("event") == "tokens" else str(last.get("event"))
    return progress
