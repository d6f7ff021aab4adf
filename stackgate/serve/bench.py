"""Decode speed the way the reference deployment measured it: single-stream streaming /generate.

Each request asks for the lock's output length with ``ignore_eos`` (a model that stops early
would make a short run look fast) and temperature 0, and streams Server-Sent Events. Tokens are
counted from the server's ``meta_info.completion_tokens``, never from chunks: speculative decoding
delivers several tokens per event. Per run: tokens, seconds, tok/s, time to first token, and the
decode rate without it. Over the runs: mean, median, stdev, CV, min, max and a 95% confidence
interval (Student's t). A run that returns fewer tokens than asked is flagged and left out.

The verdict against ``[benchmark].baseline_tok_s`` judges the decode rate (tokens after the first
event over the time after it), the figure the reference deployment's baseline is; the whole-run
rate, which also carries the time to first token, is reported beside it. Concurrency levels also
report time to first token and inter-token latency percentiles (p50/p90/p99), the inter-token
latency counted as SGLang's bench_serving counts it: an event's gap split evenly over its tokens.

A figure that does not exist (the confidence interval of one run) is written as JSON ``null``
with a note, never as ``Infinity``, which strict JSON parsers refuse.

The stream is read with one regular-expression search per event for ``completion_tokens``; only
the last event is parsed as JSON (for the token ids the quality guard compares), because SGLang
streams the cumulative text and ids, so parsing every event costs time quadratic in the length.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from stackgate.edges import httpclient
from stackgate.models.engines import NATIVE_GENERATE, OPENAI_CHAT, OPENAI_COMPLETIONS
from stackgate.models.finding import Fix
from stackgate.models.result import Result, failed, passed, skipped, warned
from stackgate.models.spec import Benchmark

__all__ = [
    "BenchFigures",
    "Difference",
    "Level",
    "PERCENTILES",
    "Sample",
    "Streams",
    "Summary",
    "difference",
    "finite",
    "generate",
    "judge",
    "percentile",
    "run_benchmark",
    "run_level",
    "summarize",
    "t95",
]

_COMPLETION = re.compile(rb'"completion_tokens":\s*(\d+)')
#: An OpenAI chunk whose choice finished: parsed for its reason (the others are not parsed at all).
_FINISHED = re.compile(rb'"finish_reason":\s*"')
STREAM_IDLE_S = Benchmark.stream_idle_floor_s  #: the longest silence inside a stream, unless the lock says
# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom.
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip # a table: ten degrees of freedom a line


@dataclass(frozen=True)
class Sample:
    """One streamed generation."""

    asked: int
    tokens: int  #: the server's completion_tokens at the end
    started: float  #: perf_counter when the request was sent
    ended: float  #: perf_counter when the last token arrived
    first: float | None  #: perf_counter when the first token arrived
    first_tokens: int  #: tokens in the first event (a speculative burst may carry several)
    events: int
    output_ids: tuple[int, ...] = ()
    finish_reason: Any = None
    error: str | None = None
    cpu_s: float = 0.0  #: the client's CPU time on this stream
    gaps: tuple[float, ...] = ()  #: inter-token latencies: each event's gap, split evenly over its tokens
    prompt_tokens: int | None = None  #: the prompt's length in tokens, as the server reported it
    spec_verify_ct: int | None = None  #: speculative verify steps the server reported (meta_info), None if none

    @property
    def accept_length(self) -> float | None:
        """Tokens per speculative verify step, as SGLang defines it (completion_tokens / spec_verify_ct)."""
        return self.tokens / self.spec_verify_ct if self.spec_verify_ct else None

    @property
    def seconds(self) -> float:
        return self.ended - self.started

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def ttft_s(self) -> float | None:
        return None if self.first is None else self.first - self.started

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens after the first event over the time after it: the rate without TTFT."""
        if self.first is None or self.ended <= self.first:
            return None
        return (self.tokens - self.first_tokens) / (self.ended - self.first)

    @property
    def short(self) -> bool:
        return self.error is None and self.tokens < self.asked

    @property
    def good(self) -> bool:
        return self.error is None and self.tokens >= self.asked

    def row(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "asked": self.asked,
            "seconds": round(self.seconds, 4),
            "tok_s": round(self.tok_s, 3),
            "ttft_s": None if self.ttft_s is None else round(self.ttft_s, 4),
            "decode_tok_s": None if self.decode_tok_s is None else round(self.decode_tok_s, 3),
            "events": self.events,
            "finish_reason": self.finish_reason,
            "error": self.error,
            "client_cpu_s": round(self.cpu_s, 4),
            **({"spec_verify_ct": self.spec_verify_ct} if self.spec_verify_ct else {}),
        }


class Streams:
    """The streams open now, so that a watcher can cut them all when the server dies."""

    def __init__(self) -> None:
        self._open: set[httpclient.EventStream] = set()
        self._guard = threading.Lock()
        self.reason: str | None = None

    def add(self, stream: httpclient.EventStream) -> None:
        with self._guard:
            if self.reason is not None:
                stream.abort()
            self._open.add(stream)

    def discard(self, stream: httpclient.EventStream) -> None:
        with self._guard:
            self._open.discard(stream)

    def abort_all(self, reason: str) -> None:
        with self._guard:
            self.reason = reason
            for stream in self._open:
                stream.abort()


def generate(
    base_url: str,
    prompt: str,
    tokens: int,
    *,
    streams: Streams | None = None,
    incremental_ids: bool = False,
    api_key: str | None = None,
    idle_s: float = STREAM_IDLE_S,
    api: str = NATIVE_GENERATE,
) -> Sample:
    """Stream one greedy generation of exactly ``tokens`` tokens (ignore_eos) and time it.

    ``api_key``: the server's --api-key, sent as ``Authorization: Bearer`` (SGLang refuses
    /generate without it when it has one). ``idle_s``: the longest silence accepted between two
    events (the lock's :attr:`Benchmark.stream_idle_s`); a longer one ends the stream as failed.
    ``api``: the engine's streaming API (:data:`NATIVE_GENERATE` or :data:`OPENAI_COMPLETIONS`).
    """
    path, body = request_body(api, prompt, tokens)
    stream = httpclient.EventStream(f"{base_url}{path}", body, timeout_s=idle_s, headers=httpclient.bearer(api_key))
    reader = _Reader(tokens, incremental_ids)
    cpu = time.thread_time()
    if streams is not None:
        streams.add(stream)
    try:
        reader.started = time.perf_counter()
        for arrival, data in stream.events():
            if reader.event(arrival, data):
                break
    except httpclient.HttpError as exc:
        what = str(exc)
        if exc.kind == "timeout":
            what = f"{stream.url}: the server sent nothing for {idle_s:g} s (the stream's idle limit)"
        reader.error = f"{what} after {reader.tokens} of {tokens} tokens"
    finally:
        stream.close()
        if streams is not None:
            streams.discard(stream)
    return reader.sample(time.thread_time() - cpu)


def request_body(api: str, prompt: str, tokens: int) -> tuple[str, dict[str, Any]]:
    """The path and body of one greedy streaming generation of exactly ``tokens`` tokens.

    SGLang's /generate reports ``meta_info.completion_tokens`` in each event; the OpenAI API's
    /v1/completions and /v1/chat/completions do so in ``usage`` when asked for continuous usage
    statistics. The chat endpoint sends the prompt as one user message, so the server applies the
    model's chat template.

    >>> request_body(OPENAI_COMPLETIONS, "Hi", 3)[1]["stream_options"]
    {'include_usage': True, 'continuous_usage_stats': True}
    >>> request_body(OPENAI_CHAT, "Hi", 3)[1]["messages"]
    [{'role': 'user', 'content': 'Hi'}]
    """
    usage = {"include_usage": True, "continuous_usage_stats": True}
    if api == OPENAI_CHAT:
        return "/v1/chat/completions", {
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": usage,
        }
    if api == OPENAI_COMPLETIONS:
        return "/v1/completions", {
            "prompt": prompt,
            "max_tokens": tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": usage,
        }
    return "/generate", {
        "text": prompt,
        "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True, "temperature": 0},
        "stream": True,
    }


@dataclass
class _Reader:
    asked: int
    incremental_ids: bool
    started: float = 0.0
    tokens: int = 0
    ended: float = 0.0
    first: float | None = None
    first_tokens: int = 0
    events: int = 0
    last: bytes = b""
    ids: list[int] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    done: bool = False
    error: str | None = None
    finish: Any = None  #: an OpenAI stream's finish reason (its last chunk carries usage, not choices)

    def event(self, arrival: float, data: bytes) -> bool:
        """Take one event; True at the end of the stream."""
        if data == b"[DONE]":
            self.done = True
            return True
        self.events += 1
        counts = _COMPLETION.findall(data)
        if not counts:
            self.error = _error_text(data)
            return self.error is not None
        count = int(counts[-1])
        if count > self.tokens:
            if self.first is None:
                self.first, self.first_tokens = arrival, count
            else:
                new = count - self.tokens
                self.gaps.extend([(arrival - self.ended) / new] * new)
            self.tokens, self.ended = count, arrival
        if _FINISHED.search(data):
            self.finish = _choice_reason(_payload(data))
        if self.incremental_ids:
            self.ids.extend(_payload(data).get("output_ids") or ())
        self.last = data
        return False

    def sample(self, cpu_s: float) -> Sample:
        final = _payload(self.last) if self.last else {}
        ids = tuple(self.ids) if self.incremental_ids else tuple(final.get("output_ids") or ())
        error = self.error
        if error is None and not self.done:
            error = f"the stream ended without [DONE] after {self.tokens} of {self.asked} tokens"
        ended = self.ended or time.perf_counter()
        meta = final.get("meta_info")
        info: dict[str, Any] = meta if isinstance(meta, dict) else {}
        reason = info.get("finish_reason") or self.finish
        verify = info.get("spec_verify_ct")
        return Sample(
            self.asked,
            self.tokens,
            self.started,
            ended,
            self.first,
            self.first_tokens,
            self.events,
            ids,
            reason,
            error,
            cpu_s,
            tuple(self.gaps),
            _prompt_tokens(final),
            verify if isinstance(verify, int) and not isinstance(verify, bool) and verify > 0 else None,
        )


def _payload(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _prompt_tokens(payload: dict[str, Any]) -> int | None:
    """The prompt's token count: SGLang's ``meta_info.prompt_tokens``, the OpenAI API's ``usage.prompt_tokens``.

    >>> _prompt_tokens({"meta_info": {"prompt_tokens": 7}}), _prompt_tokens({"usage": {"prompt_tokens": "x"}})
    (7, None)
    """
    for name in ("meta_info", "usage"):
        part = payload.get(name)
        value = part.get("prompt_tokens") if isinstance(part, dict) else None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _choice_reason(payload: dict[str, Any]) -> Any:
    """An OpenAI stream's finish reason: the last chunk with choices carries it."""
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    return choices[0].get("finish_reason")


def _error_text(data: bytes) -> str | None:
    """SGLang streams ``{"error": {"message": ...}}`` when a request fails mid-way."""
    error = _payload(data).get("error")
    if error is None:
        return None
    message = error.get("message") if isinstance(error, dict) else error
    return f"the server reported an error: {message}"


# --- statistics -------------------------------------------------------------------------------


def t95(df: int) -> float:
    """Two-sided 95% Student's t quantile (conservative for non-integer df: rounded down).

    >>> t95(4), t95(1000)
    (2.776, 1.96)
    """
    if df < 1:
        return math.inf
    if df <= len(_T95):
        return _T95[df - 1]
    return 2.021 if df < 60 else 2.0 if df < 120 else 1.98 if df < 1000 else 1.96


def finite(value: float, digits: int = 4) -> float | None:
    """A figure for JSON: rounded, or None where it does not exist (inf, nan).

    >>> finite(1.23456), finite(math.inf), finite(-math.inf)
    (1.2346, None, None)
    """
    return round(value, digits) if math.isfinite(value) else None


def percentile(values: Sequence[float], p: float) -> float | None:
    """The ``p``-th percentile, interpolated between the closest ranks (numpy's default).

    >>> percentile([4.0, 1.0, 3.0, 2.0], 50), percentile([1.0, 2.0, 3.0, 4.0], 90), percentile([], 50)
    (2.5, 3.7, None)
    """
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    median: float
    stdev: float  #: sample standard deviation (0 for one value)
    cv: float  #: stdev / mean
    min: float
    max: float
    ci_low: float  #: 95% confidence interval of the mean
    ci_high: float
    values: tuple[float, ...] = ()

    @property
    def has_interval(self) -> bool:
        """One value has no spread to estimate, so no confidence interval."""
        return math.isfinite(self.ci_low) and math.isfinite(self.ci_high)

    def to_dict(self) -> dict[str, Any]:
        raw = dataclasses.asdict(self)
        raw["values"] = [round(v, 4) for v in self.values]
        out = {k: (finite(v) if isinstance(v, float) else v) for k, v in raw.items()}
        if not self.has_interval:
            out["ci_note"] = f"no confidence interval from {self.n} value(s): ci_low and ci_high are null"
        return out

    def interval(self) -> str:
        return f"{self.ci_low:.2f}-{self.ci_high:.2f}" if self.has_interval else f"n/a (n={self.n})"

    def text(self, unit: str = "tok/s") -> str:
        return (
            f"{self.mean:.2f} {unit} (median {self.median:.2f}, CV {self.cv:.1%}, 95% CI {self.interval()}, n={self.n})"
        )


def summarize(values: Sequence[float]) -> Summary | None:
    """Mean, median, stdev, CV, min, max and a 95% confidence interval of the mean.

    >>> s = summarize([90.0, 92.0, 94.0])
    >>> (s.mean, s.median, s.stdev, round(s.cv, 4), round(s.ci_low, 3), round(s.ci_high, 3))
    (92.0, 92.0, 2.0, 0.0217, 87.031, 96.969)
    """
    if not values:
        return None
    n = len(values)
    mean = statistics.fmean(values)
    stdev = statistics.stdev(values) if n > 1 else 0.0
    half = t95(n - 1) * stdev / math.sqrt(n) if n > 1 else math.inf
    return Summary(
        n,
        mean,
        statistics.median(values),
        stdev,
        stdev / mean if mean else 0.0,
        min(values),
        max(values),
        mean - half,
        mean + half,
        tuple(values),
    )


@dataclass(frozen=True)
class Difference:
    """``b - a`` of two sets of runs, with a 95% (Welch) interval."""

    delta: float
    ci_low: float
    ci_high: float
    relative: float  #: delta / mean of a

    @property
    def significant(self) -> bool:
        return self.ci_low > 0 or self.ci_high < 0

    def text(self) -> str:
        if not (math.isfinite(self.ci_low) and math.isfinite(self.ci_high)):
            return f"{self.delta:+.2f} tok/s ({self.relative:+.1%}; no 95% CI: a side has one run)"
        return f"{self.delta:+.2f} tok/s ({self.relative:+.1%}; 95% CI {self.ci_low:+.2f} to {self.ci_high:+.2f})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "delta": round(self.delta, 4),
            "ci": [finite(self.ci_low), finite(self.ci_high)],
            "relative": round(self.relative, 4),
            "significant": self.significant,
        }


def difference(a: Summary, b: Summary) -> Difference:
    """Welch's interval for the difference of two means.

    >>> d = difference(summarize([90.0, 91.0, 92.0]), summarize([95.0, 96.0, 97.0]))
    >>> (d.delta, round(d.ci_low, 2), round(d.ci_high, 2), d.significant)
    (5.0, 2.73, 7.27, True)
    >>> difference(summarize([90.0]), summarize([95.0, 96.0])).significant  # one run: no spread known
    False
    """
    if a.n < 2 or b.n < 2:
        return Difference(b.mean - a.mean, -math.inf, math.inf, (b.mean - a.mean) / a.mean)
    va, vb = a.stdev**2 / a.n, b.stdev**2 / b.n
    se = math.sqrt(va + vb)
    if se == 0:
        return Difference(b.mean - a.mean, b.mean - a.mean, b.mean - a.mean, (b.mean - a.mean) / a.mean)
    df = (va + vb) ** 2 / (va**2 / (a.n - 1) + vb**2 / (b.n - 1) or 1e-12)
    half = t95(int(df)) * se
    delta = b.mean - a.mean
    return Difference(delta, delta - half, delta + half, delta / a.mean)


# --- the benchmark ----------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchFigures:
    warmups: tuple[Sample, ...]
    runs: tuple[Sample, ...]
    tok_s: Summary | None
    decode_tok_s: Summary | None
    ttft_s: Summary | None
    stopped: str | None  #: why the benchmark ended early, if it did
    stopped_at: float | None = None  #: time.time() when the failed request ended

    @property
    def good(self) -> list[Sample]:
        return [r for r in self.runs if r.good]

    def to_dict(self) -> dict[str, Any]:
        return {
            "warmups": [s.row() for s in self.warmups],
            "runs": [s.row() for s in self.runs],
            "tok_s": self.tok_s.to_dict() if self.tok_s else None,
            "decode_tok_s": self.decode_tok_s.to_dict() if self.decode_tok_s else None,
            "ttft_s": self.ttft_s.to_dict() if self.ttft_s else None,
            "short_runs": [i + 1 for i, r in enumerate(self.runs) if r.short],
            "stopped": self.stopped,
        }


def run_benchmark(
    base_url: str,
    bench: Benchmark,
    *,
    streams: Streams,
    incremental_ids: bool = False,
    show: Callable[[str], None] | None = None,
    explain: Callable[[str], str | None] = lambda error: None,
    api_key: str | None = None,
    floor: float | None = None,
    api: str = NATIVE_GENERATE,
) -> BenchFigures:
    """The lock's warm-ups, then its runs, then, while the decode rate's 95% interval spans
    ``floor`` (the verdict's threshold), more runs up to ``bench.run_cap``; stops at the first
    failed request.

    A stream usually ends before anyone has seen the server die, so ``explain`` is asked why,
    given the stream's own error (the watcher of the process and its log answers), before that
    error is taken as the reason; the failure is dated when the answer is in: the moment smoke
    knows its verdict.
    """
    warmups: list[Sample] = []
    runs: list[Sample] = []

    def take(kind: str, into: list[Sample], total: int, why: str = "") -> str | None:
        """One request; why the benchmark stops, if it failed."""
        if show is not None:
            show(f"benchmark: {kind} {len(into) + 1}/{total} ({bench.output_tokens} tokens){why}")
        sample = generate(
            base_url,
            bench.prompt,
            bench.output_tokens,
            streams=streams,
            incremental_ids=incremental_ids,
            api_key=api_key,
            idle_s=bench.stream_idle_s,
            api=api,
        )
        into.append(sample)
        if sample.error is None:
            return None
        return f"{kind} {len(into)} failed: {explain(sample.error) or streams.reason or sample.error}"

    for kind, into, total in (("warm-up", warmups, bench.warmup), ("run", runs, bench.runs)):
        for _ in range(total):
            if (stopped := take(kind, into, total)) is not None:
                return _figures(warmups, runs, stopped, time.time())
    while len(runs) < bench.run_cap and (spans := spanned(_decode_summary(runs), floor)) is not None:
        if (stopped := take("run", runs, bench.run_cap, f"; {spans}: one more")) is not None:
            return _figures(warmups, runs, stopped, time.time())
    return _figures(warmups, runs, None)


def spanned(decode: Summary | None, floor: float | None) -> str | None:
    """Why the decode rate cannot be judged against ``floor`` yet: its 95% interval spans it.
    None when it can (or there is no floor, or one run, whose interval is unknown).

    >>> spanned(summarize([85.1, 101.9, 93.5]), 89.8)
    'the 95% interval 72.63-114.37 tok/s spans the floor 89.80'
    >>> spanned(summarize([92.5, 92.7, 92.6]), 89.8) is None
    True
    """
    if decode is None or floor is None or not decode.has_interval or not decode.ci_low < floor < decode.ci_high:
        return None
    return f"the 95% interval {decode.interval()} tok/s spans the floor {floor:.2f}"


def _decode_summary(runs: Sequence[Sample]) -> Summary | None:
    return summarize([r.decode_tok_s for r in runs if r.good and r.decode_tok_s is not None])


def _figures(warmups: list[Sample], runs: list[Sample], stopped: str | None, at: float | None = None) -> BenchFigures:
    good = [r for r in runs if r.good]
    ttft = [r.ttft_s for r in good if r.ttft_s is not None]
    whole = summarize([r.tok_s for r in good])
    return BenchFigures(tuple(warmups), tuple(runs), whole, _decode_summary(runs), summarize(ttft), stopped, at)


def judge(
    figures: BenchFigures,
    bench: Benchmark,
    *,
    fast_label: str | None = None,
    against_baseline: bool = True,
    strict: bool = False,
) -> tuple[Result, Result | None]:
    """The verdict against the baseline, and a flag for short runs (None when there are none).

    The decode rate is judged (the baseline's figure: time to first token left out), the
    whole-run rate reported beside it. ``against_baseline=False`` (the baseline configuration
    --compare launches) measures without judging: that configuration is not the lock's. A 95%
    interval that still spans the floor after the extra runs is inconclusive: a WARN, a FAIL
    when ``strict``.
    """
    details = [_run_line(i, r) for i, r in enumerate(figures.runs)]
    data = {**figures.to_dict(), "judged": "decode_tok_s"}
    short = [i + 1 for i, r in enumerate(figures.runs) if r.short]
    flag = None
    if short:
        flag = warned(
            f"{len(short)} run(s) returned fewer tokens than the {bench.output_tokens} asked (runs "
            f"{', '.join(map(str, short))}); left out of the figures",
            [details[i - 1] for i in short],
            fix=Fix(
                "A short run means the server stopped early despite ignore_eos (context length? an abort?): read the "
                "server log."
            ),
        )
    if figures.stopped is not None:
        return failed(f"the benchmark stopped: {figures.stopped}", details, data=data), flag
    if figures.tok_s is None:
        return failed(f"no run returned the {bench.output_tokens} tokens asked", details, data=data), flag
    if figures.decode_tok_s is None:
        return failed(
            "no run streamed more than one event, so there is no decode rate to judge", details, data=data
        ), flag
    decode, whole = figures.decode_tok_s, figures.tok_s
    lines = [f"decode: {decode.text()}", f"end-to-end (with time to first token): {whole.text()}", *details]
    both = f"decode {decode.mean:.2f} tok/s (end-to-end {whole.mean:.2f})"
    if fast_label is not None:
        return passed(
            f"{fast_label}: {both}, a fast-mode figure never compared with the baseline", lines, data=data
        ), flag
    if not against_baseline:
        return passed(
            f"{both}: measured for the comparison, not judged against baseline_tok_s (it describes the lock's "
            "configuration)",
            lines,
            data=data,
        ), flag
    return _against_baseline(decode, whole, bench, lines, data, strict), flag


def _against_baseline(
    decode: Summary, whole: Summary, bench: Benchmark, lines: list[str], data: dict[str, Any], strict: bool
) -> Result:
    floor = bench.floor_tok_s
    if bench.baseline_tok_s is None or floor is None:
        return skipped(
            f"decode {decode.text()}; end-to-end {whole.mean:.2f} tok/s; the lock has no baseline_tok_s to judge it "
            "against",
            lines,
            data=data,
        )
    change = decode.mean / bench.baseline_tok_s - 1
    data = {
        **data,
        "baseline_tok_s": bench.baseline_tok_s,
        "max_regression": bench.max_regression,
        "change": round(change, 4),
    }
    data.update(floor_tok_s=round(floor, 4), runs_asked=bench.runs, run_cap=bench.run_cap, inconclusive=False)
    whole_text = f"end-to-end {whole.mean:.2f} tok/s with time to first token"
    spans = spanned(decode, floor)
    if spans is not None:
        return _inconclusive(decode, bench, spans, lines, {**data, "inconclusive": True}, strict)
    if decode.mean < floor:
        return failed(
            f"decode {decode.mean:.2f} tok/s is {-change:.1%} below the baseline {bench.baseline_tok_s:g} tok/s "
            f"(allowed: {bench.max_regression:.1%}, floor {floor:.2f}); {whole_text}",
            lines,
            fix=Fix(
                "Compare with the baseline's configuration (`stackgate smoke --benchmark --compare`) and check the "
                "findings above (attention backend, NCCL settings)."
            ),
            data=data,
        )
    return passed(
        f"decode {decode.mean:.2f} tok/s vs baseline {bench.baseline_tok_s:g} ({change:+.1%}; allowed "
        f"-{bench.max_regression:.1%}); {whole_text}",
        lines,
        data=data,
    )


def _inconclusive(
    decode: Summary, bench: Benchmark, spans: str, lines: list[str], data: dict[str, Any], strict: bool
) -> Result:
    """The interval still spans the floor after the extra runs: neither a pass nor a regression."""
    extra = f"{decode.n} runs ({bench.runs} asked, up to max_runs {bench.run_cap} while it spanned)"
    summary = f"inconclusive: decode {decode.mean:.2f} tok/s, but {spans} after {extra}"
    fix = Fix(
        "Measure on a quiet machine (no other GPU work), or raise [benchmark] runs or max_runs for a "
        "narrower interval.",
        ("nvidia-smi --query-compute-apps=pid,used_memory --format=csv",),
    )
    make = failed if strict else warned
    return make(summary + ("; --strict fails it" if strict else ""), lines, fix=fix, data=data)


def _run_line(index: int, sample: Sample) -> str:
    ttft = f"{sample.ttft_s * 1000:.0f} ms" if sample.ttft_s is not None else "-"
    decode = f"{sample.decode_tok_s:.2f}" if sample.decode_tok_s is not None else "-"
    mark = (
        f"  SHORT ({sample.tokens} of {sample.asked})"
        if sample.short
        else f"  ERROR: {sample.error}"
        if sample.error
        else ""
    )
    return (
        f"run {index + 1}: {sample.tokens} tokens in {sample.seconds:.3f} s = {sample.tok_s:.2f} tok/s; TTFT {ttft}; "
        f"decode {decode} tok/s{mark}"
    )


# --- concurrency ------------------------------------------------------------------------------


#: The latency percentiles a concurrency level reports.
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Level:
    """One concurrency level: that many streams started together."""

    streams: int
    samples: tuple[Sample, ...]

    @property
    def good(self) -> list[Sample]:
        return [s for s in self.samples if s.good]

    @property
    def aggregate_tok_s(self) -> float:
        """All tokens over the wall time from the first request to the last token."""
        if not self.samples:
            return 0.0
        span = max(s.ended for s in self.samples) - min(s.started for s in self.samples)
        return sum(s.tokens for s in self.samples) / span if span > 0 else 0.0

    @property
    def per_stream(self) -> Summary | None:
        return summarize([s.tok_s for s in self.good])

    def ttft_s(self) -> dict[str, float | None]:
        """Time to first token over the complete streams: p50, p90, p99 (seconds)."""
        values = [s.ttft_s for s in self.good if s.ttft_s is not None]
        return {f"p{p}": percentile(values, p) for p in PERCENTILES}

    def itl_s(self) -> dict[str, float | None]:
        """Inter-token latency over every token of the complete streams: p50, p90, p99 (seconds)."""
        values = [gap for s in self.good for gap in s.gaps]
        return {f"p{p}": percentile(values, p) for p in PERCENTILES}

    def to_dict(self) -> dict[str, Any]:
        per = self.per_stream
        return {
            "streams": self.streams,
            "aggregate_tok_s": round(self.aggregate_tok_s, 3),
            "per_stream_tok_s": per.to_dict() if per else None,
            "ttft_s": {k: None if v is None else round(v, 5) for k, v in self.ttft_s().items()},
            "itl_s": {k: None if v is None else round(v, 6) for k, v in self.itl_s().items()},
            "failed": sum(1 for s in self.samples if not s.good),
        }


def run_level(
    base_url: str,
    count: int,
    prompt: str,
    tokens: int,
    *,
    streams: Streams,
    api_key: str | None = None,
    idle_s: float = STREAM_IDLE_S,
    api: str = NATIVE_GENERATE,
) -> Level:
    """``count`` streams at once, released together by a barrier."""
    gate = threading.Barrier(count)
    samples: list[Sample | None] = [None] * count

    def one(i: int) -> None:
        gate.wait()
        samples[i] = generate(base_url, prompt, tokens, streams=streams, api_key=api_key, idle_s=idle_s, api=api)

    threads = [threading.Thread(target=one, args=(i,), name=f"smoke-stream-{i}", daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return Level(count, tuple(s for s in samples if s is not None))
