"""What slurm-health keeps between runs on a node: each failing check's run of consecutive
failures (the damping), the last verdict, and the node's reason history (drains, resumes, the
re-validation before each resume, what the breaker held back).

One JSON file per node, ``<state_dir>/<node>.json``, in a folder of this user's own (mode 0700);
a file that is not this user's, is writable by others, is a symbolic link or is damaged is set
aside with a note and the node starts from no count (never trusted, never a traceback).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from stackgate.edges import owned

__all__ = ["HISTORY_MAX", "SCHEMA", "NodeRecord", "counted", "load", "save"]

SCHEMA = "stackgate.slurm-health/1"
#: Events kept per node (the oldest are dropped).
HISTORY_MAX = 50
MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class NodeRecord:
    node: str
    counts: Mapping[str, int] = field(default_factory=dict)  #: check -> consecutive failures
    last: Mapping[str, Any] = field(default_factory=dict)  #: the last run: time, healthy, check, summary
    history: tuple[Mapping[str, Any], ...] = ()  #: events, oldest first: time, event, detail
    note: str = ""  #: why a record on disk was not used (set aside)

    def with_event(self, event: str, detail: str, now: float | None = None) -> NodeRecord:
        entry = {"time": time.time() if now is None else now, "event": event, "detail": detail}
        return NodeRecord(self.node, self.counts, self.last, (*self.history, entry)[-HISTORY_MAX:], self.note)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "node": self.node,
            "counts": dict(self.counts),
            "last": dict(self.last),
            "history": [dict(e) for e in self.history],
        }


def counted(previous: Mapping[str, int], failing: Sequence[str]) -> dict[str, int]:
    """Each failing check's run of consecutive failures after this run: one more for each check
    failing now, none for a check that passed (a recovery clears its count).

    >>> counted({"gpu.count": 2, "gpu.ecc": 1}, ["gpu.count", "python.pins"])
    {'gpu.count': 3, 'python.pins': 1}
    """
    return {check: previous.get(check, 0) + 1 for check in dict.fromkeys(failing)}


def load(folder: Path, node: str) -> NodeRecord:
    """The node's record (an empty one when there is none, or when the one there is not trusted:
    its ``note`` says why)."""
    try:
        fd = owned.private_folder(folder)
    except OSError as exc:
        return NodeRecord(node, note=f"state folder not used: {exc}")
    try:
        data = owned.read_owned(f"{node}.json", MAX_BYTES, dir_fd=fd)
        return _record(json.loads(data), node)
    except FileNotFoundError:
        return NodeRecord(node)
    except OSError as exc:
        return NodeRecord(node, note=f"state not used: {exc}")
    except (ValueError, TypeError, KeyError) as exc:
        return NodeRecord(node, note=f"state not used: {folder / (node + '.json')}: damaged ({exc}); counting afresh")
    finally:
        os.close(fd)


def save(folder: Path, record: NodeRecord) -> str | None:
    """Write the node's record (atomically, 0600); why it was not written, if it was not."""
    try:
        fd = owned.private_folder(folder)
    except OSError as exc:
        return f"state not kept: {exc}"
    try:
        owned.replace_owned(f"{record.node}.json", json.dumps(record.to_dict(), indent=1).encode(), dir_fd=fd)
    except OSError as exc:
        return f"state not kept: {folder}: {exc.strerror or exc}"
    finally:
        os.close(fd)
    return None


def _record(raw: Any, node: str) -> NodeRecord:
    if not isinstance(raw, dict) or raw.get("schema") != SCHEMA or raw.get("node") != node:
        raise ValueError(f"not a {SCHEMA} record of {node}")
    counts, last, history = raw.get("counts", {}), raw.get("last", {}), raw.get("history", [])
    if not isinstance(counts, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v > 0 for k, v in counts.items()
    ):
        raise TypeError("counts: not check names with counts")
    if not isinstance(last, dict) or not isinstance(history, list) or not all(isinstance(e, dict) for e in history):
        raise TypeError("last or history: not objects")
    return NodeRecord(node, counts, last, tuple(history[-HISTORY_MAX:]))
