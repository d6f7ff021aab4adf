"""The request-rate sweep (serve/sweep.py, serve/prompts.py, [smoke.sweep]) against the stand-in SGLang server.

The stand-in serves at most ``max_running`` requests at once (the rest queue), so its saturation rate is
known: max_running over one request's service time. Every figure is compared with what the stand-in
itself recorded for the same request (paired by the prompt, which is unique), never with a clock bound.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zlib

import pytest
from smoke_support import ROOT, assert_nothing_left, by_name
from specs import minimal_spec

from stackgate.models.exitcodes import UsageError
from stackgate.models.result import Status
from stackgate.models.spec import SpecError, loads_spec
from stackgate.models.spec.sweep import Sweep
from stackgate.serve import prompts, sweep

#: One request: 20 ms to the first token, then 40 tokens at 200 tok/s: about 0.22 s, one at a time.
SERVICE = {"ttft_s": 0.02, "rate": 200.0, "max_running": 1, "timing": True}
TOKENS = 40


@pytest.fixture
def rig(rig, monkeypatch):
    monkeypatch.setenv("STACKGATE_FAKE_NVML", str(rig.nvml_path))
    return rig


def sweep_table(**keys) -> str:
    chosen = {
        "arrival": "fixed",
        "requests": 6,
        "input_tokens": [20, 30],
        "output_tokens": TOKENS,
        **{k: v for k, v in keys.items() if k != "slo"},
    }
    lines = ["[smoke.sweep]", *(f"{k} = {json.dumps(v)}" for k, v in chosen.items())]
    if "slo" in keys:
        lines += ["[smoke.sweep.slo]", *(f"{k} = {json.dumps(v)}" for k, v in keys["slo"].items())]
    return "\n".join(lines)


def own_timing(rig) -> dict[int, dict]:
    """What the stand-in recorded of each stream, by the crc32 of its prompt."""
    return {e["prompt_crc"]: e for e in rig.events("stream_done")}


# --- the spec's section -----------------------------------------------------------------------------


def load(text: str):
    return loads_spec(minimal_spec(root="/opt/stackgate/t") + "\n" + text, "stackgate.toml")


def test_the_sweep_section_reads_rates_lengths_and_slo():
    spec = load(
        sweep_table(
            arrival="poisson", rates=[2, 8], input_tokens=[100, 200], slo={"rate": 8, "ttft_ms": 500, "e2e_ms": 2000}
        )
    )
    swept = spec.smoke.sweep
    assert swept.rates == (2.0, 8.0) and swept.arrival == "poisson" and swept.input_tokens == (100, 200)
    assert swept.output_tokens == (TOKENS, TOKENS) and swept.slo is not None
    assert swept.slo.objectives == {"ttft_ms": 500.0, "e2e_ms": 2000.0} and swept.slo.min_goodput == 0.9


@pytest.mark.parametrize(
    ("keys", "want"),
    [
        ({"rates": [2, 0]}, "smoke.sweep.rates[1]: must be a number of requests per second greater than 0, not 0"),
        ({"arrival": "bursty"}, "smoke.sweep.arrival: must be one of poisson, fixed, not 'bursty'"),
        ({"input_tokens": [300, 100]}, "smoke.sweep.input_tokens: must be a whole number above 0 or [low, high]"),
        ({"rates": [2], "slo": {"rate": 4, "ttft_ms": 1}}, "smoke.sweep.slo.rate: 4 is not one of smoke.sweep.rates"),
        ({"slo": {"rate": 4}}, "smoke.sweep.slo: names no objective: give ttft_ms, itl_ms or e2e_ms"),
        ({"slo": {"rate": 4, "ttft_ms": 1, "min_goodput": 1.5}}, "smoke.sweep.slo.min_goodput: must be a fraction"),
        ({"knee_rate": 2}, "smoke.sweep.knee_rate: unknown key (did you mean 'knee_ratio'?)"),
    ],
)
def test_a_bad_sweep_section_names_its_key(keys, want):
    with pytest.raises(SpecError) as caught:
        load(sweep_table(**keys))
    assert want in str(caught.value)


# --- prompts ------------------------------------------------------------------------------------------


def test_random_prompts_are_seeded_within_their_lengths_and_never_share_a_head():
    chosen = Sweep(seed=3, input_tokens=(50, 80), output_tokens=(10, 20))
    first, again = prompts.PromptMaker(chosen), prompts.PromptMaker(chosen)
    batches = [first.batch(i, 40) for i in range(3)]
    assert [p.text for p in again.batch(0, 40)] == [p.text for p in batches[0]]  # the seed decides
    every = [p for batch in batches for p in batch]
    assert all(50 <= p.words <= 80 and len(p.text.split()) == p.words and 10 <= p.output_tokens <= 20 for p in every)
    assert len({tuple(p.text.split()[:4]) for p in every}) == len(every)  # never the same prefix twice
    assert [p.words for p in batches[1]] == [p.words for p in batches[0]]  # each batch: the same lengths
    assert len({p.words for p in every}) > 10  # a distribution, not one length


def test_the_shared_prefix_case_starts_every_prompt_alike():
    made = prompts.PromptMaker(Sweep(shared_prefix_tokens=30, input_tokens=(60, 60))).batch(0, 5)
    heads = {tuple(p.text.split()[:30]) for p in made}
    assert len(heads) == 1 and len({p.text for p in made}) == 5


def test_a_sharegpt_dataset_gives_prompts_and_reply_lengths(tmp_path):
    records = [
        {"conversations": [{"from": "human", "value": f"question {i}"}, {"from": "gpt", "value": "an answer " * i}]}
        for i in range(1, 4)
    ] + [{"conversations": [{"from": "human", "value": "alone"}]}]  # one turn: skipped, as bench_serving does
    (tmp_path / "chats.json").write_text(json.dumps(records))
    maker = prompts.prompt_maker(Sweep(dataset="chats.json"), tmp_path / "stackgate.toml")
    made = maker.batch(0, 5)
    assert sorted({(p.text, p.output_tokens) for p in made}) == [
        ("question 1", 2),
        ("question 2", 4),
        ("question 3", 6),
    ]
    assert maker.wrapped  # five requests from three records


@pytest.mark.parametrize(
    ("content", "want"),
    [
        (b"\xff\xfe", "is not UTF-8 text (byte 0)"),
        (b"[{", "is not JSON: Expecting property name enclosed in double quotes at line 1, column 3"),
        (b'{"a": 1}', "must be a JSON array of ShareGPT records, not an object"),
        (b"[1]", "[0]: must be an object with conversations, not a number"),
        (b'[{"conversations": "x"}]', "[0].conversations: must be an array of turns, not a string"),
        (
            b'[{"conversations": [{"value": "q"}, {"value": null}]}]',
            "[0].conversations[1].value: must be a string, not null",
        ),
        (b'[{"conversations": [{"value": "q"}]}]', "has no record with two turns"),
    ],
)
def test_a_hostile_dataset_is_refused_naming_where(tmp_path, content, want):
    (tmp_path / "chats.json").write_bytes(content)
    with pytest.raises(UsageError) as caught:
        prompts.prompt_maker(Sweep(dataset="chats.json"), tmp_path / "stackgate.toml")
    assert str(caught.value).startswith(f"smoke.sweep.dataset: {tmp_path / 'chats.json'}: ")
    assert want in str(caught.value)


def test_a_hostile_dataset_exits_2_and_launches_nothing(rig, tmp_path):
    (tmp_path / "chats.json").write_text('[{"conversations": [{"value": 7}, {"value": "a"}]}]')
    spec = rig.spec(tables=sweep_table(rates=[2], dataset=str(tmp_path / "chats.json")))
    done = subprocess.run(
        [sys.executable, "-m", "stackgate", "smoke", "--lock", str(spec), "--benchmark"],
        cwd=ROOT,
        env=rig.environ(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "smoke.sweep.dataset: " in done.stderr and "[0].conversations[0].value: must be a string, not a number" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr and rig.events("started") == []


# --- against the stand-in --------------------------------------------------------------------------------


def test_the_sweep_measures_what_the_standin_served_and_finds_the_knee(rig):
    """One request at a time, about 0.22 s each: 2 req/s (fixed arrivals every 0.5 s) never queues, 20 req/s
    queues five requests behind the first, so the median end-to-end latency turns up there: the knee."""
    rig.behave(**SERVICE, prefill_s_per_token=0.001, itl_spread=[0.5, 1.5], itl_seed=4)
    done = rig.run(rig.spec(tables=sweep_table()), rates=(2.0, 20.0))
    results, session = by_name(done.results), done.sessions[0]
    assert results["smoke.sweep"].status == Status.PASS, results["smoke.sweep"].summary
    assert results["smoke.goodput"].status == Status.SKIP  # no SLO stated
    run = session.sweep
    assert run is not None and [r.rate for r in run.rates] == [2.0, 20.0] and run.knee == 20.0
    own = own_timing(rig)
    assert len(own) == 13  # the warm-up and 12 unique prompts: each stream is paired with the stand-in's record
    for rate in run.rates:
        for sent in rate.sent:
            served = own[zlib.crc32(sent.prompt.text.encode())]
            sample = sent.sample
            assert sample.tokens == TOKENS and served["cached"] <= 3  # a unique head: no prefix to reuse
            # The client's first token comes after the stand-in sent it, and its request before the stand-in got it.
            assert sample.ttft_s >= served["sent"][0] - served["received"]  # causal: one clock, load only widens it
            assert len(sample.gaps) == len(served["sent"]) - 1 == TOKENS - 1
    queued = [own[zlib.crc32(s.prompt.text.encode())]["queued_s"] for s in run.rates[1].sent]
    assert max(queued) > 0.5  # the stand-in's own record: requests waited at 20 req/s
    doc = session.to_dict()["sweep"]
    assert doc["knee_rate"] == 20.0 and [r["requests"] for r in doc["rates"]] == [6, 6]
    assert set(doc["rates"][0]) >= {"ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "output_tok_s", "total_tok_s", "failed"}
    assert doc["rates"][0]["input_tokens"] == sum(len(s.prompt.text.split()) for s in run.rates[0].sent)
    assert_nothing_left(rig)


def test_a_shared_prefix_is_served_from_the_standins_prefix_cache(rig):
    rig.behave(**SERVICE)
    table = sweep_table(shared_prefix_tokens=15, requests=3, input_tokens=[25, 25])
    rig.run(rig.spec(tables=table, benchmark={"warmup": 0}), rates=(4.0,))
    cached = [e["cached"] for e in rig.events("stream_done")]
    # The first prompt finds nothing; each later one reuses the 15 shared words (and at most 3 of its unique head).
    assert cached[0] == 0 and len(cached) == 3 and all(15 <= c <= 18 for c in cached[1:]), cached


def test_goodput_below_the_floor_fails_the_run(rig):
    rig.behave(**SERVICE)
    slo = {"rate": 20, "e2e_ms": 400, "min_goodput": 0.9, "max_repeats": 1}
    done = rig.run(rig.spec(tables=sweep_table(rates=[20], slo=slo)), benchmark=True)
    verdict = by_name(done.results)["smoke.goodput"]
    good, sent = verdict.data["good"], verdict.data["sent"]
    assert verdict.status == Status.FAIL and sent == 6 and good < 6, verdict.summary
    assert verdict.summary.startswith(f"goodput {good / sent:.1%} ({good} of 6 requests within E2E <= 400 ms)")
    assert "below the floor 90.0%" in verdict.summary and not done.verdict.passed
    assert verdict.fix is not None and "--rates 20" in verdict.fix.text


def test_goodput_whose_interval_spans_the_floor_runs_again_then_is_inconclusive(rig):
    rig.behave(**SERVICE)
    slo = {"rate": 2, "e2e_ms": 5000, "min_goodput": 0.9, "max_repeats": 2}
    done = rig.run(rig.spec(tables=sweep_table(rates=[2], slo=slo)), benchmark=True)
    verdict = by_name(done.results)["smoke.goodput"]
    # 6 of 6 good: the 95% interval 61%-100% spans 90%; 12 of 12: 76%-100% still does, and no repeat is left.
    assert verdict.status == Status.WARN and verdict.data["runs"] == 2 and verdict.data["sent"] == 12
    assert verdict.summary.startswith("inconclusive: goodput 100.0% (12 of 12 requests")
    strict = rig.run(
        rig.spec(tables=sweep_table(rates=[2], slo={**slo, "max_repeats": 1})), benchmark=True, strict=True
    )
    assert by_name(strict.results)["smoke.goodput"].status == Status.FAIL


def test_goodput_above_the_floor_passes(rig):
    rig.behave(**SERVICE)
    slo = {"rate": 2, "ttft_ms": 5000, "itl_ms": 1000, "min_goodput": 0.5}
    done = rig.run(rig.spec(tables=sweep_table(rates=[2], slo=slo)), benchmark=True)
    verdict = by_name(done.results)["smoke.goodput"]
    assert verdict.status == Status.PASS and verdict.data["good"] == 6, verdict.summary
    assert sweep.wilson(6, 6)[0] > 0.5


def test_the_rates_option_is_parsed_and_checked():
    from stackgate.commands.smoke import parse_rates

    assert parse_rates("2, 4.5") == (2.0, 4.5)
    for bad in ("2,x", "0", "nan", "-1"):
        with pytest.raises(UsageError):
            parse_rates(bad)


# --- reports -------------------------------------------------------------------------------------------


def test_the_sweep_reaches_the_console_json_markdown_prometheus_html_and_report_a_b(rig, tmp_path):
    import copy
    import io

    import exposition
    from history_support import gate_doc

    from stackgate.commands.smoke import _render
    from stackgate.render import html, runlines, summaries
    from stackgate.render.ui import UI
    from stackgate.runs import history, rundiff

    rig.behave(**SERVICE)
    slo = {"rate": 2, "ttft_ms": 5000, "min_goodput": 0.5}
    done = rig.run(rig.spec(tables=sweep_table(rates=[2, 20], slo=slo)), benchmark=True)
    run = done.sessions[0].sweep
    assert run is not None and run.knee == 20.0
    console = io.StringIO()
    _render(done, UI(stream=console, force_plain=True))
    assert "request-rate sweep" in console.getvalue() and "knee: 20 req/s" in console.getvalue()
    assert "TTFT ms p50/p90/p99" in console.getvalue()

    smoke_doc = done.document()
    stored = smoke_doc["smoke"]["sessions"][0]["sweep"]
    for i, rate in enumerate(run.rates):  # the JSON carries each rate's figures under their documented names
        for metric in sweep.METRICS:
            assert stored["rates"][i][metric] == rate.figures(metric)
    assert stored["slo"]["good"] == 6 and stored["rates"][0]["goodput"]["share"] == 1.0

    doc = gate_doc()
    doc["gate"]["smoke"] = {"benchmark": smoke_doc["smoke"]}
    markdown = summaries.markdown(doc)
    assert "### Request-rate sweep" in markdown and "| 2 | 6/6 |" in markdown and "| 20 | 6/6 |" in markdown
    families = exposition.parse(summaries.prometheus(doc))
    p50 = stored["rates"][0]["ttft_ms"]["p50"] / 1000
    assert families["stackgate_sweep_ttft_seconds"].value(rate="2", quantile="0.5") == pytest.approx(p50)
    assert families["stackgate_sweep_knee_requests_per_second"].value() == 20
    assert families["stackgate_sweep_goodput_ratio"].value(rate="2") == 1.0

    page = html.page([history.Run("g1", tmp_path / "g1.json", doc)], None, title="t", source="s")
    focused = html.page(
        [history.Run("g1", tmp_path / "g1.json", doc)],
        history.Run("g1", tmp_path / "g1.json", doc),
        title="t",
        source="s",
    )
    assert "sweep-chart" not in page and '<svg id="sweep-chart"' in focused
    assert 'data-series="ttft_ms.p50"' in focused and "knee 20" in focused and "<script" not in focused

    slower = copy.deepcopy(smoke_doc)
    slower["smoke"]["sessions"][0]["sweep"]["rates"][0]["ttft_ms"]["p50"] = stored["rates"][0]["ttft_ms"]["p50"] * 2
    a = history.Run("a", tmp_path / "a.json", {**smoke_doc, "command": "smoke"})
    b = history.Run("b", tmp_path / "b.json", {**slower, "command": "smoke"})
    out = io.StringIO()
    runlines.show_comparison(rundiff.compare(a, b), UI(stream=out, force_plain=True))
    text = out.getvalue()
    assert "sweep (A -> B) at 2 shared rate(s):" in text and "knee: 20 req/s -> 20 req/s" in text
    assert "(+100.0%)" in text.split("2 req/s: TTFT p50")[1].split(";")[0]
    assert_nothing_left(rig)


def test_the_dry_run_lists_the_sweeps_checks(rig):
    import io

    from stackgate.commands import smoke
    from stackgate.flows.smoke import SmokeRequest
    from stackgate.render.ui import UI

    out = io.StringIO()
    request = SmokeRequest(spec_path=rig.spec(), rates=(2.0,), dry_run=True)
    assert smoke.run(request, UI(stream=out, force_plain=True)) == 0
    assert "smoke.sweep" in out.getvalue() and "smoke.goodput" in out.getvalue()
    assert rig.events("started") == []


def test_the_sweep_runs_through_vllm_s_completions_api_and_its_usage_counts(rig):
    rig.behave(rate=2000)
    spec = rig.spec(engine="vllm", tables=sweep_table(requests=4), benchmark={"output_tokens": 20, "warmup": 0})
    done = rig.run(spec, rates=(4.0,))
    results = by_name(done.results)
    assert results["smoke.sweep"].status == Status.PASS, results["smoke.sweep"].summary
    rate = done.sessions[0].sweep.rates[0]
    assert [s.sample.tokens for s in rate.sent] == [TOKENS] * 4
    # the prompt's length from the server's usage.prompt_tokens (the vLLM stand-in counts words)
    assert [s.sample.prompt_tokens for s in rate.sent] == [s.prompt.words for s in rate.sent]
    assert_nothing_left(rig)


def test_a_rate_is_bounded_by_its_seconds_and_a_refused_request_counts_as_failed():
    from smoke_support import free_port

    from stackgate.serve.bench import Streams

    chosen = Sweep(arrival="fixed", seconds=0.25, requests=10, input_tokens=(5, 5), output_tokens=(3, 3))
    made = prompts.PromptMaker(chosen).batch(0, 10)
    run = sweep.run_rate(f"http://127.0.0.1:{free_port()}", made, 10.0, chosen, streams=Streams())  # nothing listens
    assert [r.due_s for r in run.sent] == [0.0, 0.1, 0.2]  # due at 0.3 s and later: not sent
    assert run.failed == 3 and run.completed == [] and run.to_dict()["ttft_ms"]["p50"] is None
    assert (
        sweep.arrivals(4.0, 5, "poisson", 9)
        == sweep.arrivals(4.0, 5, "poisson", 9)
        != sweep.arrivals(4.0, 5, "poisson", 8)
    )


def test_a_short_dataset_is_said_and_the_summary_still_names_the_knee(rig, tmp_path):
    records = [{"conversations": [{"value": f"question {i} " * 20}, {"value": "word " * TOKENS}]} for i in range(2)]
    (tmp_path / "chats.json").write_text(json.dumps(records))
    rig.behave(**SERVICE)
    table = sweep_table(requests=3, dataset=str(tmp_path / "chats.json"))
    done = rig.run(rig.spec(tables=table, benchmark={"warmup": 0}), rates=(4.0,))
    result = by_name(done.results)["smoke.sweep"]
    assert (
        result.status == Status.PASS
        and result.summary == "1 rate(s); knee: none up to 4 req/s (median E2E stays within 1.5x the lowest rate's)"
    )
    assert result.details[-1] == "the dataset held fewer records than the requests sent: some prompts were sent twice"
    assert result.data["sweep"]["prompts_wrapped"] is True
