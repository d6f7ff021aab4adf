"""The smoke flow: launch the engine as production will, prove what runs, benchmark it, tear it down.

:func:`run_smoke` is the library entry point (the gate calls it): for each configuration (the
lock's, and with --compare a baseline first) it refuses what cannot work before launching,
launches the server in its own process group, waits for readiness while following the log,
reads what really runs, benchmarks it, and always tears it down. Everything it learns becomes
``smoke.*`` Results, so a report can hold them beside verify's: the request, the sessions and the
finished run are :mod:`stackgate.flows.smokerun`'s, the judgements :mod:`stackgate.flows.smokeresults`'.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Mapping

from stackgate.checks.smoke import logscan, serverinfo
from stackgate.edges import faults
from stackgate.facts import serverlog
from stackgate.facts.engineversion import installed_version
from stackgate.flows import smokeresults, smokesweep
from stackgate.flows.smokereports import acceptance_result, accuracy_result, api_of, metrics_result
from stackgate.flows.smokerun import Session, SmokeInterrupted, SmokeRequest, SmokeRun
from stackgate.flows.stages import Stage, run_stages
from stackgate.models import envfile, knowledge, secretargs, settings
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.models.finding import Fix
from stackgate.models.result import Status, failed, passed, skipped, warned
from stackgate.models.spec import Spec
from stackgate.models.verdict import Verdict, judge
from stackgate.render.ui import UI
from stackgate.serve import bench, fastmode, launch, launched, quality
from stackgate.serve.launch import Config, LaunchError
from stackgate.serve.prompts import PromptMaker
from stackgate.serve.ready import Monitor, wait_ready

__all__ = ["run_smoke"]

#: How long a failed request waits for the process/log watcher to say why the server failed. A
#: dying server's stream closes when its main process exits, and its fatal lines are written
#: before that, so the answer is in within a tick or two; a stream cut while the server stays up
#: gets its verdict after this wait.
EXPLAIN_S = 0.3
#: How long a server that logged a fatal error may take to end itself before teardown starts.
SETTLE_S = 0.5


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
        results += smokeresults.compare_results(sessions[0], sessions[1])
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


@dataclass
class _Launch:
    """One configuration under way: what its stages read and fill."""

    session: Session
    context: _Context
    keep: bool  #: leave the server running (--keep-server, the last configuration)
    memory_before: dict[int, int] | str
    watcher: serverlog.LogWatcher | None = None
    server: launch.Server | None = None
    stopping: bool = False  #: an interrupt came before teardown (teardown follows it)
    interrupted: bool = False  #: an interrupt came during teardown


def _run_session(session: Session, context: _Context, *, keep: bool) -> None:
    state = _Launch(session, context, keep, launch.gpu_memory(context.nvml_lib))
    run_stages(SESSION_STAGES, state)
    if state.interrupted:
        raise KeyboardInterrupt


def _preflight_stage(state: _Launch) -> bool:
    return _preflight(state.session, state.context)


def _start_stage(state: _Launch) -> bool:
    session, context = state.session, state.context
    config = session.config
    session.log_path = context.run_dir / f"{config.label or 'server'}.log"
    state.watcher = serverlog.LogWatcher(
        session.log_path,
        context=_scan_context(context.spec, config, session.log_path),
        evidence=config.evidence,
        engine=config.engine,
    )
    state.server = _start(session, state.keep)
    return state.server is not None


def _serve_stage(state: _Launch) -> None:
    assert state.server is not None and state.watcher is not None
    _serve(state.session, state.context, state.server, state.watcher)


def _stopping(state: _Launch) -> None:
    state.stopping = True


def _teardown_stage(state: _Launch) -> None:
    server, watcher, session, context = state.server, state.watcher, state.session, state.context
    if server is None or watcher is None:
        return
    teardown = _teardown(session, context, server, watcher, keep=state.keep, interrupted=state.stopping)
    state.interrupted = teardown is not None and teardown.interrupted
    _conclude(session, context, server, watcher, state.memory_before)


#: One configuration's stages: nothing launches unless the refusals pass, and a server that started is
#: always torn down and judged on its whole log, however the stages before ended.
SESSION_STAGES: tuple[Stage[_Launch], ...] = (
    Stage("preflight", _preflight_stage, "refuse what cannot work, before launching"),
    Stage("start", _start_stage, "launch the server in its own process group", ("preflight",), interrupt=_stopping),
    Stage("serve", _serve_stage, "readiness, what really runs, the benchmark", ("start",), interrupt=_stopping),
    Stage("teardown", _teardown_stage, "stop the server, then judge its log and its end", always=True),
)


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
        "preflight.python": smokeresults.check_python(spec),
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
    session.add("launch", smokeresults.launch_result(ready, server, watcher, context.spec.smoke, ready.finding))
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
        session.add("concurrency", smokeresults.levels_result(session.levels, label))
        if session.config.speculative is not None and not context.request.compare:
            session.add("compare.concurrency", smokeresults.no_crossover(session.levels))
    report, runs = session.engine_report, session.figures.runs if session.figures else ()
    session.add("metrics", metrics_result(report, session.config.engine, session.config.launch_flags(session.shrink)))
    session.add("speculative.acceptance", acceptance_result(session.config.speculative, runs, session.levels, report))
    session.add("accuracy", accuracy_result(report, context.spec.accuracy, label))


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
            smokeresults.launch_result(seen, server, watcher, context.spec.smoke, watcher.cause),
            check=session.config.check("launch"),
        )
        named = smokeresults.swept(
            named, context.spec, session.environment, server.log_path, known=watcher.cause is not None
        )
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
    session.add("teardown", smokeresults.teardown_result(session, server, context.spec.smoke.stop_grace_s))
    if server.record is not None and server.record.error is not None:
        why = "a run killed outright could leave processes that the next run cannot find"
        session.add("launch.record", warned(f"{server.record.error}: {why}"))
    if session.teardown is not None:
        session.add("gpu_memory", launch.memory_released(memory_before, sorted(server.tree.seen), context.nvml_lib))
