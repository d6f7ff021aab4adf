"""The fleet's report in every shape the gate's has: console, JUnit, Markdown, Prometheus, HTML.

Every renderer reads only the fleet document (``stackgate.fleet/1``, commands/fleet.py): nodes x
stages, the fingerprint groups with what each odd node has that the majority has not, the
outliers with both numbers, one verdict; for ``fleet upgrade``, each node's decision and its
reason, decode tok/s live -> new with their 95% CIs, and which nodes moved.
"""

from __future__ import annotations

import html
from typing import Any, Mapping, Sequence

from stackgate.models.result import Result, Status
from stackgate.render import reporting, summaries
from stackgate.render.ui import UI

__all__ = [
    "STAGES",
    "failure_lines",
    "group_lines",
    "html_page",
    "junit",
    "markdown",
    "prometheus",
    "render",
    "rows",
    "upgrade_lines",
]

#: The gate's stages, in order (a verify node has none: its verdict stands alone).
STAGES = ("lock", "environment", "verify", "fast_smoke", "benchmark")
_ABBREV = {"passed": "pass", "failed": "FAIL", "not run": "-", "interrupted": "INT"}
_FIGURES = (("decode_tok_s", "decode tok/s"), ("busbw_gbs", "busbw GB/s"), ("tflops", "TFLOP/s"))


def _stages(doc: Mapping[str, Any]) -> list[str]:
    named = {s for node in doc.get("nodes", ()) for s in node.get("stages", {})}
    return [s for s in STAGES if s in named] + sorted(named - set(STAGES))


def _figure(node: Mapping[str, Any], name: str) -> str:
    value = node.get("figures", {}).get(name)
    return f"{value:.2f}" if isinstance(value, (int, float)) else "-"


def rows(doc: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The nodes x stages table: headers and one row per node (an upgrade's: its decision and decode live -> new)."""
    if isinstance(doc.get("upgrade"), Mapping):
        return _upgrade_rows(doc)
    stages = _stages(doc)
    shown = [(key, label) for key, label in _FIGURES if any(key in n.get("figures", {}) for n in doc.get("nodes", ()))]
    headers = ["node", "status", *stages, *(label for _, label in shown), "stack", "seconds", "reason"]
    table = []
    for node in doc.get("nodes", ()):
        cells = [
            node["name"],
            node["status"],
            *(_ABBREV.get(node.get("stages", {}).get(s, ""), node.get("stages", {}).get(s, "")) for s in stages),
        ]
        cells += [_figure(node, key) for key, _ in shown]
        cells += [
            node.get("fingerprint") or "-",
            f"{node.get('duration_s', 0):.1f}",
            node.get("reason", "") if node["status"] != "passed" else "",
        ]
        table.append([str(c) for c in cells])
    return headers, table


def _upgrade_rows(doc: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    canaries = set(doc["upgrade"].get("canary_nodes", ()))
    table = []
    for node in doc.get("nodes", ()):
        outcome = node.get("upgrade") if isinstance(node.get("upgrade"), Mapping) else {}
        live, new = (outcome.get(k) or {} for k in ("live_tok_s", "new_tok_s"))
        rates = (
            f"{live['mean']:.2f} -> {new['mean']:.2f}"
            if live.get("mean") is not None and new.get("mean") is not None
            else "-"
        )
        role = "canary" if node["name"] in canaries else "rollout"
        table.append(
            [
                node["name"],
                role,
                node["status"],
                outcome.get("decision") or "-",
                rates,
                f"{node.get('duration_s', 0):.1f}",
                node.get("reason", "") if node["status"] != "passed" else "",
            ]
        )
    return ["node", "role", "status", "decision", "decode tok/s live -> new", "seconds", "reason"], table


def group_lines(doc: Mapping[str, Any]) -> list[str]:
    """The fingerprint groups, majority first, and each odd node's differences, component by component."""
    groups = [g for g in doc.get("groups", ()) if g.get("digest")]
    lines = []
    for group in groups:
        role = "majority" if group.get("majority") else "differs"
        lines.append(f"stack {group['short']} ({role}): {', '.join(group['nodes'])}")
        for node, changes in group.get("differences", {}).items():
            lines.append(f"  {node}: {len(changes)} component(s) differ from {groups[0]['short']}:")
            lines += [_difference(c) for c in changes[:40]]
            if len(changes) > 40:
                lines.append(f"    ... and {len(changes) - 40} more (the JSON report lists them all)")
    missing = [g for g in doc.get("groups", ()) if not g.get("digest")]
    for group in missing:
        lines.append(f"no fingerprint: {', '.join(group['nodes'])}")
    return lines


def _difference(change: Mapping[str, Any]) -> str:
    """One component that differs; a section one side never measured, as such.

    >>> _difference({"section": "server", "name": "unavailable", "majority": None, "node": "no smoke stage"})
    '    server: not measured on the node (no smoke stage)'
    >>> _difference({"section": "gpu", "name": "count", "majority": "8", "node": "7"})
    '    gpu: count: 8 -> 7'
    """
    old, new = change.get("majority"), change.get("node")
    if change.get("name") == "unavailable":
        where = f"on the node ({new})" if new is not None else f"by the majority ({old})"
        return f"    {change['section']}: not measured {where}"
    return f"    {change['section']}: {change['name']}: {old or '(none)'} -> {new or '(none)'}"


#: Failed checks shown per node on the console and in Markdown (the JSON report holds them all).
SHOWN_CHECKS = 10


def failure_lines(doc: Mapping[str, Any]) -> list[str]:
    """Each node's failed checks with their one-line reasons (``fleet verify``: which checks, not
    only how many)."""
    lines = []
    for node in doc.get("nodes", ()):
        failed = node.get("failed_checks") or []
        if not failed:
            continue
        lines.append(f"{node['name']}: {len(failed)} check(s) failed:")
        lines += [f"  {c['check']} {c['status']}: {c['summary']}" for c in failed[:SHOWN_CHECKS]]
        if len(failed) > SHOWN_CHECKS:
            lines.append(f"  ... and {len(failed) - SHOWN_CHECKS} more (the JSON report lists them all)")
    return lines


def _rate(rate: Any) -> str:
    """``92.61 tok/s (95% CI 92.10-93.12, n=4)`` from an upgrade outcome's side."""
    if not isinstance(rate, Mapping) or rate.get("mean") is None:
        return "not measured"
    low, high = rate.get("ci_low"), rate.get("ci_high")
    interval = f"95% CI {low:.2f}-{high:.2f}" if low is not None and high is not None else "no CI"
    return f"{rate['mean']:.2f} tok/s ({interval}, n={rate.get('n') if rate.get('n') is not None else '?'})"


def upgrade_lines(doc: Mapping[str, Any]) -> list[str]:
    """``fleet upgrade``: per node, its part in the rollout, the decision and why, decode live ->
    new; then which nodes moved, kept their stack, were not touched."""
    rollout = doc.get("upgrade")
    if not isinstance(rollout, Mapping):
        return []
    canaries = set(rollout.get("canary_nodes", ()))
    lines = []
    for node in doc.get("nodes", ()):
        role = "canary " if node["name"] in canaries else ""
        outcome = node.get("upgrade")
        if not isinstance(outcome, Mapping):
            lines.append(f"{role}{node['name']}: {_led(node['status'], node['reason'])}")
            continue
        kept = (
            " (nothing to roll back: current never moved)"
            if outcome["decision"] != "switched" and "switched" not in node.get("steps", ())
            else ""
        )
        lines.append(f"{role}{node['name']}: {_led(outcome['decision'], outcome['reason'])}{kept}")
        if outcome.get("live_tok_s") or outcome.get("new_tok_s"):
            diff = f"; new - live {outcome['difference_text']}" if outcome.get("difference_text") else ""
            lines.append(
                f"  decode live {_rate(outcome.get('live_tok_s'))} -> new {_rate(outcome.get('new_tok_s'))}{diff}"
            )
    for key, label in (
        ("moved", "moved to the new stack"),
        ("kept", "kept their live stack"),
        ("untouched", "not touched"),
    ):
        if rollout.get(key):
            lines.append(f"{label}: {', '.join(rollout[key])}")
    return lines


def _led(word: str, reason: str) -> str:
    """``reason``, led by ``word`` unless it already is (``kept the live stack: ...``)."""
    return reason if reason.startswith(word) else f"{word}: {reason}"


def render(doc: Mapping[str, Any], ui: UI) -> None:
    headers, table = rows(doc)
    spec = doc.get("lock") or {}
    ui.table(
        f"stackgate {doc['command']}: {spec.get('name')} ({spec.get('path')}) on {len(table)} node(s)",
        headers,
        table,
        _align(headers),
    )
    for line in [*failure_lines(doc), *group_lines(doc), *upgrade_lines(doc)]:
        ui.line(line)
    for outlier in doc.get("outliers", ()):
        ui.line(f"outlier {outlier['text']}", "warning")
    word = _word(doc)
    ui.line(
        f"{_counts(doc)} in {doc['duration_s']:.2f} s: {word} ({doc['reason']})",
        "success" if word == "PASSED" else "error",
    )


def _align(headers: Sequence[str]) -> str:
    """Figures and seconds to the right, words (the reason above all) to the left: a long reason
    never pads the others."""
    figures = {label for _, label in _FIGURES} | {"seconds", "decode tok/s live -> new"}
    return "".join("r" if header in figures else "l" for header in headers)


def _word(doc: Mapping[str, Any]) -> str:
    return "INTERRUPTED" if doc.get("interrupted") else "PASSED" if doc.get("verdict") == "passed" else "FAILED"


def _counts(doc: Mapping[str, Any]) -> str:
    return ", ".join(f"{n} {status}" for status, n in sorted(doc.get("counts", {}).items())) or "no node"


# --- JUnit ----------------------------------------------------------------------------------------

_STATUS = {"passed": Status.PASS, "not run": Status.SKIP}


def _results(doc: Mapping[str, Any]) -> dict[str, list[Result]]:
    suites: dict[str, list[Result]] = {}
    for node in doc.get("nodes", ()):
        status = _STATUS.get(node["status"], Status.FAIL) if node.get("judged", True) else Status.SKIP
        results = [
            Result(
                f"{node['name']}.node",
                status,
                f"{node['status']}: {node['reason']}",
                data={"address": node["address"]},
                duration_s=float(node.get("duration_s", 0)),
            )
        ]
        for stage, state in node.get("stages", {}).items():
            results.append(Result(f"{node['name']}.{stage}", _STATUS.get(state, Status.FAIL), state))
        suites[f"stackgate.fleet.{node['name']}"] = results
    fleet = (
        [
            Result(
                "fleet.stacks",
                Status.FAIL if len([g for g in doc.get("groups", ()) if g.get("digest")]) > 1 else Status.PASS,
                "; ".join(group_lines(doc)) or "no fingerprint",
            )
        ]
        if doc.get("groups")
        else []
    )
    fleet += [
        Result(f"fleet.outlier.{o['node']}.{o['metric']}", Status.WARN, o["text"]) for o in doc.get("outliers", ())
    ]
    suites["stackgate.fleet"] = fleet
    return suites


def junit(doc: Mapping[str, Any]) -> str:
    """One testsuite per node (a case for the node and one per stage), and one for the fleet."""
    return reporting.junit_xml(_results(doc), strict=bool(doc.get("request", {}).get("strict")))


# --- Markdown -------------------------------------------------------------------------------------


def markdown(doc: Mapping[str, Any]) -> str:
    word = _word(doc)
    spec = doc.get("lock") or {}
    out = [f"## {'✅' if word == 'PASSED' else '❌'} stackgate {doc['command']}: {word}", ""]
    out += [
        f"lock **{summaries.md_text(spec.get('name'))}** · {len(doc.get('nodes', ()))} node(s) · "
        f"exit code {doc['exit_code']} · "
        f"{doc['duration_s']:.1f} s · run {summaries.md_code(doc['run_id'])}",
        "",
    ]
    out += [summaries.md_text(doc["reason"]), ""]
    headers, table = rows(doc)
    out += ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(summaries.md_text(c) for c in row) + " |" for row in table]
    failures = failure_lines(doc)
    if failures:
        out += ["", "### Failed checks", "", *summaries.md_block(failures)]
    lines = group_lines(doc)
    if lines:
        out += ["", "### Stacks (fingerprint groups)", "", *summaries.md_block(lines)]
    rollout = upgrade_lines(doc)
    if rollout:
        out += ["", "### Upgrade (canary first)", "", *summaries.md_block(rollout)]
    if doc.get("outliers"):
        out += ["", "### Outliers (against the fleet median, MAD rule)", ""]
        out += [f"- {summaries.md_text(o['text'])}" for o in doc["outliers"]]
    return "\n".join(out).rstrip() + "\n"


# --- Prometheus -----------------------------------------------------------------------------------


def prometheus(doc: Mapping[str, Any]) -> str:
    """One series per node (``node`` label) and the fleet's own; figures only where measured."""
    spec = str((doc.get("lock") or {}).get("name") or "unknown")
    base = {"lock": spec}
    nodes = doc.get("nodes", ())
    per_node = [({**base, "node": n["name"]}, n) for n in nodes]
    families: list[summaries.Family] = [
        (
            "stackgate_fleet_passed",
            "Whether the last fleet run passed (1) or not (0).",
            [(base, 1.0 if doc.get("verdict") == "passed" else 0.0)],
        ),
        ("stackgate_fleet_exit_code", "Exit code of the last fleet run.", [(base, float(doc["exit_code"]))]),
        (
            "stackgate_fleet_nodes",
            "Nodes of the last fleet run, by status.",
            [({**base, "status": s.replace(" ", "_")}, float(c)) for s, c in doc.get("counts", {}).items()],
        ),
        (
            "stackgate_fleet_stacks",
            "Distinct stacks (fingerprints) among the nodes of the last fleet run.",
            [(base, float(len([g for g in doc.get("groups", ()) if g.get("digest")])))],
        ),
        (
            "stackgate_fleet_node_passed",
            "Whether each node passed (1) or not (0).",
            [(labels, 1.0 if n["status"] == "passed" else 0.0) for labels, n in per_node],
        ),
        (
            "stackgate_fleet_node_majority_stack",
            "Whether each node runs the majority's stack (1) or not (0).",
            [(labels, 1.0 if _in_majority(doc, n["name"]) else 0.0) for labels, n in per_node],
        ),
        (
            "stackgate_fleet_node_duration_seconds",
            "Wall time of each node's run.",
            [(labels, float(n.get("duration_s", 0))) for labels, n in per_node],
        ),
        (
            "stackgate_fleet_outlier",
            "1 for each node and figure found far from the fleet median.",
            [({**base, "node": o["node"], "metric": o["metric"]}, 1.0) for o in doc.get("outliers", ())],
        ),
    ]
    if isinstance(doc.get("upgrade"), Mapping):
        moved = set(doc["upgrade"].get("moved", ()))
        samples = [(labels, 1.0 if n["name"] in moved else 0.0) for labels, n in per_node]
        families.append(
            (
                "stackgate_fleet_node_upgraded",
                "Whether fleet upgrade moved each node to the new stack (1) or not (0).",
                samples,
            )
        )
    measured = (
        ("decode_tok_s", "decode_tokens_per_second", "decode tok/s"),
        ("busbw_gbs", "allreduce_busbw_gbytes_per_second", "all-reduce bus bandwidth, GB/s"),
        ("tflops", "bf16_tflops", "bf16 matmul TFLOP/s (slowest GPU)"),
    )
    for key, name, text in measured:
        samples = [(labels, float(n["figures"][key])) for labels, n in per_node if key in n.get("figures", {})]
        families.append((f"stackgate_fleet_node_{name}", f"Each node's {text}.", samples))
    return summaries.exposition(families)


def _in_majority(doc: Mapping[str, Any], name: str) -> bool:
    return any(g.get("majority") and name in g.get("nodes", ()) for g in doc.get("groups", ()))


# --- HTML -----------------------------------------------------------------------------------------

_CSS = (
    "body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #1f2328; } "
    "table { border-collapse: collapse; }\n"
    "th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #eaeef2; } "
    "th { background: #f6f8fa; }\n"
    ".passed, .pass { color: #1a7f37; } "
    ".failed, .FAIL, .unreachable, .unavailable, .timed-out, .interrupted, .INT { color: #cf222e; font-weight: 600; }\n"
    "pre { background: #f6f8fa; padding: 6px 8px; }"
)


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _html_table(headers: Sequence[str], table: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f'<td class="{_e(c.replace(" ", "-"))}">{_e(c)}</td>' for c in row) + "</tr>" for row in table
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def html_page(doc: Mapping[str, Any]) -> str:
    """One self-contained page (no script, nothing fetched): the verdict, the table, groups, outliers."""
    word = _word(doc)
    headers, table = rows(doc)
    parts = [
        f"<h1>stackgate {_e(doc['command'])}: <span "
        f'class="{"passed" if word == "PASSED" else "failed"}">{_e(word)}</span></h1>',
        f"<p>{_e(doc['reason'])}</p>",
    ]
    parts += ["<h2>Nodes</h2>", _html_table(headers, table)]
    if failure_lines(doc):
        parts += ["<h2>Failed checks</h2>", f"<pre>{_e(chr(10).join(failure_lines(doc)))}</pre>"]
    if doc.get("upgrade"):
        parts += ["<h2>Upgrade (canary first)</h2>", f"<pre>{_e(chr(10).join(upgrade_lines(doc)))}</pre>"]
    elif doc.get("groups"):
        parts += ["<h2>Stacks</h2>", f"<pre>{_e(chr(10).join(group_lines(doc)) or 'no fingerprint')}</pre>"]
    parts += [
        "<h2>Outliers</h2>",
        "<ul>" + "".join(f"<li>{_e(o['text'])}</li>" for o in doc.get("outliers", ())) + "</ul>"
        if doc.get("outliers")
        else "<p>none</p>",
    ]
    body = "\n".join(parts)
    return (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>stackgate '
        f"{_e(doc['command'])}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )
