"""The request-rate sweep in every report shape, read from its JSON form (``SweepRun.to_dict()``), so that a stored
run renders as the one that just finished: the console table's rows, a Markdown table, an inline SVG plot of
latency against rate for the HTML report, Prometheus families, and the lines `report A B` prints.
"""

from __future__ import annotations

import html
from typing import Any, Mapping, Sequence

__all__ = [
    "SWEEP_HEADERS",
    "compare_lines",
    "knee_line",
    "prometheus_families",
    "sweep_markdown",
    "sweep_rows",
    "sweep_of",
    "sweep_svg",
]

#: The columns of the sweep's table (rows: :func:`sweep_rows`).
SWEEP_HEADERS = (
    "req/s",
    "done/sent",
    "output tok/s",
    "total tok/s",
    "TTFT ms p50/p90/p99",
    "ITL ms p50/p90/p99",
    "TPOT ms p50",
    "E2E ms p50/p90/p99",
    "goodput",
)
#: The plot's series: (metric, percentile, label, colour).
_PLOTTED = (
    ("ttft_ms", "p50", "TTFT p50", "#1f6feb"),
    ("ttft_ms", "p99", "TTFT p99", "#8250df"),
    ("e2e_ms", "p50", "E2E p50", "#1a7f37"),
    ("itl_ms", "p99", "ITL p99", "#9a6700"),
)
_QUANTILES = {"p50": "0.5", "p90": "0.9", "p99": "0.99"}
_WIDTH, _HEIGHT, _LEFT, _RIGHT, _TOP, _BOTTOM = 760, 260, 64, 16, 16, 40


def sweep_of(doc: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The sweep of a run's document: a smoke's last configuration's, or the gate's benchmark stage's.

    >>> sweep_of({"smoke": {"sessions": [{"sweep": {"knee_rate": 4}}]}}), sweep_of({"gate": {}})
    ({'knee_rate': 4}, None)
    """
    smoke = doc.get("smoke")
    gate = doc.get("gate")
    if isinstance(gate, Mapping) and isinstance(gate.get("smoke"), Mapping):
        smoke = gate["smoke"].get("benchmark")
    sessions = smoke.get("sessions") if isinstance(smoke, Mapping) else None
    last = sessions[-1] if isinstance(sessions, list) and sessions else None
    found = last.get("sweep") if isinstance(last, Mapping) else None
    return found if isinstance(found, Mapping) else None


def _rates(sweep: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    rates = (sweep or {}).get("rates")
    return [r for r in rates if isinstance(r, Mapping)] if isinstance(rates, list) else []


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _ms(figures: Any, points: Sequence[str] = ("p50", "p90", "p99")) -> str:
    """``12.0/15.5/20.1``; ``-`` where a figure is missing.

    >>> _ms({"p50": 12, "p90": 15.5, "p99": 20.06}), _ms({"p50": None})
    ('12.0/15.5/20.1', '-')
    """
    values = [_num(figures.get(p)) if isinstance(figures, Mapping) else None for p in points]
    return "-" if any(v is None for v in values) else "/".join(f"{v:.1f}" for v in values if v is not None)


def _goodput(rate: Mapping[str, Any]) -> str:
    good = rate.get("goodput")
    share = _num(good.get("share")) if isinstance(good, Mapping) else None
    return "-" if share is None else f"{share:.1%}"


def sweep_rows(sweep: Mapping[str, Any] | None) -> list[list[str]]:
    """One row per rate, as the console and Markdown tables show it."""
    rows = []
    for rate in _rates(sweep):
        rows.append(
            [
                f"{_num(rate.get('rate')) or 0:g}",
                f"{rate.get('completed')}/{rate.get('requests')}",
                f"{_num(rate.get('output_tok_s')) or 0:.1f}",
                f"{_num(rate.get('total_tok_s')) or 0:.1f}",
                _ms(rate.get("ttft_ms")),
                _ms(rate.get("itl_ms")),
                _ms(rate.get("tpot_ms"), ("p50",)),
                _ms(rate.get("e2e_ms")),
                _goodput(rate),
            ]
        )
    return rows


def knee_line(sweep: Mapping[str, Any] | None) -> str:
    knee = _num((sweep or {}).get("knee_rate"))
    ratio = _num((sweep or {}).get("knee_ratio")) or 1.5
    if knee is None:
        return f"knee: none over the rates measured (median E2E within {ratio:g}x the lowest rate's)"
    return f"knee: {knee:g} req/s (the lowest rate whose median E2E exceeds {ratio:g}x the lowest rate's)"


def sweep_markdown(sweep: Mapping[str, Any] | None, md_text: Any) -> list[str]:
    """The sweep as a Markdown section (``md_text`` escapes a cell); nothing when no sweep ran."""
    rows = sweep_rows(sweep)
    if not rows:
        return []
    out = ["", "### Request-rate sweep", ""]
    out += ["| " + " | ".join(SWEEP_HEADERS) + " |", "|" + "---:|" * len(SWEEP_HEADERS)]
    out += ["| " + " | ".join(md_text(cell) for cell in row) + " |" for row in rows]
    return out + ["", md_text(knee_line(sweep))]


def sweep_svg(sweep: Mapping[str, Any] | None) -> str:
    """Latency (ms) against request rate, one polyline per plotted series, the knee marked; no script, no network."""
    rates = [(r, rate) for rate in _rates(sweep) if (r := _num(rate.get("rate"))) is not None]
    points = {
        (metric, p): [(r, v) for r, rate in rates if (v := _num((rate.get(metric) or {}).get(p))) is not None]
        for metric, p, _, _ in _PLOTTED
    }
    values = [v for series in points.values() for _, v in series]
    if not rates or not values:
        return '<p class="muted">No request-rate sweep in this run.</p>'
    low_x, high_x = min(r for r, _ in rates), max(r for r, _ in rates)
    high_y = max(values) * 1.1 or 1.0
    span_x = (high_x - low_x) or 1.0

    def x(rate: float) -> float:
        middle = (_LEFT + _WIDTH - _RIGHT) / 2
        return middle if high_x == low_x else _LEFT + (rate - low_x) / span_x * (_WIDTH - _LEFT - _RIGHT)

    def y(value: float) -> float:
        return _TOP + (high_y - value) / high_y * (_HEIGHT - _TOP - _BOTTOM)

    out = [
        f'<svg id="sweep-chart" viewBox="0 0 {_WIDTH} {_HEIGHT}" width="{_WIDTH}" height="{_HEIGHT}" role="img" '
        'aria-label="latency against request rate">',
        f'<line x1="{_LEFT}" x2="{_LEFT}" y1="{_TOP}" y2="{_HEIGHT - _BOTTOM}" stroke="#d0d7de"/>',
        f'<line x1="{_LEFT}" x2="{_WIDTH - _RIGHT}" y1="{_HEIGHT - _BOTTOM}" y2="{_HEIGHT - _BOTTOM}" '
        'stroke="#d0d7de"/>',
    ]
    for i in range(5):
        value = high_y * i / 4
        out.append(f'<text x="{_LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end">{value:.0f}</text>')
    for r, _ in rates:
        out.append(f'<text x="{x(r):.1f}" y="{_HEIGHT - _BOTTOM + 16}" text-anchor="middle">{r:g}</text>')
    out.append(
        f'<text x="{(_LEFT + _WIDTH - _RIGHT) / 2:.0f}" y="{_HEIGHT - 6}" text-anchor="middle">requests per second '
        "(latency in ms)</text>"
    )
    knee = _num((sweep or {}).get("knee_rate"))
    if knee is not None:
        out.append(
            f'<line class="knee" x1="{x(knee):.1f}" x2="{x(knee):.1f}" y1="{_TOP}" y2="{_HEIGHT - _BOTTOM}" '
            f'stroke="#cf222e" stroke-dasharray="6 4"/><text x="{x(knee) + 4:.1f}" y="{_TOP + 10}">knee {knee:g}</text>'
        )
    for metric, p, label, colour in _PLOTTED:
        series = points[(metric, p)]
        if not series:
            continue
        path = " ".join(f"{x(r):.1f},{y(v):.1f}" for r, v in series)
        out.append(
            f'<polyline class="series" data-series="{metric}.{p}" fill="none" stroke="{colour}" stroke-width="2" '
            f'points="{path}"/>'
        )
        out += [
            f'<circle data-series="{metric}.{p}" data-rate="{r:g}" data-value="{v:.3f}" cx="{x(r):.1f}" '
            f'cy="{y(v):.1f}" r="3" fill="{colour}"><title>{html.escape(label)} at {r:g} req/s: {v:.1f} ms</title>'
            "</circle>"
            for r, v in series
        ]
    out.append("</svg>")
    legend = "".join(f'<span style="color:{colour}">■ {html.escape(label)}</span>' for _, _, label, colour in _PLOTTED)
    return "\n".join(out) + f'\n<p class="legend muted">{legend}</p>'


def prometheus_families(
    sweep: Mapping[str, Any] | None, base: Mapping[str, str]
) -> list[tuple[str, str, list[tuple[dict[str, str], float]]]]:
    """Per-rate gauges: latency quantiles in seconds (label ``quantile``), throughputs, failures, goodput, the knee."""
    rates = _rates(sweep)
    latency = []
    for metric, name in (("ttft_ms", "ttft"), ("itl_ms", "itl"), ("tpot_ms", "tpot"), ("e2e_ms", "e2e")):
        samples = [
            ({**base, "rate": f"{_num(rate.get('rate')) or 0:g}", "quantile": _QUANTILES[p]}, v / 1000)
            for rate in rates
            for p in ("p50", "p90", "p99")
            if (v := _num((rate.get(metric) or {}).get(p))) is not None
        ]
        latency.append(
            (
                f"stackgate_sweep_{name}_seconds",
                f"{name.upper()} of the last sweep at each request rate, by quantile.",
                samples,
            )
        )
    plain = []
    for key, name, text in (
        ("output_tok_s", "stackgate_sweep_output_tokens_per_second", "Output tokens per second at each rate."),
        ("total_tok_s", "stackgate_sweep_total_tokens_per_second", "Input and output tokens per second at each rate."),
        ("failed", "stackgate_sweep_failed_requests", "Requests that failed at each rate."),
    ):
        plain.append((name, text, _per_rate(rates, base, lambda rate, key=key: _num(rate.get(key)))))
    plain.append(
        (
            "stackgate_sweep_goodput_ratio",
            "Share of requests sent within every SLO objective at each rate.",
            _per_rate(rates, base, lambda rate: _num((rate.get("goodput") or {}).get("share"))),
        )
    )
    knee = _num((sweep or {}).get("knee_rate"))
    plain.append(
        (
            "stackgate_sweep_knee_requests_per_second",
            "The lowest rate whose median E2E latency exceeds the lowest rate's by knee_ratio.",
            [(dict(base), knee)] if knee is not None else [],
        )
    )
    return latency + plain


def _per_rate(
    rates: Sequence[Mapping[str, Any]], base: Mapping[str, str], pick: Any
) -> list[tuple[dict[str, str], float]]:
    return [
        ({**base, "rate": f"{_num(rate.get('rate')) or 0:g}"}, value)
        for rate in rates
        if (value := pick(rate)) is not None
    ]


def compare_lines(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> list[str]:
    """`report A B`: each rate both sweeps measured, A -> B: TTFT p50/p99, ITL p99, E2E p50, output tok/s, goodput."""
    if not _rates(old) and not _rates(new):
        return []
    a = {_num(r.get("rate")): r for r in _rates(old)}
    b = {_num(r.get("rate")): r for r in _rates(new)}
    shared = sorted(r for r in a if r is not None and r in b)
    if not shared:
        return [
            f"sweep: no rate measured by both runs (A: {_list(a)}; B: {_list(b)} req/s)",
        ]
    out = [f"sweep (A -> B) at {len(shared)} shared rate(s):"]
    for rate in shared:
        parts = [
            _change(label, _num((a[rate].get(metric) or {}).get(p)), _num((b[rate].get(metric) or {}).get(p)), "ms")
            for metric, p, label in (
                ("ttft_ms", "p50", "TTFT p50"),
                ("ttft_ms", "p99", "TTFT p99"),
                ("itl_ms", "p99", "ITL p99"),
                ("e2e_ms", "p50", "E2E p50"),
            )
        ]
        parts.append(_change("output", _num(a[rate].get("output_tok_s")), _num(b[rate].get("output_tok_s")), "tok/s"))
        if a[rate].get("goodput") or b[rate].get("goodput"):
            parts.append(f"goodput {_goodput(a[rate])} -> {_goodput(b[rate])}")
        out.append(f"  {rate:g} req/s: " + "; ".join(parts))
    out.append(f"  knee: {_knee(old)} -> {_knee(new)}")
    return out


def _list(rates: Mapping[float | None, Any]) -> str:
    return ",".join(f"{r:g}" for r in sorted(r for r in rates if r is not None)) or "none"


def _knee(sweep: Mapping[str, Any] | None) -> str:
    knee = _num((sweep or {}).get("knee_rate"))
    return "none" if knee is None else f"{knee:g} req/s"


def _change(label: str, old: float | None, new: float | None, unit: str) -> str:
    """``TTFT p50 40.0 -> 44.0 ms (+10.0%)``.

    >>> _change("TTFT p50", 40.0, 44.0, "ms"), _change("E2E p50", None, 3.0, "ms")
    ('TTFT p50 40.0 -> 44.0 ms (+10.0%)', 'E2E p50 - -> 3.0 ms')
    """
    shown = f"{label} {'-' if old is None else f'{old:.1f}'} -> {'-' if new is None else f'{new:.1f}'} {unit}"
    return shown + (f" ({new / old - 1:+.1%})" if old and new is not None else "")
