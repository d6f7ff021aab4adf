"""What smoke learns from the engine beyond speed: its own /metrics, its speculative acceptance, its answers.

- ``/metrics`` is scraped just before the first measured request and just after the last (the
  engine's own account of the run: token and request counters, speculative acceptance), and both
  scrapes are kept with the report. A body that is not the text exposition format fails
  ``metrics`` with the line that is wrong; an engine that serves none (SGLang without
  ``--enable-metrics``) skips it with the flag to add.
- Speculative acceptance, for a configuration that speculates: the mean acceptance length (tokens
  per verify step, SGLang's ``completion_tokens / spec_verify_ct``) from the engine's per-request
  ``meta_info``, over the single-stream runs and per concurrency level, or from its
  ``spec_accept_length`` gauge when the API in use does not carry ``meta_info`` (the OpenAI
  endpoints). ``[smoke.speculative] min_accept_length`` judges it: a draft model that stopped
  matching the target (a new tokenizer, a wrong draft) still serves, only slower.
- The accuracy check (:mod:`stackgate.serve.accuracy`) against ``[accuracy] floor``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Sequence

from stackgate.edges import httpclient
from stackgate.models.engines import OPENAI_CHAT, Engine
from stackgate.models.finding import Fix
from stackgate.models.result import Result, failed, passed, skipped, warned
from stackgate.models.spec import Accuracy, Benchmark, Speculative
from stackgate.serve import accuracy, bench, metrics

__all__ = ["ACCEPT_GAUGES", "EngineReport", "acceptance_result", "accuracy_result", "api_of", "metrics_result"]

#: The gauges in which an engine reports its mean acceptance length (SGLang's metrics_collector.py).
ACCEPT_GAUGES = ("sglang:spec_accept_length",)


def api_of(engine: Engine, benchmark: Benchmark) -> str:
    """The streaming API the benchmark speaks: the engine's own, or the OpenAI chat endpoint."""
    return OPENAI_CHAT if benchmark.api == "chat" else engine.api


@dataclass
class EngineReport:
    """The engine's own reports gathered during one configuration's measurement."""

    before: metrics.Scrape | None = None
    after: metrics.Scrape | None = None
    metrics_problem: str | None = None  #: why a scrape failed (the first failure)
    metrics_missing: str | None = None  #: why there is nothing to scrape (HTTP 404)
    metrics_needs: str = ""  #: what the engine needs to serve metrics
    score: accuracy.Score | None = None
    accuracy_problem: str | None = None

    def scrape(self, engine: Engine, base_url: str, api_key: str | None) -> None:
        """One scrape, kept as ``before`` until there is one, then as ``after``."""
        if self.metrics_problem is not None or self.metrics_missing is not None:
            return
        try:
            found = metrics.scrape(base_url, engine.metrics_path, api_key=api_key)
        except httpclient.HttpError as exc:
            if exc.status == 404:
                self.metrics_missing = f"{base_url}{engine.metrics_path} answered HTTP 404"
                if engine.metrics_flag:
                    self.metrics_needs = f"{engine.title} serves it only with {engine.metrics_flag}"
            else:
                self.metrics_problem = str(exc)
            return
        except metrics.MetricsError as exc:
            self.metrics_problem = str(exc)
            return
        if self.before is None:
            self.before = found
        else:
            self.after = found

    def check_accuracy(self, base_url: str, api: str, spec: Accuracy, api_key: str | None) -> None:
        if spec.floor is None:
            return
        try:
            self.score = accuracy.run_accuracy(base_url, api, spec.max_tokens, api_key=api_key)
        except accuracy.AccuracyError as exc:
            self.accuracy_problem = str(exc)

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine_metrics": {
                "before": self.before.to_dict() if self.before else None,
                "after": self.after.to_dict() if self.after else None,
                "problem": self.metrics_problem,
                "missing": "; ".join(filter(None, (self.metrics_missing, self.metrics_needs))) or None,
            },
            "accuracy": self.score.to_dict() if self.score else None,
            "accuracy_problem": self.accuracy_problem,
        }


#: Counters summed over ranks whose change during the run the metrics result states.
_COUNTERS = (
    ("sglang:num_requests_total", "requests"),
    ("sglang:prompt_tokens_total", "prompt tokens"),
    ("sglang:generation_tokens_total", "generated tokens"),
    ("vllm:request_success_total", "requests"),
    ("vllm:prompt_tokens_total", "prompt tokens"),
    ("vllm:generation_tokens_total", "generated tokens"),
)


def metrics_result(report: EngineReport, engine: Engine, flags: Sequence[str]) -> Result | None:
    """The scrapes, judged: readable, and what the engine counted during the run. An engine that
    serves no metrics is a result only where ``flags`` (the launch words) asked it to serve them;
    otherwise the report's JSON says why there are none."""
    if report.metrics_problem is not None:
        return failed(
            f"the engine's metrics could not be read: {report.metrics_problem}",
            fix=Fix(
                "The server's /metrics answer is not the Prometheus text format: read it with "
                "`curl -s URL/metrics | head`, and look for a proxy or a patched exporter in between."
            ),
        )
    asked = bool(engine.metrics_flag) and any(word.split("=", 1)[0] == engine.metrics_flag for word in flags)
    if report.metrics_missing is not None and asked:
        fix = Fix(f"Check that {engine.title} was started with {engine.metrics_flag} (server_info's enable_metrics).")
        hint = f", although {engine.metrics_flag} was given"
        return warned(f"no engine metrics: {report.metrics_missing}{hint}", fix=fix)
    before, after = report.before, report.after
    if before is None or after is None:
        return None
    lines = []
    for name, what in _COUNTERS:
        start, end = before.total(name), after.total(name)
        if start is not None and end is not None:
            lines.append(f"{name}: {end - start:+g} {what} during the run")
    summary = f"scraped {len(before.series)} series before and {len(after.series)} after the measured requests"
    return passed(summary, lines, data={"before_series": len(before.series), "after_series": len(after.series)})


def acceptance_result(
    speculative: Speculative | None,
    runs: Sequence[bench.Sample],
    levels: Sequence[bench.Level],
    report: EngineReport,
) -> Result | None:
    """The mean acceptance length of a speculating configuration, judged against min_accept_length."""
    if speculative is None:
        return None
    lines, data = _acceptance_lines(runs, levels)
    measured = [data["single_stream"]] if data["single_stream"] is not None else []
    measured = measured or [level["accept_length"] for level in data["levels"]]
    figure = statistics.fmean(measured) if measured else None
    source = "per-request meta_info (completion_tokens / spec_verify_ct)"
    if figure is None:
        gauge = [v for name in ACCEPT_GAUGES for v in (report.after.values(name) if report.after else [])]
        figure = statistics.fmean(gauge) if gauge else None
        source = f"the engine's {ACCEPT_GAUGES[0]} gauge after the run"
    if figure is None:
        return skipped(
            "no acceptance length: the engine reported no spec_verify_ct in its responses and no "
            f'{ACCEPT_GAUGES[0]} in its metrics (benchmark through the native API, [benchmark] api = "native", '
            "or add --enable-metrics to [smoke] flags)",
            lines,
        )
    data.update(accept_length=round(figure, 4), source=source, min_accept_length=speculative.min_accept_length)
    text = f"{speculative.algorithm}: {figure:.2f} tokens per verify step, from {source}"
    floor = speculative.min_accept_length
    if floor is None:
        return passed(f"{text}; no min_accept_length to judge it against", lines, data=data)
    if figure < floor:
        return failed(
            f"{text}: below min_accept_length {floor:g}",
            lines,
            fix=Fix(
                "The draft model no longer predicts the target's tokens: check that the draft matches the "
                "model and its tokenizer ([smoke.speculative] draft_model), and its num_steps/num_draft_tokens."
            ),
            data=data,
        )
    return passed(f"{text} (at least min_accept_length {floor:g})", lines, data=data)


def _acceptance_lines(runs: Sequence[bench.Sample], levels: Sequence[bench.Level]) -> tuple[list[str], dict[str, Any]]:
    """The acceptance length of the single-stream runs and of each concurrency level."""
    lines: list[str] = []
    data: dict[str, Any] = {"single_stream": None, "levels": []}
    single = [s.accept_length for s in runs if s.good and s.accept_length is not None]
    if single:
        data["single_stream"] = round(statistics.fmean(single), 4)
        lines.append(f"single stream: {data['single_stream']:.2f} tokens per verify step over {len(single)} run(s)")
    for level in levels:
        values = [s.accept_length for s in level.good if s.accept_length is not None]
        if values:
            mean = statistics.fmean(values)
            data["levels"].append({"streams": level.streams, "accept_length": round(mean, 4)})
            lines.append(f"{level.streams} stream(s): {mean:.2f} tokens per verify step")
    return lines, data


def accuracy_result(report: EngineReport, spec: Accuracy, fast_label: str | None = None) -> Result | None:
    """The share of exact greedy answers against ``[accuracy] floor``."""
    if spec.floor is None:
        return None
    if fast_label is not None:
        return skipped(f"{fast_label}: random weights, so the accuracy check does not apply")
    if report.accuracy_problem is not None:
        return failed(f"the accuracy check could not run: {report.accuracy_problem}")
    score = report.score
    if score is None:
        return None
    wrong = [a for a in score.answers if not a.right]
    lines = [f"{a.item.prompt!r}: expected {a.item.answer!r}, got {a.got!r}" for a in wrong]
    data = {**score.to_dict(), "floor": spec.floor}
    text = f"{score.right} of {len(score.answers)} exact ({score.share:.1%}) on {score.set_name}"
    if score.share < spec.floor:
        return failed(
            f"{text}: below the floor {spec.floor:.1%}",
            lines,
            fix=Fix(
                "Greedy answers changed: compare with the previous stack (`stackgate smoke --compare`), and check "
                "the attention backend and the kernels' findings above."
            ),
            data=data,
        )
    return passed(f"{text} (floor {spec.floor:.1%})", lines, data=data)
