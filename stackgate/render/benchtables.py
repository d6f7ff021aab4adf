"""The smoke run's tables for the console: a benchmark's runs and statistics, a concurrency sweep."""

from __future__ import annotations

from typing import Mapping, Sequence

from stackgate.serve import bench

__all__ = ["BENCHMARK_HEADERS", "CONCURRENCY_HEADERS", "benchmark_rows", "concurrency_rows", "latency_ms"]


#: The columns of a benchmark table (rows: :func:`benchmark_rows`).
BENCHMARK_HEADERS = ("run", "tokens", "seconds", "tok/s", "TTFT ms", "decode tok/s")


#: The columns of a concurrency table (rows: :func:`concurrency_rows`).
CONCURRENCY_HEADERS = (
    "streams",
    "aggregate tok/s",
    "per-stream tok/s",
    "TTFT ms p50/p90/p99",
    "ITL ms p50/p90/p99",
    "failed",
)


def benchmark_rows(figures: bench.BenchFigures) -> list[list[str]]:
    """Each run, then mean, median, min, max, stdev, CV and the 95% interval."""
    rows = []
    for i, sample in enumerate(figures.runs):
        first = f"{sample.ttft_s * 1000:.0f}" if sample.ttft_s is not None else "-"
        rate = f"{sample.decode_tok_s:.2f}" if sample.decode_tok_s is not None else "-"
        mark = " short" if sample.short else " error" if sample.error else ""
        rows.append([f"{i + 1}{mark}", str(sample.tokens), f"{sample.seconds:.3f}", f"{sample.tok_s:.2f}", first, rate])
    tok, ttft, decode = figures.tok_s, figures.ttft_s, figures.decode_tok_s
    if tok is None:
        return rows
    for name, pick in (
        ("mean", lambda s: s.mean),
        ("median", lambda s: s.median),
        ("min", lambda s: s.min),
        ("max", lambda s: s.max),
    ):
        rows.append(
            [
                name,
                "",
                "",
                f"{pick(tok):.2f}",
                f"{pick(ttft) * 1000:.0f}" if ttft else "-",
                f"{pick(decode):.2f}" if decode else "-",
            ]
        )
    rows.append(["stdev", "", "", f"{tok.stdev:.2f}", "", f"{decode.stdev:.2f}" if decode else "-"])
    rows.append(["CV", "", "", f"{tok.cv:.2%}", "", f"{decode.cv:.2%}" if decode else "-"])
    rows.append(["95% CI", "", "", tok.interval(), "", decode.interval() if decode else "-"])
    return rows


def concurrency_rows(levels: Sequence[bench.Level]) -> list[list[str]]:
    """Per level: throughput, then the latencies operators read (TTFT and inter-token, in ms)."""
    rows = []
    for level in levels:
        per = level.per_stream
        rows.append(
            [
                str(level.streams),
                f"{level.aggregate_tok_s:.2f}",
                f"{per.mean:.2f}" if per else "-",
                latency_ms(level.ttft_s()),
                latency_ms(level.itl_s()),
                str(level.streams - len(level.good)),
            ]
        )
    return rows


def latency_ms(points: Mapping[str, float | None]) -> str:
    """``12.0/15.5/20.1`` from seconds at p50/p90/p99; ``-`` where nothing was measured.

    >>> latency_ms({"p50": 0.012, "p90": 0.0155, "p99": 0.0201}), latency_ms({"p50": None})
    ('12.0/15.5/20.1', '-')
    """
    if any(v is None for v in points.values()):
        return "-"
    return "/".join(f"{1000 * v:.1f}" for v in points.values() if v is not None)
