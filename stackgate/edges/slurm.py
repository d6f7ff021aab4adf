"""Slurm as the fleet's engine: which nodes, in which state, and one step of one task per node.

The fleet controller (commands/fleet.py) asks this edge one thing: run ``stackgate ACTION``
on these nodes and hand back what each node said. With Slurm that is, in order:

1. the nodes: those of the allocation the controller runs in (``SLURM_JOB_ID``), or an
   allocation asked for here (``salloc --no-shell``: ``--partition``, ``--nodes`` or
   ``--nodelist``, ``--time`` and the site's own flags) and released at the end (``scancel``);
   each node's state and reason from ``sinfo``, so that a node DOWN or drained is listed, not
   dialled;
2. the spec and its pylock go to each node's local storage with ``sbcast`` (one flat file per
   file of the shipment, under a name only this run uses);
3. one step, one task per node (``srun --ntasks-per-node=1 --kill-on-bad-exit=0``), runs
   :data:`TASK` there: it moves the files into a fresh folder (``mktemp -d``), checks each
   sha256 against the controller's, checks the node's ``stackgate --version``, runs the action,
   and prints what happened as ``@sg KEY BASE64`` lines (its frame: each value in lines short
   enough that srun, which cuts lines at 1 KiB, never cuts one) on the task's output, which
   srun brings back labelled with the task's number: no shared filesystem is assumed. With a
   shared folder the frame is written there instead (one file per node), and read from there;
4. a stop (Ctrl-C, SIGTERM, the controller's timeout) sends SIGTERM to the step (``scancel
   --signal=TERM``): each task waits for its stackgate to tear down and write its report, prints
   its frame, and ends; after the grace the step is cancelled (``scancel``).

For ``fleet provision`` and ``fleet upgrade``, :class:`SrunTransport` is the SSH engine's
transport over Slurm: each command on a node a one-task step, its input forwarded to the task.

Every Slurm command runs with an argument vector (no shell on this side); node names and
reasons are data. What a node printed is parsed as frames as it arrives, everything else is
dropped: each frame value is kept up to its cap (:data:`MAX_VALUE` for the report,
:data:`MAX_SMALL` for the rest), srun's own words and a one-task step's output up to
edges/ssh.py's cap (head and tail, with a line that says what was left out).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import re
import secrets
import shlex
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

from stackgate.edges import runner, ssh
from stackgate.models.inventory import Node

__all__ = [
    "Allocation",
    "Frame",
    "FrameReader",
    "NodeState",
    "SlurmError",
    "SrunTransport",
    "Step",
    "TASK",
    "allocate",
    "broadcast",
    "current",
    "drain",
    "gres",
    "waited_s",
    "hostnames",
    "node_states",
    "node_table",
    "parse_frames",
    "partition_peers",
    "read_lines",
    "release",
    "resume",
    "run_step",
    "step_flags",
]

#: Node states (sinfo's %T, its flags after '+') in which a node takes work.
USABLE = frozenset({"idle", "mixed", "allocated", "completing", "planned", "reserved"})
_SEP = "\x1f"
_LABEL = re.compile(r"^\s*(\d+): (.*)$")
_GRANTED = re.compile(r"Granted job allocation (\d+)")
_COMMAND_S = 60.0
#: Largest base64 frame value read back (a report is read whole: a bigger one is not a stackgate report).
MAX_VALUE = 96 << 20
#: ... of every other value (a version, a failure, a last line: each a line or a few).
MAX_SMALL = 64 << 10
#: A line of srun's output longer than this is no frame line (those are under 1 KiB): dropped unread.
MAX_LINE = 64 << 10
#: The value a task's frame carries whole (its report): the others are small.
_LARGE = "report"


class SlurmError(Exception):
    """A Slurm command failed (the text says which and why): nothing ran on the nodes."""


@dataclass(frozen=True)
class NodeState:
    name: str
    state: str  #: sinfo's %T: idle, mixed, allocated, drained, draining, down*, ...
    reason: str = ""
    since: str = ""  #: when the reason was set (sinfo's %H, ISO 8601; "" when Slurm gives none)
    partitions: tuple[str, ...] = ()  #: the partitions the node is in (only where asked for)

    @property
    def usable(self) -> bool:
        """Whether a task may be sent there: up, responding, not drained."""
        words = self.state.lower().split("+")
        return (
            not self.state.endswith(("*", "~", "#", "!", "%"))
            and words[0] in USABLE
            and not any("drain" in w for w in words)
        )


@dataclass(frozen=True)
class Allocation:
    job_id: str
    nodes: tuple[str, ...]
    ours: bool  #: asked for here: released at the end
    queue_wait_s: float | None = None  #: how long the job waited in Slurm's queue (submitted to started)


def _run(argv: Sequence[str], env: Mapping[str, str] | None = None, timeout_s: float = _COMMAND_S) -> str:
    done = runner.run(argv, env=env, timeout_s=timeout_s)
    if done.returncode == 127 and done.stderr.startswith(runner.CANNOT_RUN):
        raise SlurmError(
            f"`{argv[0]}` not found: is this a Slurm login or compute node (slurm-client installed, on PATH)?"
        )
    if done.timed_out:
        raise SlurmError(f"`{shlex.join(argv)}` did not end within {timeout_s:g} s")
    if done.returncode != 0:
        raise SlurmError(f"`{shlex.join(argv)}`: exit {done.returncode}: {(done.stderr or done.stdout).strip()[-400:]}")
    return done.stdout


def hostnames(nodelist: str) -> tuple[str, ...]:
    """A Slurm host list (``gpu[01-04],x``) as names, by ``scontrol show hostnames``."""
    return tuple(
        line.strip() for line in _run(["scontrol", "show", "hostnames", nodelist]).splitlines() if line.strip()
    )


def node_states(
    names: Sequence[str] = (), partition: str | None = None, env: Mapping[str, str] | None = None
) -> dict[str, NodeState]:
    """Each node's state and reason (``sinfo -N``), of the nodes named or of a partition."""
    argv = ["sinfo", "-N", "-h", "-o", f"%N{_SEP}%T{_SEP}%E"]
    argv += ["-n", ",".join(names)] if names else []
    argv += ["-p", partition] if partition else []
    found: dict[str, NodeState] = {}
    for line in _run(argv, env).splitlines():
        parts = line.split(_SEP)
        if len(parts) == 3 and parts[0] not in found:
            reason = "" if parts[2] == "none" else parts[2]
            found[parts[0]] = NodeState(parts[0], parts[1], reason)
    return found


def node_table(partition: str | None = None, env: Mapping[str, str] | None = None) -> dict[str, NodeState]:
    """Every node (of ``partition``, else of all partitions: ``sinfo -N -a``) with its state, its
    reason, the reason's time and its partitions."""
    argv = [
        "sinfo",
        "-N",
        "-h",
        "-o",
        f"%N{_SEP}%P{_SEP}%T{_SEP}%E{_SEP}%H",
        *(["-p", partition] if partition else ["-a"]),
    ]
    rows: dict[str, NodeState] = {}
    for line in _run(argv, env).splitlines():
        parts = line.split(_SEP)
        if len(parts) != 5:
            continue
        name, part, state, reason, since = parts
        known = rows.get(name)
        partitions = (*known.partitions, part.rstrip("*")) if known else (part.rstrip("*"),)
        reason, since = ("" if reason == "none" else reason), ("" if since == "Unknown" else since)
        rows[name] = NodeState(name, state, reason, since, partitions)
    return rows


def partition_peers(node: str, env: Mapping[str, str] | None = None) -> dict[str, list[NodeState]]:
    """Every node of each partition ``node`` is in: what the health check's breaker counts."""
    rows = node_table(env=env)
    mine = rows[node].partitions if node in rows else ()
    return {p: [s for s in rows.values() if p in s.partitions] for p in mine}


def gres(node: str, env: Mapping[str, str] | None = None) -> str:
    """The node's generic resources as Slurm configured them (``scontrol show node``'s ``Gres=``,
    e.g. ``gpu:h200:8(S:0-1)``); "" when it has none."""
    for word in _run(["scontrol", "-o", "show", "node", node], env).split():
        if word.startswith("Gres="):
            value = word.removeprefix("Gres=")
            return "" if value == "(null)" else value
    return ""


def drain(node: str, reason: str, env: Mapping[str, str] | None = None) -> None:
    """``scontrol update nodename=NODE state=drain reason=REASON`` (an argument vector: the
    reason is data, whatever it holds)."""
    _run(["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"], env)


def resume(node: str, env: Mapping[str, str] | None = None) -> None:
    _run(["scontrol", "update", f"nodename={node}", "state=resume"], env)


def current() -> Allocation | None:
    """The allocation this process runs in (``SLURM_JOB_ID``), None outside one; how long it
    waited in the queue from Slurm's record of the job (its submit and start times)."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return None
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    submitted, _, started = _run(["squeue", "-h", "-j", job, "-o", "%V|%S"]).strip().partition("|")
    if not nodelist:
        nodelist = _run(["squeue", "-h", "-j", job, "-o", "%N"]).strip()
    return Allocation(job, hostnames(nodelist), ours=False, queue_wait_s=waited_s(submitted, started))


def waited_s(submitted: str, started: str) -> float | None:
    """Seconds from Slurm's submit time to its start time (ISO 8601, as squeue's %V and %S print them).

    >>> waited_s("2026-12-02T04:00:05", "2026-12-02T04:01:07"), waited_s("2026-12-02T04:00:05", "N/A")
    (62.0, None)
    """
    try:
        return max(0.0, (datetime.fromisoformat(started) - datetime.fromisoformat(submitted)).total_seconds())
    except ValueError:
        return None


def allocate(
    nodes: Sequence[str],
    count: int | None,
    partition: str | None,
    time_limit: str | None,
    extra: Sequence[str],
    waiting: Callable[[str], None] | None = None,
) -> Allocation:
    """An allocation of its own (``salloc --no-shell``): the named nodes, or ``count`` of the
    partition's. While the request is pending, ``waiting`` is told that it is queued and Slurm's
    reason (again when the reason changes, and every 10 minutes); on any way out before the
    allocation is handed back (Ctrl-C, SIGTERM, SIGHUP, an error) the request is cancelled."""
    name = f"stackgate-fleet-{new_token()}"
    # --no-kill: a node lost mid-run fails its own task, not the whole allocation
    argv = ["salloc", "--no-shell", f"--job-name={name}", "--ntasks-per-node=1", "--no-kill"]
    argv += [f"--nodelist={','.join(nodes)}", f"--nodes={len(nodes)}"] if nodes else [f"--nodes={count}"]
    argv += [f"--partition={partition}"] if partition else []
    argv += [f"--time={time_limit}"] if time_limit else []
    try:
        # its own session (runner.start): a Ctrl-C at the terminal is ours to handle (cancel, then stop salloc)
        process = runner.start([*argv, *extra], stdout=False)
    except FileNotFoundError:
        raise SlurmError("`salloc` not found: is this a Slurm login node (slurm-client installed, on PATH)?") from None
    said = ssh.Capped(64 << 10)
    reader = threading.Thread(target=_drain, args=(process.stderr, said), daemon=True)
    reader.start()
    job: str | None = None
    asked = time.monotonic()
    try:
        with _hangup_interrupts():
            _await(process, said, waiting)
        reader.join(10)
        words = said.text()
        granted = _GRANTED.search(words)
        if process.returncode != 0 or granted is None:
            raise SlurmError(f"`{shlex.join([*argv, *extra])}`: exit {process.returncode}: {words.strip()[-400:]}")
        job = granted.group(1)
        nodes = hostnames(_run(["squeue", "-h", "-j", job, "-o", "%N"]).strip())
        return Allocation(job, nodes, ours=True, queue_wait_s=round(time.monotonic() - asked, 3))
    except BaseException:
        _cancel_request(process, job or _job_of(said.text()), name)
        raise
    finally:
        runner.forget(process)


_PENDING = re.compile(r"(?:Pending job allocation|job) (\d+)")
_SAY_AGAIN_S = 600.0


def _job_of(words: str) -> str | None:
    found = _GRANTED.search(words) or _PENDING.search(words)
    return found.group(1) if found else None


def _await(process: subprocess.Popen[bytes], said: ssh.Capped, waiting: Callable[[str], None] | None) -> None:
    """Until salloc ends (granted or refused), telling ``waiting`` while the request is queued."""
    look, every, told, when = time.monotonic() + 2.0, 2.0, None, 0.0
    while process.poll() is None:
        try:
            process.wait(0.2)
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if waiting is None or now < look:
            continue
        look, every = now + every, min(every * 2, 60.0)  # squeue now and then, not a load on slurmctld
        job = _job_of(said.text())
        reason = _pending(job) if job else None
        if reason is not None and (reason != told or now - when > _SAY_AGAIN_S):
            waiting(f"queued: Slurm job {job} is pending ({reason}); waiting for the allocation (Ctrl-C cancels it)")
            told, when = reason, now


def _pending(job: str) -> str | None:
    """Slurm's reason a job waits (Resources, Priority, ReqNodeNotAvail, ...), None when it does not."""
    try:
        state, _, reason = _run(["squeue", "-h", "-j", job, "-o", "%T|%r"], timeout_s=10.0).strip().partition("|")
    except SlurmError:
        return None
    return (reason or "no reason given") if state == "PENDING" else None


def _cancel_request(process: subprocess.Popen[bytes], job: str | None, name: str) -> None:
    """The request cancelled (by its id, else by its name, which only this run uses), salloc ended."""
    runner.run(["scancel", job] if job else ["scancel", f"--name={name}"], timeout_s=_COMMAND_S, cleanup=True)
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def _hangup_interrupts() -> Iterator[None]:
    """SIGHUP (the terminal closed during a day-long wait) ends the wait as Ctrl-C does."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGHUP, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def release(allocation: Allocation) -> None:
    """An allocation asked for here is cancelled; one this process runs in is left alone."""
    if allocation.ours:
        runner.run(["scancel", allocation.job_id], timeout_s=_COMMAND_S, cleanup=True)


def broadcast(job_id: str, files: Mapping[str, bytes], node_dir: str, token: str) -> None:
    """Each file to every node of the job: ``<node_dir>/stackgate-fleet.<token>.<index>``."""
    with tempfile.TemporaryDirectory(prefix="stackgate-sbcast.") as local:
        for index, data in enumerate(files.values()):
            source = Path(local) / str(index)
            source.write_bytes(data)
            _run(
                ["sbcast", "--force", f"--jobid={job_id}", str(source), f"{node_dir}/stackgate-fleet.{token}.{index}"],
                timeout_s=300.0,
            )


#: What each task runs (``sh -c TASK sh ARGS``): see the module's docstring. Its arguments: the
#: node's stackgate, the version it must have, the node folder the files were sent to, this run's
#: token, the shared folder ("" for none), the number of files, then a name and a sha256 for each
#: file, then the action's arguments (the spec named relative to the task's folder).
TASK = r"""
sg=$1 want=$2 base=$3 token=$4 shared=$5 count=$6; shift 6
node=${SLURMD_NODENAME:-$(hostname)}
out=/dev/stdout
[ -n "$shared" ] && out="$shared/$node.frame.$token" && : > "$out"
emit() { printf '@sg %s \n' "$1" >> "$out"; printf '%s' "$2" | base64 -w 700 | sed "s/^/@sg $1 /" >> "$out"; }
t0=$(date +%s%N)
emit node "$node"
emit step "${SLURM_JOB_ID:-}.${SLURM_STEP_ID:-}"
d=$(mktemp -d "$base/stackgate-fleet.XXXXXXXX") || { emit failed "cannot make a folder in $base on the node"; exit 3; }
trap 'rm -rf -- "$d"' EXIT
i=0
while [ $i -lt "$count" ]; do
  name=$1 sum=$2; shift 2
  if ! mv -- "$base/stackgate-fleet.$token.$i" "$d/$name" 2>/dev/null; then
    emit failed "$name did not arrive (sbcast)"; exit 3
  fi
  got=$(sha256sum < "$d/$name" | cut -d' ' -f1)
  if [ "$got" != "$sum" ]; then emit failed "$name arrived damaged: sha256 $got on the node, $sum here"; exit 3; fi
  i=$((i+1))
done
"$sg" --version > "$d/.version" 2>&1; rc=$?
v=$(head -c 4096 "$d/.version")
emit version "$v"
if [ $rc -ne 0 ]; then
  emit failed "\`$sg --version\` on the node: exit $rc: $(printf '%s' "$v" | tail -n 1 | cut -c1-300)"; exit 3
fi
if [ "$v" != "stackgate $want" ]; then
  emit failed "the node has ${v#stackgate }, this controller stackgate $want: install the same version on every node"
  exit 3
fi
cd "$d" || exit 3
trap ':' TERM INT HUP
NO_COLOR=1 "$sg" "$@" --json report.json < /dev/null > output 2>&1 &
pid=$!
emit started "$pid"
wait $pid; rc=$?
while kill -0 $pid 2>/dev/null; do wait $pid; rc=$?; done
emit exit "$rc"
emit tail "$(grep -v '^[[:space:]]*$' output | tail -n 1 | cut -c1-300)"
emit duration_ns "$(( $(date +%s%N) - t0 ))"
if [ -f report.json ]; then
  emit report_sha256 "$(head -c 67108865 report.json | sha256sum | cut -d' ' -f1)"
  printf '@sg report \n' >> "$out"
  head -c 67108865 report.json | base64 -w 700 | sed 's/^/@sg report /' >> "$out"
fi
cd / && rm -rf -- "$d"
exit 0
"""


@dataclass
class Frame:
    """What one node's task said: its fields (node, version, failed, exit, tail, report, ...)."""

    task: int | None
    fields: dict[str, str] = field(default_factory=dict)
    cut: frozenset[str] = frozenset()  #: values over their cap: dropped

    @property
    def node(self) -> str | None:
        return self.fields.get("node")


class FrameReader:
    """Frames read line by line as srun's output arrives (``N: @sg KEY BASE64``, a value's first
    line with nothing after the key, its pieces after it); other lines are not kept, and a value
    over its cap (:data:`MAX_VALUE` for the report, :data:`MAX_SMALL` for the rest, and as many
    keys as fit in twice that) is dropped and named in the frame's ``cut``."""

    def __init__(self, labelled: bool = True) -> None:
        self.labelled = labelled
        self._pieces: dict[int | None, dict[str, list[str]]] = {}
        self._sizes: dict[int | None, dict[str, int]] = {}
        self._cut: dict[int | None, set[str]] = {}

    def add(self, line: str) -> None:
        task, text = None, line.rstrip("\n")
        if self.labelled:
            matched = _LABEL.match(text)
            if matched is None:
                return
            task, text = int(matched.group(1)), matched.group(2)
        words = text.split(" ", 2)
        if len(words) != 3 or words[0] != "@sg":
            return
        key, piece = words[1], words[2].strip()
        values, sizes = self._pieces.setdefault(task, {}), self._sizes.setdefault(task, {})
        if not piece:
            values[key], sizes[key] = [], 0  # a value begins (again)
            self._cut.get(task, set()).discard(key)
            return
        cap = MAX_VALUE if key == _LARGE else MAX_SMALL
        total = sum(sizes.values())
        if key in self._cut.get(task, ()):
            return
        if sizes.get(key, 0) + len(piece) > cap or total + len(piece) > MAX_VALUE + 2 * MAX_SMALL:
            self._cut.setdefault(task, set()).add(key)
            values.pop(key, None)
            sizes.pop(key, None)
            return
        values.setdefault(key, []).append(piece)
        sizes[key] = sizes.get(key, 0) + len(piece)

    def frames(self) -> list[Frame]:
        tasks = dict.fromkeys([*self._pieces, *self._cut])
        return [Frame(task, _decoded(self._pieces.get(task, {})), frozenset(self._cut.get(task, ()))) for task in tasks]


def parse_frames(lines: Sequence[str], labelled: bool = True) -> list[Frame]:
    """The frames in srun's labelled output (:class:`FrameReader`); a value that is not base64,
    not text or too large is dropped.

    >>> lines = ["0: @sg node ", "0: @sg node bjE=", "noise", "1: @sg node ", "1: @sg node bjI="]
    >>> lines += ["0: @sg exit ", "0: @sg exit MA=="]
    >>> [f.fields for f in parse_frames(lines)]
    [{'node': 'n1', 'exit': '0'}, {'node': 'n2'}]
    """
    reader = FrameReader(labelled)
    for line in lines:
        reader.add(line)
    return reader.frames()


def read_lines(stream: object, on_line: Callable[[str], None], max_line: int = MAX_LINE) -> None:
    """Each line of a binary stream, as text, to ``on_line`` as it arrives; a line longer than
    ``max_line`` is dropped whole, never held (what a node prints cannot fill the controller).

    >>> import io
    >>> seen = []
    >>> read_lines(io.BufferedReader(io.BytesIO(b"a\\n" + b"x" * 50 + b"\\nb\\nc")), seen.append, max_line=10)
    >>> seen
    ['a', 'b', 'c']
    """
    rest, skipping = b"", False
    while chunk := stream.read1(1 << 16):  # type: ignore[attr-defined]
        *whole, rest = (rest + chunk).split(b"\n")
        for line in whole:
            if skipping or len(line) > max_line:
                skipping = False  # (the end of) a line too long to keep
                continue
            on_line(line.decode("utf-8", "replace"))
        if len(rest) > max_line:
            rest, skipping = b"", True
    if rest and not skipping:
        on_line(rest.decode("utf-8", "replace"))


def _decoded(values: Mapping[str, list[str]]) -> dict[str, str]:
    found = {}
    for key, parts in values.items():
        try:
            found[key] = base64.b64decode("".join(parts), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            continue
    return found


@dataclass
class Step:
    """One step's outcome: each node's frame, srun's exit and its own words, why it stopped."""

    frames: dict[str, Frame]
    returncode: int | None
    stderr: str
    stopped: str | None = None  #: "interrupted" or "timed out" when the controller ended it
    step_id: str | None = None


def run_step(
    allocation: Allocation,
    nodes: Sequence[str],
    task_args: Sequence[str],
    *,
    token: str,
    timeout_s: float,
    grace_s: float,
    stop: threading.Event,
    shared: Path | None = None,
    extra: Sequence[str] = (),
) -> Step:
    """:data:`TASK` on each of ``nodes``, one task per node, until it ends, ``stop`` is set or
    ``timeout_s`` passes (then SIGTERM to the step, and after ``grace_s`` its cancellation).
    ``extra``: srun flags of the spec's (:func:`step_flags`: the GPUs each task asks for, its container)."""
    name = f"stackgate-fleet-{token}"
    argv = [
        "srun",
        f"--jobid={allocation.job_id}",
        f"--job-name={name}",
        f"--nodes={len(nodes)}",
        f"--nodelist={','.join(nodes)}",
        "--ntasks-per-node=1",
        f"--ntasks={len(nodes)}",
        "--kill-on-bad-exit=0",
        "--no-kill",
        "--overlap",
        "--label",
        "--input=none",
        "--mpi=none",
        *extra,
        "sh",
        "-c",
        TASK,
        "sh",
        *task_args,
    ]
    process = runner.start(argv, env=_step_env())
    try:
        return _follow_step(process, allocation, nodes, name, token, timeout_s, grace_s, stop, shared)
    finally:
        runner.forget(process)


def _follow_step(
    process: subprocess.Popen[bytes],
    allocation: Allocation,
    nodes: Sequence[str],
    name: str,
    token: str,
    timeout_s: float,
    grace_s: float,
    stop: threading.Event,
    shared: Path | None,
) -> Step:
    """The step's output read as frames until it ends (or is ended: :func:`_watch`)."""
    out = FrameReader()
    err = ssh.Capped()
    readers = [
        threading.Thread(target=read_lines, args=(process.stdout, out.add), daemon=True),
        threading.Thread(target=_drain, args=(process.stderr, err), daemon=True),
    ]
    for reader in readers:
        reader.start()
    stopped, step_id = _watch(process, allocation.job_id, name, timeout_s, grace_s, stop)
    for reader in readers:
        reader.join(10)
    frames = out.frames() if shared is None else _shared_frames(shared, nodes, token)
    by_node = {f.node: f for f in frames if f.node is not None and f.node in nodes}
    step_id = step_id or next((f.fields["step"] for f in by_node.values() if "step" in f.fields), None)
    return Step(by_node, process.returncode, err.text(), stopped, step_id)


def _watch(
    process: subprocess.Popen[bytes], job_id: str, name: str, timeout_s: float, grace_s: float, stop: threading.Event
) -> tuple[str | None, str | None]:
    deadline = time.monotonic() + timeout_s
    while process.poll() is None:
        if stop.is_set() or time.monotonic() > deadline:
            why = "interrupted" if stop.is_set() else "timed out"
            return why, _end_step(process, job_id, name, grace_s)
        try:
            process.wait(0.1)
        except subprocess.TimeoutExpired:
            pass
        except KeyboardInterrupt:
            stop.set()
    return None, None


def _end_step(process: subprocess.Popen[bytes], job_id: str, name: str, grace_s: float) -> str | None:
    """SIGTERM to the step's every process, its cancellation after ``grace_s``; the step's id."""
    step = _step_id(job_id, name)
    if step is None:  # not started yet (or gone): srun itself is stopped, which ends what it began
        process.terminate()
    else:
        runner.run(["scancel", "--signal=TERM", step], timeout_s=_COMMAND_S, cleanup=True)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        if step is not None:
            runner.run(["scancel", step], timeout_s=_COMMAND_S, cleanup=True)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return step


def _step_id(job_id: str, name: str, wait_s: float = 5.0) -> str | None:
    deadline = time.monotonic() + wait_s
    while True:
        done = runner.run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i %j"], timeout_s=_COMMAND_S, cleanup=True)
        for line in done.stdout.splitlines():
            words = line.split()
            if len(words) == 2 and words[1] == name:
                return words[0]
        if time.monotonic() > deadline:
            return None
        time.sleep(0.1)


def _shared_frames(shared: Path, nodes: Sequence[str], token: str) -> list[Frame]:
    frames = []
    for node in nodes:
        path = shared / f"{node}.frame.{token}"
        reader = FrameReader(labelled=False)
        try:
            with path.open("rb") as stream:
                read_lines(stream, reader.add)
        except OSError:
            continue
        path.unlink(missing_ok=True)
        frames += reader.frames()
    return frames


def step_flags(gpus_per_node: int | None, image: str | None, mounts: Sequence[str | Path]) -> list[str]:
    """srun's flags for the spec's ``[slurm]`` section: the GPUs a task asks for (the GPUs a job
    would own under ConstrainDevices) and the pyxis container it runs in, with ``mounts`` (the
    folders the task reads and writes) bound at the same paths inside.

    >>> for flag in step_flags(8, "nvcr.io#nvidia/pytorch:25.01-py3", ["/tmp"]): print(flag)
    --gpus-per-node=8
    --container-image=nvcr.io#nvidia/pytorch:25.01-py3
    --container-mounts=/tmp:/tmp
    --no-container-mount-home
    >>> step_flags(None, None, ["/tmp"])
    []
    """
    flags = [f"--gpus-per-node={gpus_per_node}"] if gpus_per_node else []
    if image:
        binds = ",".join(f"{m}:{m}" for m in dict.fromkeys(str(m) for m in mounts))
        flags += [f"--container-image={image}", f"--container-mounts={binds}", "--no-container-mount-home"]
    return flags


def new_token() -> str:
    return secrets.token_hex(6)


class SrunTransport:
    """The SSH engine's transport (edges/ssh.py) over Slurm: each command a one-task step
    (``srun --nodelist=NODE -N1 -n1``) in the allocation, its input forwarded to the task. The
    fleet's per-node actions (provision, then a gate; an upgrade) run through it unchanged."""

    def __init__(self, allocation: Allocation, extra: Sequence[str] = ()) -> None:
        self.allocation, self.extra = allocation, tuple(extra)

    def connect(self, node: Node) -> SrunSession:
        return SrunSession(self.allocation.job_id, node.name, self.extra)


class SrunSession:
    def __init__(self, job_id: str, node: str, extra: Sequence[str] = ()) -> None:
        self.job_id, self.node, self.extra = job_id, node, tuple(extra)

    def run(
        self,
        command: str,
        *,
        timeout_s: float,
        stdin: bytes | None = None,
        stop: threading.Event | None = None,
        limit: int = ssh.OUTPUT_CAP,
    ) -> ssh.Completed:
        argv = [
            "srun",
            f"--jobid={self.job_id}",
            f"--nodelist={self.node}",
            "--nodes=1",
            "--ntasks=1",
            "--overlap",
            "--kill-on-bad-exit=0",
            "--mpi=none",
            f"--input={'0' if stdin is not None else 'none'}",
            *self.extra,
            "sh",
            "-c",
            command,
        ]
        try:
            process = runner.start(argv, env=_step_env(), stdin=stdin is not None)
        except OSError as exc:
            raise ssh.TransportError(f"slurm:{self.node}: cannot run srun: {exc.strerror or exc}") from exc
        try:
            return _follow_one(process, stdin, timeout_s, stop, limit)
        finally:
            if process.poll() is not None:  # one left running (stopped, timed out) stays runner's to end
                runner.forget(process)

    def close(self) -> None:
        pass


def _follow_one(
    process: subprocess.Popen[bytes], stdin: bytes | None, timeout_s: float, stop: threading.Event | None, limit: int
) -> ssh.Completed:
    """A one-task step's output (capped) until it ends; its input fed from a thread."""
    out, err = ssh.Capped(limit), ssh.Capped(limit)
    threads = [
        threading.Thread(target=_drain, args=(s, b), daemon=True)
        for s, b in ((process.stdout, out), (process.stderr, err))
    ]
    if stdin is not None:
        threads.append(threading.Thread(target=_feed, args=(process.stdin, stdin), daemon=True))
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    while process.poll() is None:
        if stop is not None and stop.is_set():
            raise ssh.Stopped("stopped")  # left running: the caller stops the node's process group
        if time.monotonic() > deadline:
            raise ssh.CommandTimeout(f"no end within {timeout_s:g} s")
        time.sleep(0.02)
    for thread in threads:
        thread.join(10)
    return ssh.Completed(process.returncode, out.text(), err.text(), out.cut + err.cut)


def _step_env() -> dict[str, str]:
    """This environment without a batch script's SLURM_NTASKS and the like: the step is named by
    --jobid, and those would shape it."""
    return {
        k: v
        for k, v in os.environ.items()
        if k == "SLURM_CONF" or not k.startswith(("SLURM_", "SRUN_", "SALLOC_", "SBATCH_"))
    }


def _drain(stream: object, into: ssh.Capped) -> None:
    while chunk := stream.read1(1 << 16):  # type: ignore[attr-defined]
        into.add(chunk)


def _feed(stream: object, data: bytes) -> None:
    try:
        stream.write(data)  # type: ignore[attr-defined]
        stream.close()  # type: ignore[attr-defined]
    except OSError:
        pass  # the task ended without reading it all: its exit status says why
