"""Smoke against the stand-in: the engine's /metrics kept with the report, the OpenAI chat endpoint,
speculative acceptance from the engine's own reports, and the accuracy check."""

from __future__ import annotations

import json

import pytest
from smoke_support import Rig, by_name
from specs import minimal_spec

from stackgate.models.result import Status
from stackgate.models.spec import SpecError, loads_spec
from stackgate.serve import accuracy

METRICS = ("--enable-metrics",)


@pytest.fixture(autouse=True)
def _fake_machine(rig, monkeypatch):
    """conftest's stand-in rig, its fake NVML machine named for the in-process smoke."""
    monkeypatch.setenv("STACKGATE_FAKE_NVML", str(rig.nvml_path))


def speculative(rig: Rig, extra: str = "") -> str:
    draft = rig.tmp / "draft"
    draft.mkdir(exist_ok=True)
    draft.joinpath("config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    return f'[smoke.speculative]\nalgorithm = "EAGLE3"\ndraft_model = "{draft}"\nnum_steps = 3\n{extra}\n'


def session_doc(done, index: int = -1):
    return json.loads(json.dumps(done.document(), allow_nan=False))["smoke"]["sessions"][index]


# --- /metrics ---------------------------------------------------------------------------------


def test_the_engines_metrics_are_scraped_before_and_after_and_kept_in_the_json(rig):
    done = rig.run(rig.spec(flags=METRICS, benchmark={"output_tokens": 40, "runs": 2, "warmup": 1}), benchmark=True)
    results = by_name(done.results)
    assert done.verdict.passed, {r.check: r.summary for r in done.results}
    found = results["smoke.metrics"]
    assert found.status == Status.PASS
    # the stand-in counted the warm-up and two runs of 40 tokens between the scrapes
    assert "sglang:num_requests_total: +3 requests during the run" in found.details
    assert "sglang:generation_tokens_total: +120 generated tokens during the run" in found.details
    kept = session_doc(done)["engine_metrics"]
    assert kept["problem"] is None and kept["before"]["at"] <= kept["after"]["at"]
    after = {s["name"]: s for s in kept["after"]["series"]}
    assert after["sglang:num_running_reqs"]["labels"] == {
        "engine_type": "unified",
        "model_name": str(rig.model),
        "pp_rank": "0",
        "tp_rank": "0",
    }
    assert kept["after"]["types"]["sglang:generation_tokens_total"] == "counter"


@pytest.mark.parametrize(
    "body, why",
    [
        ('sglang:x{a="1" 2\n', 'line 1: a label is not name="value"'),
        ("# TYPE sglang:x gauge\nsglang:x 1\nsglang:x one\n", "line 3: 'one' is not a number"),
        ("<html>\x1b[2J502 Bad Gateway</html>\n", "line 1: a sample does not start with a metric name: '<html>?[2J"),
    ],
)
def test_a_hostile_metrics_body_fails_the_metrics_check_with_its_line_and_nothing_else(rig, body, why):
    rig.behave(metrics_body=body)
    done = rig.run(rig.spec(flags=METRICS, benchmark={"output_tokens": 20, "runs": 2, "warmup": 0}), benchmark=True)
    results = by_name(done.results)
    found = results["smoke.metrics"]
    assert found.status == Status.FAIL
    assert found.summary.startswith(f"the engine's metrics could not be read: http://127.0.0.1:{rig.port}/metrics: ")
    assert why in found.summary and found.fix is not None
    assert results["smoke.benchmark"].status != Status.FAIL  # the measurement itself stands
    kept = session_doc(done)["engine_metrics"]
    assert kept["before"] is None and why in kept["problem"]


def test_without_enable_metrics_the_report_says_why_there_are_none_and_adds_no_result(rig):
    done = rig.run(rig.spec(benchmark={"output_tokens": 20, "runs": 2, "warmup": 0}), benchmark=True)
    assert "smoke.metrics" not in by_name(done.results)
    kept = session_doc(done)["engine_metrics"]
    assert kept["missing"] == (
        f"http://127.0.0.1:{rig.port}/metrics answered HTTP 404; SGLang serves it only with --enable-metrics"
    )


# --- the OpenAI chat endpoint -----------------------------------------------------------------


def test_the_benchmark_speaks_the_chat_endpoint_when_the_spec_asks(rig):
    bench = {"output_tokens": 50, "runs": 2, "warmup": 1, "api": "chat"}
    done = rig.run(rig.spec(benchmark=bench), benchmark=True)
    assert done.verdict.passed, {r.check: r.summary for r in done.results}
    runs = session_doc(done)["benchmark"]["runs"]
    assert [r["tokens"] for r in runs] == [50, 50] and all(r["finish_reason"] == "length" for r in runs)
    log = done.sessions[-1].log_path.read_text()
    # the warm-up and both runs went to the chat endpoint; /generate only served the server's own warm-up
    assert log.count('"POST /v1/chat/completions HTTP/1.1" 200') == 3
    assert log.count('"POST /generate HTTP/1.1" 200') == 1


def test_a_spec_names_only_a_known_benchmark_api(tmp_path):
    text = minimal_spec(name="x") + '\n[benchmark]\napi = "grpc"\n\n[accuracy]\nfloor = 1.5\n'
    with pytest.raises(SpecError) as raised:
        loads_spec(text, tmp_path / "x.toml")
    message = str(raised.value)
    assert "benchmark.api: must be one of native, chat, not 'grpc'" in message
    assert "accuracy.floor: must be a fraction in (0, 1], not 1.5" in message


# --- speculative acceptance -------------------------------------------------------------------


def test_acceptance_length_is_read_from_the_engines_meta_info_per_run_and_level(rig):
    rig.behave(accept_lengths=[3, 4])
    spec = rig.spec(tables=speculative(rig, "min_accept_length = 3.0"), benchmark={"output_tokens": 70, "warmup": 0})
    done = rig.run(spec, benchmark=True, concurrency=(1, 3))
    found = by_name(done.results)["smoke.speculative.acceptance"]
    assert found.status == Status.PASS, found.summary
    # 70 tokens in verify steps of 3, 4, 3, 4, ...: 20 steps, 3.5 tokens each
    assert found.summary == (
        "EAGLE3: 3.50 tokens per verify step, from per-request meta_info (completion_tokens / spec_verify_ct) "
        "(at least min_accept_length 3)"
    )
    assert found.data["levels"] == [{"streams": 1, "accept_length": 3.5}, {"streams": 3, "accept_length": 3.5}]
    assert session_doc(done)["benchmark"]["runs"][0]["spec_verify_ct"] == 20


def test_an_acceptance_length_below_the_floor_fails_with_the_draft_to_check(rig):
    rig.behave(accept_lengths=[1, 2])
    spec = rig.spec(tables=speculative(rig, "min_accept_length = 2.5"), benchmark={"output_tokens": 60, "warmup": 0})
    done = rig.run(spec, benchmark=True)
    found = by_name(done.results)["smoke.speculative.acceptance"]
    assert found.status == Status.FAIL and not done.verdict.passed
    assert found.summary.startswith("EAGLE3: 1.50 tokens per verify step") and "below min_accept_length 2.5" in (
        found.summary
    )
    assert "draft_model" in found.fix.text


def test_through_the_chat_endpoint_acceptance_comes_from_the_engines_gauge(rig):
    rig.behave(accept_lengths=[2, 3])
    bench = {"output_tokens": 50, "warmup": 0, "api": "chat"}
    done = rig.run(rig.spec(flags=METRICS, tables=speculative(rig), benchmark=bench), benchmark=True)
    found = by_name(done.results)["smoke.speculative.acceptance"]
    assert found.status == Status.PASS
    # 50 tokens in steps of 2, 3, ...: 20 steps; the gauge is the engine's tokens over verify steps
    assert found.summary == (
        "EAGLE3: 2.50 tokens per verify step, from the engine's sglang:spec_accept_length gauge after the run; "
        "no min_accept_length to judge it against"
    )


# --- accuracy ---------------------------------------------------------------------------------


def test_a_model_that_answers_the_shipped_set_passes_the_accuracy_floor(rig):
    _, items = accuracy.load_set()
    spec = rig.spec(benchmark={"output_tokens": 20, "runs": 2, "warmup": 0}, tables="[accuracy]\nfloor = 0.95\n")
    done = rig.run(spec, benchmark=True)
    found = by_name(done.results)["smoke.accuracy"]
    assert found.status == Status.PASS
    assert found.summary == f"{len(items)} of {len(items)} exact (100.0%) on stackgate-exact-16 (floor 95.0%)"
    kept = session_doc(done)["accuracy"]
    assert kept["answers"][0] == {"prompt": items[0].prompt, "expected": items[0].answer, "got": "42", "right": True}


@pytest.mark.parametrize("api", ["native", "chat"])
def test_wrong_answers_below_the_floor_fail_and_are_listed(rig, api):
    rig.behave(wrong_answer_rate=0.5)
    bench = {"output_tokens": 20, "runs": 2, "warmup": 0, "api": api}
    done = rig.run(rig.spec(benchmark=bench, tables="[accuracy]\nfloor = 0.9\n"), benchmark=True)
    found = by_name(done.results)["smoke.accuracy"]
    assert found.status == Status.FAIL and not done.verdict.passed
    wrong = [a for a in found.data["answers"] if not a["right"]]
    assert wrong and all(a["got"] == "I am not sure" for a in wrong)
    assert found.summary.endswith("below the floor 90.0%")
    assert found.details[0] == f"{wrong[0]['prompt']!r}: expected {wrong[0]['expected']!r}, got 'I am not sure'"


def test_the_dry_run_names_the_engine_report_checks_it_would_run(rig):
    from stackgate.flows.smokeplan import plan_smoke
    from stackgate.models.spec import load_spec
    from stackgate.serve import launch

    tables = speculative(rig) + "\n[accuracy]\nfloor = 0.9\n"
    spec = load_spec(rig.spec(flags=METRICS, tables=tables))
    configs = launch.configs(spec, model=None, tp=None, port=None, fast=False, compare=False)
    planned = plan_smoke(spec, configs, {}, measures=True, concurrency=False)
    assert planned[0].checks[-5:] == (
        "smoke.metrics",
        "smoke.speculative.acceptance",
        "smoke.accuracy",
        "smoke.teardown",
        "smoke.gpu_memory",
    )
    assert rig.events() == []


def test_metrics_missing_although_enable_metrics_was_given_is_a_warning_with_what_to_check(rig):
    rig.behave(metrics_404=True)
    done = rig.run(rig.spec(flags=METRICS, benchmark={"output_tokens": 20, "runs": 2, "warmup": 0}), benchmark=True)
    found = by_name(done.results)["smoke.metrics"]
    assert found.status == Status.WARN
    assert found.summary == (
        f"no engine metrics: http://127.0.0.1:{rig.port}/metrics answered HTTP 404, although --enable-metrics was given"
    )
    assert "--enable-metrics" in found.fix.text


def test_acceptance_with_neither_meta_info_nor_metrics_is_skipped_saying_how_to_get_it(rig):
    bench = {"output_tokens": 30, "runs": 2, "warmup": 0, "api": "chat"}
    done = rig.run(rig.spec(tables=speculative(rig), benchmark=bench), benchmark=True)
    found = by_name(done.results)["smoke.speculative.acceptance"]
    assert found.status == Status.SKIP
    assert found.summary.startswith("no acceptance length: the engine reported no spec_verify_ct")
    assert 'api = "native"' in found.summary and "--enable-metrics" in found.summary
