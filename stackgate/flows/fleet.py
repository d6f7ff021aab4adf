"""The fleet's rollouts: the same command on every node, one fleet verdict.

The nodes come from a fleet engine (flows/fleetengines.py: SSH, Slurm, ...); this module is what
every engine shares: the rollouts' orders, the run and the fleet's report. Each node's outcome and
the per-node actions over any transport (version, ship the spec, run, read the report back, clean
up) are flows/fleetnode.py's.

Ctrl-C (or SIGTERM) stops every node: over a fresh connection each remote process group gets
SIGTERM (stackgate tears its servers down and writes its report), then SIGKILL after a grace;
the reports already written are read back, the fleet report is written, and the exit is 130.

``fleet provision --batch K`` moves K nodes at a time: provision, then a gate, on each; at the
first batch with a failure the failed nodes that were provisioned are rolled back (``stackgate
rollback``) and no further node is touched. :func:`run_nodes` and :func:`rolling` take any
per-node action, so other rollouts can reuse them.

``fleet upgrade --to NEW [--lock LIVE] --canary N --batch K`` is a canary rollout of ``stackgate
upgrade`` (flows/upgrade.py): both specs (and their pylocks) are shipped; the first N nodes
upgrade together (each builds the new stack beside its live one, A/Bs them on its own GPUs and
switches only if the new one wins); only when every canary won, the rest follow K at a time,
stopping after the first batch where a node did not win. A node that did not win kept its live
stack by upgrade's own rule (``current`` moves only in its last, atomic step): nothing is rolled
back. :func:`canary_rollout` is that order of nodes, for any per-node action.
"""

from __future__ import annotations

import concurrent.futures
import datetime as _dt
import threading
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from stackgate import __version__
from stackgate.edges import ssh
from stackgate.flows.fleetnode import (
    FAILED,
    NOT_RUN,
    PASSED,
    Action,
    NodeRun,
    Shipment,
    gate_on_node,
    on_node,
    provision_on_node,
    upgrade_on_node,
)
from stackgate.flows.fleetrequest import FleetRequest
from stackgate.models import settings
from stackgate.models.exitcodes import ExitCode
from stackgate.models.inventory import Node
from stackgate.models.printable import printable
from stackgate.models.spec import Spec
from stackgate.render.ui import UI
from stackgate.runs import aggregate, history

SCHEMA = "stackgate.fleet/1"


Work = Callable[[Node, threading.Event], NodeRun]


Progress = Callable[[NodeRun], None]


def run_nodes(
    nodes: Sequence[Node], work: Work, parallel: int, stop: threading.Event, progress: Progress = lambda done: None
) -> list[NodeRun]:
    """``work`` on every node, ``parallel`` at a time, in the nodes' order; after ``stop`` is set
    (by Ctrl-C here) nodes not yet begun are not run and the running ones stop."""
    pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=max(1, min(parallel, len(nodes) or 1)), thread_name_prefix="fleet"
    )
    futures = {pool.submit(work, node, stop): node for node in nodes}
    try:
        _wait(futures, stop, progress)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return [_result(future, node) for future, node in futures.items()]


def _wait(
    futures: Mapping[concurrent.futures.Future[NodeRun], Node], stop: threading.Event, progress: Progress
) -> None:
    pending = set(futures)
    while pending:
        try:
            done, pending = concurrent.futures.wait(
                pending, timeout=0.5, return_when=concurrent.futures.FIRST_COMPLETED
            )
            for future in done:
                progress(_result(future, futures[future]))
        except KeyboardInterrupt:
            stop.set()  # every node stops; a second Ctrl-C waits on, as their groups are being stopped


def _result(future: concurrent.futures.Future[NodeRun], node: Node) -> NodeRun:
    if future.cancelled():
        return NodeRun(node, NOT_RUN, "not run: the fleet was interrupted")
    error = future.exception()
    if error is not None:
        return NodeRun(node, FAILED, f"the controller failed on this node: {type(error).__name__}: {error}")
    return future.result()


def rolling(
    nodes: Sequence[Node],
    batch: int,
    work: Work,
    stop: threading.Event,
    progress: Progress = lambda done: None,
    lost: str = "failed",
) -> list[NodeRun]:
    """``work`` on ``batch`` nodes at a time; after a batch with a node that did not pass, the
    nodes after it are not run (``not run: an earlier batch <lost> (its nodes)``)."""
    done: list[NodeRun] = []
    for start in range(0, len(nodes), batch):
        if stop.is_set() or any(not d.passed for d in done):
            why = (
                "the fleet was interrupted"
                if stop.is_set()
                else f"an earlier batch {lost} ({', '.join(d.node.name for d in done if not d.passed)})"
            )
            done += [NodeRun(node, NOT_RUN, f"not run: {why}") for node in nodes[start:]]
            break
        done += run_nodes(nodes[start : start + batch], work, batch, stop, progress)
    return done


def canary_rollout(
    nodes: Sequence[Node],
    canary: int,
    batch: int,
    work: Work,
    stop: threading.Event,
    progress: Progress = lambda done: None,
) -> list[NodeRun]:
    """``work`` on the first ``canary`` nodes together; only when every one of them passed, on the
    rest ``batch`` at a time (:func:`rolling`); otherwise no other node is touched."""
    first = [replace(n, steps=("canary", *n.steps)) for n in run_nodes(nodes[:canary], work, canary, stop, progress)]
    lost = [n.node.name for n in first if not n.passed]
    if stop.is_set() or lost:
        why = "the fleet was interrupted" if stop.is_set() else f"the canary did not win ({', '.join(lost)})"
        return first + [NodeRun(node, NOT_RUN, f"not run: {why}") for node in nodes[canary:]]
    return first + rolling(nodes[canary:], batch, work, stop, progress, "did not win")


@dataclass(frozen=True)
class FleetRun:
    request: FleetRequest
    run_id: str
    spec: Spec
    shipment: Shipment
    nodes: tuple[NodeRun, ...]
    started: float
    duration_s: float
    interrupted: bool
    engine: Mapping[str, Any] | None = None  #: the engine's own part of the report (Slurm's job and step; SSH: none)

    def document(self) -> dict[str, Any]:
        return document(self)


def document(done: FleetRun) -> dict[str, Any]:
    """The fleet's report (``stackgate.fleet/1``): every node, the groups, the outliers, one
    verdict; what came from the nodes made printable (:func:`~stackgate.models.printable.printable`)."""
    return printable(_document(done))


def _document(done: FleetRun) -> dict[str, Any]:
    upgrade = done.request.action == "upgrade"
    # an upgrade's node reports carry no fingerprint nor gate figures: its own part says what moved;
    # a verify's none either (the gate takes the fingerprint)
    fingerprinted = done.request.action in ("gate", "provision")
    groups = aggregate.groups([(n.node.name, n.doc) for n in done.nodes]) if fingerprinted else []
    outliers = (
        []
        if upgrade
        else aggregate.outliers([(n.node.name, aggregate.figures(n.doc)) for n in done.nodes if n.doc is not None])
    )
    code, reason = _upgrade_verdict(done) if upgrade else _verdict(done, groups, outliers)
    spec = done.spec
    doc = {
        "schema": SCHEMA,
        "command": f"fleet {done.request.action}",
        "run_id": done.run_id,
        "tool": {"name": "stackgate", "version": __version__},
        "lock": {"name": spec.name, "path": str(spec.path), "sha256": spec.sha256},
        "shipped": done.shipment.sha256,
        "request": {k: getattr(done.request, k) for k in ("action", "parallel", "batch", "fast_only", "strict")}
        | {"checks": list(done.request.checks)},
        "started": _dt.datetime.fromtimestamp(done.started, _dt.timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(done.duration_s, 3),
        "interrupted": done.interrupted,
        **({"engine": dict(done.engine)} if done.engine else {}),
        "nodes": [_node_part(n) for n in done.nodes],
        "counts": dict(Counter(n.status for n in done.nodes)),
        "groups": [g.to_dict() for g in groups],
        "outliers": [o.to_dict() for o in outliers],
        "verdict": "passed" if code == ExitCode.PASSED else "failed",
        "reason": reason,
        "exit_code": int(code),
    }
    if upgrade:
        doc["upgrade"] = _upgrade_part(done)
    return doc


def _upgrade_part(done: FleetRun) -> dict[str, Any]:
    """The rollout: its options, the canary nodes, and which nodes moved, kept or were not touched."""
    request = done.request
    return {
        "to": str(request.to_path),
        "live_spec": str(request.spec_path)
        if request.spec_path
        else None,  #: None: each node's live generation's own spec
        "canary": request.canary,
        "batch": request.batch,
        "switch": request.switch,
        "accept_output_change": request.accept_output_change,
        "canary_nodes": [n.node.name for n in done.nodes[: request.canary]],
        "moved": [n.node.name for n in done.nodes if _moved(n)],
        "kept": [n.node.name for n in done.nodes if n.status not in (PASSED, NOT_RUN) and not _moved(n)],
        "untouched": [n.node.name for n in done.nodes if n.status == NOT_RUN],
    }


def _moved(done: NodeRun) -> bool:
    return "switched" in done.steps


def _upgrade_verdict(done: FleetRun) -> tuple[ExitCode, str]:
    nodes, canary = done.nodes, done.request.canary
    moved = [n.node.name for n in nodes if _moved(n)]
    if done.interrupted:
        return (
            ExitCode.INTERRUPTED,
            f"interrupted (Ctrl-C or SIGTERM): {len(moved)} of {len(nodes)} node(s) had moved to the new stack"
            + (f" ({', '.join(moved)})" if moved else ""),
        )
    if not nodes:
        return ExitCode.FAILED, "no node was upgraded"
    lost = [n for n in nodes[:canary] if not n.passed]
    if lost:
        return (
            ExitCode.FAILED,
            f"the canary {lost[0].node.name} did not win ({lost[0].status}: {lost[0].reason}): "
            "no other node was touched",
        )
    bad = [n for n in nodes if not n.passed and n.status != NOT_RUN]
    if bad:
        left = [n.node.name for n in nodes if n.status == NOT_RUN]
        return ExitCode.FAILED, (
            f"{bad[0].node.name} did not win ({bad[0].status}: {bad[0].reason}): the rollout stopped after its batch; "
            f"{len(moved)} node(s) moved, {len(bad)} kept their live stack, {len(left)} not touched"
        )
    return ExitCode.PASSED, f"{len(moved)} of {len(nodes)} node(s) moved to the new stack" + (
        f", {len(nodes) - len(moved)} already on it" if len(moved) < len(nodes) else ""
    )


def _node_part(done: NodeRun) -> dict[str, Any]:
    doc = done.doc or {}
    stages = doc.get("gate", {}).get("stages") if isinstance(doc.get("gate"), Mapping) else None
    finger = doc.get("gate", {}).get("fingerprint") if isinstance(doc.get("gate"), Mapping) else None
    return {
        "name": done.node.name,
        "address": done.node.address,
        "status": done.status,
        "reason": done.reason,
        "exit_code": done.exit_code,
        "duration_s": round(done.duration_s, 3),
        "version": done.version,
        "steps": list(done.steps),
        "judged": done.judged,
        "run_id": doc.get("run_id") if isinstance(doc.get("run_id"), str) else None,
        "hostname": doc.get("host", {}).get("hostname") if isinstance(doc.get("host"), Mapping) else None,
        "stages": {str(s.get("name")): str(s.get("status")) for s in stages if isinstance(s, Mapping)}
        if isinstance(stages, list)
        else {},
        "fingerprint": finger.get("short")
        if isinstance(finger, Mapping) and isinstance(finger.get("short"), str)
        else None,
        "figures": aggregate.figures(doc),
        "counts": doc.get("counts") if isinstance(doc.get("counts"), Mapping) else {},
        "failed_checks": aggregate.failed_checks(doc),
        **({"upgrade": aggregate.upgrade_outcome(done.doc)} if doc.get("command") == "upgrade" else {}),
    }


def _verdict(
    done: FleetRun, groups: Sequence[aggregate.Group], outliers: Sequence[aggregate.Outlier]
) -> tuple[ExitCode, str]:
    nodes = [n for n in done.nodes if n.judged]
    aside = [n.node.name for n in done.nodes if not n.judged]
    bad = [n for n in nodes if not n.passed]
    stacks = [g for g in groups if g.digest is not None]
    if done.interrupted:
        return (
            ExitCode.INTERRUPTED,
            f"interrupted (Ctrl-C or SIGTERM): {len(nodes) - len(bad)} of {len(nodes)} node(s) had passed",
        )
    if not nodes:
        return ExitCode.FAILED, "no node was checked"
    if bad:
        return ExitCode.FAILED, f"{len(bad)} of {len(nodes)} node(s) did not pass: " + "; ".join(
            f"{n.node.name} {n.status}" for n in bad[:5]
        ) + (" ..." if len(bad) > 5 else "")
    if len(stacks) > 1:
        odd = [node for g in stacks[1:] for node in g.nodes]
        return (
            ExitCode.FAILED,
            f"the nodes run {len(stacks)} different stacks: {', '.join(odd)} "
            f"{'differs' if len(odd) == 1 else 'differ'} from the majority {stacks[0].short}",
        )
    if outliers and done.request.strict:
        return ExitCode.FAILED, f"{len(outliers)} outlier(s) with --strict: {outliers[0].text()}"
    listed = f"; {len(aside)} unavailable, not judged ({_names(aside)})" if aside else ""
    return ExitCode.PASSED, f"{len(nodes)} node(s) passed" + (
        f", {len(outliers)} outlier(s)" if outliers else ""
    ) + listed


def _names(names: Sequence[str], shown: int = 5) -> str:
    """
    >>> _names(["n1", "n2"]), _names([f"n{i}" for i in range(7)])
    ('n1, n2', 'n0, n1, n2, n3, n4 ...')
    """
    return ", ".join(names[:shown]) + (" ..." if len(names) > shown else "")


def run_fleet(
    request: FleetRequest,
    nodes: Sequence[Node],
    spec: Spec,
    ui: UI,
    transport: ssh.Transport | None = None,
    live: Spec | None = None,
    opener: Callable[[threading.Event], ssh.Transport] = ssh.SshTransport,
) -> FleetRun:
    """Run the request's action on every node (see the module's docstring); never raises for what
    a node does. ``lock`` is the spec shipped (an upgrade's new one; ``live``, its live one); the
    nodes are reached through ``transport``, else the one ``opener`` opens (given the run's stop)."""
    stop = threading.Event()
    transport = transport or opener(stop)  # a connect under way ends at once on Ctrl-C
    shipment = Shipment.of(spec, live)
    action = _action(request, shipment)
    started, clock = time.time(), time.monotonic()
    run_id = history.new_id("fleet", started)

    def work(node: Node, stop: threading.Event) -> NodeRun:
        return on_node(node, shipment, action, transport, stop)

    def progress(done: NodeRun) -> None:
        ui.info(printable(f"{done.node.name}: {done.status} in {done.duration_s:.1f} s: {done.reason}"))

    log = ssh_log(run_id)
    with ssh.paramiko_log(log):
        if request.action == "upgrade":
            ran = canary_rollout(nodes, request.canary, request.batch, work, stop, progress)
        elif request.action == "provision":
            ran = rolling(nodes, request.batch, work, stop, progress)
        else:
            ran = run_nodes(nodes, work, request.parallel, stop, progress)
    if log.is_file():
        ui.info(f"the SSH layer's log: {log}")
    return FleetRun(request, run_id, spec, shipment, tuple(ran), started, time.monotonic() - clock, stop.is_set())


def ssh_log(run_id: str) -> Path:
    """Where paramiko's own log of a fleet run goes (``$STACKGATE_LOG_DIR/fleet/<run id>-ssh.log``)."""
    return Path(settings.LOG_DIR.value()).resolve() / "fleet" / f"{run_id}-ssh.log"


def _action(request: FleetRequest, shipment: Shipment) -> Action:
    if request.action == "upgrade":
        args = [
            "--switch",
            request.switch,
            *(["--accept-output-change"] if request.accept_output_change else []),
            *(["--model", request.model] if request.model else []),
        ]
        return upgrade_on_node(args, shipment.live_name)
    if request.action == "verify":
        return gate_on_node(
            [*(a for c in request.checks for a in ("--check", c)), *(["--strict"] if request.strict else [])], "verify"
        )
    gate_args = [*(["--fast-only"] if request.fast_only else []), *(["--strict"] if request.strict else [])]
    return provision_on_node(gate_args) if request.action == "provision" else gate_on_node(gate_args)
