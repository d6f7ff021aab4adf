"""The deep checks' measurement: real work on every GPU and an all-reduce sweep, run by the stack's
interpreter, read back as figures.

stackgate never imports torch: the work is done by :mod:`stackgate.edges.deepwork` (run as a
file) under the lock's target interpreter, through the runner (its own process group, killed
whole on timeout, its output in a log file as it is written); this module reads the JSON lines
it leaves behind and aggregates them (per-size means, bus bandwidth). Judging the figures is
:mod:`stackgate.checks.deep`'s, so the judgement is tested with plain numbers.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import shutil
import statistics
import tempfile
import threading
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator, Mapping, Sequence

from stackgate.edges import elf, faults, nvml, runner
from stackgate.facts.collect import Facts
from stackgate.facts.values import Missing
from stackgate.models import settings
from stackgate.models.spec import DeepAttention, Spec

__all__ = [
    "ATTENTION_RTOL",
    "FLASHWORK",
    "FUSION_RTOL",
    "GATE_TIMEOUT_S",
    "REQUIRED_ENV",
    "SCRIPT",
    "Ahead",
    "AllReduceRequest",
    "AttentionRequest",
    "AttentionRun",
    "FusionGate",
    "FusionRequest",
    "FusionRun",
    "FusionTokens",
    "GpuWork",
    "GpuWorkRequest",
    "SizeFigures",
    "Sweep",
    "aggregate",
    "aggregate_fusion",
    "bus_bandwidth",
    "flashinfer_env",
    "gpu_activity",
    "host_interfaces",
    "Launch",
    "ahead",
    "jit_workspace",
    "launch_env",
    "nccl_variables",
    "read_gate",
    "run_attention",
    "run_fusion",
    "run_gpu_work",
    "run_sweep",
]

SCRIPT = Path(__file__).resolve().parents[1] / "edges" / "deepwork.py"  # run by the target interpreter, as a file
FLASHWORK = SCRIPT.with_name("flashwork.py")  # flashinfer's kernels, run the same way
#: Set in every environment the deep checks launch, whatever the shell says: the GPU machines
#: here require NVLink multicast off, and no PCIe box has multicast anyway.
REQUIRED_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
_TRANSPORT = re.compile(r"NCCL INFO Channel \d+(?:/\d+)? ?: .* via (\S+)")
_CHANNELS = re.compile(r"NCCL INFO (\d+) coll channels")


def launch_env(lock: Spec, facts: Facts) -> dict[str, str]:
    """The stack's environment, the serving engine's [smoke.env] (its NCCL tuning), the required
    multicast switches, and an NCCL_DEBUG=INFO log on stdout.

    The INFO log is always on rather than asked for on a re-run: NCCL logs at set-up, not per
    operation, so it costs nothing measurable, and a hang may not come back on a second run.
    """
    env = dict(facts.env.environ)
    env.update(lock.smoke.env)
    env.update(REQUIRED_ENV)
    env["NCCL_DEBUG"] = "INFO"
    env.pop("NCCL_DEBUG_FILE", None)  # keep the log in our capture, where its tail is reported
    return env


def nccl_variables(env: Mapping[str, str]) -> dict[str, str]:
    """The NCCL settings in force in ``env``.

    >>> nccl_variables({"NCCL_P2P_LEVEL": "SYS", "PATH": "/bin", "TORCH_NCCL_BLOCKING_WAIT": "1"})
    {'NCCL_P2P_LEVEL': 'SYS', 'TORCH_NCCL_BLOCKING_WAIT': '1'}
    """
    return {k: env[k] for k in sorted(env) if k.startswith(("NCCL_", "TORCH_NCCL_"))}


# --- runs started ahead of their checks -----------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """What a deep run starts: the stack's interpreter running one of the work scripts, in an environment."""

    python: Path
    script: Path
    env: Mapping[str, str]


class Ahead:
    """Deep runs started ahead of their checks, so that each run's interpreter start and torch import
    (seconds with a CUDA build) overlap the work before it (:class:`runner.Held`); a run whose launch
    matches one held here takes it, any other starts as it always did. What is never taken is killed
    by :meth:`close`."""

    def __init__(self) -> None:
        self._held: list[tuple[Launch, runner.Held]] = []
        self._guard = threading.Lock()
        self.started = 0
        self.taken = 0

    def start(self, launch: Launch) -> None:
        """Start ``launch``'s script waiting for its arguments; one that cannot start is left to its run to report."""
        try:
            held = runner.Held([launch.python, launch.script, "hold"], env=launch.env)
        except OSError:
            return
        with self._guard:
            self._held.append((launch, held))
            self.started += 1

    def take(self, launch: Launch) -> runner.Held | None:
        """The run started ahead for exactly this launch (interpreter, script, environment), if any."""
        with self._guard:
            for index, (held_for, held) in enumerate(self._held):
                if held_for == launch:
                    del self._held[index]
                    self.taken += 1
                    return held
        return None

    def close(self) -> None:
        """End every run started ahead and never taken."""
        with self._guard:
            left, self._held = self._held, []
        for _, held in left:
            held.close()


_AHEAD: list[Ahead] = []  #: the pool the deep runs take from now (verify --deep's), innermost last


@contextlib.contextmanager
def ahead() -> Iterator[Ahead]:
    """A pool of runs started ahead, in force for the deep runs until the block ends (then the rest is killed)."""
    pool = Ahead()
    _AHEAD.append(pool)
    try:
        yield pool
    finally:
        _AHEAD.remove(pool)
        pool.close()


def _launch(
    launch: Launch, rest: Sequence[str | Path], log: Path, timeout_s: float | None, *, held: bool = True
) -> runner.Completed:
    """Run ``launch``'s script with ``rest``: on the run started ahead for it when there is one, else started now."""
    waiting = _AHEAD[-1].take(launch) if held and _AHEAD else None
    if waiting is None:
        return runner.run_logged([launch.python, launch.script, *rest], log, timeout_s=timeout_s, env=launch.env)
    return waiting.run(rest, log=log, timeout_s=timeout_s)


def _work_dir() -> Path | None:
    """Where each run's folder (its JSON lines and full log) is made; kept after the run, named in the result."""
    where = settings.DEEP_DIR.value()
    if where is not None:
        where.mkdir(parents=True, exist_ok=True)
    return where


def _new_seed() -> int:
    return secrets.randbits(24)  # deepwork.py's integer data stays exact below 2^24


def _read_lines(path: Path) -> list[dict[str, Any]]:
    """JSON lines; a last line cut short by a kill is dropped."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def _tail(done: runner.Completed, lines: int = 20) -> tuple[str, ...]:
    """The last lines of the run's log: NCCL's INFO lines and Python's, in the order written."""
    return tuple([line for line in done.stdout.splitlines() if line.strip()][-lines:])


def gpu_activity(lib: ModuleType | None = None) -> nvml.NvmlSnapshot | Missing:
    """NVML now, just before a measurement: what other processes are doing on the GPUs."""
    try:
        return nvml.snapshot(lib)
    except nvml.NvmlError as exc:
        return Missing(str(exc))


# --- per-GPU work -----------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuWorkRequest:
    """What deepwork.py's ``gpu`` mode is asked to do on each device."""

    device: str = "cuda"  #: "cpu" in the tests
    bf16_n: int = 8192  #: ~1.4 ms a product on an H200 (~790 TFLOP/s): far past launch overhead
    fp32_n: int = 4096  #: IEEE fp32 runs on CUDA cores (~50 TFLOP/s): ~3 ms a product
    copy_bytes: int = 2 << 30  #: ~1 ms a copy at 4.3 TB/s read+write
    warmup: int = 3
    iters: int = 20
    sample: int = 64  #: rows and columns of each product checked against float64 on the CPU
    seed: int = field(default_factory=_new_seed)


@dataclass(frozen=True)
class GpuWork:
    """What the per-GPU run left behind."""

    begin: Mapping[str, Any]  #: torch version, device count, seed, or the error that stopped it
    records: tuple[Mapping[str, Any], ...]  #: one per device finished
    running: int | None  #: the device started and never finished (a hang), if any
    returncode: int | None  #: None: killed at the timeout
    timeout_s: float
    tail: tuple[str, ...]
    log: Path
    duration_s: float


def run_gpu_work(
    python: Path, request: GpuWorkRequest, env: Mapping[str, str], timeout_s: float | None = None
) -> GpuWork:
    """Run deepwork.py's per-GPU work under ``python`` (for ``timeout_s``, default $STACKGATE_DEEP_TIMEOUT_S);
    never raises for what happens there."""
    timeout_s = settings.DEEP_TIMEOUT_S.value() if timeout_s is None else timeout_s
    workdir = Path(tempfile.mkdtemp(prefix="stackgate-gpu-work-", dir=_work_dir()))
    out = workdir / "gpu.jsonl"
    log = workdir / "gpu-work.log"
    request_json = json.dumps({**asdict(request), "faults": faults.deep_faults()})
    done = _launch(Launch(python, SCRIPT, env), ["gpu", out, request_json], log, timeout_s)
    lines = _read_lines(out)
    begin = next((r for r in lines if r.get("event") == "begin"), {})
    records = tuple(r for r in lines if r.get("event") == "done")
    started = [r["index"] for r in lines if r.get("event") == "start"]
    running = started[-1] if len(started) > len(records) else None
    return GpuWork(begin, records, running, done.returncode, timeout_s, _tail(done), log, done.duration_s)


# --- the collective ---------------------------------------------------------------------------


@dataclass(frozen=True)
class AllReduceRequest:
    """What deepwork.py's ``allreduce`` mode is asked to do; defaults are all_reduce_perf's
    ``-b 8K -e 1G -f 2`` with its own -w 5 -n 20, on float32 sums."""

    world: int
    backend: str = "nccl"  #: "gloo" in the tests
    device: str = "cuda"  #: "cpu" in the tests
    min_bytes: int = 8 << 10
    max_bytes: int = 1 << 30
    warmup: int = 5
    iters: int = 20
    replays: int = 5  #: timed replays of the captured ``iters`` ops; each rank's figure is their median
    seed: int = field(default_factory=_new_seed)
    graphs: bool = True  #: time from captured CUDA graphs (False: eager only, as one rank's correctness pass)

    @classmethod
    def for_world(cls, world: int) -> AllReduceRequest:
        """The sweep for ``world`` ranks: one rank has no bus bandwidth to measure (2(n-1)/n = 0), so it gets a
        correctness pass over the same sizes (one warm-up and two ops each, no graphs) instead of the timed sweep."""
        return cls(world) if world > 1 else cls(world, warmup=1, iters=2, replays=1, graphs=False)

    def sizes(self) -> list[int]:
        """Doubling from min_bytes to max_bytes.

        >>> AllReduceRequest(2, min_bytes=8 << 10, max_bytes=64 << 10).sizes()
        [8192, 16384, 32768, 65536]
        """
        sizes, size = [], self.min_bytes
        while size <= self.max_bytes:
            sizes.append(size)
            size *= 2
        return sizes

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "sizes": self.sizes()}


@dataclass(frozen=True)
class SizeFigures:
    """One message size, as all_reduce_perf prints it (its in-place columns)."""

    bytes: int
    time_us: float  #: per operation: each rank's median replay, the mean over ranks (all_reduce_perf's -a 1)
    algbw_gbs: float  #: bytes / time, 1 GB = 1e9 B
    busbw_gbs: float | None  #: algbw x 2(n-1)/n; None for one rank, where it is not defined
    wrong: int  #: elements that differ from the exact sum, over all ranks
    timing: str = "eager"  #: "cuda-graph": ops replayed from a captured graph (the GPUs' time)
    eager_us: float | None = None  #: per op launched one by one from Python (host overhead included)
    min_us: float | None = None  #: the fastest replay of any rank (cuda-graph timing only)


@dataclass(frozen=True)
class Sweep:
    """What the all-reduce run left behind."""

    request: AllReduceRequest
    sizes: tuple[SizeFigures, ...]  #: the sizes every rank finished
    progress: Mapping[int, int]  #: rank -> sizes finished (-1: still warming up); absent: never set up
    pids: tuple[int, ...]
    nccl_version: str | None
    returncode: int | None  #: None: killed at the timeout
    timeout_s: float
    tail: tuple[str, ...]
    log: Path
    nccl_env: Mapping[str, str]
    transports: Mapping[str, int]  #: "P2P/CUMEM/read": channels, from the INFO log
    channels: int | None
    duration_s: float
    interfaces: tuple[
        str, ...
    ] = ()  #: this host's network interfaces (/sys/class/net), for a bootstrap that found none

    @property
    def world(self) -> int:
        return self.request.world


def bus_bandwidth(algbw_gbs: float, world: int) -> float | None:
    """nccl-tests' all-reduce bus bandwidth: algbw x 2(n-1)/n; not defined for one rank.

    >>> bus_bandwidth(100.0, 8)
    175.0
    >>> bus_bandwidth(100.0, 1) is None
    True
    """
    return algbw_gbs * 2 * (world - 1) / world if world > 1 else None


def _finished(
    per_rank: Mapping[int, Sequence[Mapping[str, Any]]], event: str, key: str, world: int
) -> list[tuple[int, list[Mapping[str, Any]]]]:
    """(value of ``key``, its lines) of every rank's ``event`` lines, in order, where all ``world`` ranks wrote one.

    >>> size = lambda n: {"event": "size", "bytes": n}
    >>> events = {0: [size(8), size(16)], 1: [size(8)]}
    >>> _finished(events, "size", "bytes", 2)
    [(8, [{'event': 'size', 'bytes': 8}, {'event': 'size', 'bytes': 8}])]
    """
    found: dict[int, list[Mapping[str, Any]]] = {}
    for lines in per_rank.values():
        for line in lines:
            if line.get("event") == event:
                found.setdefault(line[key], []).append(line)
    return [(value, found[value]) for value in sorted(found) if len(found[value]) >= world]


def aggregate(world: int, per_rank: Mapping[int, Sequence[Mapping[str, Any]]]) -> list[SizeFigures]:
    """Per-size figures from every rank's "size" lines, for the sizes all ``world`` ranks finished."""
    figures = []
    for size, lines in _finished(per_rank, "size", "bytes", world):
        time_us = statistics.fmean(line["us"] for line in lines)
        algbw = size / (time_us * 1e-6) / 1e9
        timing = "cuda-graph" if all(line.get("timing") == "cuda-graph" for line in lines) else "eager"
        eager = [line["eager_us"] for line in lines if "eager_us" in line]
        eager_us = statistics.fmean(eager) if len(eager) == len(lines) else None
        fastest = [line["us_min"] for line in lines if "us_min" in line]
        min_us = min(fastest) if timing == "cuda-graph" and len(fastest) == len(lines) else None
        figures.append(
            SizeFigures(
                size,
                time_us,
                algbw,
                bus_bandwidth(algbw, world),
                sum(line["wrong"] for line in lines),
                timing,
                eager_us,
                min_us,
            )
        )
    return figures


def run_sweep(python: Path, request: AllReduceRequest, env: Mapping[str, str], timeout_s: float | None = None) -> Sweep:
    """Run deepwork.py's all-reduce sweep under ``python`` (for ``timeout_s``, default
    $STACKGATE_DEEP_TIMEOUT_S); never raises for what happens there."""
    timeout_s = settings.DEEP_TIMEOUT_S.value() if timeout_s is None else timeout_s
    workdir = Path(tempfile.mkdtemp(prefix="stackgate-allreduce-", dir=_work_dir()))
    rest: list[str | Path] = ["allreduce", workdir, json.dumps({**request.to_json(), "faults": faults.deep_faults()})]
    log = workdir / "allreduce.log"
    # Into a file as it is written (NCCL flushes each line), so a hang's log survives the kill.
    done = _launch(Launch(python, SCRIPT, env), rest, log, timeout_s)
    text = log.read_text(errors="replace")
    per_rank = {rank: _read_lines(workdir / f"rank{rank}.jsonl") for rank in range(request.world)}
    inits = [line for lines in per_rank.values() for line in lines if line.get("event") == "init"]
    nccl = next((".".join(map(str, i["nccl"])) for i in inits if i.get("nccl")), None)
    channels = [int(m[1]) for m in _CHANNELS.finditer(text)]
    return Sweep(
        request,
        tuple(aggregate(request.world, per_rank)),
        _progress(per_rank),
        tuple(i["pid"] for i in inits),
        nccl,
        done.returncode,
        timeout_s,
        _tail(done),
        log,
        nccl_variables(env),
        dict(Counter(m[1] for m in _TRANSPORT.finditer(text))),
        max(channels) if channels else None,
        done.duration_s,
        host_interfaces(),
    )


def host_interfaces(root: Path = Path("/sys/class/net")) -> tuple[str, ...]:
    """The host's network interfaces, as NCCL's socket bootstrap chooses among them."""
    try:
        return tuple(sorted(entry.name for entry in root.iterdir()))
    except OSError:
        return ()


def _progress(per_rank: Mapping[int, Sequence[Mapping[str, Any]]]) -> dict[int, int]:
    """How far each rank that set up got: -1 in the warm-up, else the number of sizes finished."""
    progress = {}
    for rank, lines in per_rank.items():
        events = [line.get("event") for line in lines]
        if "init" in events:
            progress[rank] = events.count("size") if "warm" in events else -1
    return progress


# --- flashinfer: the fusion's arch gate, attention, the allreduce fusion ----------------------

#: The relative part of the tolerance ``|a - b| <= atol + rtol * |ref|`` that the flashinfer
#: checks judge by; the target script picks each output's worst element by it (the element whose
#: error exceeds rtol * |ref| most), and checks/deep/common.py holds the atol. 2^-7 is two roundings
#: to bf16 (8 significant bits: half an ulp is at most 2^-8 of |x|).
ATTENTION_RTOL = 2.0**-7
FUSION_RTOL = 2.0**-7
#: How long reading the gate from the installed code may take (a Python start and two files).
GATE_TIMEOUT_S = 120.0


def jit_workspace(lock: Spec, environ: Mapping[str, str]) -> tuple[Path, str]:
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
    if lock.python.root is not None:
        return lock.python.root / "cache" / "flashinfer", "the stack's root"
    cache = (
        Path(environ["XDG_CACHE_HOME"])
        if environ.get("XDG_CACHE_HOME")
        else Path(environ.get("HOME") or Path.home()) / ".cache"
    )
    return cache / "stackgate" / "flashinfer", "the user's cache (the lock names an existing interpreter)"


def flashinfer_env(lock: Spec, facts: Facts) -> dict[str, str]:
    """:func:`launch_env` with flashinfer's JIT cache where :func:`jit_workspace` says."""
    env = launch_env(lock, facts)
    workspace, _ = jit_workspace(lock, env)
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
    sglang: Mapping[str, Any] | None  #: the same for sglang's runtime gate; None: no sglang there
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
