"""The fleet's Slurm engine (edges/slurm.py): the allocation's nodes, one step, the same report.

Gate and verify are one srun step, one task per node (:meth:`SlurmEngine.collect`); provision and
upgrade run the per-node actions of flows/fleetnode.py with each command a one-task step
(edges/slurm.py's SrunTransport). Nodes down or drained are listed, not dialled.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from stackgate import __version__
from stackgate.edges import slurm, slurmframes
from stackgate.flows.fleetengine import Placement
from stackgate.flows.fleetnode import (
    FAILED,
    INTERRUPTED,
    NOT_RUN,
    STOP_GRACE_S,
    TIMED_OUT,
    UNAVAILABLE,
    UNREACHABLE,
    NodeFailed,
    NodeRun,
    Shipment,
    judged,
    parse_report,
    tail,
)
from stackgate.flows.fleetrequest import (
    ACTIONS,
    FleetRequest,
    check_batch,
    check_upgrade,
    unknown_action,
    whole,
)
from stackgate.models import fleetoptions
from stackgate.models.exitcodes import UsageError
from stackgate.models.inventory import DEFAULT_TIMEOUT_S as DEFAULT_NODE_TIMEOUT_S
from stackgate.models.inventory import Node
from stackgate.models.printable import printable
from stackgate.models.spec import load_spec
from stackgate.render.ui import UI

__all__ = ["ENGINE", "OPTIONS", "SlurmEngine", "SlurmOptions"]


@dataclass(frozen=True, kw_only=True)
class SlurmOptions:
    """Where the Slurm engine finds its nodes and puts its files (edges/slurm.py)."""

    partition: str | None = None
    nodes: int | None = None  #: outside an allocation: this many nodes of the partition
    nodelist: str | None = None  #: outside an allocation: these nodes (a Slurm host list)
    time_limit: str | None = None  #: the allocation's --time
    extra: tuple[str, ...] = ()  #: the site's own salloc flags (--slurm-arg)
    stackgate: str = "stackgate"  #: the program on the nodes
    node_dir: str = "/tmp"  #: node-local folder sbcast writes into
    shared_dir: Path | None = None  #: a folder every node and this host see: the documents come back there
    #: nodes Slurm lists as down or drained count in the verdict even when the run did not ask for them
    #: (--nodes N of a partition); those the run names (--nodelist, the allocation's) always count
    count_unavailable: bool = False
    step_extra: tuple[str, ...] = ()  #: srun flags from the spec's [slurm] section (GPUs per node, container)


#: The engine's options (``--engine-option NAME=VALUE``; each also a flag of its own, ``--NAME VALUE``).
OPTIONS = fleetoptions.SLURM


def _options(given: Mapping[str, Sequence[str]]) -> SlurmOptions:
    """The engine's options from their texts (the last value of each, every value of slurm-arg)."""
    one = {key: values[-1] for key, values in given.items() if values}
    shared = one.get("shared-dir")
    return SlurmOptions(
        partition=one.get("partition"),
        nodes=whole("--nodes", one["nodes"], 1) if "nodes" in one else None,
        nodelist=one.get("nodelist"),
        time_limit=one.get("time"),
        extra=tuple(given.get("slurm-arg", ())),
        stackgate=one.get("stackgate") or "stackgate",
        node_dir=one.get("node-dir") or "/tmp",
        shared_dir=Path(shared) if shared else None,
        count_unavailable=_switch("count-unavailable", one.get("count-unavailable")),
    )


def _switch(name: str, text: str | None) -> bool:
    """An option without a value: given alone (or ``=true``), or not (or ``=false``).

    >>> _switch("count-unavailable", ""), _switch("count-unavailable", "false"), _switch("count-unavailable", None)
    (True, False, False)
    """
    if text is None:
        return False
    if text.lower() in ("", "true", "yes", "1"):
        return True
    if text.lower() in ("false", "no", "0"):
        return False
    raise UsageError(f"fleet --engine slurm: {name}={text!r}: true or false (or the name alone)")


def _slurm_task_args(request: FleetRequest, spec_name: str) -> list[str]:
    """The action's arguments on the node (the spec named relative to the task's folder)."""
    if request.action == "verify":
        return [
            "verify",
            "--lock",
            spec_name,
            *(a for c in request.checks for a in ("--check", c)),
            *(["--strict"] if request.strict else []),
        ]
    return [
        "gate",
        "--lock",
        spec_name,
        *(["--fast-only"] if request.fast_only else []),
        *(["--strict"] if request.strict else []),
    ]


def _slurm_plan(
    options: SlurmOptions, ui: UI
) -> tuple[slurm.Allocation | None, dict[str, slurm.NodeState], tuple[str, ...], list[str]]:
    """The allocation, every node's state, every node named (the allocation's, then those not
    dialled) and the usable ones, which run; a Slurm command that failed is a usage error."""
    try:
        allocation, states = _slurm_nodes(options, lambda said: ui.info(printable(said)))
    except slurm.SlurmError as exc:
        raise UsageError(f"fleet --engine slurm: {exc}") from None
    if allocation is not None and allocation.queue_wait_s is not None:
        ui.info(f"Slurm job {allocation.job_id}: waited {allocation.queue_wait_s:.0f} s in the queue")
    names = tuple(dict.fromkeys([*states, *(allocation.nodes if allocation is not None else ())]))
    usable = [n for n in names if n in states and states[n].usable] if allocation is not None else []
    return allocation, states, names, usable


def _engine(allocation: slurm.Allocation | None) -> dict[str, Any]:
    """The report's ``engine`` part: the Slurm job, and whether this run asked for it."""
    return {
        "name": "slurm",
        "job_id": allocation.job_id if allocation else None,
        "allocated_here": bool(allocation and allocation.ours),
        "queue_wait_s": allocation.queue_wait_s if allocation else None,
    }


def _slurm_nodes(
    options: SlurmOptions, waiting: Callable[[str], None]
) -> tuple[slurm.Allocation | None, dict[str, slurm.NodeState]]:
    """The allocation (the current one, or one asked for here with the usable nodes) and the state
    of every node named: the allocation's, the --nodelist's, or the partition's."""
    current = slurm.current()
    if current is not None:
        return current, slurm.node_states(current.nodes)
    named = slurm.hostnames(options.nodelist) if options.nodelist else ()
    found = slurm.node_states(named, options.partition)
    states = (
        {n: found.get(n, slurm.NodeState(n, "unknown", "not a node of this cluster")) for n in named}
        if named
        else found
    )
    usable = [n for n, s in states.items() if s.usable]
    if options.nodes is not None and len(usable) < options.nodes:
        raise slurm.SlurmError(
            f"--nodes {options.nodes}: {len(usable)} node(s) of {options.partition or 'the default partition'}"
            " can take work (the rest are down or drained)"
        )
    if not usable:
        return None, states
    allocation = slurm.allocate(
        usable if named else (), options.nodes, options.partition, options.time_limit, options.extra, waiting
    )
    return allocation, {**{n: s for n, s in states.items() if not s.usable}, **slurm.node_states(allocation.nodes)}


def _slurm_node(name: str) -> Node:
    return Node(name=name, host=name, port=0, engine="slurm")


def _not_dialled(name: str, state: slurm.NodeState | None, status: str = UNAVAILABLE) -> NodeRun:
    """A node Slurm says cannot take work: ``unavailable`` in a gate, ``not run`` in a rollout."""
    said = "not dialled" if status == UNAVAILABLE else "not run"
    if state is None:
        return NodeRun(_slurm_node(name), status, f"{said}: Slurm reports no state for the node")
    reason = f" ({state.reason})" if state.reason else ""
    return NodeRun(_slurm_node(name), status, f"{said}: Slurm state {state.state}{reason}")


def _slurm_step(
    request: FleetRequest,
    options: SlurmOptions,
    shipment: Shipment,
    allocation: slurm.Allocation,
    usable: Sequence[str],
    stop: threading.Event,
) -> slurm.Step:
    token = slurm.new_token()
    try:
        slurm.broadcast(allocation.job_id, shipment.files, options.node_dir, token)
    except slurm.SlurmError as exc:
        return slurm.Step({}, None, f"sbcast failed: {exc}")
    files = [word for name, digest in shipment.sha256.items() for word in (name, digest)]
    task_args = [
        options.stackgate,
        __version__,
        options.node_dir,
        token,
        str(options.shared_dir or ""),
        str(len(shipment.files)),
        *files,
    ]
    timeout_s = request.timeout_s or DEFAULT_NODE_TIMEOUT_S
    return slurm.run_step(
        allocation,
        usable,
        [*task_args, *_slurm_task_args(request, shipment.spec_name)],
        token=token,
        timeout_s=timeout_s,
        grace_s=STOP_GRACE_S,
        stop=stop,
        shared=options.shared_dir,
        extra=options.step_extra,
    )


def _from_frame(node: Node, frame: slurmframes.Frame | None, step: slurm.Step, what: str, elapsed_s: float) -> NodeRun:
    """A node's NodeRun from what its task said (or did not say) and how the step ended."""
    fields = frame.fields if frame is not None else {}
    version = fields["version"].removeprefix("stackgate ") if "version" in fields else None
    duration = int(fields["duration_ns"]) / 1e9 if fields.get("duration_ns", "").isdigit() else elapsed_s
    if "failed" in fields:
        return NodeRun(node, FAILED, fields["failed"], duration, version=version)
    doc = None
    if frame is not None and "report" in frame.cut:
        return NodeRun(
            node,
            FAILED,
            f"the node's report is larger than {slurmframes.MAX_VALUE >> 20} MiB (base64): not a stackgate report",
            duration,
            version=version,
        )
    if "report" in fields and hashlib.sha256(fields["report"].encode()).hexdigest() != fields.get("report_sha256"):
        why = _srun_words(step.stderr, node.name) or f"srun exit {step.returncode}"
        return NodeRun(
            node, UNREACHABLE, f"the node's report arrived cut short: srun's output ended early ({why})", duration
        )
    try:
        doc = parse_report(fields["report"]) if "report" in fields else None
    except NodeFailed as failure:
        return NodeRun(node, FAILED, failure.reason, duration, version=version)
    stopped = _stopped_status(step)
    code = fields.get("exit", "")
    if not code.lstrip("-").isdigit():
        status = stopped or UNREACHABLE
        why = _srun_words(step.stderr, node.name) or f"srun exit {step.returncode}"
        text = (
            f"{status}: the node's task ended before its stackgate did ({why})"
            if stopped
            else f"the node's task did not start or was lost: {why}"
        )
        return NodeRun(
            node, status, text, duration, version=version, doc=doc, steps=(what,) if "started" in fields else ()
        )
    done = judged(node, int(code), fields.get("tail") or "(no output)", doc, what, (what,))
    if stopped and not done.passed and done.status != INTERRUPTED:
        done = replace(done, status=stopped, reason=f"{stopped}: {done.reason}")
    return replace(done, duration_s=duration, version=version)


def _stopped_status(step: slurm.Step) -> str | None:
    if step.stopped == "interrupted":
        return INTERRUPTED
    if step.stopped == "timed out" or "DUE TO TIME LIMIT" in step.stderr:
        return TIMED_OUT
    return None


def _srun_words(stderr: str, node: str) -> str:
    """srun's last line about ``node`` (else its last line at all, not its "Try srun --help"), made short."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip() and not line.startswith("Try ")]
    about = [line for line in lines if node in line.split()] or [line for line in lines if node in line]
    return tail("\n".join(about or lines[-1:]), 200) if lines else ""


def check_slurm(request: FleetRequest) -> None:
    """What `fleet --engine slurm` cannot take, refused before anything is asked of Slurm."""
    options = request.options or SlurmOptions()
    if request.action not in ACTIONS:
        raise UsageError(unknown_action(request.action))
    check_batch(request)
    check_upgrade(request)
    if options.shared_dir is not None and request.action not in ("gate", "verify"):
        raise UsageError(f"fleet {request.action} --engine slurm: --shared-dir is for gate and verify")
    if request.hosts is not None or request.inventory is not None:
        raise UsageError(
            "fleet --engine slurm: the nodes are Slurm's (the allocation's, or --nodes/--nodelist):"
            " not --hosts or --inventory"
        )
    if request.checks and request.action != "verify":
        raise UsageError("fleet: --check is for `fleet verify`")
    if options.nodes is not None and options.nodelist is not None:
        raise UsageError("fleet --engine slurm: --nodes N or --nodelist LIST, not both")
    inside = bool(os.environ.get("SLURM_JOB_ID"))
    if not inside and options.nodes is None and options.nodelist is None:
        raise UsageError(
            "fleet --engine slurm: outside an allocation, ask for nodes with --nodes N or --nodelist LIST"
            " (SLURM_JOB_ID is not set)"
        )
    if options.shared_dir is not None and not options.shared_dir.is_dir():
        raise UsageError(f"--shared-dir {options.shared_dir}: not a folder")


class SlurmEngine:
    """Clusters under Slurm: an allocation's nodes (this one's, or one asked for with salloc)."""

    name = "slurm"
    summary = "an allocation's nodes under Slurm: one srun step, documents back through srun (docs/slurm.md)"
    options = OPTIONS

    def parse_options(self, given: Mapping[str, Sequence[str]]) -> SlurmOptions:
        return _options(given)

    def check(self, request: FleetRequest) -> None:
        check_slurm(request)

    def place(self, request: FleetRequest, ui: UI) -> Placement:
        """The allocation and the nodes' states; a rollout's nodes not run (down, drained) listed."""
        options = _with_spec(request.options or SlurmOptions(), request)
        allocation, states, names, usable = _slurm_plan(options, ui)
        release = (lambda: slurm.release(allocation)) if allocation is not None else (lambda: None)
        if request.action == "upgrade" and request.canary > len(usable):
            release()
            raise UsageError(f"fleet upgrade: --canary {request.canary}: Slurm gives {len(usable)} usable node(s)")
        timeout_s = request.timeout_s or DEFAULT_NODE_TIMEOUT_S
        nodes = [replace(_slurm_node(n), stackgate=options.stackgate, timeout_s=timeout_s) for n in usable]
        listed = [_not_dialled(n, states.get(n), NOT_RUN) for n in names if n not in usable]
        handle = (allocation, states, names, usable, options)
        return Placement(nodes, listed, _engine(allocation), handle, release)

    def transport(self, placement: Placement, stop: threading.Event) -> slurm.SrunTransport:
        return slurm.SrunTransport(placement.handle[0], placement.handle[4].step_extra)

    def collect(
        self, request: FleetRequest, placement: Placement, shipment: Shipment, stop: threading.Event, ui: UI
    ) -> Sequence[NodeRun] | None:
        """Gate and verify: one step on every usable node, each node's frame read into its NodeRun;
        the nodes Slurm says cannot take work listed (``unavailable``) in their places."""
        if request.action not in ("gate", "verify"):
            return None
        allocation, states, names, usable, options = placement.handle
        # the nodes the run names (--nodelist, the allocation's) are judged; a partition's others only on request
        counted = options.nodes is None or options.count_unavailable
        ran = {n: replace(_not_dialled(n, states.get(n)), judged=counted) for n in names if n not in usable}
        if usable and allocation is not None:
            clock = time.monotonic()
            step = _slurm_step(request, options, shipment, allocation, usable, stop)
            assert placement.part is not None
            placement.part["step_id"] = step.step_id
            ran |= {
                n: _from_frame(_slurm_node(n), step.frames.get(n), step, request.action, time.monotonic() - clock)
                for n in usable
            }
        nodes = [ran[n] for n in names]
        for done in nodes:
            ui.info(printable(f"{done.node.name}: {done.status} in {done.duration_s:.1f} s: {done.reason}"))
        return nodes


def _with_spec(options: SlurmOptions, request: FleetRequest) -> SlurmOptions:
    """``options`` with the spec's ``[slurm]`` GPUs per node (asked of salloc and of each step) and
    container (each step runs in it); the options as given when the spec cannot be read (the
    controller says why)."""
    try:
        section = load_spec(request.to_path or request.spec_path).slurm
    except (UsageError, OSError):
        return options
    gpus = [f"--gpus-per-node={section.gpus_per_node}"] if section.gpus_per_node else []
    mounts: list[str | Path] = [options.node_dir, *([options.shared_dir] if options.shared_dir else [])]
    step = slurm.step_flags(section.gpus_per_node, section.container_image, mounts)
    return replace(options, extra=(*gpus, *options.extra), step_extra=tuple(step))


ENGINE = SlurmEngine()
