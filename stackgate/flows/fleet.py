"""The fleet's rollouts: the same command on every node, one fleet verdict.

The nodes come from a fleet engine (flows/fleetengines.py: SSH, Slurm, ...); this module is what
every engine shares: the request, each node's outcome, the per-node actions over any transport, the
rollouts' orders and the fleet's report.

On each node, over one session of the engine's transport (SSH's: edges/ssh.py), in order:

1. ``stackgate --version``: the node's installed stackgate must be this one's version;
2. the spec (and its pylock, when there is one beside it) is written to a fresh temporary folder
   (``mktemp -d``) and its sha256 checked there, file by file, against the controller's;
3. ``stackgate gate|verify --lock <that spec> --json <that folder>/report.json`` runs in its own
   session and process group (``setsid``), its group id written beside the report;
4. the report is read back and judged (the node's exit code and its document), and the folder
   removed.

A node that cannot be reached, refuses the key, answers with another version or runs past its
timeout is a failed node carrying the reason; nothing waits longer than the node's timeouts.
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
import hashlib
import json
import re
import shlex
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from stackgate import __version__
from stackgate.edges import ssh
from stackgate.flows.fleetrequest import FleetRequest
from stackgate.models import inputfile, pylock, rundoc, settings
from stackgate.models.exitcodes import ExitCode
from stackgate.models.inventory import Node
from stackgate.models.printable import printable
from stackgate.models.spec import Spec
from stackgate.render.ui import UI
from stackgate.runs import aggregate, history

SCHEMA = "stackgate.fleet/1"


PASSED, FAILED, UNREACHABLE, TIMED_OUT, INTERRUPTED, NOT_RUN, UNAVAILABLE = (
    "passed",
    "failed",
    "unreachable",
    "timed out",
    "interrupted",
    "not run",
    "unavailable",  #: the scheduler says the node cannot take work (down, drained): listed, not dialled
)


#: What an upgrade that did not win left on its node (flows/upgrade.py: ``current`` moves only in
#: its last, atomic step).
KEPT = "kept the live stack: nothing to roll back"


#: ... and what a node stopped before it wrote its report left: upgrade's rule, no report to confirm it.
STOPPED = "stopped before its report: current is the live stack unless upgrade's last, atomic step (the switch) had run"


#: A node's report is read whole: a bigger one is not a stackgate report.
MAX_REPORT_BYTES = 64 << 20


#: How long a stopped node's stackgate gets to tear down (its servers) before SIGKILL.
STOP_GRACE_S = 30.0


_FOLDER = re.compile(r"^/[^\n]*/stackgate-fleet\.[A-Za-z0-9]{8}$")


@dataclass(frozen=True)
class NodeRun:
    """One node's outcome: its status, the reason in one line, its own report when it wrote one."""

    node: Node
    status: str  #: passed | failed | unreachable | timed out | interrupted | not run | unavailable
    reason: str
    duration_s: float = 0.0
    exit_code: int | None = None
    version: str | None = None
    doc: Mapping[str, Any] | None = None
    steps: tuple[str, ...] = ()  #: what was done to the node, in order (provisioned, gated, rolled back)
    judged: bool = True  #: counted in the verdict (False: listed only, a node the run was not meant to judge)

    @property
    def passed(self) -> bool:
        return self.status == PASSED


@dataclass(frozen=True)
class Shipment:
    """The files every node gets: name -> bytes, and their sha256."""

    spec_name: str
    files: Mapping[str, bytes]
    live_name: str | None = None  #: upgrade: the live spec's name among the files

    @property
    def sha256(self) -> dict[str, str]:
        return {name: hashlib.sha256(data).hexdigest() for name, data in self.files.items()}

    @staticmethod
    def of(spec: Spec, live: Spec | None = None) -> Shipment:
        """The spec and its pylock; with ``live`` (an upgrade's live spec) that one's too, under
        ``live-NAME`` when its names would take the new one's."""
        files = _spec_files(spec.path.name, spec)
        if live is None:
            return Shipment(spec.path.name, files)
        name = live.path.name
        if name in files or pylock.path_for(Path(name)).name in files:
            name = f"live-{name}"
        return Shipment(spec.path.name, {**files, **_spec_files(name, live)}, name)


def _spec_files(name: str, spec: Spec) -> dict[str, bytes]:
    """A spec's bytes under ``name``, and its pylock's (when there is one) under the name the node's
    stackgate will look for beside ``name``."""
    files = {name: inputfile.read_capped(spec.path, inputfile.MAX_SPEC_BYTES)}
    locked = pylock.path_for(spec.path)
    if locked.exists():  # a pylock that cannot be used is a bad lockfile (exit 2), not each node's failure
        checked = pylock.load_beside(spec).path
        files[pylock.path_for(Path(name)).name] = inputfile.read_capped(checked, inputfile.MAX_PYLOCK_BYTES)
    return files


class NodeFailed(Exception):
    """A step on a node that failed: the node's status and the reason."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


@dataclass
class Remote:
    """A node's session and its temporary folder: the steps every per-node action is made of."""

    node: Node
    session: ssh.Session
    transport: ssh.Transport
    stop: threading.Event
    folder: str = ""
    started: float = field(default_factory=time.monotonic)

    def left_s(self) -> float:
        return max(self.node.timeout_s - (time.monotonic() - self.started), 1.0)

    def sh(
        self, command: str, *, stdin: bytes | None = None, timeout_s: float | None = None, limit: int = ssh.OUTPUT_CAP
    ) -> ssh.Completed:
        try:
            return self.session.run(
                command, timeout_s=timeout_s or self.left_s(), stdin=stdin, stop=self.stop, limit=limit
            )
        except ssh.Stopped:
            raise NodeFailed(INTERRUPTED, "interrupted (Ctrl-C or SIGTERM)") from None
        except ssh.CommandTimeout:
            raise NodeFailed(
                TIMED_OUT, f"timed out: the node's run took longer than its {self.node.timeout_s:g} s"
            ) from None
        except ssh.TransportError as exc:
            raise NodeFailed(UNREACHABLE, str(exc)) from None

    def version(self) -> str:
        done = self.sh(f"{shlex.quote(self.node.stackgate)} --version", timeout_s=min(self.left_s(), 120.0))
        words = done.stdout.split()
        if done.returncode != 0 or len(words) != 2 or words[0] != "stackgate":
            raise NodeFailed(
                FAILED,
                f"`{self.node.stackgate} --version` on the node: exit {done.returncode}: {_said(done)}",
            )
        if words[1] != __version__:
            raise NodeFailed(
                FAILED,
                f"the node has stackgate {words[1]}, this controller {__version__}: "
                "install the same version on every node",
            )
        return words[1]

    def ship(self, shipment: Shipment) -> str:
        """The spec (and pylock) in a fresh folder on the node, their sha256 checked there; the
        spec's path there. One command: each file is read from its stdin, exactly its length."""
        names = [shlex.quote(name) for name in shipment.files]
        writes = " && ".join(
            f'head -c {len(data)} > "$d"/{name}' for name, data in zip(names, shipment.files.values(), strict=True)
        )
        script = (
            'umask 077 && d=$(mktemp -d "${TMPDIR:-/tmp}/stackgate-fleet.XXXXXXXX") && echo "$d" && '
            f'{writes} && cd "$d" && sha256sum -- {" ".join(names)}'
        )
        done = self.sh(script, stdin=b"".join(shipment.files.values()))
        lines = done.stdout.splitlines()
        if lines and _FOLDER.match(lines[0]):
            # made: removed at the end whatever happens next (only a folder of this shape is ever removed)
            self.folder = lines[0]
        if done.returncode != 0 or not self.folder:
            raise NodeFailed(
                FAILED,
                f"cannot write the spec into a temporary folder on the node: exit {done.returncode}: {_said(done)}",
            )
        found = {
            line.split(None, 1)[1].lstrip("*"): line.split(None, 1)[0]
            for line in lines[1:]
            if len(line.split(None, 1)) == 2
        }
        for name, digest in shipment.sha256.items():
            if found.get(name) != digest:
                raise NodeFailed(
                    FAILED, f"{name} arrived damaged: sha256 {found.get(name, '(none)')} on the node, {digest} here"
                )
        return f"{self.folder}/{shipment.spec_name}"

    def path(self, name: str) -> str:
        return shlex.quote(f"{self.folder}/{name}")

    def stackgate(self, *args: str) -> ssh.Completed:
        """``stackgate ARGS`` in its own session and process group (its id in ``pgid``); on a stop
        or a timeout that group is stopped over a fresh connection."""
        argv = " ".join(shlex.quote(a) for a in (self.node.stackgate, *args))
        command = (
            f"cd {shlex.quote(self.folder)} && "
            f'NO_COLOR=1 setsid -w sh -c \'echo $$ > "$0"; exec "$@"\' pgid {argv} </dev/null'
        )
        try:
            return self.sh(command)
        except NodeFailed as failure:
            if failure.status in (INTERRUPTED, TIMED_OUT):
                self.kill_group()
            raise

    def kill_group(self) -> None:
        """SIGTERM to the remote process group, SIGKILL after the grace; over a fresh connection
        (the first may be what hangs), falling back to the first one."""
        ticks = int(STOP_GRACE_S / 0.2)
        script = (
            f'f={self.path("pgid")}; i=0; while [ ! -s "$f" ] && [ $i -lt 25 ]; do sleep 0.2; i=$((i+1)); done; '
            'pg=$(cat "$f" 2>/dev/null); [ -n "$pg" ] || exit 0; kill -TERM -"$pg" 2>/dev/null || exit 0; '
            f'i=0; while kill -0 -"$pg" 2>/dev/null && [ $i -lt {ticks} ]; do sleep 0.2; i=$((i+1)); done; '
            'kill -KILL -"$pg" 2>/dev/null; exit 0'
        )
        try:
            fresh = self.transport.connect(self.node)
        except ssh.TransportError:
            fresh = self.session
        try:
            fresh.run(script, timeout_s=STOP_GRACE_S + 30)
        except ssh.TransportError:
            pass  # the node went away too: nothing more can be done from here
        finally:
            if fresh is not self.session:
                fresh.close()

    def report(self) -> dict[str, Any] | None:
        """The node's report, or None when it wrote none; a damaged one fails the node."""
        done = self.sh(
            f"test -f {self.path('report.json')} || exit 3; head -c {MAX_REPORT_BYTES + 1} {self.path('report.json')}",
            timeout_s=120.0,
            limit=MAX_REPORT_BYTES + 1,  # more is cut: then longer than a report may be
        )
        if done.returncode == 3:
            return None
        self._check(done, "cannot read the node's report")
        return parse_report(done.stdout)

    def cleanup(self) -> None:
        if self.folder:
            try:
                self.session.run(f"rm -rf -- {shlex.quote(self.folder)}", timeout_s=60.0)
            except ssh.TransportError:
                pass  # a node that went away keeps a folder in its temp dir, nothing worse

    @staticmethod
    def _check(done: ssh.Completed, what: str) -> None:
        if done.returncode != 0:
            raise NodeFailed(FAILED, f"{what}: exit {done.returncode}: {_said(done)}")


def _said(done: ssh.Completed) -> str:
    """A remote command's last line of output (stderr first), and whether its output was cut."""
    return tail(done.stderr or done.stdout) + done.note


def tail(text: str, limit: int = 300) -> str:
    """A command's last line of output, cut to ``limit`` characters.

    >>> tail("one\\ntwo\\n\\n"), tail(""), tail("x" * 10, 6)
    ('two', '(no output)', 'xxx...')
    """
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else "(no output)"
    return last if len(last) <= limit else last[: limit - 3] + "..."


def parse_report(text: str) -> dict[str, Any]:
    """A node's ``stackgate.report/1`` document from its text, checked; a damaged one fails the node."""
    if len(text) > MAX_REPORT_BYTES:
        raise NodeFailed(
            FAILED, f"the node's report is larger than {MAX_REPORT_BYTES >> 20} MiB: not a stackgate report"
        )
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise NodeFailed(FAILED, f"the node's report is not JSON ({exc})") from None
    except RecursionError:
        raise NodeFailed(FAILED, "the node's report is not JSON (nested too deeply)") from None
    if not isinstance(doc, dict) or doc.get("schema") != "stackgate.report/1":
        raise NodeFailed(FAILED, "the node's report is not a stackgate.report/1 document")
    bad = rundoc.problems(doc, ("verdict", "exit_code", "results"))
    if bad:
        raise NodeFailed(FAILED, f"the node's report is damaged: {'; '.join(bad)}")
    return doc


#: A per-node action: (the node's Remote, the shipped spec's path there) -> its NodeRun.
Action = Callable[["Remote", str], NodeRun]


def on_node(node: Node, shipment: Shipment, action: Action, transport: ssh.Transport, stop: threading.Event) -> NodeRun:
    """Connect, check the version, ship the spec, run ``action``; every failure a NodeRun."""
    begun = time.monotonic()
    if stop.is_set():
        return NodeRun(node, NOT_RUN, "not run: the fleet was interrupted")
    try:
        session = transport.connect(node)
    except ssh.Stopped:
        return NodeRun(node, INTERRUPTED, "interrupted (Ctrl-C or SIGTERM) while connecting", time.monotonic() - begun)
    except ssh.TransportError as exc:
        return NodeRun(node, UNREACHABLE, str(exc), time.monotonic() - begun)
    remote = Remote(node, session, transport, stop)
    version = None
    try:
        version = remote.version()
        done = action(remote, remote.ship(shipment))
        return replace(done, duration_s=time.monotonic() - begun, version=version)
    except NodeFailed as failure:
        return NodeRun(node, failure.status, failure.reason, time.monotonic() - begun, version=version)
    finally:
        remote.cleanup()
        session.close()


def _judged(remote: Remote, done: ssh.Completed, what: str, steps: tuple[str, ...]) -> NodeRun:
    """A NodeRun from a stackgate run's exit code and its report."""
    return judged(remote.node, done.returncode, _said(done), remote.report(), what, steps)


def judged(
    node: Node, returncode: int, tail: str, doc: Mapping[str, Any] | None, what: str, steps: tuple[str, ...]
) -> NodeRun:
    """A NodeRun from a stackgate run's exit code, its output's last line and its report."""
    if returncode == 0 and doc is not None:
        return NodeRun(node, PASSED, str(doc.get("reason") or "passed"), exit_code=0, doc=doc, steps=steps)
    if returncode == ExitCode.INTERRUPTED:
        return NodeRun(node, INTERRUPTED, "interrupted on the node", exit_code=returncode, doc=doc, steps=steps)
    reason = str(doc.get("reason")) if doc is not None and doc.get("reason") and returncode in (1, 2) else tail
    failed = [c["check"] for c in aggregate.failed_checks(doc)]
    named = f" ({', '.join(failed[:5])}{', ...' if len(failed) > 5 else ''})" if failed else ""
    return NodeRun(
        node, FAILED, f"{what} exit {returncode}: {reason}{named}", exit_code=returncode, doc=doc, steps=steps
    )


def gate_on_node(args: Sequence[str], what: str = "gate", spec_flag: str = "--lock") -> Action:
    """The action: ``stackgate <what> --lock SPEC --json report.json ARGS`` and its report."""

    def act(remote: Remote, spec: str) -> NodeRun:
        try:
            done = remote.stackgate(what, spec_flag, spec, "--json", f"{remote.folder}/report.json", *args)
        except NodeFailed as failure:
            if failure.status not in (INTERRUPTED, TIMED_OUT):
                raise
            doc = _report_or_none(remote)
            return NodeRun(remote.node, failure.status, failure.reason, doc=doc, steps=(what,))
        return _judged(remote, done, what, (what,))

    return act


def _report_or_none(remote: Remote) -> dict[str, Any] | None:
    """What a stopped node wrote before it ended (a fresh connection: the first was left)."""
    try:
        fresh = remote.transport.connect(remote.node)
    except ssh.TransportError:
        return None
    try:
        return Remote(remote.node, fresh, remote.transport, threading.Event(), remote.folder).report()
    except NodeFailed:
        return None
    finally:
        fresh.close()


def provision_on_node(gate_args: Sequence[str]) -> Action:
    """Provision, then gate; a node whose gate fails after a provision that worked is rolled back."""
    gate = gate_on_node(gate_args)

    def act(remote: Remote, spec: str) -> NodeRun:
        done = remote.stackgate("provision", "--lock", spec, "--yes")
        if done.returncode != 0:
            return NodeRun(
                remote.node,
                FAILED,
                f"provision exit {done.returncode}: {_said(done)}",
                exit_code=done.returncode,
                steps=("provision failed",),
            )
        gated = gate(remote, spec)
        if gated.passed:
            return replace(gated, steps=("provisioned", "gated"))
        back = remote.stackgate("rollback", "--lock", spec)
        rolled = "rolled back" if back.returncode == 0 else f"rollback failed (exit {back.returncode}: {_said(back)})"
        return replace(gated, steps=("provisioned", "gate failed", rolled))

    return act


def upgrade_on_node(args: Sequence[str], live_name: str | None = None) -> Action:
    """``stackgate upgrade --to NEW [--lock LIVE] --json report.json ARGS``: the node passes only
    when the new stack won and is live there (or already was). One that did not win kept its live
    stack by upgrade's own rule, so nothing is rolled back: its steps say so."""

    def act(remote: Remote, spec: str) -> NodeRun:
        live = (
            ["--lock", f"{remote.folder}/{live_name}"] if live_name else []
        )  # else: the spec its live generation was built from
        return upgraded(gate_on_node([*live, *args], "upgrade", "--to")(remote, spec))

    return act


def upgraded(ran: NodeRun) -> NodeRun:
    """A node's upgrade judged for the rollout: won (moved), already there, or kept its live stack."""
    outcome = aggregate.upgrade_outcome(ran.doc)
    if outcome is not None and outcome["moved"]:
        if ran.passed:
            return replace(ran, reason=outcome["reason"], steps=("upgraded", "switched"))
        return replace(
            ran, steps=("upgraded", "switched", f"then {ran.status}")
        )  # e.g. interrupted after its atomic switch
    if ran.passed and outcome is not None and outcome["decision"] == aggregate.UNCHANGED:
        return replace(ran, reason=outcome["reason"], steps=("already on the new stack",))
    if ran.passed:  # exit 0 without a switch: not a win a rollout can build on
        return replace(
            ran,
            status=FAILED,
            reason=f"the node did not switch: {outcome['reason'] if outcome else 'its report has no upgrade part'}",
            steps=("upgrade", KEPT),
        )
    if outcome is None and ran.status in (INTERRUPTED, TIMED_OUT):
        return replace(ran, steps=("upgrade", STOPPED))
    return replace(ran, steps=("upgrade", KEPT))


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
