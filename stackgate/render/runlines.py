"""The console lines of `stackgate report`: the list of kept runs with their trends, one run, its
findings, two runs compared, and the hosts that regressed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from stackgate.render import summaries
from stackgate.render.sweeptables import compare_lines, sweep_of
from stackgate.render.ui import UI
from stackgate.runs import catalog, history

if TYPE_CHECKING:
    from pathlib import Path

    from stackgate.runs import rundiff

__all__ = ["list_runs", "show_comparison", "show_findings", "show_regressions", "show_run", "trend_line"]

#: The trend shows at most this many of the newest runs.
TREND = catalog.TREND


def show_regressions(found: Sequence[catalog.Regression], nodes: int, since: str, threshold_pct: float, ui: UI) -> None:
    rule = f"decode tok/s more than {threshold_pct:g}% below the node's previous measured run, or passed -> failed"
    regressed = list(dict.fromkeys(r.node for r in found))
    ui.line(f"{len(regressed)} of {nodes} node(s) with runs since {since} regressed ({rule})")
    for item in found:
        ui.line(
            f"{item.node}: {item.run.id} ({item.run.kind} of {item.run.spec}): {'; '.join(item.reasons)}; "
            f"against {item.against.id}"
        )
        prints = (
            f"fingerprint {item.against.short} -> {item.run.short}"
            if item.against.short and item.run.short
            else "fingerprints not both recorded"
        )
        if item.run.fingerprint and item.run.fingerprint == item.against.fingerprint:
            ui.line(f"  nothing changed in the stack (fingerprint {item.run.short}): look at the node itself")
        elif not item.changes:
            ui.line(f"  no difference in what both runs recorded ({', '.join(item.compared) or 'nothing'}; {prints})")
        else:
            ui.line(f"  what changed ({len(item.changes)} component(s), {prints}):")
            for change in item.changes[:30]:
                ui.line(f"    {change.section}: {change}")


def list_runs(listing: catalog.Listing, directory: Path, ui: UI) -> None:
    for skipped in listing.skipped:
        ui.warn(f"warning: {skipped.reason}")
    if not listing.rows:
        ui.line(f"no runs kept in {directory} yet: `stackgate gate` and `stackgate smoke` keep theirs there")
        return
    rows = [
        [r.id, r.command, r.spec, r.verdict, _num(r.decode_tok_s), _num(r.tok_s), r.short or ""] for r in listing.rows
    ]
    shown = (
        f"{listing.total} run(s)" if len(rows) == listing.total else f"the last {len(rows)} of {listing.total} run(s)"
    )
    ui.table(
        f"{shown} in {directory}, oldest first",
        ["run", "command", "lock", "verdict", "decode tok/s", "tok/s", "fingerprint"],
        rows,
        align="llllrrl",
    )
    for spec, values in listing.trends:
        ui.line(trend_line(spec, values, unicode=ui.unicode))


def trend_line(spec: str, values: Sequence[float | None], *, unicode: bool) -> str:
    """``trend standin (decode tok/s, last 5 runs): ▁▃█ ▅  197.31 -> 148.02``"""
    recent = list(values)[-TREND:]
    measured = [v for v in recent if v is not None]
    if not measured:
        return f"trend {spec}: no run with a benchmark of the real weights yet"
    spark = history.sparkline(recent, unicode=unicode)
    arrow = "→" if unicode else "->"
    return (
        f"trend {spec} (decode tok/s, last {len(recent)} run(s)): {spark}  {measured[0]:.2f} {arrow} "
        f"{measured[-1]:.2f} (min {min(measured):.2f}, max {max(measured):.2f})"
    )


def _num(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def show_run(run: history.Run, ui: UI) -> None:
    ui.line(f"run {run.label()}")
    ui.line(f"  started {run.started} on {run.host}; {run.doc.get('reason', '')}")
    stages = (run.doc.get("gate") or {}).get("stages") or []
    if stages:
        ui.table(
            "stages",
            ["stage", "status", "seconds", "reason"],
            [
                [str(s.get("name")), str(s.get("status")), _num(s.get("duration_s"), ".1f"), str(s.get("reason"))]
                for s in stages
            ],
            align="llrl",
        )
    bad = [r for r in run.results if r.get("status") in ("FAIL", "ERROR", "WARN")]
    for result in bad:
        where = f"{result.get('stage', run.command)} {result.get('check')}"
        ui.line(f"  {result['status']:<5} {where}: {result.get('summary')}")
        fix = result.get("fix") or {}
        if fix:
            ui.line(f"        fix: {fix.get('text', '')}")
            for command in fix.get("commands", ()):
                ui.line(f"        $ {command}")
    show_findings(run, ui)
    if run.command == "gate":
        ui.line(summaries.benchmark_line(run.benchmark))
    elif run.benchmark is not None:
        ui.line(f"decode {_num(run.decode_tok_s)} tok/s; {_num(run.figure('tok_s'))} tok/s")
    finger = run.fingerprint
    if finger:
        ui.line(f"fingerprint {finger.get('short')} ({', '.join(finger['components'])})")
    ui.line(f"file: {run.path}")


def show_findings(run: history.Run, ui: UI) -> None:
    """The known failures the run's server logs showed, one line each, most severe first."""
    from stackgate.models import knowledge  # its patterns load at import: not for a listing

    findings, unreadable = run.findings()
    if findings:
        ui.line(f"known failures in the server logs ({len(findings)}):")
    for finding in sorted(findings, key=knowledge.rank):
        seen = f", {finding.evidence.count} times" if finding.evidence.count > 1 else ""
        ui.line(f"  {finding.severity.upper():<7} {finding.id}: {finding.title} ({finding.evidence.where}{seen})")
    for problem in unreadable:
        ui.warn(f"warning: a finding of run {run.id} cannot be read: {problem}")


def show_comparison(comparison: rundiff.Comparison, ui: UI) -> None:
    old, new = comparison.old, comparison.new
    ui.line(f"A: {old.label()}, started {old.started}")
    ui.line(f"B: {new.label()}, started {new.started}")
    for speed in comparison.speed:
        ui.line(speed.text())
    for figure in comparison.figures:
        ui.line(figure.text())
    for line in compare_lines(sweep_of(old.doc), sweep_of(new.doc)):
        ui.line(line)
    a, b = (old.fingerprint or {}).get("short"), (new.fingerprint or {}).get("short")
    prints = f"; fingerprint {a} -> {b}" if a and b else ""
    if comparison.same_stack:
        ui.line(
            f"the stack is the same in what both runs recorded ({', '.join(comparison.sections) or 'nothing'}){prints}"
        )
    else:
        ui.line(f"what changed from A to B ({len(comparison.changes)} component(s){prints}):")
        section = None
        for change in comparison.changes:
            if change.section != section:
                section = change.section
                ui.line(f"  {section}:")
            ui.line(f"    {change}")
    missing = [s for s in ("gpu", "toolkits", "distributions", "patches") if s not in comparison.sections]
    if missing and comparison.sections:
        smoke = "smoke" in (old.command, new.command)
        ui.line(
            f"  (not compared: {', '.join(missing)}: "
            f"{'a smoke run records only its lock and its server' if smoke else 'not recorded by both runs'})"
        )
    if comparison.statuses:
        ui.line(f"checks whose status changed ({len(comparison.statuses)}):")
        for status in comparison.statuses[:30]:
            ui.line(f"  {status}")
