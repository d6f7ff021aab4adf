"""Node health's judgement beyond one verify (``stackgate slurm-health``): Slurm's GRES against
NVML, the damping of a flapping check, the breaker that never drains past a share of a
partition, and what a finished job left behind.

Pure functions of what was observed (Slurm's words, NVML's GPUs, /proc), so each rule is read,
and tested, apart from the commands that act on it (commands/slurmhealth.py).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from stackgate.edges.slurm import NodeState
from stackgate.models.healthconfig import ours

__all__ = [
    "Breaker",
    "Leak",
    "breaker",
    "gpu_gres",
    "gres_problem",
    "job_processes",
    "ripe",
]

_GRES = re.compile(r"^gpu(?::([^:(]+))?:(\d+)")


def gpu_gres(gres: str) -> list[tuple[str, int]]:
    """The GPUs in Slurm's ``Gres=`` of a node: (type, count) for each entry (type "" when untyped).

    >>> gpu_gres("gpu:h200:8(S:0-1),nic:2")
    [('h200', 8)]
    >>> gpu_gres("gpu:4,gpu:a100:2"), gpu_gres("")
    ([('', 4), ('a100', 2)], [])
    """
    found = []
    for entry in gres.split(","):
        matched = _GRES.match(entry.strip())
        if matched:
            found.append((matched.group(1) or "", int(matched.group(2))))
    return found


def _squash(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def gres_problem(gres: str, gpus: Sequence[str]) -> str | None:
    """How Slurm's view of the node's GPUs (``gres``) and NVML's (their names) disagree, None when
    they agree or Slurm schedules no GPUs here (nothing to compare).

    >>> gres_problem("gpu:h200:2", ["NVIDIA H200"])
    "Slurm's Gres=gpu:h200:2 counts 2 GPU(s), NVML sees 1 (NVIDIA H200)"
    >>> gres_problem("gpu:a100:1", ["NVIDIA H200"])
    "Slurm's Gres=gpu:a100:1 names type a100, NVML sees NVIDIA H200"
    >>> gres_problem("gpu:h200:1(S:0)", ["NVIDIA H200"]) is None, gres_problem("", ["NVIDIA H200"]) is None
    (True, True)
    """
    entries = gpu_gres(gres)
    if not entries:
        return None
    counted = sum(count for _, count in entries)
    seen = ", ".join(sorted(set(gpus))) or "none"
    if counted != len(gpus):
        return f"Slurm's Gres={gres.split('(')[0]} counts {counted} GPU(s), NVML sees {len(gpus)} ({seen})"
    types = [kind for kind, _ in entries if kind]
    strangers = [kind for kind in types if not any(_squash(kind) in _squash(name) for name in gpus)]
    if strangers:
        return f"Slurm's Gres={gres.split('(')[0]} names type {', '.join(strangers)}, NVML sees {seen}"
    return None


def ripe(counts: Mapping[str, int], drain_after: int) -> str | None:
    """The failing check whose run of consecutive failures has reached ``drain_after`` (the
    longest run; of equal ones, the first failed), None while every failure is still transient.

    >>> ripe({"gpu.ecc": 1, "gpu.count": 3}, 3), ripe({"gpu.ecc": 2}, 3), ripe({"gpu.x": 1, "gpu.a": 1}, 1)
    ('gpu.count', None, 'gpu.x')
    """
    due = [check for check, n in counts.items() if n >= drain_after]
    return max(due, key=lambda check: counts[check]) if due else None


@dataclass(frozen=True)
class Breaker:
    """Whether stackgate may drain one more node of each partition the node is in."""

    holds: bool  #: True: this drain would pass the share: not done
    partition: str = ""
    drained: tuple[str, ...] = ()  #: the nodes stackgate has drained in it (the first to keep)
    total: int = 0
    allowed: int = 0

    def words(self, share: float) -> str:
        return (
            f"breaker: stackgate has drained {len(self.drained)} of the {self.total} nodes of partition "
            f"{self.partition} ({', '.join(self.drained) or 'none'}); the spec's [slurm] max_drained_share {share:g} "
            f"allows {self.allowed}"
        )


def _drained_by_us(state: NodeState) -> bool:
    base = state.state.lower().rstrip("*~#!%$@^-")
    return base in ("drained", "draining", "drain") and ours(state.reason)


def breaker(node: str, peers: Mapping[str, Iterable[NodeState]], share: float) -> Breaker:
    """Whether ``node`` may be (or stay) drained by stackgate: in every partition it is in, the
    nodes stackgate has drained, ordered by when their reason was set (then by name), are kept up
    to ``floor(share * nodes)`` (at least one); a node past that number is held back. Every
    node's check reads the same order, so checks that drain at once agree on which ones stay.

    >>> idle, ours_ = (lambda n: NodeState(n, "idle")), (lambda n, t: NodeState(n, "drained", "stackgate: x", t))
    >>> peers = {"gpu": [ours_("n1", "T1"), ours_("n2", "T2"), idle("n3"), idle("n4")]}
    >>> breaker("n3", peers, 0.5).holds, breaker("n1", peers, 0.5).holds
    (True, False)
    """
    for partition, members in sorted(peers.items()):
        members = list(members)
        allowed = max(1, int(share * len(members) + 1e-9))
        drained = sorted((s for s in members if _drained_by_us(s) or s.name == node), key=_order(node))
        kept = [s.name for s in drained[:allowed]]
        if node not in kept:
            return Breaker(True, partition, tuple(s.name for s in drained if s.name != node), len(members), allowed)
    return Breaker(False)


def _order(node: str) -> Callable[[NodeState], tuple[int, str, str]]:
    """Drained nodes by the time of their reason, then name; ``node`` itself, not drained yet, last."""

    def key(state: NodeState) -> tuple[int, str, str]:
        pending = state.name == node and not _drained_by_us(state)
        return (1 if pending else 0, state.since or "~", state.name)

    return key


@dataclass(frozen=True)
class Leak:
    pid: int
    command: str


def job_processes(job_id: str, cluster: str = "", proc: Path = Path("/proc")) -> list[Leak]:
    """The processes still running with the job's ``SLURM_JOB_ID`` (and its cluster's
    ``SLURM_CLUSTER_NAME``, where given) in their environment: what a finished job left behind
    (read as root, as slurmd runs the epilog). This process and its ancestors are not counted."""
    mine = _ancestors(proc)
    wanted = {f"SLURM_JOB_ID={job_id}".encode()}
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            environ = set((entry / "environ").read_bytes().split(b"\0"))
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except OSError:
            continue
        if wanted <= environ and (not cluster or f"SLURM_CLUSTER_NAME={cluster}".encode() in environ) and command:
            found.append(Leak(int(entry.name), command[:80]))
    return sorted(found, key=lambda leak: leak.pid)


def _ancestors(proc: Path) -> set[int]:
    seen, pid = set(), os.getpid()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        try:
            pid = int((proc / str(pid) / "stat").read_text().rsplit(") ", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return seen
