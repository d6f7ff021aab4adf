"""An upgrade's report, from its (redacted) document: the console, Markdown and one HTML page.

Every form says the same, in the same order: what changed (toolkits, distributions, spec inputs,
patches, env, smoke flags) beside what it did (the decode rate of each side and the difference
with its interval), the backend each side really ran and the flags' evidence before and after,
the legs in launch order, and the decision with its reason.
"""

from __future__ import annotations

import html
from typing import Any, Mapping, Sequence

from stackgate.render.ui import UI

__all__ = ["console", "markdown", "page", "plan_lines"]

LEG_HEADERS = ("leg", "side", "generation", "decode tok/s", "95% CI", "backend", "evidence", "passed")


def plan_lines(
    live_id: str, live_path: Any, new_path: Any, changes: Sequence[Mapping[str, Any]], build: Sequence[str]
) -> list[str]:
    """The plan as printed before anything runs (and all that --dry-run prints)."""
    lines = [f"upgrade plan: live generation {live_id} (from {live_path}) -> {new_path}"]
    lines.append(
        f"what changes ({len(changes)}):"
        if changes
        else "what changes: nothing in the stack's spec, pylock, patches, env or smoke flags"
    )
    lines += [f"  {c['area']:<12} {_change(c)}" for c in changes]
    lines.append("build beside the live stack (current is not switched):")
    lines += [f"  {line}" for line in build]
    return lines


def _change(change: Mapping[str, Any]) -> str:
    old = change.get("old") if change.get("old") is not None else "(none)"
    new = change.get("new") if change.get("new") is not None else "(none)"
    return f"{change['name']}: {old} -> {new}"


def _part(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    part = doc.get("upgrade")
    return part if isinstance(part, Mapping) else {}


def leg_rows(doc: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for leg in _part(doc).get("ab", {}).get("legs", []):
        decode = leg.get("decode_tok_s") or {}
        ci = (
            f"{decode['ci_low']:.2f}-{decode['ci_high']:.2f}"
            if decode.get("ci_low") is not None and decode.get("ci_high") is not None
            else "-"
        )
        mean = f"{decode['mean']:.2f}" if decode.get("mean") is not None else "-"
        evidence = ", ".join(f"{e['check'].rsplit('.', 1)[-1]} {e['status']}" for e in leg.get("evidence", [])) or "-"
        rows.append(
            [
                str(leg.get("position")),
                str(leg.get("side")),
                str(leg.get("generation")),
                mean,
                ci,
                str(leg.get("attention_backend") or "-"),
                evidence,
                "yes" if leg.get("passed") else "no",
            ]
        )
    return rows


def summary_lines(doc: Mapping[str, Any]) -> list[str]:
    """The decision's lines: what changed beside the tok/s change, backends, evidence, reason."""
    part = _part(doc)
    ab, decision = part.get("ab") or {}, part.get("decision")
    current = part.get("current") or {}
    if part.get("blocked"):
        return [f"CANNOT UPGRADE: {part['blocked']}", f"current: {current.get('before')} (unchanged)"]
    if part.get("step") == "plan":
        what = (
            "dry run (--dry-run): nothing was built, launched or switched"
            if (part.get("request") or {}).get("dry_run")
            else "nothing to upgrade"
        )
        return [f"{what}; current: {current.get('before')} (unchanged)"]
    lines = []
    build = part.get("build") or {}
    if build:
        lines.append(
            f"build: {build.get('status')}: {build.get('reason')}"
            + (f"; verify {build['verify']}" if build.get("verify") else "")
        )
    lines += [
        f"  verify {r['status']}: {r['check']}: {r['summary']}"
        for r in part.get("verify", [])
        if r.get("status") in ("FAIL", "ERROR")
    ]
    sides = ab.get("sides") or {}
    for name in ("live", "new"):
        side = sides.get(name) or {}
        decode = side.get("decode_tok_s")
        if side.get("legs"):
            lines.append(
                f"{name}: decode {_summary(decode)} over legs {', '.join(map(str, side['legs']))}"
                + ("" if side.get("passed") else f"; FAILED: {'; '.join(side.get('failures', [])[:2])}")
            )
    if ab.get("difference_text"):
        moved = [
            c for c in part.get("plan", {}).get("changes", []) if c.get("area") in ("toolkit", "distribution", "smoke")
        ]
        what = ", ".join(_change(c) for c in moved[:6]) + (f" (and {len(moved) - 6} more)" if len(moved) > 6 else "")
        lines.append(f"{what or 'the change'}: decode new - live {ab['difference_text']}")
    lines += _backend_lines(ab.get("legs", []))
    if decision:
        lines += [f"  [{'x' if c['held'] else ' '}] {c['name']}: {c['text']}" for c in decision.get("conditions", [])]
    if part.get("interrupted"):
        lines.append(
            f"INTERRUPTED during {part.get('step')} (Ctrl-C or SIGTERM): every server was torn down; current: "
            f"{current.get('before')} (unchanged)"
        )
        return lines
    word = (
        "SWITCHED"
        if current.get("switched") or (decision and decision.get("switch") and part.get("step") == "done")
        else "KEPT"
    )
    reason = decision["reason"] if decision else doc.get("reason", "")
    lines.append(f"{word}: {reason}")
    if current.get("switched"):
        lines.append(f"current: {current.get('before')} -> {current.get('after')}")
    elif decision and decision.get("switch") and part.get("new", {}).get("generation") == current.get("before"):
        lines.append(
            f"current: {current.get('before')} (unchanged: the new spec runs on the live generation; its [smoke] flags "
            "and [env] are what changed)"
        )
    else:
        lines.append(f"current: {current.get('before')} (unchanged)")
    if part.get("new", {}).get("state") == "failed":
        lines.append(
            f"the new generation {part['new']['generation']} failed: kept for inspection at {part['new']['path']}, "
            "never switched or rolled back to"
        )
    return lines


def _summary(decode: Mapping[str, Any] | None) -> str:
    if not decode:
        return "not measured"
    ci = (
        f"95% CI {decode['ci_low']:.2f}-{decode['ci_high']:.2f}"
        if decode.get("ci_low") is not None and decode.get("ci_high") is not None
        else "no CI"
    )
    return f"{decode['mean']:.2f} tok/s ({ci}, n={decode['n']})"


def _backend_lines(legs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Per side, the backend its server reported and the evidence of each flag (first leg)."""
    lines = []
    for name in ("live", "new"):
        leg = next((leg for leg in legs if leg.get("side") == name and leg.get("attention_backend")), None)
        if leg is None:
            continue
        evidence = (
            "; ".join(
                f"{e['check'].rsplit('.', 1)[-1]}: {e['status']} ({e['summary']})" for e in leg.get("evidence", [])
            )
            or "no flag with evidence to look for"
        )
        lines.append(f"{name}: attention backend {leg['attention_backend']}; evidence: {evidence}")
    return lines


def console(doc: Mapping[str, Any], ui: UI) -> None:
    rows = leg_rows(doc)
    if rows:
        order = " ".join(str(s) for s in _part(doc).get("ab", {}).get("order", []))
        ui.table(f"A/B legs (order {order})", list(LEG_HEADERS), rows, align="lllrllll")
    for line in summary_lines(doc):
        ui.line(line, "success" if line.startswith("SWITCHED") else "error" if line.startswith("KEPT") else None)


def markdown(doc: Mapping[str, Any]) -> str:
    part = _part(doc)
    changes = part.get("plan", {}).get("changes", [])
    out = [f"# stackgate upgrade: {part.get('live', {}).get('lock')} -> {part.get('new', {}).get('lock')}", ""]
    out += [f"**{line}**" if line.startswith(("SWITCHED", "KEPT")) else f"- {line}" for line in summary_lines(doc)]
    out += ["", "## What changes", "", "| area | name | live | new |", "|---|---|---|---|"]
    out += [f"| {c['area']} | {_md(c['name'])} | {_md(c.get('old'))} | {_md(c.get('new'))} |" for c in changes]
    rows = leg_rows(doc)
    if rows:
        out += ["", "## A/B legs", "", "| " + " | ".join(LEG_HEADERS) + " |", "|" + "---|" * len(LEG_HEADERS)]
        out += ["| " + " | ".join(_md(v) for v in row) + " |" for row in rows]
    return "\n".join(out) + "\n"


def _md(value: Any) -> str:
    return "(none)" if value is None else str(value).replace("|", "\\|")


def page(doc: Mapping[str, Any]) -> str:
    """One self-contained page (inline CSS, nothing fetched)."""
    part = _part(doc)
    title = f"stackgate upgrade: {part.get('live', {}).get('lock')} -> {part.get('new', {}).get('lock')}"
    lines = "".join(f"<li>{_e(line)}</li>" for line in summary_lines(doc))
    changes = "".join(
        f"<tr><td>{_e(c['area'])}</td><td>{_e(c['name'])}</td>"
        f"<td>{_e(c.get('old'))}</td><td>{_e(c.get('new'))}</td></tr>"
        for c in part.get("plan", {}).get("changes", [])
    )
    legs = "".join("<tr>" + "".join(f"<td>{_e(v)}</td>" for v in row) + "</tr>" for row in leg_rows(doc))
    head = "".join(f"<th>{_e(h)}</th>" for h in LEG_HEADERS)
    body = (
        f"<h1>{_e(title)}</h1><p>started {_e(doc.get('started'))}, {_e(doc.get('duration_s'))} s</p><ul>{lines}</ul>"
        f"<h2>What changes</h2><table><tr><th>area</th><th>name</th><th>live</th><th>new</th></tr>{changes}</table>"
        f"<h2>A/B legs</h2><table><tr>{head}</tr>{legs}</table>"
    )
    style = (
        "body{font:14px system-ui,sans-serif;margin:24px;max-width:1100px}table{border-collapse:collapse}"
        "td,th{border-bottom:1px solid #ddd;padding:4px 8px;text-align:left}"
    )
    return (
        '<!doctype html>\n<html lang="en"><head><meta '
        f'charset="utf-8"><title>{_e(title)}</title><style>{style}</style></head><body>{body}</body></html>\n'
    )


def _e(value: Any) -> str:
    return html.escape("(none)" if value is None else str(value), quote=True)
