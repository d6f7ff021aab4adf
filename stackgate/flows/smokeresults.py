"""Smoke's judgements: a launch's outcome, the concurrency sweep, the teardown, --compare's figures.

Each function reads what a session learned and returns a :class:`~stackgate.models.result.Result`;
:mod:`stackgate.flows.smoke` adds them to the session under their check names.
"""

from __future__ import annotations

import dataclasses
import signal
from pathlib import Path
from typing import Any, Mapping, Sequence

from stackgate.facts import Facts, evidencesweep, serverlog
from stackgate.flows.smokerun import Session
from stackgate.models.finding import Finding, Fix
from stackgate.models.result import Result, failed, passed, skipped, warned
from stackgate.models.spec import Smoke, Spec
from stackgate.render.benchtables import latency_ms
from stackgate.serve import bench, benchstats, launch, quality
from stackgate.serve.ready import Readiness

__all__ = [
    "check_python",
    "compare_results",
    "exit_text",
    "launch_result",
    "levels_result",
    "no_crossover",
    "swept",
    "teardown_result",
]


def check_python(spec: Spec) -> Result:
    target = spec.python.target
    if target.exists():
        return passed(f"the stack's interpreter {target}")
    how = "run `stackgate provision`" if spec.python.root is not None else "fix python.interpreter in the lock"
    return failed(
        f"no interpreter at {target}: {how}; nothing was launched",
        fix=Fix("Provision the stack first.", ("stackgate provision",)),
    )


def launch_result(
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
            f"the server exited ({exit_text(ready.exit_code)}{note}) after {ready.seconds:.1f} s while "
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


def swept(result: Result, spec: Spec, environ: Mapping[str, str], log: Path, *, known: bool) -> Result:
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


def exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        return f"killed by {name}, status {128 - code}"
    return f"exit code {code}"


def no_crossover(levels: Sequence[bench.Level]) -> Result:
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


def levels_result(levels: Sequence[bench.Level], label: str | None) -> Result:
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


def teardown_result(session: Session, server: launch.Server, grace_s: float) -> Result:
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
    ended = exit_text(teardown.exit_code)
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


def compare_results(base: Session, full: Session) -> list[Result]:
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
    diff = benchstats.difference(a, b)
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
