"""The smoke flow: launch the engine as production will, prove what runs, benchmark it, tear it down.

:func:`run_smoke` is the library entry point (the gate calls it): for each configuration (the
lock's, and with --compare a baseline first) it refuses what cannot work before launching,
launches the server in its own process group, waits for readiness while following the log,
reads what really runs, benchmarks it, and always tears it down. Everything it learns becomes
``smoke.*`` Results, so a report can hold them beside verify's.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping, Sequence

from stackgate.checks.smoke import logscan, serverinfo
from stackgate.edges import faults
from stackgate.facts import Facts, evidencesweep, serverlog
from stackgate.facts.engineversion import installed_version
from stackgate.flows import smokesweep
from stackgate.flows.smokereports import EngineReport, acceptance_result, accuracy_result, api_of, metrics_result
from stackgate.models import envfile, knowledge, runenv, secretargs, settings
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.models.finding import Finding, Fix
from stackgate.models.redact import redact
from stackgate.models.result import Result, Status, failed, passed, skipped, warned
from stackgate.models.spec import Smoke, Spec
from stackgate.models.verdict import Verdict, judge
from stackgate.models.verdict import document as report_document
from stackgate.render.benchtables import latency_ms
from stackgate.render.ui import UI
from stackgate.serve import bench, fastmode, launch, launched, quality
from stackgate.serve.launch import Config, LaunchError
from stackgate.serve.prompts import PromptMaker
from stackgate.serve.ready import Monitor, Readiness, wait_ready
from stackgate.serve.sweep import SweepRun

__all__ = [
    "SCHEMA",
    "LaunchError",
    "Session",
    "SmokeInterrupted",
    "SmokeRequest",
    "SmokeRun",
    "run_smoke",
]

#: The smoke part's version: each finding in its one form (models.finding).
SCHEMA = "stackgate.smoke/2"
#: How long a failed request waits for the process/log watcher to say why the server failed. A
#: dying server's stream closes when its main process exits, and its fatal lines are written
#: before that, so the answer is in within a tick or two; a stream cut while the server stays up
#: gets its verdict after this wait.
EXPLAIN_S = 0.3
#: How long a server that logged a fatal error may take to end itself before teardown starts.
SETTLE_S = 0.5


@dataclass(frozen=True, kw_only=True)
class SmokeRequest:
    spec_path: Path | None = None
    model: str | None = None
    tp: int | None = None
    port: int | None = None
    benchmark: bool = False
    compare: bool = False
    concurrency: tuple[int, ...] = ()
    rates: tuple[float, ...] = ()  #: request rates to sweep (requests per second); [smoke.sweep] rates otherwise
    fast: bool = False
    keep_server: bool = False
    json_path: Path | None = None
    strict: bool = False
    run_dir: Path | None = None  #: where the server logs go (default: reports/smoke/<time>-<pid>)
    dry_run: bool = False  #: say the command, environment and checks; launch nothing

    @property
    def measures(self) -> bool:
        """Single-stream runs are measured (--benchmark, or --compare, which compares them)."""
        return self.benchmark or self.compare


@dataclass
class Session:
    """One launched configuration, and everything learned about it."""

    config: Config
    results: list[Result] = field(default_factory=list)
    argv: tuple[str, ...] = ()  #: the command line as shown: a secret option's literal value hidden
    launch_argv: tuple[str, ...] = field(default=(), repr=False)  #: as launched: references resolved
    api_key: str | None = field(default=None, repr=False)  #: the server's --api-key, sent by the client
    environment: dict[str, str] = field(default_factory=dict)
    set_by_stackgate: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    pid: int | None = None
    shrink: fastmode.Shrink | None = None
    readiness: Readiness | None = None
    server_info: dict[str, Any] | None = None
    info_endpoint: str | None = None
    findings: list[Finding] = field(default_factory=list)
    evidence: list[serverlog.FlagSighting] = field(default_factory=list)
    figures: bench.BenchFigures | None = None
    levels: list[bench.Level] = field(default_factory=list)
    sweep: SweepRun | None = None
    engine_report: EngineReport = field(default_factory=EngineReport)
    teardown: launch.Teardown | None = None
    kept: bool = False
    failure: str | None = None
    failure_seen_at: float | None = None  #: time.time() when smoke knew the server had failed

    def add(self, name: str, result: Result | None) -> None:
        if result is not None:
            self.results.append(dataclasses.replace(result, check=self.config.check(name)) if name else result)

    def failed(self, reason: str, at: float | None) -> None:
        if self.failure is None:
            self.failure, self.failure_seen_at = reason, at or time.time()

    def to_dict(self) -> dict[str, Any]:
        """The session for a report, its secrets hidden (the server's key wherever it appears)."""
        ready = self.readiness
        explaining, others = runenv.recorded(self.environment, self.set_by_stackgate)
        shown = {
            "label": self.config.title,
            "command": list(self.argv),
            "command_line": secretargs.command_line(self.argv) if self.argv else None,
            "environment": explaining,
            "environment_names_only": others,
            "set_by_stackgate": dict(sorted(self.set_by_stackgate.items())),
            "log_path": str(self.log_path) if self.log_path else None,
            "pid": self.pid,
            "fast_mode": {
                "layers": self.shrink.layers,
                "of": self.shrink.total,
                "key": self.shrink.key,
                "override": dict(self.shrink.override),
            }
            if self.shrink
            else None,
            "readiness": {
                "ready": ready.ready,
                "reason": ready.reason,
                "seconds": round(ready.seconds, 3),
                "phase": ready.phase,
                "exit_code": ready.exit_code,
                "detail": ready.detail or None,  #: a hang's silence, or who holds the port
                "proof": ready.proof or None,  #: how the answering server was known to be ours
            }
            if ready
            else None,
            "server_info_endpoint": self.info_endpoint,
            "server_info": self.server_info,
            "findings": [f.to_dict() for f in self.findings],
            "evidence": [dataclasses.asdict(e) for e in self.evidence],
            "benchmark": self.figures.to_dict() if self.figures else None,
            "concurrency": [level.to_dict() for level in self.levels],
            "sweep": self.sweep.to_dict() if self.sweep else None,
            **self.engine_report.to_dict(),
            "teardown": dataclasses.asdict(self.teardown) if self.teardown else None,
            "kept_running": self.kept,
            "failure": self.failure,
            "failure_seen_at": self.failure_seen_at,
        }
        return redact(shown, known=[self.api_key] if self.api_key else ())


@dataclass(frozen=True)
class SmokeRun:
    """A finished smoke: what the gate and the report need of it."""

    spec: Spec
    request: SmokeRequest
    sessions: tuple[Session, ...]
    results: list[Result]
    verdict: Verdict
    started: float
    duration_s: float
    interrupted: bool = False

    @property
    def log_paths(self) -> list[Path]:
        return [s.log_path for s in self.sessions if s.log_path is not None]

    @property
    def figures(self) -> bench.BenchFigures | None:
        """The lock's configuration's benchmark."""
        return self.sessions[-1].figures if self.sessions else None

    @property
    def server_info(self) -> dict[str, Any] | None:
        return self.sessions[-1].server_info if self.sessions else None

    def document(self) -> dict[str, Any]:
        request = {
            k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
            for k, v in dataclasses.asdict(self.request).items()
        }
        smoke = {
            "schema": SCHEMA,
            "request": request,
            "interrupted": self.interrupted,
            "sessions": [s.to_dict() for s in self.sessions],
        }
        doc = report_document(
            "smoke",
            self.results,
            self.verdict,
            spec=self.spec,
            started=self.started,
            duration_s=self.duration_s,
            extra={"smoke": smoke},
        )
        return redact(doc, known=self.secrets())

    def secrets(self) -> set[str]:
        """The API keys the servers were launched with: the document shows them hidden, so a
        log line that repeats one could not be recognised from the document alone."""
        return {s.api_key for s in self.sessions if s.api_key}


class SmokeInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM ended smoke; every server was torn down. ``run`` holds what was learned."""

    def __init__(self, run: SmokeRun) -> None:
        super().__init__("interrupted")
        self.run = run


# --- the library entry point ------------------------------------------------------------------


@dataclass(frozen=True)
class _Context:
    spec: Spec
    request: SmokeRequest
    ui: UI
    run_dir: Path
    environ: Mapping[str, str]
    nvml_lib: ModuleType | None
    rates: tuple[float, ...] = ()  #: the sweep's rates
    prompts: PromptMaker | None = None  #: the sweep's prompts, checked before any launch


def run_smoke(
    spec: Spec,
    request: SmokeRequest,
    ui: UI,
    *,
    environ: Mapping[str, str] | None = None,
    nvml_lib: ModuleType | None = None,
) -> SmokeRun:
    """Smoke every configuration the request asks for; raise SmokeInterrupted on Ctrl-C/SIGTERM.

    Raises :class:`LaunchError` (bad usage, nothing launched).
    """
    started, clock = time.time(), time.monotonic()
    configs = launch.configs(
        spec, model=request.model, tp=request.tp, port=request.port, fast=request.fast, compare=request.compare
    )
    rates = smokesweep.rates(spec, request.rates, request.measures)
    try:
        maker = smokesweep.prompts(spec, rates)
    except UsageError as exc:  # the dataset cannot be used: the gate records it as it records a launch
        raise LaunchError(f"{exc}; nothing was launched") from exc
    launched.reap_and_tell(ui.warn)  # what a run killed outright left running (its port, its GPUs)
    environ = dict(os.environ if environ is None else environ)
    context = _Context(spec, request, ui, _run_dir(request), environ, nvml_lib, rates, maker)
    sessions: list[Session] = []
    try:
        for i, config in enumerate(configs):
            session = Session(config)
            sessions.append(session)
            _run_session(session, context, keep=request.keep_server and i == len(configs) - 1)
    except KeyboardInterrupt:
        done = _finish(context, sessions, started, clock, interrupted=True)
        raise SmokeInterrupted(done) from None
    return _finish(context, sessions, started, clock, interrupted=False)


def _run_dir(request: SmokeRequest) -> Path:
    if request.run_dir is not None:
        return request.run_dir
    root = settings.LOG_DIR.value().resolve()
    return root / "smoke" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def _finish(context: _Context, sessions: list[Session], started: float, clock: float, *, interrupted: bool) -> SmokeRun:
    results = [r for s in sessions for r in s.results]
    if len(sessions) == 2:
        results += _compare_results(sessions[0], sessions[1])
    if interrupted:
        results.append(
            dataclasses.replace(
                failed("interrupted (Ctrl-C or SIGTERM); every server was torn down"), check="smoke.interrupted"
            )
        )
    verdict = judge(results, strict=context.request.strict)
    if interrupted:
        # The command exits 130: the report and the console say so too, not "1 check(s) failed".
        verdict = Verdict(
            ExitCode.INTERRUPTED, verdict.counts, "interrupted (Ctrl-C or SIGTERM); every server was torn down"
        )
    return SmokeRun(
        context.spec, context.request, tuple(sessions), results, verdict, started, time.monotonic() - clock, interrupted
    )


# --- one configuration ------------------------------------------------------------------------


def _run_session(session: Session, context: _Context, *, keep: bool) -> None:
    memory_before = launch.gpu_memory(context.nvml_lib)
    if not _preflight(session, context):
        return
    config = session.config
    session.log_path = context.run_dir / f"{config.label or 'server'}.log"
    watcher = serverlog.LogWatcher(
        session.log_path,
        context=_scan_context(context.spec, config, session.log_path),
        evidence=config.evidence,
        engine=config.engine,
    )
    server: launch.Server | None = None
    interrupted = stopping = False  # a Ctrl-C during teardown; one before it (teardown follows it)
    try:
        server = _start(session, keep)
        if server is not None:
            _serve(session, context, server, watcher)
    except KeyboardInterrupt:
        stopping = True
        raise
    finally:
        if server is not None:
            teardown = _teardown(session, context, server, watcher, keep=keep, interrupted=stopping)
            interrupted = teardown is not None and teardown.interrupted
            _conclude(session, context, server, watcher, memory_before)
    if interrupted:
        raise KeyboardInterrupt


def _scan_context(spec: Spec, config: Config, log_path: Path) -> dict[str, str]:
    """What the knowledge base's causes and fixes quote: the lock's values, this launch's own."""
    values = knowledge.spec_context(spec)
    values.update(
        lock_backend=config.attention_backend,
        lock_tp=str(config.tp),
        lock_port=str(config.port),
        log_file=shlex.quote(str(log_path)),
    )
    return values


def _preflight(session: Session, context: _Context) -> bool:
    """The refusals before launch; True when the launch may go ahead."""
    config, spec = session.config, context.spec
    try:
        environ, stackgate_set = launch.server_env(spec, config, context.environ)
    except envfile.EnvFileError as exc:
        session.add(
            "preflight.env",
            failed(
                f"the live environment file cannot be read: {exc}; nothing was launched",
                fix=Fix("Re-run provision to rewrite it.", ("stackgate provision",)),
            ),
        )
        return False
    session.environment, session.set_by_stackgate = environ, stackgate_set
    installed = installed_version(spec.python.target, environ, config.engine.distribution or config.engine.name)
    session.config = config = launch.for_installed(config, installed)
    model = launch.check_model(config, environ)
    if model.status == Status.PASS:
        session.config = config = launch.cached_models(config, environ)
    checks = {
        "preflight.python": _check_python(spec),
        "preflight.model": model,
        "preflight.port": launch.check_port(config),
    }
    checks["preflight.gpus"] = launch.check_gpus(config, environ, context.nvml_lib)
    for name, result in checks.items():
        session.add(name, result)
    if config.fast_layers is not None and model.status == Status.PASS:
        session.shrink = _shrink(session, config)
    refused = any(r.status >= Status.FAIL for r in checks.values())
    return not refused and (config.fast_layers is None or session.shrink is not None) and _command(session, context)


def _command(session: Session, context: _Context) -> bool:
    """The command line to launch, the one to show, and the client's key; False if a key is unset."""
    words = session.config.argv(context.spec.python.target, session.shrink)
    session.argv = tuple(secretargs.shown(words))
    try:
        session.launch_argv = tuple(secretargs.resolve(words, session.environment))
    except secretargs.SecretArgError as exc:
        session.add(
            "preflight.api_key",
            failed(
                f"{exc}; nothing was launched",
                fix=Fix("Export the variable before running smoke, or set it in [smoke.env]."),
            ),
        )
        return False
    session.api_key = secretargs.api_key(session.launch_argv)
    return True


def _start(session: Session, keep: bool) -> launch.Server | None:
    assert session.log_path is not None
    try:
        server = launch.start(session.launch_argv, session.environment, session.log_path, keep=keep)
    except OSError as exc:
        session.add("launch", failed(f"cannot start {session.argv[0]}: {exc.strerror or exc}"))
        return None
    session.pid = server.pid
    return server


def _check_python(spec: Spec) -> Result:
    target = spec.python.target
    if target.exists():
        return passed(f"the stack's interpreter {target}")
    how = "run `stackgate provision`" if spec.python.root is not None else "fix python.interpreter in the lock"
    return failed(
        f"no interpreter at {target}: {how}; nothing was launched",
        fix=Fix("Provision the stack first.", ("stackgate provision",)),
    )


def _shrink(session: Session, config: Config) -> fastmode.Shrink | None:
    try:
        return fastmode.shrink(Path(config.model), config.fast_layers or 1)
    except fastmode.FastModeError as exc:
        session.add(
            "fast_mode",
            failed(
                f"{exc}; nothing was launched",
                fix=Fix("Run without --fast (a full load), or use a model whose config counts layers at top level."),
            ),
        )
        return None


def _serve(session: Session, context: _Context, server: launch.Server, watcher: serverlog.LogWatcher) -> None:
    """Readiness, what really runs, the benchmark and the concurrency sweep."""
    config = session.config
    with context.ui.activity(
        f"waiting for {config.engine.title} ({config.title}, TP {config.tp}, pid {server.pid}) to be ready"
    ) as activity:
        ready = wait_ready(
            server,
            watcher,
            config,
            context.spec.smoke.ready_timeout_s,
            lambda phase, _: activity.update(phase),
            silence_s=context.spec.smoke.load_silence_s,
        )
    session.readiness = ready
    session.add("launch", _launch_result(ready, server, watcher, context.spec.smoke, ready.finding))
    if not ready.ready:
        session.failed(f"not ready: {ready.reason}", ready.failed_at)
        return
    faults.trip("smoke:ready")
    _what_runs(session)
    wanted = context.request.measures or bool(context.request.concurrency) or bool(context.rates)
    decisive = _decisive(session, watcher) if wanted else []
    if decisive:
        session.failed(f"not measured: {decisive[0]}", time.time())
        session.add("benchmark", skipped(f"not run: {'; '.join(decisive)}: the server is not what the lock describes"))
    elif wanted:
        _measure(session, context, server, watcher)


#: How long smoke waits, once /health answers 200, for the log's ready line (SGLang writes it just
#: after the warm-up request marks the server up) before it judges the start-up log as complete.
READY_LINE_WAIT_S = 5.0


def _decisive(session: Session, watcher: serverlog.LogWatcher) -> list[str]:
    """What is already known to fail at ready time, so that nothing is benchmarked: another server
    answered, the backend or TP is not the lock's, or a flag's path did not run while starting.

    A fused path's evidence is written while the server starts (graph capture, the warm-up
    request), so once the ready line is in the log its absence is decisive; a server started
    with --skip-server-warmup may run the path first at the benchmark's first request, so its
    evidence waits for the end of the run.
    """
    failures = [
        r.summary
        for r in session.results
        if r.status >= Status.FAIL and r.check in {session.config.check(n) for n in _IDENTITY_CHECKS}
    ]
    flags = session.config.launch_flags(session.shrink)
    quiet = serverinfo.log_level(session.server_info, flags) in serverinfo.QUIET_LEVELS  # no ready line to wait for
    if not session.config.evidence or "--skip-server-warmup" in flags or quiet:
        return failures
    deadline = time.monotonic() + READY_LINE_WAIT_S
    while "ready" not in watcher.reached and time.monotonic() < deadline:
        time.sleep(0.05)
        watcher.poll()
    if "ready" not in watcher.reached:
        return failures
    for item in watcher.evidence:
        early = serverinfo.check_evidence(item, session.server_info, flags)
        if early.status >= Status.FAIL:
            failures.append(f"{item.flag}: its path never initialised while the server started")
    return failures


#: The checks of what runs whose failure means the answering server is not the lock's.
_IDENTITY_CHECKS = ("server_info", "attention_backend", "tp_size")


def _launch_result(
    ready: Readiness, server: launch.Server, watcher: serverlog.LogWatcher, smoke: Smoke, cause: Finding | None
) -> Result:
    tail = [f"> {serverlog.excerpt(line)}" for line in watcher.last_lines(15)]
    fix = Fix("Read the server log; the findings below name known causes.", (f"tail -n 200 {server.log_path}",))
    known = f" (known failure {cause.id}: see below)" if cause else ""
    data = {
        "reason": ready.reason,
        "seconds": round(ready.seconds, 3),
        "phase": ready.phase,
        "exit_code": ready.exit_code,
        "pid": server.pid,
    }
    if ready.reason == "ready":
        return passed(f"ready after {ready.seconds:.1f} s (pid {server.pid})", [ready.proof], data=data)
    if ready.reason == "not ours":
        port = _port_of(server)
        return failed(
            f"port {port} answered /health after {ready.seconds:.1f} s, but from a socket that pid {server.pid} "
            f"never bound: it belongs to {ready.detail}; another server took the port while ours was {ready.phase} "
            "(nothing was benchmarked)",
            tail,
            fix=Fix("Stop the other server, or pass another --port.", (f"ss -ltnp 'sport = :{port}'",)),
            data={**data, "holder": ready.detail},
        )
    if ready.reason == "silent":
        return failed(
            f"the server hung while {ready.phase}: {ready.detail}; stopped waiting after {ready.seconds:.1f} s{known}",
            tail,
            fix=Fix(
                f"If this phase is only slow here, raise [smoke] silence_s (now {smoke.load_silence_s:g} s); "
                f"otherwise see where the server's processes wait (py-spy dump --pid {server.pid}).",
                fix.commands,
            ),
            data={**data, "silence": ready.detail},
        )
    if ready.reason == "exited":
        note = "; SGLang kills its own process tree on a fatal error" if ready.exit_code == -signal.SIGKILL else ""
        return failed(
            f"the server exited ({_exit_text(ready.exit_code)}{note}) after {ready.seconds:.1f} s while "
            f"{ready.phase}{known}",
            tail,
            fix=fix,
            data=data,
        )
    if ready.reason == "fatal":
        return failed(
            f"the log shows a fatal error after {ready.seconds:.1f} s while {ready.phase}{known}; stopped waiting",
            tail,
            fix=fix,
            data=data,
        )
    timeout_s = smoke.ready_timeout_s
    fix = Fix(
        f"If the model is only slow to load, raise [smoke] ready_timeout_s (now {timeout_s:g} s); otherwise read the "
        "log.",
        fix.commands,
    )
    return failed(f"not ready after {timeout_s:g} s (last phase: {ready.phase})", tail, fix=fix, data=data)


def _swept(result: Result, spec: Spec, environ: Mapping[str, str], log: Path, *, known: bool) -> Result:
    """A failed launch told with what the evidence sweep finds abnormal in the server's environment (its limits,
    paths, the stack's shared objects, the kernel's events) and its log's first error: evidence before a log line's
    reading; with no known cause, what the sweep checked where it found nothing."""
    facts = Facts(spec, environ=environ)
    try:
        if known and not evidencesweep.judge(facts.sweep):
            return result
        output = log.read_text(errors="replace")[-200_000:] if log.is_file() else ""
        return evidencesweep.with_cause(result, facts.sweep, output)
    finally:
        facts.close()


def _port_of(server: launch.Server) -> str:
    argv = list(server.argv)
    return argv[argv.index("--port") + 1] if "--port" in argv[:-1] else "?"


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        return f"killed by {name}, status {128 - code}"
    return f"exit code {code}"


def _what_runs(session: Session) -> None:
    config = session.config
    try:
        info, endpoint = serverinfo.fetch(config.base_url, api_key=session.api_key, engine=config.engine)
    except serverinfo.ServerInfoError as exc:
        session.add("server_info", failed(f"the server's configuration could not be read: {exc}"))
        return
    session.server_info, session.info_endpoint = info, endpoint
    session.add("server_info", serverinfo.check_identity(info, endpoint, config.port, config.model, config.engine))
    reports = config.engine.info_fields
    unreported = f"{config.engine.title}'s {endpoint} does not report it"
    backend = serverinfo.check_backend(info, config.attention_backend)
    session.add("attention_backend", backend if "attention_backend" in reports else skipped(unreported))
    session.add("tp_size", serverinfo.check_tp(info, config.tp) if "tp" in reports else skipped(unreported))
    session.add(
        "flags",
        serverinfo.check_flags(
            info, secretargs.resolve(config.launch_flags(session.shrink), session.environment), endpoint
        ),
    )


def _measure(session: Session, context: _Context, server: launch.Server, watcher: serverlog.LogWatcher) -> None:
    config, request, benchmark = session.config, context.request, context.spec.benchmark
    streams = bench.Streams()
    incremental = bool((session.server_info or {}).get("stream_output"))
    # Only the lock's configuration at full weights is judged against the floor, so only it earns extra runs.
    floor = benchmark.floor_tok_s if not config.label and session.shrink is None else None
    api = api_of(config.engine, benchmark)
    with Monitor(server, watcher, streams.abort_all) as monitor:
        session.engine_report.scrape(config.engine, config.base_url, session.api_key)
        if request.measures:
            session.figures = bench.run_benchmark(
                config.base_url,
                benchmark,
                streams=streams,
                incremental_ids=incremental,
                show=context.ui.info,
                explain=lambda error: _explain(monitor, error),
                api_key=session.api_key,
                floor=floor,
                api=api,
            )
        elif benchmark.warmup:
            for _ in range(benchmark.warmup):
                bench.generate(
                    config.base_url,
                    benchmark.prompt,
                    benchmark.output_tokens,
                    streams=streams,
                    api_key=session.api_key,
                    idle_s=benchmark.stream_idle_s,
                    api=api,
                )
        for count in request.concurrency:
            if monitor.failure is not None:
                break
            context.ui.info(f"concurrency: {count} stream(s) of {benchmark.output_tokens} tokens")
            session.levels.append(
                bench.run_level(
                    config.base_url,
                    count,
                    benchmark.prompt,
                    benchmark.output_tokens,
                    streams=streams,
                    api_key=session.api_key,
                    idle_s=benchmark.stream_idle_s,
                    api=api,
                )
            )
        if context.prompts is not None and monitor.failure is None:
            session.sweep = smokesweep.run(
                config,
                context.spec,
                context.rates,
                context.prompts,
                judged=not config.label and session.shrink is None,
                streams=streams,
                api_key=session.api_key,
                show=context.ui.info,
                stop=lambda: monitor.failure is not None,
            )
        if monitor.failure is None:
            session.engine_report.scrape(config.engine, config.base_url, session.api_key)
            if session.shrink is None:
                session.engine_report.check_accuracy(config.base_url, api, context.spec.accuracy, session.api_key)
    stopped = session.figures.stopped_at if session.figures is not None else None
    seen = [t for t in (monitor.failed_at, stopped) if t is not None]
    if monitor.failure is not None or stopped is not None:
        reason = monitor.failure or (session.figures.stopped if session.figures else None) or "a request failed"
        session.failed(reason, min(seen))
    _measure_results(session, context)


def _explain(monitor: Monitor, error: str) -> str:
    """Why a request failed: the server's exit or fatal line, a process of it that cannot answer
    (stopped, state T), or the stream's error with the server up."""
    failure = monitor.wait_failure(EXPLAIN_S)
    if failure is not None:
        return failure
    halted = monitor.server.tree.halted()
    if halted:
        return f"{error}; the server stopped answering: {'; '.join(halted)}"
    return f"{error}; the server is still up (no exit, no fatal log line)"


def _measure_results(session: Session, context: _Context) -> None:
    benchmark = context.spec.benchmark
    label = session.shrink.label if session.shrink else None
    if session.figures is not None:
        # Only the lock's configuration is what baseline_tok_s describes; --compare's baseline is measured, not judged.
        judged, strict = not session.config.label, context.request.strict
        verdict, short = bench.judge(
            session.figures, benchmark, fast_label=label, against_baseline=judged, strict=strict
        )
        session.add("benchmark", verdict)
        session.add("benchmark.short_runs", short)
        if label is not None:
            session.add("quality", skipped("fast mode: random weights, so the quality guard does not apply"))
        else:
            session.add("quality", quality.check_repeatable(session.figures.runs))
    if session.sweep is not None:
        judged = not session.config.label and label is None
        for name, result in smokesweep.results(session.sweep, label, judged=judged, strict=context.request.strict):
            session.add(name, result)
    if session.levels:
        session.add("concurrency", _levels_result(session.levels, label))
        if session.config.speculative is not None and not context.request.compare:
            session.add("compare.concurrency", _no_crossover(session.levels))
    report, runs = session.engine_report, session.figures.runs if session.figures else ()
    session.add("metrics", metrics_result(report, session.config.engine, session.config.launch_flags(session.shrink)))
    session.add("speculative.acceptance", acceptance_result(session.config.speculative, runs, session.levels, report))
    session.add("accuracy", accuracy_result(report, context.spec.accuracy, label))


def _no_crossover(levels: Sequence[bench.Level]) -> Result:
    """A speculative lock's sweep without --compare: why no crossover is estimated (no guess is made)."""
    counts = ",".join(str(level.streams) for level in levels)
    return skipped(
        "no crossover estimate without --compare: run with --compare to measure the non-speculative configuration at "
        "the same levels",
        [
            "speculative decoding stops paying where its per-stream rate falls below the non-speculative "
            "configuration's at the same concurrency;",
            "that rate falls with concurrency too (batching), so a single-stream figure such as baseline_tok_s would "
            "place the crossover too early",
            f"measure both: stackgate smoke --compare --concurrency {counts}",
        ],
    )


def _levels_result(levels: Sequence[bench.Level], label: str | None) -> Result:
    lines = []
    for level in levels:
        per = level.per_stream
        per_text = f"{per.mean:.2f} tok/s per stream (min {per.min:.2f})" if per else "no complete stream"
        latency = f"; TTFT p50/p90/p99 {latency_ms(level.ttft_s())} ms, ITL p50/p90/p99 {latency_ms(level.itl_s())} ms"
        lines.append(f"{level.streams} stream(s): {level.aggregate_tok_s:.2f} tok/s aggregate, {per_text}{latency}")
    data = {"levels": [level.to_dict() for level in levels], "fast_mode": label is not None}
    broken = [level for level in levels if len(level.good) < level.streams]
    if broken:
        return failed(
            f"{sum(level.streams - len(level.good) for level in broken)} concurrent stream(s) did not complete",
            lines,
            data=data,
        )
    prefix = f"{label}: " if label else ""
    return passed(f"{prefix}{'; '.join(line.split(',')[0] for line in lines)}", lines, data=data)


# --- the end of a configuration ---------------------------------------------------------------


def _teardown(
    session: Session,
    context: _Context,
    server: launch.Server,
    watcher: serverlog.LogWatcher,
    *,
    keep: bool,
    interrupted: bool,
) -> launch.Teardown | None:
    watcher.poll()
    if watcher.fatal is not None:
        # After a fatal line SGLang kills its own tree at once: let it, so its exit code is reported.
        # A stream cut while the server stays up has no such line: no wait.
        _wait_exit(server, SETTLE_S)
    alive = server.exit_code() is None
    if keep and alive and session.readiness is not None and session.readiness.ready:
        session.kept = True
        launch.release(server)
        return None
    again = "again " if interrupted else ""

    def waiting(grace_s: float) -> None:
        context.ui.info(
            f"waiting up to {grace_s:g} s for the server (pid {server.pid}) to stop after SIGTERM; "
            f"press Ctrl-C {again}to kill it now"
        )

    session.teardown = launch.stop(server, context.spec.smoke.stop_grace_s, waiting)
    return session.teardown


def _wait_exit(server: launch.Server, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while server.exit_code() is None and time.monotonic() < deadline:
        time.sleep(0.02)


def _conclude(
    session: Session,
    context: _Context,
    server: launch.Server,
    watcher: serverlog.LogWatcher,
    memory_before: dict[int, int] | str,
) -> None:
    """Evidence, log findings, teardown: judged on everything the log said."""
    if session.kept:
        watcher.poll()
    else:
        # The server is gone: the log is complete. How it ends is judged unless smoke stopped the
        # server before the wait for readiness ended (an interrupt): the log then ends mid-load.
        watcher.finish(judge_end=session.readiness is not None)
    session.findings, session.evidence = watcher.findings, watcher.evidence
    ready = session.readiness is not None and session.readiness.ready
    if session.readiness is not None and not ready:
        # The log is complete now: name the best-explaining finding, not the first one seen, and
        # the exit code of a server that died by itself just after its fatal line.
        seen = session.readiness
        if seen.reason == "fatal" and session.teardown is not None and session.teardown.how == "exited by itself":
            seen = dataclasses.replace(seen, reason="exited", exit_code=session.teardown.exit_code)
        named = dataclasses.replace(
            _launch_result(seen, server, watcher, context.spec.smoke, watcher.cause),
            check=session.config.check("launch"),
        )
        named = _swept(named, context.spec, session.environment, server.log_path, known=watcher.cause is not None)
        session.results = [named if r.check == named.check else r for r in session.results]
    for item in session.evidence:
        name = f"evidence.{item.flag.lstrip('-')}"
        evidence = serverinfo.check_evidence(item, session.server_info, session.config.launch_flags(session.shrink))
        session.add(name, evidence if ready else skipped("the server never became ready"))
    engine = session.config.engine
    found = logscan.finding_results(
        session.findings, "log", lock_backend=session.config.attention_backend, backend_finding=engine.backend_finding
    )
    for result in found:
        session.add(result.check, result)
    if not session.findings:
        session.add("log", passed(f"no known failure signature in {watcher.lines} log lines"))
    session.add("teardown", _teardown_result(session, server, context.spec.smoke.stop_grace_s))
    if server.record is not None and server.record.error is not None:
        why = "a run killed outright could leave processes that the next run cannot find"
        session.add("launch.record", warned(f"{server.record.error}: {why}"))
    if session.teardown is not None:
        session.add("gpu_memory", launch.memory_released(memory_before, sorted(server.tree.seen), context.nvml_lib))


def _teardown_result(session: Session, server: launch.Server, grace_s: float) -> Result:
    if session.kept:
        return passed(
            f"left running on purpose (--keep-server): process group {server.pid}; stop it with `kill -TERM -- "
            f"-{server.pid}`",
            data={"pid": server.pid},
        )
    teardown = session.teardown
    assert teardown is not None
    data = dataclasses.asdict(teardown)
    if teardown.leftovers:
        pids = " ".join(p.split()[0] for p in teardown.leftovers)
        return failed(
            f"{len(teardown.leftovers)} process(es) of the server survived teardown",
            list(teardown.leftovers),
            fix=Fix("Kill them.", (f"kill -KILL {pids}",)),
            data=data,
        )
    summary = f"server stopped ({_teardown_story(teardown)}) in {teardown.seconds:.1f} s; none of its processes is left"
    if teardown.stubborn:
        return warned(
            f"{summary}; {len(teardown.stubborn)} process(es) ignored SIGTERM for the whole {grace_s:g} s grace: a "
            "production drain (SIGTERM) would hang",
            list(teardown.stubborn),
            fix=Fix(
                "Find what does not end on SIGTERM (a stuck request, a worker that ignores the signal); until then, "
                "stop the server with SIGKILL after a timeout."
            ),
            data=data,
        )
    if teardown.interrupted and teardown.ignoring:
        return warned(
            f"{summary}; {len(teardown.ignoring)} process(es) ignore SIGTERM (their signal mask says so) and ended "
            "only when the second Ctrl-C killed them: a production drain (SIGTERM) would hang",
            list(teardown.ignoring),
            fix=Fix(
                "Find what sets SIGTERM to be ignored in the server (a wrapper, a worker); until then, stop the server "
                "with SIGKILL after a timeout."
            ),
            data=data,
        )
    if teardown.orphans:
        return warned(
            summary,
            list(teardown.orphans),
            fix=Fix("A server's workers should end with it (SGLang's follow their parent): find what kept them."),
            data=data,
        )
    return passed(summary, data=data)


def _teardown_story(teardown: launch.Teardown) -> str:
    """What happened, in order: the server's own end, and what smoke did."""
    ended = _exit_text(teardown.exit_code)
    if teardown.ended_before:
        if not teardown.orphans:
            return f"it had already ended: {ended}"
        return (
            f"it had already ended ({ended}), leaving {len(teardown.orphans)} process(es) behind; smoke ended them "
            f"with {teardown.how}"
        )
    if teardown.how == "SIGTERM" and teardown.exit_code == -signal.SIGKILL:
        return "SIGTERM; it drained and ended its own tree with SIGKILL, as SGLang does"
    return f"{teardown.how}; {ended}"


# --- --compare --------------------------------------------------------------------------------


def _compare_results(base: Session, full: Session) -> list[Result]:
    names = (base.config.title, full.config.title)
    results = [_speed_result(base, full, names)]
    if full.shrink is None:
        agreement = quality.check_agreement(_first_good(base), _first_good(full), names)
        results.append(dataclasses.replace(agreement, check="smoke.compare.quality"))
    if base.levels and full.levels:
        results.append(_crossover_result(base, full, names))
    return results


def _first_good(session: Session) -> bench.Sample | None:
    return next(iter(session.figures.good), None) if session.figures else None


def _speed_result(base: Session, full: Session, names: tuple[str, str]) -> Result:
    """The lock's configuration against the baseline configuration: the decode rates' difference,
    with the end-to-end rates beside it."""
    a = base.figures.decode_tok_s if base.figures else None
    b = full.figures.decode_tok_s if full.figures else None
    if a is None or b is None:
        return dataclasses.replace(
            failed(f"cannot compare: {names[0] if a is None else names[1]} has no complete benchmark"),
            check="smoke.compare",
        )
    diff = bench.difference(a, b)
    lines = [
        f"{names[0]}: decode {a.text()}",
        f"{names[1]}: decode {b.text()}",
        f"{names[1]} - {names[0]}: {diff.text()}",
    ]
    for session, name in ((base, names[0]), (full, names[1])):
        whole = session.figures.tok_s if session.figures else None
        if whole is not None:
            lines.append(f"{name}: end-to-end {whole.text()}")
    data = {"judged": "decode_tok_s", "baseline": a.to_dict(), "full": b.to_dict(), **diff.to_dict()}
    summary = f"{names[1]} vs {names[0]}: decode {diff.text()}"
    if diff.significant and diff.delta < 0:
        return dataclasses.replace(
            warned(f"{summary}: slower than the baseline", lines, data=data), check="smoke.compare"
        )
    return dataclasses.replace(passed(summary, lines, data=data), check="smoke.compare")


def _crossover_result(base: Session, full: Session, names: tuple[str, str]) -> Result:
    pairs = [(a, b) for a in base.levels for b in full.levels if a.streams == b.streams]
    lines = [
        f"{a.streams} stream(s): {names[0]} {a.aggregate_tok_s:.2f}, {names[1]} {b.aggregate_tok_s:.2f} tok/s "
        f"({b.aggregate_tok_s / a.aggregate_tok_s - 1:+.1%})"
        for a, b in pairs
        if a.aggregate_tok_s
    ]
    pays = [b.aggregate_tok_s > a.aggregate_tok_s for a, b in pairs]
    data: dict[str, Any] = {
        "levels": [
            {"streams": a.streams, names[0]: round(a.aggregate_tok_s, 3), names[1]: round(b.aggregate_tok_s, 3)}
            for a, b in pairs
        ]
    }
    what = (
        "speculative decoding"
        if (full.config.speculative is not None) != (base.config.speculative is not None)
        else names[1]
    )
    stop = next((a.streams for (a, _), good in zip(pairs, pays, strict=True) if not good), None)
    if stop is None:
        text = f"{what} pays at every level measured (up to {pairs[-1][0].streams} streams)"
    elif not any(pays):
        text = f"{what} pays at no level measured"
    else:
        text = f"{what} stops paying at {stop} concurrent streams"
    data["stops_paying_at"] = stop
    return dataclasses.replace(passed(text, lines, data=data), check="smoke.compare.concurrency")
