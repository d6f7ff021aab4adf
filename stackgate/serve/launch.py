"""Launch the serving engine exactly as production will, and always take it down again.

The command is the target interpreter running the spec's serving engine as its description in
:mod:`stackgate.models.engines` spells it (SGLang's ``-m sglang.launch_server``, vLLM's ``vllm serve``),
with every choice explicit (model, TP size, host, port, attention backend, the lock's flags); the environment is this
process's, with the live stackgate.env and the lock's [smoke].env applied. Before anything is
launched, the refusals: a model path that is missing or unreadable, a port that is taken (SGLang
only binds it after loading the weights, so it would notice ten minutes late), fewer GPUs visible
than the TP size. The server runs in its own session, its output appended to the run's log file.
Teardown sends SIGTERM to the group (then SIGCONT, so that a stopped process can act on it), waits
longer than SGLang's 5 s drain poll, then SIGKILLs what is left and checks that nothing of it survives.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Callable, Iterator, Mapping, Sequence

from stackgate.edges import nvml, runner
from stackgate.models import engines, envfile
from stackgate.models.exitcodes import UsageError
from stackgate.models.finding import Fix
from stackgate.models.result import Result, failed, passed, warned
from stackgate.models.spec import Spec, Speculative, edit_hint
from stackgate.serve import fastmode, hub, launched
from stackgate.serve.procs import ProcessTree, describe, ignores, read_stat

__all__ = [
    "FUSION_MARK",
    "LOG_NOTE",
    "Config",
    "LaunchError",
    "Server",
    "Teardown",
    "check_gpus",
    "cached_models",
    "check_model",
    "check_port",
    "configs",
    "for_installed",
    "gpu_memory",
    "memory_released",
    "release",
    "server_env",
    "signals_held",
    "start",
    "stop",
]

#: What the console says of a kept server log: the server's own words, secrets and all, kept private.
LOG_NOTE = "the server's raw output, unredacted: readable only by its owner (mode 0600)"
#: Flags that turn on a fused communication path; the default --compare baseline drops them.
FUSION_MARK = "fusion"
#: Memory a GPU may still show in use after teardown (driver bookkeeping), per GPU.
MEMORY_SLACK_BYTES = 512 * 2**20
#: How long a server may take to stop after SIGTERM before teardown says that it is waiting.
NOTICE_S = 1.0
_POLL_S = 0.05


class LaunchError(UsageError):
    """Smoke cannot be set up from this lock and these options; nothing was launched."""


@dataclass(frozen=True)
class Config:
    """One server configuration to launch: the lock's, or the baseline --compare measures against."""

    label: str  #: "" for the lock's configuration, the [smoke.compare] name for the baseline
    model: str
    tp: int
    host: str
    port: int
    attention_backend: str
    flags: tuple[str, ...]
    speculative: Speculative | None
    evidence: Mapping[str, str]
    env: Mapping[str, str]  #: [smoke].env, with [smoke.compare].env for the baseline
    fast_layers: int | None = None  #: set in fast mode
    engine: engines.Engine = engines.ENGINES["sglang"]  #: the serving engine, as the registry describes it

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def check(self, name: str) -> str:
        """The name of one of this configuration's checks: ``smoke.launch``, ``smoke.baseline.launch``."""
        return ".".join(p for p in ("smoke", self.label, name) if p)

    @property
    def title(self) -> str:
        return self.label or "lock"

    def launch_flags(self, shrink: fastmode.Shrink | None = None) -> tuple[str, ...]:
        """The words after the explicit ones: the lock's flags, speculative decoding, fast mode."""
        fast = self.engine.fast_flags(shrink.override) if shrink is not None else ()
        return (*self.flags, *self._speculative(), *fast)

    def _speculative(self) -> tuple[str, ...]:
        spec = self.speculative
        if spec is None:
            return ()
        words = self.engine.speculative_words(spec.algorithm, spec.draft_model, spec.num_steps, spec.num_draft_tokens)
        return words or spec.flags

    def argv(self, python: Path, shrink: fastmode.Shrink | None = None) -> list[str]:
        """The engine's launch words with every choice explicit: for SGLang ``<python> -m
        sglang.launch_server --model-path M --tp-size N --host H --port P --attention-backend B ...``."""
        head = self.engine.argv(str(python), self.model, self.tp, self.host, self.port, self.attention_backend)
        return [*head, *self.launch_flags(shrink)]


def configs(
    spec: Spec,
    *,
    model: str | None = None,
    tp: int | None = None,
    port: int | None = None,
    fast: bool = False,
    compare: bool = False,
) -> list[Config]:
    """The configurations to launch, in order: [lock's] or, with ``compare``, [baseline, lock's]."""
    smoke = spec.smoke
    chosen = model or smoke.model
    if not chosen:
        raise LaunchError(
            f"no model to launch: set [smoke] model {edit_hint(spec)} or pass --model PATH",
            hint=f"stackgate smoke --model /path/to/model --lock {spec.path}",
        )
    if tp is not None and tp < 1:
        raise LaunchError(f"--tp must be 1 or more, not {tp}")
    if port is not None and not 0 < port < 65536:
        raise LaunchError(f"--port must be a TCP port (1-65535), not {port}")
    main = Config(
        label="",
        model=chosen,
        tp=tp or smoke.tp,
        host=smoke.host,
        port=port or smoke.port,
        attention_backend=smoke.attention_backend,
        flags=smoke.flags,
        speculative=smoke.speculative,
        evidence=smoke.evidence,
        env=smoke.env,
        fast_layers=smoke.fast_layers if fast else None,
        engine=smoke.serving,
    )
    if not compare:
        return [main]
    return [_baseline(spec, main), main]


def for_installed(config: Config, version: str | None) -> Config:
    """``config`` with its engine as the ``installed`` release speaks (:meth:`Engine.at`): the fusion
    flag's default evidence becomes that release's line; a pattern the spec set itself is kept."""
    engine = config.engine.at(version)
    if engine is config.engine:
        return config
    default = config.engine.fusion_evidence
    evidence = {
        flag: engine.fusion_evidence if flag == engine.fusion_flag and pattern == default else pattern
        for flag, pattern in config.evidence.items()
    }
    return dataclasses.replace(config, engine=engine, evidence=MappingProxyType(evidence))


def _baseline(spec: Spec, main: Config) -> Config:
    table = spec.smoke.compare
    name = table.name if table else "baseline"
    flags = table.flags if table and table.flags is not None else tuple(f for f in main.flags if not _fusion(main, f))
    baseline = Config(
        label=name,
        model=main.model,
        tp=main.tp,
        host=main.host,
        port=main.port,
        attention_backend=(table.attention_backend if table else None) or main.attention_backend,
        flags=flags,
        speculative=main.speculative if (table is None or table.speculative) else None,
        evidence=MappingProxyType({f: p for f, p in main.evidence.items() if f in flags}),
        env=MappingProxyType({**main.env, **(table.env if table else {})}),
        fast_layers=main.fast_layers,
        engine=main.engine,
    )
    same = (baseline.flags, baseline.attention_backend, baseline.speculative, dict(baseline.env)) == (
        main.flags,
        main.attention_backend,
        main.speculative,
        dict(main.env),
    )
    if same:
        raise LaunchError(
            "--compare needs a baseline that differs from the lock's configuration: the lock has no "
            "fusion flag to drop; describe the baseline in a [smoke.compare] table (flags, attention_backend, "
            "speculative, env)"
        )
    return baseline


def _fusion(config: Config, word: str) -> bool:
    """Whether a launch word turns on a fused communication path (dropped from the default baseline)."""
    return FUSION_MARK in word or config.engine.fusion_asked((word,))


def server_env(spec: Spec, config: Config, base: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The server's environment and the variables stackgate set in it (file, then [smoke].env).

    Raises :class:`stackgate.models.envfile.EnvFileError` when the live stackgate.env is unreadable.
    """
    environ, from_file = envfile.apply(spec.python.env_file, base)
    proving = dict(config.engine.fusion_env) if config.engine.fusion_flag in config.evidence else {}
    environ.update(proving)
    environ.update(config.env)
    return environ, {**from_file, **proving, **config.env}


# --- refusals before launch -------------------------------------------------------------------


def check_model(config: Config, environ: Mapping[str, str] | None = None) -> Result:
    """The model (and a draft model) is a readable directory with a config.json: a local path, or
    a Hugging Face Hub id found in the server's Hub cache (:mod:`stackgate.serve.hub`)."""
    environ = os.environ if environ is None else environ
    where = {}
    for what, text in _models(config):
        path, problem, offline = _locate(text, environ)
        if problem:
            download = (f"huggingface-cli download {text}",) if hub.is_hub_id(text) and offline is None else ()
            return failed(
                f"{what} {text}: {problem}; nothing was launched",
                fix=Fix(
                    "Point [smoke] at a local Hugging Face model directory "
                    f"({'--model PATH' if what == 'model' else 'smoke.speculative.draft_model'}), or put the Hub id "
                    "in the Hub cache on a host that can reach the Hub (HF_HOME names the cache).",
                    download or (f"ls -l {text}",),
                ),
            )
        where[what] = str(path)
    cached = f" (Hub id, cached at {where['model']})" if where["model"] != config.model else ""
    return passed(f"model {config.model} is readable{cached}", data={"model": config.model, "path": where["model"]})


def cached_models(config: Config, environ: Mapping[str, str]) -> Config:
    """``config`` with each Hub id replaced by its snapshot directory in the Hub cache, so that the
    server loads exactly what was checked, without the network."""
    model = _locate(config.model, environ)[0]
    speculative = config.speculative
    if speculative is not None and speculative.draft_model:
        draft = _locate(speculative.draft_model, environ)[0]
        speculative = dataclasses.replace(speculative, draft_model=str(draft))
    return dataclasses.replace(config, model=str(model), speculative=speculative)


def _models(config: Config) -> list[tuple[str, str]]:
    paths = [("model", config.model)]
    if config.speculative is not None and config.speculative.draft_model:
        paths.append(("draft model", config.speculative.draft_model))
    return paths


def _locate(text: str, environ: Mapping[str, str]) -> tuple[Path, str, str | None]:
    """Where a model is, what is wrong with it ("" if nothing), and why the host is offline (a Hub
    id not cached) or None."""
    path = Path(text)
    if path.exists() or not hub.is_hub_id(text):
        return path, _unreadable(path), None
    found = hub.resolve(text, environ)
    if found.path is not None:
        return found.path, _unreadable(found.path), None
    offline = hub.offline_reason(environ)
    if offline is not None:
        return (
            path,
            f"not a local path, and as a Hugging Face Hub id it {found.problem}, and this host is offline: {offline}",
            offline,
        )
    return (
        path,
        f"not a local path, and as a Hugging Face Hub id it {found.problem}: download it first (smoke does not "
        "time a download against ready_timeout_s)",
        None,
    )


def _unreadable(path: Path) -> str:
    if not path.exists():
        return "no such file or directory"
    if not path.is_dir():
        return "is not a directory"
    if not os.access(path, os.R_OK | os.X_OK):
        return "is not readable by this user"
    config = path / "config.json"
    if not config.is_file():
        return "has no config.json (not a Hugging Face model directory)"
    try:
        json.loads(config.read_text(encoding="utf-8"))
    except OSError as exc:
        return f"config.json cannot be read: {exc.strerror or exc}"
    except ValueError as exc:
        return f"config.json is not JSON: {exc}"
    return ""


def check_port(config: Config) -> Result:
    """Nothing listens on the server's host and port."""
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # uvicorn binds with SO_REUSEADDR too, so a socket in TIME_WAIT is not "taken" for it.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((config.host, config.port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return failed(f"cannot bind {config.host}:{config.port}: {exc.strerror or exc}; nothing was launched")
            return failed(
                f"port {config.port} on {config.host} is taken; nothing was launched ({config.engine.title} would find "
                "out only after loading the weights)",
                fix=Fix("Stop what listens there, or pass another --port.", (f"ss -ltnp 'sport = :{config.port}'",)),
                data={"port": config.port},
            )
    return passed(f"port {config.port} on {config.host} is free", data={"port": config.port})


def check_gpus(config: Config, env: Mapping[str, str], lib: ModuleType | None = None) -> Result:
    """At least TP-size GPUs are visible to the server (NVML, then CUDA_VISIBLE_DEVICES)."""
    try:
        snap = nvml.snapshot(lib)
    except nvml.NvmlError as exc:
        return warned(
            f"cannot count the GPUs ({exc}); launching anyway",
            fix=Fix("Check the driver with nvidia-smi.", ("nvidia-smi",)),
        )
    visible = _visible(snap, env.get("CUDA_VISIBLE_DEVICES"))
    data = {"gpus": len(snap.gpus), "visible": visible, "tp": config.tp}
    where = f" (CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r})" if "CUDA_VISIBLE_DEVICES" in env else ""
    if visible < config.tp:
        return failed(
            f"TP {config.tp} needs {config.tp} GPUs but {visible} are visible{where}; nothing was launched",
            fix=Fix("Lower --tp, or make more GPUs visible (unset or widen CUDA_VISIBLE_DEVICES).", ("nvidia-smi -L",)),
            data=data,
        )
    return passed(f"{visible} GPU(s) visible{where} for TP {config.tp}", data=data)


def _visible(snap: nvml.NvmlSnapshot, devices: str | None) -> int:
    """How many GPUs CUDA will enumerate: CUDA stops at the first entry that names no GPU.

    >>> gpus = tuple(nvml.GpuInfo(i, "g", f"GPU-{i}aa", *[None] * 11, ()) for i in range(4))
    >>> snap = nvml.NvmlSnapshot("580", None, gpus)
    >>> [_visible(snap, v) for v in (None, "0,2", "1,9,2", "GPU-3", "", "-1")]
    [4, 2, 1, 1, 0, 0]
    """
    if devices is None:
        return len(snap.gpus)
    count = 0
    for entry in (e.strip() for e in devices.split(",")):
        known = entry.isdigit() and int(entry) < len(snap.gpus)
        known = known or (entry.startswith(("GPU-", "MIG-")) and any(g.uuid.startswith(entry) for g in snap.gpus))
        if not known:
            break
        count += 1
    return count


# --- the server process -----------------------------------------------------------------------


@dataclass(frozen=True)
class Teardown:
    """How the server went away, and what teardown had to do about it."""

    how: str  #: "exited by itself", "SIGTERM", "SIGKILL after N s"
    exit_code: int | None
    seconds: float
    leftovers: tuple[str, ...] = ()  #: processes still alive afterwards, described
    interrupted: bool = False  #: a Ctrl-C/SIGTERM arrived during teardown (it escalated to SIGKILL)
    ended_before: bool = False  #: the server's main process had already exited when teardown began
    orphans: tuple[str, ...] = ()  #: processes it left behind then (teardown ended them)
    stubborn: tuple[str, ...] = ()  #: processes still alive after SIGTERM and the whole grace period
    ignoring: tuple[str, ...] = ()  #: processes alive at SIGKILL whose signal mask ignores SIGTERM


@dataclass
class Server:
    """A launched engine: its process group, its log, and everything it spawned."""

    process: subprocess.Popen[bytes]
    argv: tuple[str, ...]
    log_path: Path
    started: float  #: time.monotonic() at launch
    record: launched.Record | None = None  #: the launch's record under the state folder
    tree: ProcessTree = field(init=False)
    teardown: Teardown | None = None

    def __post_init__(self) -> None:
        self.tree = ProcessTree(self.process.pid, self.record.update if self.record is not None else None)

    @property
    def pid(self) -> int:
        return self.process.pid

    def exit_code(self) -> int | None:
        return self.process.poll()

    def stop_hint(self) -> str:
        return f"kill -TERM -- -{self.pid}; sleep 10; kill -KILL -- -{self.pid}"


def start(argv: Sequence[str], env: Mapping[str, str], log_path: Path, *, keep: bool = False) -> Server:
    """Launch in a new session, output appended to ``log_path``. Raises OSError if it cannot start.

    Signals are not held here: a child inherits the signal mask, and an engine that cannot see
    SIGTERM cannot drain. A Ctrl-C that lands while Popen waits for the exec loses the Popen
    object, so the child is then found by its command line among this process's children.
    Unless it is to be ``keep``-t running, the server is SIGKILLed by Linux if smoke dies
    (SGLang's own workers follow their parent).
    """
    token = launched.new_token()  # the launch marker: proof, for a later reap, that it launched this server
    try:
        process = runner.spawn(argv, log_path=log_path, env={**env, launched.MARKER: token}, die_with_parent=not keep)
    except KeyboardInterrupt:
        _kill_strays(argv)
        raise
    server = Server(process, tuple(argv), log_path, time.monotonic(), launched.Record(process.pid, argv, token))
    server.tree.scan()  # the first look writes the record
    return server


def release(server: Server) -> None:
    """The server stays up on purpose (--keep-server): its record goes, so no later run reaps it."""
    if server.record is not None:
        server.record.forget()


def _kill_strays(argv: Sequence[str]) -> None:
    """Kill the group of any child of this process, leading a session of its own, running ``argv``."""
    wanted = "\0".join(argv).encode()
    for entry in Path("/proc").iterdir():
        stat = read_stat(int(entry.name)) if entry.name.isdigit() else None
        if stat is None or stat.ppid != os.getpid() or stat.session != stat.pid:
            continue
        try:
            command = (entry / "cmdline").read_bytes().rstrip(b"\0")
        except OSError:
            continue
        if command == wanted:
            runner.kill_group(stat.pid)


def stop(server: Server, grace_s: float, on_wait: Callable[[float], None] | None = None) -> Teardown:
    """SIGTERM the group, wait ``grace_s``, SIGKILL what is left, confirm nothing survives.

    ``on_wait(grace_s)`` is called once when the server is still up :data:`NOTICE_S` after
    SIGTERM, so that the wait is never silent (and a person knows a Ctrl-C ends it).

    A Ctrl-C or SIGTERM during the grace period cuts it short (straight to SIGKILL); the final
    kill-and-confirm runs with those signals held, so a second interrupt cannot leave processes.
    The Teardown is also stored on ``server.teardown`` before any held signal is delivered. It
    records what was found and done: a main process that had already ended and what it left
    behind, and what outlived SIGTERM for the whole grace period.
    """
    begun = time.monotonic()
    server.tree.scan()
    ended_before = server.exit_code() is not None
    orphans = tuple(describe(pid) for pid in server.tree.alive()) if ended_before else ()
    how, interrupted = "exited by itself", False
    stubborn: tuple[str, ...] = ()
    if server.exit_code() is None or server.tree.alive():
        server.tree.signal(signal.SIGTERM)
        server.tree.signal(signal.SIGCONT)  # a stopped process acts on SIGTERM only once it runs again
        how = "SIGTERM"
        try:
            if not _wait_gone(server, min(NOTICE_S, grace_s)) and on_wait is not None:
                on_wait(grace_s)
            _wait_gone(server, grace_s - (time.monotonic() - begun))
        except KeyboardInterrupt:
            interrupted = True
    ignoring: tuple[str, ...] = ()
    with signals_held():
        if server.exit_code() is None or server.tree.alive():
            living = _living(server)
            if not interrupted:
                stubborn = tuple(describe(pid) for pid in living)
            ignoring = tuple(describe(pid) for pid in living if ignores(pid, signal.SIGTERM))
            how = f"SIGKILL after {time.monotonic() - begun:.1f} s"
            server.tree.signal(signal.SIGKILL)
            _wait_gone(server, 5.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.process.wait(timeout=1.0)
        left = tuple(describe(pid) for pid in server.tree.alive())
        if not left and server.record is not None:
            server.record.forget()  # what survives stays recorded: the next run reaps it
        server.teardown = Teardown(
            how,
            server.exit_code(),
            time.monotonic() - begun,
            left,
            interrupted,
            ended_before,
            orphans,
            stubborn,
            ignoring,
        )
    return server.teardown


def _living(server: Server) -> list[int]:
    """The server's processes alive now, the main process first if it is."""
    rest = [pid for pid in server.tree.alive() if pid != server.pid]
    return ([server.pid] if server.exit_code() is None else []) + rest


def _wait_gone(server: Server, limit_s: float) -> bool:
    """Wait up to ``limit_s`` for every process of the server to end; True when they did."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if server.exit_code() is not None and not server.tree.alive():
            return True
        time.sleep(_POLL_S)
    return server.exit_code() is not None and not server.tree.alive()


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM (in this thread) until the block ends; they are delivered then."""
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


# --- GPU memory -------------------------------------------------------------------------------


def gpu_memory(lib: ModuleType | None = None) -> dict[int, int] | str:
    """Memory in use per GPU index, or why NVML cannot say."""
    try:
        snap = nvml.snapshot(lib)
    except nvml.NvmlError as exc:
        return str(exc)
    return {g.index: g.memory_used_bytes or 0 for g in snap.gpus}


def memory_released(
    before: dict[int, int] | str, pids: Sequence[int], lib: ModuleType | None = None, wait_s: float = 10.0
) -> Result | None:
    """WARN when, after teardown, a GPU still holds the server's memory; None where NVML cannot tell."""
    if isinstance(before, str):
        return None
    deadline = time.monotonic() + wait_s
    while True:
        held = _held(before, set(pids), lib)
        if held is None or not held or time.monotonic() >= deadline:
            break
        time.sleep(0.25)  # the driver frees a dead process's memory shortly after it exits
    if not held:
        return None
    return warned(
        f"GPU memory not released after teardown: {'; '.join(held)}",
        fix=Fix(
            "Find and stop what still holds the GPUs.",
            ("nvidia-smi --query-compute-apps=pid,used_memory --format=csv",),
        ),
    )


def _held(before: dict[int, int], pids: set[int], lib: ModuleType | None) -> list[str] | None:
    try:
        snap = nvml.snapshot(lib)
    except nvml.NvmlError:
        return None
    held = []
    for gpu in snap.gpus:
        grown = (gpu.memory_used_bytes or 0) - before.get(gpu.index, 0)
        ours = sorted(p.pid for p in gpu.processes if p.pid in pids)
        if ours or grown > MEMORY_SLACK_BYTES:
            who = f", by pid {', '.join(map(str, ours))}" if ours else ""
            held.append(f"GPU {gpu.index}: {grown / 2**30:+.2f} GiB since launch{who}")
    return held
