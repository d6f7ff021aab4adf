"""A Slurm cluster's health at a glance (``stackgate slurm-health --summary``), as sinfo shows it:
nodes by verdict, by drift (the check stackgate drained each failing node for) and by drain
reason, in the console, Markdown and JSON.

The verdict of a node, from Slurm's state and reason alone (so it needs no node to answer):
``healthy`` (in service, no reason), ``failing`` (drained by stackgate: its reason starts with
``stackgate:``), ``held by an admin`` (drained, down or failed with someone else's reason) or
``unknown`` (not responding, or a state stackgate does not judge).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from stackgate.edges.slurm import NodeState
from stackgate.models.healthconfig import PREFIX
from stackgate.models.printable import printable
from stackgate.render.summaries import md_text

__all__ = ["SCHEMA", "console_lines", "markdown", "summarize"]

SCHEMA = "stackgate.slurm-summary/1"
_IN_SERVICE = ("idle", "allocated", "mixed", "completing", "planned", "reserved")


def _verdict(state: NodeState) -> str:
    base = state.state.lower()
    if base.endswith(("*", "~", "#", "!", "%")):
        return "unknown"
    if state.reason.startswith(PREFIX):
        return "failing"
    if state.reason or any(word in base for word in ("drain", "down", "fail")):
        return "held by an admin"
    return "healthy" if base in _IN_SERVICE else "unknown"


def summarize(states: Iterable[NodeState], partition: str | None = None) -> dict[str, Any]:
    """The summary document: every node's state, reason and verdict, and the three groupings.

    >>> doc = summarize([NodeState("n1", "idle"), NodeState("n2", "drained", "stackgate: gpu.count: 0 GPU(s)")])
    >>> doc["by_verdict"], doc["by_drift"]
    ({'healthy': ['n1'], 'failing': ['n2']}, {'gpu.count': ['n2']})
    """
    nodes = [
        {"name": s.name, "state": s.state, "reason": s.reason, "since": s.since, "verdict": _verdict(s)}
        for s in sorted(states, key=lambda s: s.name)
    ]
    by_verdict: dict[str, list[str]] = {}
    by_drift: dict[str, list[str]] = {}
    by_reason: dict[str, list[str]] = {}
    for node in nodes:
        by_verdict.setdefault(node["verdict"], []).append(node["name"])
        if node["verdict"] == "failing":
            check = node["reason"].removeprefix(PREFIX).strip().split(":", 1)[0]
            by_drift.setdefault(check, []).append(node["name"])
        if node["reason"]:
            by_reason.setdefault(node["reason"], []).append(node["name"])
    return {
        "schema": SCHEMA,
        "partition": partition,
        "nodes": nodes,
        "by_verdict": by_verdict,
        "by_drift": by_drift,
        "by_reason": by_reason,
    }


def console_lines(doc: Mapping[str, Any]) -> list[str]:
    """sinfo's way: one line a group, its nodes after it."""
    where = f"partition {doc['partition']}" if doc.get("partition") else "every partition"
    lines = [f"stackgate slurm summary, {where}: {len(doc['nodes'])} node(s)"]
    for title, key in (
        ("verdict", "by_verdict"),
        ("drift (the check that failed)", "by_drift"),
        ("reason", "by_reason"),
    ):
        lines.append(f"by {title}:")
        groups = doc[key]
        lines += [f"  {len(names):>4}  {printable(group)}: {', '.join(names)}" for group, names in groups.items()]
        if not groups:
            lines.append("     0  (none)")
    return lines


def markdown(doc: Mapping[str, Any]) -> str:
    where = f"partition {doc['partition']}" if doc.get("partition") else "every partition"
    out = [f"# Slurm node health: {md_text(where)}", "", f"{len(doc['nodes'])} node(s).", ""]
    for title, key in (
        ("Verdict", "by_verdict"),
        ("Drift (the check that failed)", "by_drift"),
        ("Reason", "by_reason"),
    ):
        out += [f"## By {title.lower()}", "", f"| {title} | Nodes | Count |", "|---|---|---:|"]
        out += [
            f"| {md_text(group)} | {md_text(', '.join(names))} | {len(names)} |" for group, names in doc[key].items()
        ]
        out.append("")
    out += ["## Nodes", "", "| Node | State | Verdict | Reason |", "|---|---|---|---|"]
    out += [
        f"| {md_text(n['name'])} | {md_text(n['state'])} | {md_text(n['verdict'])} | {md_text(n['reason'])} |"
        for n in doc["nodes"]
    ]
    return "\n".join(out) + "\n"
