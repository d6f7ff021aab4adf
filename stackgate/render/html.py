"""One self-contained HTML page for a run or for the history: inline CSS and an inline SVG chart,
nothing fetched from anywhere (the page opens from a CI artifact, offline, as it is).

The page holds the tok/s chart over the runs of the lock (tok/s, decode tok/s, the baseline
and its floor), the runs, and for the run in focus its stages, the benchmark runs, every check
with its fix, and what changed since the run before it.
"""

from __future__ import annotations

import datetime as _dt
import html
import math
from typing import Any, Mapping, Sequence

from stackgate.render.sweeptables import SWEEP_HEADERS, knee_line, sweep_of, sweep_rows, sweep_svg
from stackgate.runs import rundiff
from stackgate.runs.history import Run

__all__ = ["CHART_ID", "page"]

CHART_ID = "tok-chart"
WIDTH, HEIGHT = 760, 260
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 16, 40
SERIES = (("tok_s", "tok/s", "#1f6feb"), ("decode_tok_s", "decode tok/s", "#1a7f37"))
CSS = (
    "\n"
    'body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; '
    "margin: 24px; color: #1f2328; max-width: 1100px; }\n"
    "h1 { font-size: 22px; margin: 0 0 4px; } "
    "h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid #d0d7de; padding-bottom: 4px; }\n"
    ".muted { color: #59636e; } code { font: 12px ui-monospace, SFMono-Regular, Menlo, monospace; }\n"
    "table { border-collapse: collapse; width: 100%; margin: 6px 0; } "
    "th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #eaeef2; vertical-align: top; }\n"
    "th { background: #f6f8fa; } td.num { text-align: right; font-variant-numeric: tabular-nums; }\n"
    ".PASS, .passed { color: #1a7f37; } .WARN { color: #9a6700; } "
    ".FAIL, .ERROR, .failed, .interrupted { color: #cf222e; font-weight: 600; } "
    ".SKIP, .not-run { color: #59636e; }\n"
    "tr.focus td { background: #fff8c5; } .verdict { font-size: 18px; font-weight: 700; }\n"
    ".fix { margin-top: 4px; } "
    "pre { background: #f6f8fa; padding: 6px 8px; margin: 4px 0; white-space: pre-wrap; }\n"
    "svg text { font: 11px system-ui, sans-serif; fill: #59636e; } .legend span { margin-right: 16px; }\n"
)


def page(runs: Sequence[Run], focus: Run | None, *, title: str, source: str, warnings: Sequence[str] = ()) -> str:
    """The page: the chart and table of ``runs`` (oldest first), the details of ``focus``."""
    parts = [f"<h1>{_e(title)}</h1>", f'<p class="muted">{_e(source)} · generated {_e(_now())} by stackgate</p>']
    parts += [f'<p class="WARN">{_e(w)}</p>' for w in warnings]
    parts += ["<h2>tok/s over runs</h2>", chart(runs, focus), _legend(runs)]
    parts += ["<h2>Runs</h2>", _runs_table(runs, focus)]
    if focus is not None:
        parts += _focus(focus, _previous(runs, focus))
    body = "\n".join(parts)
    return (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta '
        f'charset="utf-8">\n<title>{_e(title)}</title>\n<style>{CSS}</style>\n</head>\n'
        f"<body>\n{body}\n</body>\n</html>\n"
    )


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _finite(value: Any) -> float | None:
    """A figure of a run (read back from a document: checked again here), or None."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if number else None


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _previous(runs: Sequence[Run], focus: Run) -> Run | None:
    """What the run in focus is compared with: the last good run of its lock before it (one with
    a benchmark if there is one), else simply the run before it."""
    earlier = [r for r in runs if (r.started, r.id) < (focus.started, focus.id) and r.lock_name == focus.lock_name]
    good = [r for r in earlier if r.verdict == "passed"]
    measured = [r for r in good if r.decode_tok_s is not None]
    return (measured or good or earlier)[-1] if earlier else None


# --- the chart ----------------------------------------------------------------------------------


def chart(runs: Sequence[Run], focus: Run | None) -> str:
    """An SVG line chart: one point per run and figure, with the run's id and value on it."""
    values = [v for r in runs for name, _, _ in SERIES if (v := r.figure(name)) is not None]
    baseline = next((b for r in reversed(runs) if (b := _finite((r.benchmark or {}).get("baseline_tok_s")))), None)
    floor = next((f for r in reversed(runs) if (f := _finite((r.benchmark or {}).get("floor_tok_s")))), None)
    if not values:
        return (
            f'<svg id="{CHART_ID}" width="{WIDTH}" height="60" role="img" aria-label="no benchmark figures"><text '
            'x="8" y="30">No run with a benchmark of the real weights yet.</text></svg>'
        )
    low, high = _bounds([*values, *(v for v in (baseline, floor) if v is not None)])
    x, y = _scale_x(len(runs)), _scale_y(low, high)
    out = [
        f'<svg id="{CHART_ID}" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
        'aria-label="tok/s over runs">'
    ]
    out += _axes(low, high, y, runs, x)
    for value, name, dash in ((baseline, "baseline", "6 4"), (floor, "floor", "2 3")):
        if value is not None:
            out.append(
                f'<line class="{name}" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
                f'stroke="#cf222e" stroke-dasharray="{dash}"/>'
            )
            out.append(
                f'<text x="{WIDTH - RIGHT - 4}" y="{y(value) - 4:.1f}" text-anchor="end">{name} {value:g}</text>'
            )
    for name, label, colour in SERIES:
        out += _series(runs, name, label, colour, x, y, focus)
    out.append("</svg>")
    return "\n".join(out)


def _bounds(values: Sequence[float]) -> tuple[float, float]:
    low, high = min(values), max(values)
    pad = (high - low) * 0.1 or max(abs(high) * 0.05, 1.0)
    return max(0.0, low - pad), high + pad


def _scale_x(count: int) -> Any:
    span = WIDTH - LEFT - RIGHT
    return lambda i: LEFT + (span / 2 if count == 1 else i * span / (count - 1))


def _scale_y(low: float, high: float) -> Any:
    return lambda value: TOP + (high - value) / (high - low) * (HEIGHT - TOP - BOTTOM)


def _axes(low: float, high: float, y: Any, runs: Sequence[Run], x: Any) -> list[str]:
    out = [
        f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{HEIGHT - BOTTOM}" stroke="#d0d7de"/>',
        f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{HEIGHT - BOTTOM}" y2="{HEIGHT - BOTTOM}" stroke="#d0d7de"/>',
    ]
    for i in range(5):
        value = low + (high - low) * i / 4
        out.append(f'<text x="{LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end">{value:.1f}</text>')
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(value):.1f}" y2="{y(value):.1f}" stroke="#eaeef2"/>')
    for i in sorted({0, len(runs) - 1}):
        out.append(
            f'<text x="{x(i):.1f}" y="{HEIGHT - BOTTOM + 16}" '
            f'text-anchor="{"start" if i == 0 and len(runs) > 1 else "end" if i else "middle"}">'
            f"{_e(runs[i].started[:16])}</text>"
        )
    out.append(
        f'<text x="{(LEFT + WIDTH - RIGHT) / 2:.0f}" y="{HEIGHT - 6}" text-anchor="middle">{len(runs)} run(s), oldest '
        "first</text>"
    )
    return out


def _series(runs: Sequence[Run], name: str, label: str, colour: str, x: Any, y: Any, focus: Run | None) -> list[str]:
    points = [(i, r, v) for i, r in enumerate(runs) if (v := r.figure(name)) is not None]
    if not points:
        return []
    path = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, _, v in points)
    out = [
        f'<polyline class="series" data-series="{name}" fill="none" stroke="{colour}" stroke-width="2" '
        f'points="{path}"/>'
    ]
    for i, run, value in points:
        focused = focus is not None and run.id == focus.id
        out.append(
            f'<circle class="point{" focus" if focused else ""}" data-series="{name}" data-run="{_e(run.id)}" '
            f'data-value="{value:.3f}" '
            f'cx="{x(i):.1f}" cy="{y(value):.1f}" r="{6 if focused else 4}" fill="{colour}"><title>{_e(run.id)}: '
            f"{value:.2f} {label} ({_e(run.verdict)})</title></circle>"
        )
    return out


def _legend(runs: Sequence[Run]) -> str:
    spans = [f'<span style="color:{colour}">■ {label}</span>' for _, label, colour in SERIES]
    spans.append('<span style="color:#cf222e">- - baseline and floor (baseline × (1 - max_regression))</span>')
    return f'<p class="legend muted">{"".join(spans)}</p>'


# --- the tables ---------------------------------------------------------------------------------


def _runs_table(runs: Sequence[Run], focus: Run | None) -> str:
    rows = [
        "<table><thead><tr><th>run</th><th>started</th><th>command</th><th>lock</th><th>verdict</th>"
        "<th>tok/s</th><th>decode tok/s</th><th>fingerprint</th></tr></thead><tbody>"
    ]
    for run in reversed(runs):
        focused = ' class="focus"' if focus is not None and run.id == focus.id else ""
        finger = (run.fingerprint or {}).get("short", "")
        rows.append(
            f"<tr{focused}><td><code>{_e(run.id)}</code></td><td>{_e(run.started)}</td>"
            f"<td>{_e(run.command)}</td><td>{_e(run.lock_name)}</td>"
            f'<td class="{_e(run.verdict.replace(" ", "-"))}">{_e(run.verdict)}</td><td '
            f'class="num">{_num(run.figure("tok_s"))}</td>'
            f'<td class="num">{_num(run.decode_tok_s)}</td><td><code>{_e(finger)}</code></td></tr>'
        )
    rows.append("</tbody></table>")
    return "\n".join(rows)


def _num(value: Any, spec: str = ".2f") -> str:
    """A figure as the page shows it; "-" for none (or for anything that is no finite number)."""
    number = _finite(value)
    return "-" if number is None else format(number, spec)


def _focus(run: Run, previous: Run | None) -> list[str]:
    doc = run.doc
    out = [
        f"<h2>Run <code>{_e(run.id)}</code></h2>",
        f'<p class="verdict {_e(run.verdict)}">{_e(run.verdict.upper())}: {_e(doc.get("reason", ""))}</p>',
    ]
    out.append(
        f'<p class="muted">{_e(run.command)} of {_e(run.lock_name)} on {_e(run.host)}, started {_e(run.started)}, '
        f"{_num(doc.get('duration_s'), '.1f')} s</p>"
    )
    stages = (doc.get("gate") or {}).get("stages") if isinstance(doc.get("gate"), Mapping) else None
    if isinstance(stages, list):
        out += ["<h3>Stages</h3>", _stages_table(stages)]
    out += ["<h3>Benchmark runs (real weights)</h3>", _bench_table(run.benchmark)]
    sweep = sweep_of(doc)
    if sweep is not None:
        out += ["<h3>Latency against request rate</h3>", sweep_svg(sweep), _sweep_table(sweep)]
    out += ["<h3>Checks</h3>", _checks_table(run.results)]
    if previous is not None:
        good = " the last good run" if previous.verdict == "passed" else ""
        out += [
            f"<h3>Changes since{good} <code>{_e(previous.id)}</code></h3>",
            _changes(rundiff.compare(previous, run)),
        ]
    return out


def _sweep_table(sweep: Mapping[str, Any]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in SWEEP_HEADERS)
    rows = [f"<table><thead><tr>{head}</tr></thead><tbody>"]
    for row in sweep_rows(sweep):
        rows.append("<tr>" + "".join(f'<td class="num">{_e(cell)}</td>' for cell in row) + "</tr>")
    rows.append(f'</tbody></table><p class="muted">{_e(knee_line(sweep))}</p>')
    return "".join(rows)


def _stages_table(stages: Sequence[Any]) -> str:
    rows = ["<table><thead><tr><th>stage</th><th>status</th><th>seconds</th><th>reason</th></tr></thead><tbody>"]
    for stage in stages:
        if isinstance(stage, Mapping):
            status = str(stage.get("status"))
            rows.append(
                f'<tr><td>{_e(stage.get("name"))}</td><td class="{_e(status.replace(" ", "-"))}">{_e(status)}</td>'
                f'<td class="num">{_num(stage.get("duration_s"), ".1f")}</td><td>{_e(stage.get("reason"))}</td></tr>'
            )
    rows.append("</tbody></table>")
    return "\n".join(rows)


def _bench_table(bench: Mapping[str, Any] | None) -> str:
    runs = bench.get("runs") if bench else None
    if not bench or not isinstance(runs, list) or not runs:
        return '<p class="muted">No benchmark of the real weights in this run.</p>'
    rows = [
        "<table><thead><tr><th>run</th><th>tokens</th><th>seconds</th><th>tok/s</th><th>TTFT ms</th><th>decode "
        "tok/s</th></tr></thead><tbody>"
    ]
    for i, row in enumerate(r for r in runs if isinstance(r, Mapping)):
        ttft = _finite(row.get("ttft_s"))
        cells = [
            _num(row.get("tokens"), "g"),
            _num(row.get("seconds")),
            _num(row.get("tok_s")),
            _num(None if ttft is None else ttft * 1000, ".0f"),
            _num(row.get("decode_tok_s")),
        ]
        rows.append(f"<tr><td>{i + 1}</td>" + "".join(f'<td class="num">{_e(c)}</td>' for c in cells) + "</tr>")
    rows.append("</tbody></table>")
    baseline = _finite(bench.get("baseline_tok_s"))
    note = (
        f'<p class="muted">baseline {_num(baseline, "g")} tok/s, floor {_num(bench.get("floor_tok_s"))}: '
        f"{_e(bench.get('summary') or '')}</p>"
        if baseline
        else ""
    )
    return "\n".join(rows) + note


def _checks_table(results: Sequence[Mapping[str, Any]]) -> str:
    rows = ["<table><thead><tr><th>stage</th><th>check</th><th>status</th><th>result</th></tr></thead><tbody>"]
    for result in results:
        status = str(result.get("status"))
        body = _e(result.get("summary", ""))
        if status in ("WARN", "FAIL", "ERROR"):
            body += "".join(f'<br><span class="muted">{_e(d)}</span>' for d in list(result.get("details") or ())[:8])
            fix = result.get("fix")
            if isinstance(fix, Mapping):
                commands = "\n".join(str(c) for c in fix.get("commands") or ())
                body += (
                    f'<div class="fix">fix: {_e(fix.get("text", ""))}'
                    + (f"<pre>{_e(commands)}</pre>" if commands else "")
                    + "</div>"
                )
        rows.append(
            f"<tr><td>{_e(result.get('stage', ''))}</td><td><code>{_e(result.get('check'))}</code></td><td "
            f'class="{_e(status)}">{_e(status)}</td><td>{body}</td></tr>'
        )
    rows.append("</tbody></table>")
    return "\n".join(rows)


def _changes(comparison: rundiff.Comparison) -> str:
    figures = [s.text() for s in comparison.speed] + [f.text() for f in comparison.figures]
    out = ["<ul>"] + [f"<li>{_e(text)}</li>" for text in figures] + ["</ul>"]
    if comparison.same_stack:
        out.append(f"<p>The stack is the same ({_e(', '.join(comparison.sections) or 'nothing to compare')}).</p>")
    else:
        out.append(
            "<table><thead><tr><th>section</th><th>component</th><th>before</th><th>after</th></tr></thead><tbody>"
        )
        out += [
            f"<tr><td>{_e(c.section)}</td><td><code>{_e(c.name)}</code></td>"
            f"<td>{_e(c.old or '(none)')}</td><td>{_e(c.new or '(none)')}</td></tr>"
            for c in comparison.changes[:200]
        ]
        out.append("</tbody></table>")
    return "\n".join(out)
