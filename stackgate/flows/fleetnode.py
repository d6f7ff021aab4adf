"""A fleet's node: its outcome, the files it gets, and the per-node actions over any transport.

On each node, over one session of the engine's transport (SSH's: edges/ssh.py), :func:`on_node` runs
its stages (:data:`NODE_STAGES`, flows/stages.py's loop) in order:

1. ``stackgate --version``: the node's installed stackgate must be this one's version;
2. the spec (and its pylock, when there is one beside it) is written to a fresh temporary folder
   (``mktemp -d``) and its sha256 checked there, file by file, against the controller's;
3. the action: ``stackgate gate|verify --lock <that spec> --json <that folder>/report.json`` runs in
   its own session and process group (``setsid``), its group id written beside the report (or
   provision then a gate, or upgrade: :func:`provision_on_node`, :func:`upgrade_on_node`);
4. the report is read back and judged (the node's exit code and its document), and the folder
   removed, however the stages before ended.

A node that cannot be reached, refuses the key, answers with another version or runs past its
timeout is a failed node carrying the reason; nothing waits longer than the node's timeouts.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from stackgate import __version__
from stackgate.edges import ssh
from stackgate.flows.stages import Stage, run_stages
from stackgate.models import inputfile, pylock, rundoc
from stackgate.models.exitcodes import ExitCode
from stackgate.models.inventory import Node
from stackgate.models.spec import Spec
from stackgate.runs import aggregate

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


@dataclass
class _OnNode:
    """One node's per-node action under way: what its stages read and fill."""

    node: Node
    shipment: Shipment
    action: Action
    transport: ssh.Transport
    stop: threading.Event
    begun: float = field(default_factory=time.monotonic)
    remote: Remote | None = None
    version: str | None = None
    spec: str = ""  #: the shipped spec's path on the node
    outcome: NodeRun | None = None
    ended: float | None = None  #: when the action's stages ended, before the clean-up


def on_node(node: Node, shipment: Shipment, action: Action, transport: ssh.Transport, stop: threading.Event) -> NodeRun:
    """Connect, check the version, ship the spec, run ``action``, clean up; every failure a NodeRun."""
    state = _OnNode(node, shipment, action, transport, stop)
    try:
        run_stages(NODE_STAGES, state)
    except NodeFailed as failure:
        seconds = (state.ended or time.monotonic()) - state.begun
        return NodeRun(node, failure.status, failure.reason, seconds, version=state.version)
    assert state.outcome is not None
    return state.outcome


def _connect_stage(state: _OnNode) -> bool:
    node = state.node
    if state.stop.is_set():
        state.outcome = NodeRun(node, NOT_RUN, "not run: the fleet was interrupted")
        return False
    try:
        session = state.transport.connect(node)
    except ssh.Stopped:
        seconds = time.monotonic() - state.begun
        state.outcome = NodeRun(node, INTERRUPTED, "interrupted (Ctrl-C or SIGTERM) while connecting", seconds)
        return False
    except ssh.TransportError as exc:
        state.outcome = NodeRun(node, UNREACHABLE, str(exc), time.monotonic() - state.begun)
        return False
    state.remote = Remote(node, session, state.transport, state.stop)
    return True


def _version_stage(state: _OnNode) -> None:
    assert state.remote is not None
    state.version = state.remote.version()


def _ship_stage(state: _OnNode) -> None:
    assert state.remote is not None
    state.spec = state.remote.ship(state.shipment)


def _action_stage(state: _OnNode) -> None:
    assert state.remote is not None
    done = state.action(state.remote, state.spec)
    state.outcome = replace(done, duration_s=time.monotonic() - state.begun, version=state.version)


def _cleanup_stage(state: _OnNode) -> None:
    state.ended = time.monotonic()
    if state.remote is not None:
        try:
            state.remote.cleanup()
        finally:
            state.remote.session.close()


#: A node's per-node action: each stage stands on the one before; the clean-up (its temporary folder,
#: its session) follows however they ended.
NODE_STAGES: tuple[Stage[_OnNode], ...] = (
    Stage("connect", _connect_stage, "open a session on the node"),
    Stage("version", _version_stage, "the node's stackgate is this one's version", ("connect",)),
    Stage("ship", _ship_stage, "the spec and its pylock, into a temporary folder", ("version",)),
    Stage("action", _action_stage, "the action: gate, verify, provision or upgrade", ("ship",)),
    Stage("cleanup", _cleanup_stage, "remove the temporary folder, close the session", always=True),
)


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
