"""`stackgate slurm-health`: the node health check slurmd runs as slurm.conf's ``HealthCheckProgram``.

One run, on the node it checks:

1. ``stackgate verify --cached`` against the configured spec (its static checks' results reused
   while what they judged is unchanged, the GPUs measured every time), in a forked child (or as the
   configured ``stackgate`` program) under a hard time cap (``timeout_s``: past it, the child's
   whole process group is killed and that is the failure); it writes the Prometheus textfile as
   ``verify --cached --prom`` does;
2. the node's Slurm state and reason (``sinfo``), then one decision. This check writes one
   state (a drain) with one kind of reason (``stackgate: ...``), and touches only a node in service
   or one whose state and reason it wrote itself:

   - on a node Slurm has given to a job (allocated, mixed, completing, draining: Slurm's own state,
     before or after verify), the occupancy checks (:data:`OCCUPANCY`: GPU memory held by
     processes) judge nothing: the job explains what they see, and the line says they were not
     judged;
   - a failed check drains a node in service (idle, allocated, mixed, completing, with no reason
     or one of this check's): ``scontrol update nodename=NODE state=drain reason="stackgate:
     <check>: <summary>"`` (one line, at most 120 characters); a node this check drained already
     gets the newer reason;
   - a pass resumes the node only when this check drained it (drained or draining, its reason with
     the prefix);
   - any other node is left exactly as it is, whatever the check finds: one an admin drained,
     set DOWN or FAIL (an RMA ticket), one in maintenance, one whose reason is not this check's.

Settings come from flags or the ``--config`` file (models/healthconfig.py): slurmd gives the
program no PATH of the site's and no SLURM_CONF, so the paths are absolute and Slurm's commands
are looked for in ``slurm_bin`` first. Exit 0 when the node is healthy, 1 when it is not, 2 for
settings it cannot use (nothing was run).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from stackgate.edges import runner, slurm
from stackgate.models import healthconfig
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.models.healthconfig import HealthConfig
from stackgate.render import summaries
from stackgate.render.outputs import Output, check_outputs, write_reports
from stackgate.render.ui import UI

__all__ = ["BUSY", "IN_SERVICE", "OCCUPANCY", "OURS", "HealthVerdict", "check_node", "decide", "excuse", "run"]

#: Checks that judge how busy the GPUs are (memory other processes hold): a job explains them.
OCCUPANCY = frozenset({"gpu.processes"})
#: Slurm states (sinfo's %T without its flag suffixes) of a node given to a job.
BUSY = frozenset({"allocated", "mixed", "completing", "draining"})
#: ... of a node in service, which a failure may drain.
IN_SERVICE = frozenset({"idle", "allocated", "mixed", "completing"})
#: ... the one state this check writes: a drain, with a job still on the node or not.
OURS = frozenset({"drained", "draining"})
_FLAGS = "*~#!%$@^-"  # sinfo's suffixes: not responding, powered off, powering up, ...


@dataclass(frozen=True)
class HealthVerdict:
    """What verify said: healthy, or the first failed check and its summary."""

    healthy: bool
    check: str = ""
    summary: str = ""
    duration_s: float = 0.0
    failed: tuple[tuple[str, str, str], ...] = ()  #: every check that failed or crashed: (name, status, summary)
    excused: tuple[str, ...] = ()  #: failed occupancy checks a job on the node explains: not judged


#: verify in this program: (spec, JSON report, Prometheus file, checks) -> its exit status. Given by
#: the task (tasks.py), and run in a forked child: one Python start fewer than the program again.
LocalVerify = Callable[[Path, Path, "Path | None", tuple[str, ...]], int]


def run(config_path: Path | None, flags: Mapping[str, Any], ui: UI, local: LocalVerify | None = None) -> ExitCode:
    config = (healthconfig.load(config_path) if config_path is not None else HealthConfig()).merged(flags)
    if config.spec is None:
        raise UsageError("slurm-health: no spec to check against: give --lock or `lock` in --config (an absolute path)")
    problem = check_outputs({"--prom": Output(config.prom, summaries.verify_prometheus)})
    if problem is not None:
        raise UsageError(f"slurm-health: {problem}")
    env = environment(config)
    node = config.node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    before = _state(node, env)
    found = check_node(config, env, local, node)
    try:
        state = slurm.node_states([node], env=env).get(node)
        found = excuse(found, state, before)
        action = decide(node, state, found, env)
    except slurm.SlurmError as exc:
        action = f"Slurm not told: {exc}"
    verdict = "healthy" if found.healthy else f"FAIL {found.check}: {found.summary}"
    if found.excused:
        verdict += f" ({', '.join(found.excused)} not judged: Slurm has given the node to a job, which explains it)"
    ui.line(f"stackgate slurm-health {node}: {verdict} ({found.duration_s:.2f} s); {action}")
    return ExitCode.PASSED if found.healthy else ExitCode.FAILED


def _state(node: str, env: Mapping[str, str]) -> slurm.NodeState | None:
    try:
        return slurm.node_states([node], env=env).get(node)
    except slurm.SlurmError:
        return None


def _base(state: slurm.NodeState | None) -> str:
    """Slurm's state word without its flag suffixes (``idle*`` -> ``idle``)."""
    return state.state.lower().rstrip(_FLAGS) if state is not None else ""


def excuse(found: HealthVerdict, *states: slurm.NodeState | None) -> HealthVerdict:
    """``found`` with its failed occupancy checks not judged when Slurm has the node given to a job
    in any of ``states`` (before verify, after it): healthy when nothing else failed."""
    if found.healthy or not any(_base(s) in BUSY for s in states):
        return found
    explained = [status == "FAIL" and name in OCCUPANCY for name, status, _ in found.failed]
    excused = tuple(bad[0] for bad, why in zip(found.failed, explained, strict=True) if why)
    rest = [bad for bad, why in zip(found.failed, explained, strict=True) if not why]
    if not excused:
        return found
    if rest:
        return replace(found, check=rest[0][0], summary=rest[0][2], excused=excused)
    return replace(found, healthy=True, check="", summary="", excused=excused)


def environment(config: HealthConfig) -> dict[str, str]:
    """This process's environment with Slurm's commands found first in ``slurm_bin`` (slurmd's
    own gives no PATH) and the configured slurm.conf."""
    env = dict(os.environ)
    path = env.get("PATH") or os.defpath
    env["PATH"] = f"{config.slurm_bin}{os.pathsep}{path}" if config.slurm_bin else path
    if config.slurm_conf is not None:
        env["SLURM_CONF"] = str(config.slurm_conf)
    env["NO_COLOR"] = "1"
    return env


def check_node(
    config: HealthConfig, env: Mapping[str, str], local: LocalVerify | None = None, node: str | None = None
) -> HealthVerdict:
    """``verify --cached`` under the time cap (``local`` in a forked child, else the configured
    program, else this interpreter's stackgate), read back from its JSON report; the Prometheus
    file written from that report, as ``verify --prom`` writes it, with ``node`` (Slurm's name for
    it) as its ``host`` label."""
    with tempfile.TemporaryDirectory(prefix="stackgate-slurm-health.") as folder:
        report = Path(folder) / "verify.json"
        if local is not None and config.stackgate is None:
            child = _child(local, config, report, env)
            done = runner.call_forked(child, timeout_s=config.timeout_s, output=Path(folder) / "out")
        else:
            program = [str(config.stackgate)] if config.stackgate else [sys.executable, "-m", "stackgate"]
            argv = [*program, "verify", "--cached", "--lock", str(config.spec), "--json", str(report)]
            argv += [a for c in config.checks for a in ("--check", c)]
            done = runner.run(argv, timeout_s=config.timeout_s, env=env, cwd=folder)
        doc = _report(report)
    if doc is not None and config.prom is not None:
        host: dict[str, Any] = doc["host"] if isinstance(doc.get("host"), dict) else {}
        named = {**doc, "host": {**host, "hostname": node or host.get("hostname", "unknown")}}
        write_reports(named, {"--prom": Output(config.prom, summaries.verify_prometheus)})
    if done.timed_out:
        return HealthVerdict(False, "verify", f"no verdict within {config.timeout_s:g} s (killed)", done.duration_s)
    if done.returncode == 0 and doc is not None:
        return HealthVerdict(True, duration_s=done.duration_s)
    bad = [r for r in (doc or {}).get("results", ()) if isinstance(r, Mapping) and r.get("status") in ("FAIL", "ERROR")]
    if done.returncode == 1 and bad:
        failed = tuple((str(r.get("check")), str(r.get("status")), str(r.get("summary"))) for r in bad)
        return HealthVerdict(False, str(bad[0].get("check")), str(bad[0].get("summary")), done.duration_s, failed)
    tail = (done.tail(1) or ["(no output)"])[0]
    return HealthVerdict(False, "verify", f"{done.ended}: {tail}", done.duration_s)


def _child(local: LocalVerify, config: HealthConfig, report: Path, env: Mapping[str, str]) -> Callable[[], int]:
    def child() -> int:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(report.parent)
        assert config.spec is not None
        return local(config.spec, report, None, config.checks)

    return child


def _report(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def decide(node: str, state: slurm.NodeState | None, found: HealthVerdict, env: Mapping[str, str]) -> str:
    """Drain, resume or leave the node (the module's rule); what was done, in words."""
    if state is None:
        return f"left alone: Slurm does not know a node {node!r}"
    base, ours = _base(state), healthconfig.ours(state.reason)
    drained = base in OURS and ours
    if not drained and not (base in IN_SERVICE and (ours or not state.reason)):
        return f"left alone: {state.state} ({state.reason or 'no reason'}), not set by stackgate"
    if found.healthy:
        if drained:
            slurm.resume(node, env)
            return f"resumed (this check had drained it: {state.reason})"
        return f"left {state.state}"
    reason = healthconfig.drain_reason(found.check, found.summary)
    if drained and state.reason.startswith(reason):  # Slurm may append [user@time] to what was written
        return "kept drained"
    slurm.drain(node, reason, env)
    return f"drained: {reason}"
