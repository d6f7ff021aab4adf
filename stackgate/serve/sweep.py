"""The request-rate sweep: open-loop arrivals at each rate, latency percentiles, the knee, goodput.

At each rate (requests per second) the client sends the batch's prompts at arrival times drawn
with the spec's seed: exponential gaps (a Poisson process; the first request at once, as SGLang's
bench_serving sends it) or equal gaps of 1/rate. Each request streams through the engine's own
streaming API (:func:`stackgate.serve.bench.generate`, so SGLang's /generate and vLLM's
/v1/completions alike) on a thread of its own, so a slow server never slows the arrivals.

The figures follow ``sglang.benchmark.serving.calculate_metrics`` (0.5.23), over the requests
that completed: TTFT (send to first token), TPOT ((latency - TTFT) / (output tokens - 1)),
end-to-end latency, ITL, output throughput (output tokens over the rate's duration, first send to
last response) and total throughput (input and output tokens over the same). Percentiles are
numpy's linear interpolation, as there. Where they differ:

- ITL: an event that carries several tokens (speculative decoding) has its gap split evenly over
  them, as bench_serving does only for its retokenized ITL; its default ITL takes each chunk's
  gap whole, which makes a burst of k tokens look like one slow token. One token per event (no
  speculation): the same figures.
- Failed requests count as sent and not good; bench_serving's ``completed`` leaves them out of
  the throughputs too, as here.
- Goodput's ITL objective (``itl_ms``) is judged on the request's TPOT, as bench_serving's
  ``tpot`` SLO is: one stalled gap does not fail a request, a slow stream does.
- Input tokens are the server's own count (``prompt_tokens``); bench_serving counts its own
  tokenizer's, which stackgate does not load.

The knee is the lowest rate whose median end-to-end latency exceeds the lowest rate's by more
than ``knee_ratio`` (1.5 unless the spec says): where queueing, not decoding, starts to set the
latency. None when latency never turns up over the rates measured.

Goodput at the SLO's rate is the share of requests sent that completed within every objective,
judged as decode is: its 95% (Wilson) interval against ``min_goodput``; while the interval spans
the floor the rate is run again with fresh prompts (pooled), up to ``max_repeats``; still spanning,
the verdict is inconclusive (a WARN, a FAIL with --strict).
"""

from __future__ import annotations

import math
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from stackgate.models.engines import NATIVE_GENERATE
from stackgate.models.finding import Fix
from stackgate.models.result import Result, failed, passed, skipped, warned
from stackgate.models.spec.sweep import Slo, Sweep
from stackgate.serve.bench import PERCENTILES, STREAM_IDLE_S, Sample, Streams, generate, percentile
from stackgate.serve.prompts import Prompt, PromptMaker

__all__ = [
    "METRICS",
    "RateRun",
    "SweepRun",
    "arrivals",
    "goodput_result",
    "knee",
    "run_rate",
    "run_sweep",
    "sweep_lines",
    "sweep_result",
    "wilson",
]

#: The latency figures of each rate, in milliseconds, by their JSON names.
METRICS = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")
_Z95 = 1.96


def arrivals(rate: float, count: int, kind: str, seed: int) -> list[float]:
    """When each of ``count`` requests is due, in seconds after the first (sent at 0).

    >>> arrivals(4.0, 3, "fixed", 1)
    [0.0, 0.25, 0.5]
    >>> a = arrivals(4.0, 2000, "poisson", 2); round(a[-1] / 1999, 2)  # mean gap 1/rate
    0.25
    """
    if kind == "fixed":
        return [i / rate for i in range(count)]
    draw = random.Random(f"{seed}:{rate}")
    due, out = 0.0, []
    for _ in range(count):
        out.append(due)
        due += draw.expovariate(rate)
    return out


@dataclass(frozen=True)
class Sent:
    """One request of a rate: its prompt, when it was due, and what came back."""

    prompt: Prompt
    due_s: float  #: seconds after the rate's start
    late_s: float  #: how much later the client sent it (its own lag)
    sample: Sample

    @property
    def tpot_s(self) -> float | None:
        """(latency - TTFT) / (output tokens - 1), bench_serving's TPOT."""
        s = self.sample
        if s.ttft_s is None or s.tokens < 2:
            return None
        return (s.seconds - s.ttft_s) / (s.tokens - 1)

    def meets(self, slo: Slo) -> bool:
        """Completed, and within every objective the SLO gives."""
        s = self.sample
        if not s.good or s.ttft_s is None:
            return False
        seen = {"ttft_ms": s.ttft_s * 1000, "itl_ms": (self.tpot_s or 0.0) * 1000, "e2e_ms": s.seconds * 1000}
        return all(seen[name] <= limit for name, limit in slo.objectives.items())


@dataclass(frozen=True)
class RateRun:
    """The requests sent at one rate."""

    rate: float
    arrival: str
    sent: tuple[Sent, ...]
    duration_s: float  #: the rate's start to the last response's end

    @property
    def completed(self) -> list[Sent]:
        return [r for r in self.sent if r.sample.good]

    @property
    def failed(self) -> int:
        return len(self.sent) - len(self.completed)

    def values(self, metric: str) -> list[float]:
        """A latency metric's values over the completed requests, in milliseconds."""
        done = self.completed
        if metric == "ttft_ms":
            return [r.sample.ttft_s * 1000 for r in done if r.sample.ttft_s is not None]
        if metric == "itl_ms":
            return [gap * 1000 for r in done for gap in r.sample.gaps]
        if metric == "tpot_ms":
            return [r.tpot_s * 1000 for r in done if r.tpot_s is not None]
        return [r.sample.seconds * 1000 for r in done]

    def figures(self, metric: str) -> dict[str, float | None]:
        """p50, p90, p99 and the mean of a metric (milliseconds)."""
        values = self.values(metric)
        out = {f"p{p}": _round(percentile(values, p)) for p in PERCENTILES}
        out["mean"] = _round(sum(values) / len(values)) if values else None
        return out

    @property
    def output_tokens(self) -> int:
        return sum(r.sample.tokens for r in self.completed)

    @property
    def input_tokens(self) -> int:
        """The server's prompt token counts (the prompt's words where it reported none)."""
        done = self.completed
        return sum(r.sample.prompt_tokens if r.sample.prompt_tokens is not None else r.prompt.words for r in done)

    def throughput(self, tokens: int) -> float:
        return tokens / self.duration_s if self.duration_s > 0 else 0.0

    def good(self, slo: Slo) -> int:
        return sum(1 for r in self.sent if r.meets(slo))

    def to_dict(self, slo: Slo | None = None) -> dict[str, Any]:
        lates = [r.late_s * 1000 for r in self.sent]
        cpu = [r.sample.cpu_s * 1000 for r in self.sent]
        doc: dict[str, Any] = {
            "rate": self.rate,
            "arrival": self.arrival,
            "requests": len(self.sent),
            "completed": len(self.completed),
            "failed": self.failed,
            "duration_s": round(self.duration_s, 4),
            "request_throughput": round(self.throughput(len(self.completed)), 4),
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "output_tok_s": round(self.throughput(self.output_tokens), 3),
            "total_tok_s": round(self.throughput(self.output_tokens + self.input_tokens), 3),
            **{metric: self.figures(metric) for metric in METRICS},
            "client": {
                "cpu_ms_per_request": _round(sum(cpu) / len(cpu)) if cpu else None,
                "late_ms_p99": _round(percentile(lates, 99)),
            },
        }
        if slo is not None:
            good = self.good(slo)
            doc["goodput"] = {
                "good": good,
                "share": round(good / len(self.sent), 4) if self.sent else None,
                "rps": round(self.throughput(good), 4),
            }
        return doc


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def run_rate(
    base_url: str,
    prompts: Sequence[Prompt],
    rate: float,
    sweep: Sweep,
    *,
    streams: Streams,
    api_key: str | None = None,
    idle_s: float = STREAM_IDLE_S,
    api: str = NATIVE_GENERATE,
    stop: Callable[[], bool] = lambda: False,
) -> RateRun:
    """Send ``prompts`` at ``rate`` (the spec's arrivals, bounded by its seconds), each on its own thread."""
    dues = arrivals(rate, len(prompts), sweep.arrival, sweep.seed)
    if sweep.seconds is not None:
        dues = [d for d in dues if d < sweep.seconds]
    results: list[Sample | None] = [None] * len(dues)

    def one(i: int) -> None:
        prompt = prompts[i]
        results[i] = generate(
            base_url, prompt.text, prompt.output_tokens, streams=streams, api_key=api_key, idle_s=idle_s, api=api
        )

    threads = []
    start = time.perf_counter()
    for i, due in enumerate(dues):
        wait = start + due - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        if stop():
            break
        thread = threading.Thread(target=one, args=(i,), name=f"smoke-sweep-{i}", daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    sent = tuple(
        Sent(prompts[i], dues[i], max(0.0, sample.started - start - dues[i]), sample)
        for i, sample in enumerate(results)
        if sample is not None
    )
    end = max((r.sample.ended for r in sent), default=start)
    return RateRun(rate, sweep.arrival, sent, end - start)


def wilson(good: int, n: int) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion ``good / n``.

    >>> [round(v, 4) for v in wilson(45, 50)]
    [0.7864, 0.9565]
    >>> wilson(0, 0)
    (0.0, 1.0)
    """
    if n == 0:
        return 0.0, 1.0
    p = good / n
    z2 = _Z95 * _Z95
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = _Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class SweepRun:
    """Every rate of the sweep, in ascending order, and the repeats of the rate the SLO judges."""

    sweep: Sweep
    rates: tuple[RateRun, ...]
    repeats: tuple[RateRun, ...] = ()  #: further runs of the SLO's rate, pooled with its first
    prompts_wrapped: bool = False  #: the dataset was shorter than the requests sent

    @property
    def knee(self) -> float | None:
        return knee(self.rates, self.sweep.knee_ratio)

    def judged(self) -> list[RateRun]:
        """The SLO's rate: its sweep run and its repeats."""
        slo = self.sweep.slo
        if slo is None:
            return []
        return [r for r in self.rates if r.rate == slo.rate] + list(self.repeats)

    def goodput(self) -> tuple[int, int]:
        """Good requests and requests sent at the SLO's rate, over every run of it."""
        slo = self.sweep.slo
        runs = self.judged()
        if slo is None:
            return 0, 0
        return sum(r.good(slo) for r in runs), sum(len(r.sent) for r in runs)

    def to_dict(self) -> dict[str, Any]:
        slo = self.sweep.slo
        good, n = self.goodput()
        low, high = wilson(good, n)
        return {
            "arrival": self.sweep.arrival,
            "seed": self.sweep.seed,
            "dataset": self.sweep.dataset,
            "prompts_wrapped": self.prompts_wrapped,
            "knee_rate": self.knee,
            "knee_ratio": self.sweep.knee_ratio,
            "rates": [r.to_dict(slo) for r in self.rates],
            "slo": None
            if slo is None
            else {
                "rate": slo.rate,
                "objectives_ms": slo.objectives,
                "min_goodput": slo.min_goodput,
                "good": good,
                "sent": n,
                "goodput": round(good / n, 4) if n else None,
                "ci": [round(low, 4), round(high, 4)],
                "runs": 1 + len(self.repeats) if n else 0,
            },
        }


def knee(rates: Sequence[RateRun], ratio: float) -> float | None:
    """The lowest rate whose median end-to-end latency exceeds the lowest rate's by more than ``ratio``.

    >>> def at(rate, ms):
    ...     s = Sample(1, 1, 0.0, ms / 1000, 0.0, 1, 1)
    ...     return RateRun(rate, "fixed", (Sent(Prompt("p", 1, 1), 0.0, 0.0, s),), 1.0)
    >>> knee([at(1, 100), at(2, 120), at(4, 400)], 1.5), knee([at(1, 100), at(2, 140)], 1.5)
    (4, None)
    """
    ordered = sorted(rates, key=lambda r: r.rate)
    medians = [(r.rate, percentile(r.values("e2e_ms"), 50)) for r in ordered]
    base = next((m for _, m in medians if m is not None), None)
    if base is None:
        return None
    return next((rate for rate, m in medians[1:] if m is not None and m > ratio * base), None)


def run_sweep(
    base_url: str,
    sweep: Sweep,
    rates: Sequence[float],
    maker: PromptMaker,
    *,
    streams: Streams,
    api_key: str | None = None,
    idle_s: float = STREAM_IDLE_S,
    api: str = NATIVE_GENERATE,
    show: Callable[[str], None] = lambda line: None,
    stop: Callable[[], bool] = lambda: False,
    judge: bool = True,
) -> SweepRun:
    """Each rate in ascending order (the SLO's rate among them), then, while goodput's interval at the SLO's
    rate spans the floor, that rate again, up to the SLO's max_repeats (only when ``judge``)."""
    slo = sweep.slo
    chosen = sorted({*rates, *([slo.rate] if slo is not None else [])})
    done: list[RateRun] = []
    batch = 0

    def measure(rate: float, why: str = "") -> RateRun:
        nonlocal batch
        show(f"sweep: {rate:g} requests/s, {sweep.requests} requests ({sweep.arrival} arrivals){why}")
        prompts = maker.batch(batch, sweep.requests)
        batch += 1
        return run_rate(
            base_url, prompts, rate, sweep, streams=streams, api_key=api_key, idle_s=idle_s, api=api, stop=stop
        )

    for rate in chosen:
        if stop():
            break
        done.append(measure(rate))
    run = SweepRun(sweep, tuple(done), (), maker.wrapped)
    while judge and slo is not None and not stop() and len(run.judged()) < slo.max_repeats:
        spans = _spans(run, slo)
        if spans is None or not run.judged():
            break
        run = SweepRun(sweep, run.rates, (*run.repeats, measure(slo.rate, f"; {spans}: once more")), maker.wrapped)
    return run


def _spans(run: SweepRun, slo: Slo) -> str | None:
    """Why goodput cannot be judged yet: its 95% interval spans the floor."""
    good, n = run.goodput()
    low, high = wilson(good, n)
    if n == 0 or not low < slo.min_goodput < high:
        return None
    return f"goodput's 95% interval {low:.1%}-{high:.1%} spans the floor {slo.min_goodput:.1%}"


# --- results -----------------------------------------------------------------------------------


def sweep_lines(run: SweepRun) -> list[str]:
    """One line per rate: throughput, then TTFT, ITL and E2E at p50/p90/p99 (ms)."""

    def three(rate: RateRun, metric: str) -> str:
        f = rate.figures(metric)
        return "/".join("-" if f[f"p{p}"] is None else f"{f[f'p{p}']:.1f}" for p in PERCENTILES)

    lines = []
    for rate in run.rates:
        lines.append(
            f"{rate.rate:g} req/s: {len(rate.completed)}/{len(rate.sent)} completed, "
            f"{rate.throughput(rate.output_tokens):.1f} output tok/s; TTFT p50/p90/p99 {three(rate, 'ttft_ms')} ms, "
            f"ITL {three(rate, 'itl_ms')} ms, E2E {three(rate, 'e2e_ms')} ms"
        )
    knee_rate = run.knee
    lines.append(
        f"knee: {knee_rate:g} req/s (median E2E above {run.sweep.knee_ratio:g}x the lowest rate's)"
        if knee_rate is not None
        else f"knee: none up to {max((r.rate for r in run.rates), default=0):g} req/s (median E2E stays within "
        f"{run.sweep.knee_ratio:g}x the lowest rate's)"
    )
    if run.prompts_wrapped:
        lines.append("the dataset held fewer records than the requests sent: some prompts were sent twice")
    return lines


def sweep_result(run: SweepRun, label: str | None = None) -> Result:
    """The sweep's table as a result: FAIL when a request failed (the server's fault at any rate)."""
    lines = sweep_lines(run)
    data = {"sweep": run.to_dict(), "fast_mode": label is not None}
    broken = [r for r in run.rates if r.failed]
    if broken:
        where = ", ".join(f"{r.failed} at {r.rate:g} req/s" for r in broken)
        return failed(
            f"{sum(r.failed for r in broken)} request(s) of the sweep failed ({where})",
            lines + _errors(broken),
            fix=Fix("Read the server log for the failed requests (an abort, a context length, a crash)."),
            data=data,
        )
    prefix = f"{label}: " if label else ""
    knee = next(line for line in lines if line.startswith("knee: "))
    return passed(f"{prefix}{len(run.rates)} rate(s); {knee}", lines, data=data)


def _errors(broken: Sequence[RateRun]) -> list[str]:
    first = [next(r.sample for r in rate.sent if not r.sample.good) for rate in broken]
    return [
        f"{rate.rate:g} req/s, first failure: {s.error or f'{s.tokens} of {s.asked} tokens'}"
        for rate, s in zip(broken, first, strict=True)
    ]


def goodput_result(run: SweepRun, *, judged: bool = True, strict: bool = False) -> Result:
    """Goodput at the SLO's rate against its floor, with the decode verdict's discipline."""
    slo = run.sweep.slo
    if slo is None:
        return skipped("the spec states no SLO ([smoke.sweep.slo]): goodput is not judged")
    good, n = run.goodput()
    data = run.to_dict()["slo"]
    if n == 0:
        return failed(f"no request was sent at the SLO's rate {slo.rate:g} req/s", data=data)
    low, high = wilson(good, n)
    objectives = ", ".join(f"{k.removesuffix('_ms').upper()} <= {v:g} ms" for k, v in slo.objectives.items())
    what = (
        f"goodput {good / n:.1%} ({good} of {n} requests within {objectives}) at {slo.rate:g} req/s, "
        f"95% CI {low:.1%}-{high:.1%}"
    )
    lines = [what, f"floor {slo.min_goodput:.1%} (min_goodput); {1 + len(run.repeats)} run(s) of that rate"]
    if not judged:
        return passed(f"{what}: measured, not judged (not the spec's configuration)", lines, data=data)
    if low < slo.min_goodput < high:
        make = failed if strict else warned
        return make(
            f"inconclusive: {what} spans the floor {slo.min_goodput:.1%} after {1 + len(run.repeats)} run(s)"
            + ("; --strict fails it" if strict else ""),
            lines,
            fix=Fix(
                "Measure on a quiet machine, or raise [smoke.sweep] requests or [smoke.sweep.slo] max_repeats for a "
                "narrower interval."
            ),
            data=data,
        )
    if good / n < slo.min_goodput:
        return failed(
            f"{what}: below the floor {slo.min_goodput:.1%}",
            lines,
            fix=Fix(
                "Serve the rate with more capacity (TP, replicas) or relax the objectives; the sweep's knee shows "
                "where latency turns up: stackgate smoke --benchmark --rates "
                + ",".join(f"{r.rate:g}" for r in run.rates)
            ),
            data=data,
        )
    return passed(f"{what}: at or above the floor {slo.min_goodput:.1%}", lines, data=data)
