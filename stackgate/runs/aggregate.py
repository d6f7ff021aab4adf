"""What a fleet's node reports add up to: which nodes run the same stack, and which are slow.

Pure functions over the nodes' own JSON documents (``stackgate.report/1``, as each node's gate or
verify wrote it), so the same aggregation serves SSH, a Kubernetes Job per node or Slurm's
``srun``: whatever collects the documents.

- **Groups**: nodes whose fingerprints (runs/fingerprint.py) have the same digest run byte-identical
  stacks. The largest group is the majority (a tie goes to the group of the first node listed);
  for each node of another group, every component that differs from the majority's, section by
  section, as ``report A B`` names them.
- **Outliers**: for decode tok/s, all-reduce bus bandwidth and bf16 TFLOP/s, the fleet median
  and the median absolute deviation (MAD). A node is an outlier when it lies further from the
  median than 3.5 robust standard deviations (``|x - median| * 0.6745 / MAD > 3.5``, Iglewicz
  and Hoaglin's rule) and more than 5% of the median (so that a fleet of near-identical nodes,
  MAD near 0, does not flag a 0.1% difference). At least three nodes must have the figure.
- **Upgrade outcomes**: a node's ``stackgate upgrade`` report (its ``stackgate.upgrade/1`` part)
  in the fleet's words: switched or kept and why, decode tok/s of each side with its 95% CI, the
  difference new - live, whether the node moved to the new stack.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from stackgate.runs import fingerprint

__all__ = [
    "KEPT",
    "METRICS",
    "SWITCHED",
    "UNCHANGED",
    "UNDECIDED",
    "Group",
    "Outlier",
    "failed_checks",
    "figures",
    "groups",
    "outliers",
    "upgrade_outcome",
]

#: figure name -> (label, unit)
METRICS: Mapping[str, tuple[str, str]] = {
    "decode_tok_s": ("decode", "tok/s"),
    "busbw_gbs": ("all-reduce busbw", "GB/s"),
    "tflops": ("bf16 matmul (slowest GPU)", "TFLOP/s"),
}
MAD_LIMIT = 3.5
MIN_RELATIVE = 0.05
MIN_NODES = 3
#: An upgrade's outcome on a node: the new stack is live, the live one kept, the node already ran
#: the new spec's stack, or no decision (the plan was blocked, the run stopped).
SWITCHED, KEPT, UNCHANGED, UNDECIDED = "switched", "kept", "already on the new stack", "not decided"


def _at(value: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def figures(doc: Mapping[str, Any]) -> dict[str, float]:
    """A node report's figures that the fleet compares (those it measured).

    >>> figures({"gate": {"benchmark": {"decode_tok_s": {"mean": 92.6}}},
    ...          "results": [{"check": "deep.collective", "data": {"peak_busbw_gbs": 38.5}}]})
    {'decode_tok_s': 92.6, 'busbw_gbs': 38.5}
    """
    found: dict[str, float] = {}
    decode = _number(_at(doc, "gate", "benchmark", "decode_tok_s", "mean"))
    if decode is not None:
        found["decode_tok_s"] = decode
    results = doc.get("results")
    for result in results if isinstance(results, list) else ():
        data = _at(result, "data")
        if _at(result, "check") == "deep.collective":
            busbw = _number(_at(data, "peak_busbw_gbs"))
            if busbw is not None:
                found["busbw_gbs"] = busbw
        elif _at(result, "check") == "deep.gpu_work":
            gpus = _at(data, "gpus")
            rates = [
                r
                for g in (gpus if isinstance(gpus, list) else ())
                if (r := _number(_at(g, "bfloat16", "tflops"))) is not None
            ]
            if rates:
                found["tflops"] = min(rates)
    return found


#: A failed check's summary is kept to this many characters (one line of a console or a table cell).
SUMMARY_CHARS = 240
FAILED = ("FAIL", "ERROR")


def failed_checks(doc: Mapping[str, Any] | None) -> list[dict[str, str]]:
    r"""A node report's failed (or crashed) checks, each with its one-line reason, in its order.

    >>> failed_checks({"results": [
    ...     {"check": "gpu.count", "status": "FAIL", "summary": "1 GPU(s) visible,\nthe lock wants 2"},
    ...     {"check": "gpu.driver", "status": "PASS", "summary": "ok"}, "junk"]})
    [{'check': 'gpu.count', 'status': 'FAIL', 'summary': '1 GPU(s) visible, the lock wants 2'}]
    """
    results = _at(doc, "results")
    found = []
    for result in results if isinstance(results, list) else ():
        check, status, summary = _at(result, "check"), _at(result, "status"), _at(result, "summary")
        if isinstance(check, str) and status in FAILED:
            line = " ".join(str(summary or "").split())
            found.append(
                {
                    "check": check,
                    "status": str(status),
                    "summary": line if len(line) <= SUMMARY_CHARS else line[: SUMMARY_CHARS - 3] + "...",
                }
            )
    return found


@dataclass(frozen=True)
class Group:
    digest: str | None  #: None: the nodes that reported no fingerprint
    nodes: tuple[str, ...]
    majority: bool
    #: node -> what differs from the majority's stack, as fingerprint.Change
    differences: Mapping[str, tuple[fingerprint.Change, ...]]

    @property
    def short(self) -> str:
        return self.digest[:12] if self.digest else "none"

    def to_dict(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "short": self.short,
            "nodes": list(self.nodes),
            "majority": self.majority,
            "differences": {
                node: [{"section": c.section, "name": c.name, "majority": c.old, "node": c.new} for c in found]
                for node, found in self.differences.items()
            },
        }


def _fingerprint(doc: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    found = _at(doc, "gate", "fingerprint")
    return (
        found
        if isinstance(found, Mapping)
        and isinstance(found.get("digest"), str)
        and isinstance(found.get("components"), Mapping)
        else None
    )


def _components(finger: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    return {
        str(k): {str(n): str(v) for n, v in s.items()}
        for k, s in finger["components"].items()
        if isinstance(s, Mapping)
    }


def groups(docs: Sequence[tuple[str, Mapping[str, Any] | None]]) -> list[Group]:
    """The nodes by fingerprint, majority first, then by size; the nodes without one last."""
    by_digest: dict[str, list[str]] = {}
    parts: dict[str, dict[str, dict[str, str]]] = {}
    missing = []
    for name, doc in docs:
        finger = _fingerprint(doc)
        if finger is None:
            missing.append(name)
            continue
        by_digest.setdefault(finger["digest"], []).append(name)
        parts.setdefault(finger["digest"], _components(finger))
    ordered = sorted(
        by_digest.items(), key=lambda item: -len(item[1])
    )  # stable: a tie keeps the first node's group first
    found = []
    for index, (digest, nodes) in enumerate(ordered):
        majority = parts[ordered[0][0]]
        differences = {} if index == 0 else {node: _differences(majority, parts[digest]) for node in nodes}
        found.append(Group(digest, tuple(nodes), index == 0, differences))
    if missing:
        found.append(Group(None, tuple(missing), False, {}))
    return found


def _differences(
    majority: Mapping[str, Mapping[str, str]], node: Mapping[str, Mapping[str, str]]
) -> tuple[fingerprint.Change, ...]:
    """What differs, component by component, in the sections both measured; a section only one side
    measured (a node that failed before its smoke read no /server_info) is one change, named
    ``unavailable``, with the reason on the side that lacks it, not every component of the other.

    >>> majority = {"server": {"attention_backend": "flashinfer", "tp_size": "8"}, "gpu": {"count": "8"}}
    >>> node = {"server": {"unavailable": "no smoke stage read /server_info"}, "gpu": {"count": "7"}}
    >>> [(c.section, str(c)) for c in _differences(majority, node)]
    [('gpu', 'count: 8 -> 7'), ('server', 'unavailable: (none) -> no smoke stage read /server_info')]
    """
    sections = majority.keys() | node.keys()
    both = {
        s for s in sections if fingerprint.measured(majority.get(s) or {}) and fingerprint.measured(node.get(s) or {})
    }
    found = fingerprint.changes({s: majority.get(s) or {} for s in both}, {s: node.get(s) or {} for s in both})
    for section in [s for s in fingerprint.SECTIONS if s in sections - both] + sorted(
        sections - both - set(fingerprint.SECTIONS)
    ):
        old, new = (side.get(section) or {} for side in (majority, node))
        if fingerprint.measured(old) or fingerprint.measured(new) or old != new:
            found.append(
                fingerprint.Change(
                    section, fingerprint.UNAVAILABLE, old.get(fingerprint.UNAVAILABLE), new.get(fingerprint.UNAVAILABLE)
                )
            )
    return tuple(found)


@dataclass(frozen=True)
class Outlier:
    node: str
    metric: str
    value: float
    median: float
    mad: float

    @property
    def relative(self) -> float:
        return self.value / self.median - 1 if self.median else 0.0

    def text(self) -> str:
        """``n4: decode 1000.00 tok/s, fleet median 2000.00 tok/s (-50.0%, below)``"""
        label, unit = METRICS[self.metric]
        side = "below" if self.value < self.median else "above"
        return (
            f"{self.node}: {label} {self.value:.2f} {unit}, "
            f"fleet median {self.median:.2f} {unit} ({self.relative:+.1%}, {side})"
        )

    def to_dict(self) -> dict[str, Any]:
        label, unit = METRICS[self.metric]
        figures = {"value": self.value, "median": self.median, "mad": self.mad, "relative": round(self.relative, 4)}
        return {"node": self.node, "metric": self.metric, "label": label, "unit": unit, **figures, "text": self.text()}


def outliers(per_node: Sequence[tuple[str, Mapping[str, float]]]) -> list[Outlier]:
    """Every node whose figure lies far from the fleet's median (the module's rule).

    >>> rates = [("a", 92.5), ("b", 92.7), ("c", 92.6), ("d", 61.0)]
    >>> [o.text() for o in outliers([(name, {"decode_tok_s": rate}) for name, rate in rates])]
    ['d: decode 61.00 tok/s, fleet median 92.55 tok/s (-34.1%, below)']
    """
    found = []
    for metric in METRICS:
        values = [(name, figs[metric]) for name, figs in per_node if metric in figs]
        if len(values) < MIN_NODES:
            continue
        median = statistics.median(v for _, v in values)
        mad = statistics.median(abs(v - median) for _, v in values)
        limit = max(MAD_LIMIT * mad / 0.6745, MIN_RELATIVE * abs(median))
        found += [Outlier(name, metric, value, median, mad) for name, value in values if abs(value - median) > limit]
    return found


def upgrade_outcome(doc: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A node's upgrade report in the fleet's words (None when ``doc`` holds no upgrade part);
    every value type-checked (the report came from a node).

    >>> part = {"schema": "stackgate.upgrade/1", "decision": {"switch": True, "reason": "switched: faster"},
    ...         "current": {"before": "g1", "after": "g2", "switched": True},
    ...         "ab": {"sides": {"live": {"decode_tok_s": {"mean": 90.0, "ci_low": 89.0, "ci_high": 91.0, "n": 4}},
    ...                          "new": {"decode_tok_s": {"mean": "fast"}}}}}
    >>> found = upgrade_outcome({"exit_code": 0, "upgrade": part})
    >>> (found["decision"], found["moved"], found["live_tok_s"], found["new_tok_s"], found["generation"])
    ('switched', True, {'mean': 90.0, 'ci_low': 89.0, 'ci_high': 91.0, 'n': 4}, None, {'before': 'g1', 'after': 'g2'})
    """
    part = _at(doc, "upgrade")
    if doc is None or not isinstance(part, Mapping) or part.get("schema") != "stackgate.upgrade/1":
        return None
    decision = _at(part, "decision")
    changes = _at(part, "plan", "changes")
    moved = _at(part, "current", "switched") is True or (_at(decision, "switch") is True and doc.get("exit_code") == 0)
    reason = (
        _text(_at(decision, "reason")) or _text(_at(part, "blocked")) or _text(doc.get("reason")) or "no reason given"
    )
    if moved:
        word = SWITCHED
    elif isinstance(changes, list) and not changes and decision is None and _at(part, "blocked") is None:
        word, reason = UNCHANGED, "already on the new stack: nothing to upgrade"
    else:
        word = KEPT if isinstance(decision, Mapping) else UNDECIDED
    sides = _at(part, "ab", "sides")
    diff = _at(part, "ab", "difference")
    return {
        "decision": word,
        "reason": reason,
        "moved": moved,
        "step": _text(_at(part, "step")),
        "generation": {"before": _text(_at(part, "current", "before")), "after": _text(_at(part, "current", "after"))},
        "live_tok_s": _rate(_at(sides, "live", "decode_tok_s")),
        "new_tok_s": _rate(_at(sides, "new", "decode_tok_s")),
        "difference": {
            "delta": _number(_at(diff, "delta")),
            "relative": _number(_at(diff, "relative")),
            "significant": _at(diff, "significant") is True,
        }
        if isinstance(diff, Mapping)
        else None,
        "difference_text": _text(_at(part, "ab", "difference_text")),
    }


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _rate(summary: Any) -> dict[str, Any] | None:
    """A side's decode tok/s: its mean and 95% CI (None where the node gave none)."""
    mean = _number(_at(summary, "mean"))
    if mean is None:
        return None
    n = _at(summary, "n")
    return {
        "mean": mean,
        "ci_low": _number(_at(summary, "ci_low")),
        "ci_high": _number(_at(summary, "ci_high")),
        "n": n if isinstance(n, int) and not isinstance(n, bool) else None,
    }
