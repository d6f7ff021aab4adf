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

The spec's ``[slurm]`` section shapes the decision (flows/nodehealth.py holds the rules): a check
drains only after ``drain_after`` consecutive failures (the counts, and each node's reason
history, in ``state_dir``: runs/healthstate.py), never past ``max_drained_share`` of a partition
(the breaker), and a node this check drained is resumed only once a fresh verify (``revalidate``:
every check run afresh, or ``--deep``) passes too. Slurm's ``Gres=gpu:...`` is compared with NVML's
GPUs (``slurm.gres``). ``role`` runs the same program as slurm.conf's Prolog (no damping: a failure
drains at once and Slurm requeues the job), its Epilog (a process the job left, GPU memory still
held) or for LBNL NHC (``judge``: the verdict only, Slurm untouched). :func:`summary` reads the
cluster's nodes from Slurm and groups them by verdict, drift and drain reason.

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
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from stackgate.edges import nvml, runner, slurm
from stackgate.flows import nodehealth
from stackgate.models import healthconfig
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.models.healthconfig import HealthConfig
from stackgate.models.spec import load_spec
from stackgate.models.spec import slurm as slurmspec
from stackgate.render import clustersummary, summaries
from stackgate.render.outputs import JSON, Output, check_outputs, write_reports
from stackgate.render.ui import UI
from stackgate.runs import healthstate

__all__ = [
    "BUSY",
    "IN_SERVICE",
    "OCCUPANCY",
    "OURS",
    "HealthVerdict",
    "check_node",
    "decide",
    "excuse",
    "run",
    "summary",
]

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


#: verify in this program: (spec, JSON report, Prometheus file, checks, mode) -> its exit status. Given
#: by the task (tasks.py), and run in a forked child: one Python start fewer than the program again.
LocalVerify = Callable[[Path, Path, "Path | None", tuple[str, ...], str], int]
#: verify's flags for each mode of :func:`check_node`.
_MODES = {"cached": ("--cached",), "verify": (), "deep": ("--deep",)}


def run(config_path: Path | None, flags: Mapping[str, Any], ui: UI, local: LocalVerify | None = None) -> ExitCode:
    config = (healthconfig.load(config_path) if config_path is not None else HealthConfig()).merged(flags)
    if config.spec is None:
        raise UsageError("slurm-health: no spec to check against: give --lock or `lock` in --config (an absolute path)")
    problem = check_outputs({"--prom": Output(_prom_path(config.prom, "node"), summaries.verify_prometheus)})
    if problem is not None:
        raise UsageError(f"slurm-health: {problem}")
    env = environment(config)
    node = config.node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    config = replace(config, prom=_prom_path(config.prom, node))
    policy = _policy(config.spec)
    record = healthstate.load(config.state_dir, node)
    before = _state(node, env) if config.role != "epilog" else None
    found = _epilog(config, env, local, node) if config.role == "epilog" else check_node(config, env, local, node)
    found = _with_gres(found, node, env)
    acting = Acting(policy if config.role == "check" else replace(policy, drain_after=1), record)
    if config.role == "check":
        acting.revalidate = lambda: check_node(config, env, local, node, mode=policy.revalidate)
    try:
        state = slurm.node_states([node], env=env).get(node)
        found = excuse(found, state, before) if config.role != "epilog" else found
        action = decide(node, state, found, env, acting) if config.role != "judge" else "Slurm left to the caller"
    except slurm.SlurmError as exc:
        action = f"Slurm not told: {exc}"
    verdict = "healthy" if found.healthy else f"FAIL {found.check}: {found.summary}"
    if found.excused:
        verdict += f" ({', '.join(found.excused)} not judged: Slurm has given the node to a job, which explains it)"
    prefix = "" if config.role == "check" else f" {config.role}"
    ui.line(f"stackgate slurm-health{prefix} {node}: {verdict} ({found.duration_s:.2f} s); {action}")
    if acting.held is not None:
        ui.error(f"stackgate slurm-health {node}: BREAKER HOLDS, node not drained: {acting.held}")
    kept = _keep(config.state_dir, acting.record, found, config.role)
    if kept is not None or record.note:
        ui.error(f"stackgate slurm-health {node}: {kept or record.note}")
    return ExitCode.PASSED if found.healthy or (acting.held is not None and config.role != "check") else ExitCode.FAILED


def summary(
    config_path: Path | None,
    flags: Mapping[str, Any],
    partition: str | None,
    outputs: Mapping[str, Path | None],
    ui: UI,
) -> ExitCode:
    """The cluster's health at a glance (render/clustersummary.py), from Slurm's view of every node:
    the console's lines, and the JSON and Markdown asked for (``{"--json": path, "--markdown": path}``)."""
    config = (healthconfig.load(config_path) if config_path is not None else HealthConfig()).merged(flags)
    reports = {
        "--json": Output(outputs.get("--json"), JSON),
        "--markdown": Output(outputs.get("--markdown"), clustersummary.markdown),
    }
    problem = check_outputs(reports)
    if problem is not None:
        raise UsageError(f"slurm-health --summary: {problem}")
    try:
        doc = clustersummary.summarize(slurm.node_table(partition, environment(config)).values(), partition)
    except slurm.SlurmError as exc:
        raise UsageError(f"slurm-health --summary: {exc}") from None
    for line in clustersummary.console_lines(doc):
        ui.line(line)
    write_reports(doc, reports)
    return ExitCode.PASSED if set(doc["by_verdict"]) <= {"healthy"} else ExitCode.FAILED


def _prom_path(prom: Path | None, node: str) -> Path | None:
    """The textfile's path with ``{node}`` as the node's Slurm name (one file per node in a shared folder)."""
    return Path(str(prom).replace("{node}", node)) if prom is not None else None


def _policy(spec_path: Path | None) -> slurmspec.Slurm:
    """The spec's ``[slurm]`` settings; Slurm's defaults when the spec cannot be read (verify says why)."""
    try:
        return load_spec(spec_path).slurm if spec_path is not None else slurmspec.Slurm()
    except (UsageError, OSError):
        return slurmspec.Slurm()


def _with_gres(found: HealthVerdict, node: str, env: Mapping[str, str]) -> HealthVerdict:
    """``found`` with ``slurm.gres`` failed when Slurm's GPUs for the node and NVML's disagree."""
    try:
        gres = slurm.gres(node, env)
    except slurm.SlurmError:
        return found
    if not nodehealth.gpu_gres(gres):
        return found
    try:
        gpus = [g.name for g in nvml.snapshot().gpus]
    except nvml.NvmlError:
        gpus = []
    problem = nodehealth.gres_problem(gres, gpus)
    if problem is None:
        return found
    failed = (*found.failed, ("slurm.gres", "FAIL", problem))
    if found.healthy:
        return replace(found, healthy=False, check="slurm.gres", summary=problem, failed=failed)
    return replace(found, failed=failed)


def _epilog(config: HealthConfig, env: Mapping[str, str], local: LocalVerify | None, node: str) -> HealthVerdict:
    """What the job that just ended left: its processes (by its SLURM_JOB_ID) and GPU memory held
    (verify's occupancy checks, judged: no job explains it any more)."""
    job, cluster = os.environ.get("SLURM_JOB_ID", ""), os.environ.get("SLURM_CLUSTER_NAME", "")
    leaks = nodehealth.job_processes(job, cluster) if job.isdigit() else []
    found = check_node(replace(config, checks=tuple(OCCUPANCY)), env, local, node)
    if not leaks:
        return found
    shown = ", ".join(f"pid {leak.pid} ({leak.command})" for leak in leaks[:3])
    summary = f"job {job} left {len(leaks)} process(es) running: {shown}"
    failed = (("epilog.processes", "FAIL", summary), *found.failed)
    return HealthVerdict(False, "epilog.processes", summary, found.duration_s, failed)


def _keep(folder: Path, record: healthstate.NodeRecord, found: HealthVerdict, role: str) -> str | None:
    last = {"time": time.time(), "role": role, "healthy": found.healthy, "check": found.check, "summary": found.summary}
    return healthstate.save(folder, replace(record, last=last))


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
    config: HealthConfig,
    env: Mapping[str, str],
    local: LocalVerify | None = None,
    node: str | None = None,
    mode: str = "cached",
) -> HealthVerdict:
    """verify under the time cap (``local`` in a forked child, else the configured program, else
    this interpreter's stackgate), read back from its JSON report; the Prometheus file written from
    that report, as ``verify --prom`` writes it, with ``node`` (Slurm's name for it) as its ``host``
    label. ``mode``: ``cached`` (``verify --cached``), ``verify`` (every check run afresh) or
    ``deep`` (``verify --deep``): the last two are the re-validation before a resume."""
    with tempfile.TemporaryDirectory(prefix="stackgate-slurm-health.") as folder:
        report = Path(folder) / "verify.json"
        if local is not None and config.stackgate is None:
            child = _child(local, config, report, env, mode)
            done = runner.call_forked(child, timeout_s=config.timeout_s, output=Path(folder) / "out")
        else:
            program = [str(config.stackgate)] if config.stackgate else [sys.executable, "-m", "stackgate"]
            argv = [*program, "verify", *_MODES[mode], "--lock", str(config.spec), "--json", str(report)]
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


def _child(
    local: LocalVerify, config: HealthConfig, report: Path, env: Mapping[str, str], mode: str
) -> Callable[[], int]:
    def child() -> int:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(report.parent)
        assert config.spec is not None
        return local(config.spec, report, None, config.checks, mode)

    return child


def _report(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


@dataclass
class Acting:
    """How a decision acts (the spec's damping, breaker and re-validation) and what it keeps."""

    policy: slurmspec.Slurm
    record: healthstate.NodeRecord
    revalidate: Callable[[], HealthVerdict] | None = None  #: the fuller check a drained node must pass first
    held: str | None = None  #: set when the breaker held a drain back: why


def decide(
    node: str, state: slurm.NodeState | None, found: HealthVerdict, env: Mapping[str, str], acting: Acting
) -> str:
    """Drain, resume or leave the node (the module's rule); what was done, in words."""
    if state is None:
        return f"left alone: Slurm does not know a node {node!r}"
    base, ours = _base(state), healthconfig.ours(state.reason)
    drained = base in OURS and ours
    if not drained and not (base in IN_SERVICE and (ours or not state.reason)):
        return f"left alone: {state.state} ({state.reason or 'no reason'}), not set by stackgate"
    judged = [name for name, _, _ in found.failed if name not in found.excused]  # a job explains the others
    failing = [] if found.healthy else judged or [found.check]
    counts = healthstate.counted(acting.record.counts, failing)
    acting.record = replace(acting.record, counts=counts)
    if found.healthy:
        return _resume(node, state, env, acting) if drained else f"left {state.state}"
    due = nodehealth.ripe(counts, acting.policy.drain_after)
    if due is None:
        n = counts.get(found.check, 0)
        return (
            f"not drained: {found.check} has failed {n} consecutive time(s), the spec drains after "
            f"{acting.policy.drain_after} (transient until then)"
        )
    summary = next((said for name, _, said in found.failed if name == due), found.summary)
    reason = healthconfig.drain_reason(due, summary)
    if drained and state.reason.startswith(reason):  # Slurm may append [user@time] to what was written
        return "kept drained"
    if not drained:
        held = nodehealth.breaker(node, slurm.partition_peers(node, env), acting.policy.max_drained_share)
        if held.holds:
            return _held(acting, held.words(acting.policy.max_drained_share))
    slurm.drain(node, reason, env)
    if not drained:  # checks that drained at once: the breaker's order keeps the earliest
        after = nodehealth.breaker(node, slurm.partition_peers(node, env), acting.policy.max_drained_share)
        if after.holds:
            slurm.resume(node, env)
            return _held(acting, after.words(acting.policy.max_drained_share) + " (drained at once: undone)")
    acting.record = acting.record.with_event("drained", reason)
    return f"drained: {reason}"


def _held(acting: Acting, why: str) -> str:
    acting.held = why
    acting.record = acting.record.with_event("breaker", why)
    return f"NOT drained: {why}"


def _resume(node: str, state: slurm.NodeState, env: Mapping[str, str], acting: Acting) -> str:
    """A node this check drained, healthy again: resumed once the fuller check passes too."""
    if acting.revalidate is None:
        return "kept drained: only the periodic check, after its re-validation, resumes a node"
    again = acting.revalidate()
    how = acting.policy.revalidate
    if not again.healthy:
        reason = healthconfig.drain_reason(again.check, again.summary)
        if not state.reason.startswith(reason):
            slurm.drain(node, reason, env)
        acting.record = acting.record.with_event("kept drained", f"re-validation ({how}) failed: {reason}")
        return f"kept drained: the cached check passes, the re-validation ({how}) does not: {reason}"
    slurm.resume(node, env)
    words = f"re-validated ({how}, {again.duration_s:.2f} s) after: {state.reason}"
    acting.record = acting.record.with_event("resumed", words)
    return f"resumed (this check had drained it; {words})"
