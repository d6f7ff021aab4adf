"""smoke's parts one by one: configurations, refusals, fast mode, the log watcher, what-runs checks,
statistics and verdicts, the quality guard, process trees and teardown."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fakes import fake_nvml
from fakes.fake_nvml import gpu, machine
from smoke_support import living, wait_for
from specs import minimal_spec

from stackgate.checks.smoke import logscan, serverinfo
from stackgate.edges.files import write_json
from stackgate.facts import serverlog
from stackgate.flows import smoke
from stackgate.models import secretargs
from stackgate.models.redact import REDACTED
from stackgate.models.result import Status
from stackgate.models.spec import Benchmark, Spec, loads_spec
from stackgate.serve import bench, benchstats, fastmode, launch, quality, ready
from stackgate.serve.procs import ProcessTree, ignores

#: The smoke tables of the spec :func:`make_lock` writes.
SMOKE = """[smoke]
model = "/models/m"
tp = 2
flags = ["--enable-flashinfer-allreduce-fusion", "--enable-torch-symm-mem", "--mem-fraction-static", "0.85"]
evidence = { "--enable-flashinfer-allreduce-fusion" = "FlashInfer workspace initialized" }
[smoke.env]
NCCL_P2P_LEVEL = "SYS"
"""


def make_spec(tmp_path: Path, tables: str = "") -> Spec:
    return loads_spec(minimal_spec(gpu_count=2, root=tmp_path / "stack", tail=f"{SMOKE}{tables}\n"))


# --- configurations ---------------------------------------------------------------------------


def test_the_command_is_explicit_about_every_choice(tmp_path):
    (config,) = launch.configs(make_spec(tmp_path), port=31000)
    assert config.argv(Path("/opt/stackgate/current/bin/python")) == [
        "/opt/stackgate/current/bin/python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/m",
        "--tp-size",
        "2",
        "--host",
        "127.0.0.1",
        "--port",
        "31000",
        "--attention-backend",
        "flashinfer",
        "--enable-flashinfer-allreduce-fusion",
        "--enable-torch-symm-mem",
        "--mem-fraction-static",
        "0.85",
    ]
    assert config.check("launch") == "smoke.launch" and config.base_url == "http://127.0.0.1:31000"


def test_the_default_compare_baseline_drops_the_fusion_flags_only(tmp_path):
    baseline, main = launch.configs(make_spec(tmp_path), compare=True, model="/m2", tp=1)
    assert baseline.flags == ("--enable-torch-symm-mem", "--mem-fraction-static", "0.85")
    assert baseline.evidence == {} and dict(main.evidence) == {
        "--enable-flashinfer-allreduce-fusion": "FlashInfer workspace initialized"
    }
    assert (baseline.label, baseline.model, baseline.tp, main.model, main.tp) == ("baseline", "/m2", 1, "/m2", 1)
    assert baseline.check("launch") == "smoke.baseline.launch"


def test_a_compare_table_describes_the_baseline(tmp_path):
    tables = (
        '[smoke.speculative]\nalgorithm = "NGRAM"\n[smoke.compare]\nname = "plain"\nflags = []\nspeculative = '
        "false\nattention_backend "
        '= "triton"\n[smoke.compare.env]\nNCCL_ALGO = "Ring"\n'
    )
    baseline, main = launch.configs(make_spec(tmp_path, tables), compare=True)
    assert (baseline.label, baseline.flags, baseline.speculative, baseline.attention_backend) == (
        "plain",
        (),
        None,
        "triton",
    )
    assert dict(baseline.env) == {"NCCL_P2P_LEVEL": "SYS", "NCCL_ALGO": "Ring"}
    assert main.speculative is not None and main.launch_flags()[-2:] == ("--speculative-algorithm", "NGRAM")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"model": ""}, "no model to launch"),
        ({"tp": 0}, "--tp must be 1 or more, not 0"),
        ({"port": 70000}, "--port must be a TCP port (1-65535), not 70000"),
    ],
)
def test_bad_options_are_usage_errors(tmp_path, kwargs, message):
    spec = make_spec(tmp_path)
    if kwargs.get("model") == "":
        spec = dataclasses.replace(spec, smoke=dataclasses.replace(spec.smoke, model=""))
    with pytest.raises(launch.LaunchError, match=re.escape(message)):
        launch.configs(spec, **kwargs)


def test_the_server_environment_is_the_shell_then_stackgate_env_then_smoke_env(tmp_path):
    spec = make_spec(tmp_path)
    spec.python.env_file.parent.mkdir(parents=True)
    spec.python.env_file.write_text(
        'export CUDA_HOME="/usr/local/cuda-13.0"\nexport PATH="$CUDA_HOME/bin:$PATH"\nexport NCCL_P2P_LEVEL="LOC"\n'
    )
    (config,) = launch.configs(spec)
    environ, ours = launch.server_env(spec, config, {"PATH": "/usr/bin", "HOME": "/root"})
    assert environ == {
        "PATH": "/usr/local/cuda-13.0/bin:/usr/bin",
        "HOME": "/root",
        "CUDA_HOME": "/usr/local/cuda-13.0",
        "NCCL_P2P_LEVEL": "SYS",
    }
    assert ours == {
        "CUDA_HOME": "/usr/local/cuda-13.0",
        "PATH": "/usr/local/cuda-13.0/bin:/usr/bin",
        "NCCL_P2P_LEVEL": "SYS",
    }


def test_a_session_shows_its_environment_and_server_info_with_the_secrets_hidden(tmp_path):
    (config,) = launch.configs(make_spec(tmp_path))
    key = "Zq9-served-key-1"
    environment = {
        "HF_TOKEN": "x",
        "WANDB_API_KEY": "y",
        "DB_PASSWORD": "z",
        "AWS_SECRET": "s",
        "CUDA_HOME": "/c",
        "SERVE_AUTH": key,
    }
    info = {"api_key": key, "admin_api_key": None, "tokenizer_path": "/m", "max_total_num_tokens": 5}
    session = smoke.Session(
        config, argv=("sglang", "--api-key", "${SERVE_AUTH}"), api_key=key, environment=environment, server_info=info
    )
    shown = session.to_dict()
    assert shown["environment"] == {"CUDA_HOME": "/c", "HF_TOKEN": REDACTED}  # what explains a run, its secrets hidden
    # the rest: names only
    assert shown["environment_names_only"] == ["AWS_SECRET", "DB_PASSWORD", "SERVE_AUTH", "WANDB_API_KEY"]
    assert shown["server_info"] == {**info, "api_key": REDACTED} and shown["command"] == [
        "sglang",
        "--api-key",
        "${SERVE_AUTH}",
    ]  # a reference is shown
    assert key not in json.dumps(shown)


# --- refusals ---------------------------------------------------------------------------------


def test_a_port_in_use_is_refused_and_a_free_one_passes(tmp_path):
    (config,) = launch.configs(make_spec(tmp_path))
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = dataclasses.replace(config, port=squatter.getsockname()[1])
        assert launch.check_port(taken).status == Status.FAIL
    assert launch.check_port(taken).status == Status.PASS


def test_gpus_are_counted_through_nvml_and_cuda_visible_devices(tmp_path):
    (config,) = launch.configs(make_spec(tmp_path))  # TP 2
    fake_nvml.configure(machine([gpu(uuid="GPU-aaa"), gpu(uuid="GPU-bbb")]))
    try:
        assert launch.check_gpus(config, {}, fake_nvml).summary == "2 GPU(s) visible for TP 2"
        assert launch.check_gpus(config, {"CUDA_VISIBLE_DEVICES": "GPU-bbb"}, fake_nvml).status == Status.FAIL
        fake_nvml.configure({**machine([]), "init_error": "NVML_ERROR_LIBRARY_NOT_FOUND"})
        unknown = launch.check_gpus(config, {}, fake_nvml)
    finally:
        fake_nvml.configure(None)
    assert unknown.status == Status.WARN
    assert unknown.summary.startswith("cannot count the GPUs (NVML not usable: ") and unknown.summary.endswith(
        "); launching anyway"
    )


def test_the_nvml_module_can_be_named_in_the_environment(tmp_path, monkeypatch):
    spec = tmp_path / "nvml.json"
    spec.write_text(json.dumps(machine([gpu()])))
    monkeypatch.setenv("STACKGATE_FAKE_NVML", str(spec))
    monkeypatch.setenv("STACKGATE_NVML_MODULE", "fakes.fake_nvml")
    (config,) = launch.configs(make_spec(tmp_path))
    assert launch.check_gpus(config, {}).summary == "TP 2 needs 2 GPUs but 1 are visible; nothing was launched"


# --- fast mode --------------------------------------------------------------------------------


def model_dir(tmp_path: Path, **config: object) -> Path:
    tmp_path.joinpath("config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize(
    "config, layers, override",
    [
        ({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 80}, 4, {"num_hidden_layers": 4}),
        (
            {"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 61, "first_k_dense_replace": 3},
            2,
            {"num_hidden_layers": 4},
        ),
        ({"architectures": ["ChatGLMModel"], "num_layers": 28}, 4, {"num_layers": 4}),
        ({"architectures": ["GPT2LMHeadModel"], "n_layer": 12}, 4, {"n_layer": 4}),
        ({"architectures": ["Tiny"], "num_hidden_layers": 2}, 4, {"num_hidden_layers": 2}),
    ],
    ids=["llama", "deepseek-keeps-a-moe-layer", "chatglm", "gpt2", "already-small"],
)
def test_fast_mode_shrinks_the_model_s_own_layer_key(tmp_path, config, layers, override):
    assert dict(fastmode.shrink(model_dir(tmp_path, **config), layers).override) == override


@pytest.mark.parametrize(
    "config, message",
    [
        (
            {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": {"num_hidden_layers": 61}},
            "counts its layers in text_config",
        ),
        ({"architectures": ["Mystery"]}, "has none of num_hidden_layers, num_layers, n_layers, n_layer"),
    ],
)
def test_fast_mode_says_why_it_cannot_shrink_a_model(tmp_path, config, message):
    with pytest.raises(fastmode.FastModeError, match=message):
        fastmode.shrink(model_dir(tmp_path, **config), 4)


# --- the log ----------------------------------------------------------------------------------


def test_the_watcher_follows_partial_lines_progress_bars_phases_and_evidence(tmp_path):
    log = tmp_path / "server.log"
    watcher = serverlog.LogWatcher(
        log,
        context={"lock_backend": "flashinfer"},
        evidence={"--fusion": r"FlashInfer workspace initialized for rank \d+"},
    )
    assert watcher.poll() == [] and watcher.phase == "launching"  # no file yet
    with open(log, "a") as out:
        out.write(
            (
                "[2026-01-12 10:00:00 TP0] Load weight begin. avail mem=93.52 GB\n\rLoading safetensors checkpoint "
                "shards:  "
                "25% Comp"
            )
        )
    watcher.poll()
    assert watcher.phase == "loading weights"  # the bar's line is not complete yet
    with open(log, "a") as out:
        out.write(
            (
                "leted\rLoading safetensors checkpoint shards: 100% Completed\n[2026-01-12 10:00:09 TP1] FlashInfer "
                "workspace "
                "initialized for rank 1, world_size 2\n"
            )
        )
    watcher.poll()
    assert watcher.phase == "loading weights (100%)"
    assert watcher.last_lines() == [
        "[2026-01-12 10:00:00 TP0] Load weight begin. avail mem=93.52 GB",
        "Loading safetensors checkpoint shards: 100% Completed",
        "[2026-01-12 10:00:09 TP1] FlashInfer workspace initialized for rank 1, world_size 2",
    ]
    (evidence,) = watcher.evidence
    assert evidence.seen and evidence.line == 4


def test_the_cause_is_the_specific_error_not_the_wrapper(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(
        "[2026-01-12 10:00:09 TP3] Scheduler hit an exception: Traceback (most recent call last):\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB.\n"
        "[2026-01-12 10:00:09] Received sigquit from a child process. It usually means the child failed.\n"
    )
    watcher = serverlog.LogWatcher(log)
    watcher.poll()
    assert watcher.fatal.id == "sglang-scheduler-exception"  # the first to stop on
    assert watcher.cause.id == "cuda-out-of-memory"  # the one to report
    results = logscan.finding_results(watcher.findings, "log", lock_backend="flashinfer")
    assert [r.check for r in results] == [
        "log.cuda-out-of-memory",
        "log.sglang-scheduler-exception",
        "log.sglang-child-failed",
    ]
    assert results[0].summary == "A GPU ran out of memory while serving" and results[0].data["finding"]["evidence"] == {
        "file": str(log),
        "line": 2,
        "start_line": 2,
        "count": 1,
        "lines": ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB."],
    }


def test_a_default_backend_equal_to_the_lock_s_is_only_a_warning(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("[2026-01-12 10:00:01] Attention backend not specified. Use flashinfer backend by default.\n")
    watcher = serverlog.LogWatcher(log, context={"lock_backend": "flashinfer"})
    watcher.poll()
    (result,) = logscan.finding_results(watcher.findings, "log", lock_backend="flashinfer")
    assert result.status == Status.WARN


# --- what really runs -------------------------------------------------------------------------


def test_a_secret_flag_is_compared_but_its_value_is_never_shown():
    info = {"api_key": "sk-right", "admin_api_key": None}
    good = serverinfo.check_flags(info, ["--api-key", "sk-right"])
    assert good.status == Status.PASS and good.details == ("--api-key: api_key='<redacted>'",)
    wrong = serverinfo.check_flags(info, ["--api-key=sk-wrong", "--admin-api-key", "adm"])
    assert wrong.status == Status.FAIL
    assert wrong.details == (
        "--api-key: asked '<redacted>', the server runs api_key='another value'",
        "--admin-api-key: asked '<redacted>', the server runs admin_api_key=None",
    )
    assert "sk-" not in json.dumps(wrong.to_dict()) and "adm'" not in json.dumps(wrong.to_dict())


def test_a_secret_option_may_name_a_variable_and_an_unset_one_is_refused():
    words = ["--mem-fraction-static", "0.8", "--api-key", "${SERVE_AUTH}"]
    assert secretargs.resolve(words, {"SERVE_AUTH": "sk-9"})[-1] == "sk-9"
    assert secretargs.shown(words) == words  # a reference is not a secret
    assert secretargs.shown(["--api-key", "sk-9"]) == ["--api-key", "<redacted>"]
    with pytest.raises(
        secretargs.SecretArgError,
        match=re.escape("--api-key refers to $SERVE_AUTH, which the server's environment does not set"),
    ):
        secretargs.resolve(words, {})


def test_the_evidence_cannot_be_judged_at_a_log_level_that_hides_info_lines():
    unseen = serverlog.FlagSighting("--enable-flashinfer-allreduce-fusion", "FlashInfer workspace initialized")
    info = {"enable_flashinfer_allreduce_fusion": True, "log_level": "info"}
    assert serverinfo.check_evidence(unseen, info).status == Status.FAIL
    quiet = serverinfo.check_evidence(unseen, {**info, "log_level": "warning"})
    assert (
        quiet.status == Status.WARN
        and "cannot be told: the server logs at --log-level warning, which hides INFO lines" in quiet.summary
    )
    assert (
        serverinfo.check_evidence(unseen, None, ["--log-level", "error"]).status == Status.WARN
    )  # no /server_info: the flag says
    seen = dataclasses.replace(unseen, line=7, text="FlashInfer workspace initialized for rank 0")
    assert serverinfo.check_evidence(seen, {**info, "log_level": "warning"}).status == Status.PASS


def test_flags_are_compared_with_the_server_s_resolved_values():
    info = {
        "enable_torch_symm_mem": True,
        "mem_fraction_static": 0.85,
        "cuda_graph_bs": [1, 2, 4],
        "json_model_override_args": '{"num_hidden_layers": 4}',
    }
    words = [
        "--enable-torch-symm-mem",
        "--mem-fraction-static",
        "0.85",
        "--cuda-graph-bs",
        "1",
        "2",
        "4",
        "--json-model-override-args",
        '{"num_hidden_layers":4}',
    ]
    assert serverinfo.check_flags(info, words).status == Status.PASS
    wrong = serverinfo.check_flags({**info, "enable_torch_symm_mem": False}, words)
    assert wrong.status == Status.FAIL and wrong.details == (
        "--enable-torch-symm-mem: asked True, the server runs enable_torch_symm_mem=False",
    )
    unknown = serverinfo.check_flags(info, ["--tp", "2"])
    assert unknown.status == Status.WARN and unknown.details == ("--tp: /server_info has no field 'tp'",)


def test_another_server_answering_on_the_port_fails():
    result = serverinfo.check_identity(
        {"port": 30001, "model_path": "/other", "version": "0.5.9"}, "/server_info", 30000, "/models/m"
    )
    assert result.status == Status.FAIL and result.summary.endswith("another server answered")


# --- statistics and verdicts ------------------------------------------------------------------


def sample(
    tokens: int, seconds: float, asked: int = 100, ids: tuple[int, ...] = (1, 2, 3), error: str | None = None
) -> bench.Sample:
    return bench.Sample(asked, tokens, 0.0, seconds, 0.05, 1, tokens, ids, None, error)


def figures(*samples: bench.Sample, stopped: str | None = None) -> bench.BenchFigures:
    return bench._figures([], list(samples), stopped)


def test_the_verdict_names_the_measured_and_the_baseline_figures():
    slow = figures(sample(100, 1.3), sample(100, 1.3))  # decode 99 tokens in 1.25 s = 79.2 tok/s
    spec = Benchmark(output_tokens=100, baseline_tok_s=92.6, max_regression=0.03)
    verdict, short = bench.judge(slow, spec)
    assert verdict.status == Status.FAIL and short is None
    assert verdict.summary == (
        "decode 79.20 tok/s is 14.5% below the baseline 92.6 tok/s (allowed: 3.0%, floor 89.82); end-to-end "
        "76.92 "
        "tok/s with time to first token"
    )
    fine, _ = bench.judge(figures(sample(100, 1.12), sample(100, 1.12)), spec)
    assert (
        fine.status == Status.PASS
        and fine.summary
        == "decode 92.52 tok/s vs baseline 92.6 (-0.1%; allowed -3.0%); end-to-end 89.29 tok/s with time to first token"
    )


def timed(tokens: int, ttft_s: float, decode_tok_s: float) -> bench.Sample:
    """A run whose first token came after ``ttft_s`` and the rest at ``decode_tok_s``."""
    return bench.Sample(tokens, tokens, 0.0, ttft_s + (tokens - 1) / decode_tok_s, ttft_s, 1, tokens)


def test_the_baseline_judges_the_decode_rate_and_reports_the_end_to_end_rate_beside_it():
    # The case: decode 2.9% under the baseline (3% allowed), end-to-end 3.6% under at 512 tokens.
    baseline = 100.0
    run = timed(512, 0.0486, baseline * 0.971)  # TTFT 49 ms
    assert run.decode_tok_s / baseline - 1 == pytest.approx(-0.029) and run.tok_s / baseline - 1 == pytest.approx(
        -0.036, abs=0.0005
    )
    verdict, _ = bench.judge(
        figures(run, run), Benchmark(output_tokens=512, baseline_tok_s=baseline, max_regression=0.03)
    )
    assert verdict.status == Status.PASS
    assert (
        verdict.summary
        == "decode 97.10 tok/s vs baseline 100 (-2.9%; allowed -3.0%); end-to-end 96.40 tok/s with time to first token"
    )
    assert verdict.details[:2] == (
        "decode: 97.10 tok/s (median 97.10, CV 0.0%, 95% CI 97.10-97.10, n=2)",
        "end-to-end (with time to first token): 96.40 tok/s (median 96.40, CV 0.0%, 95% CI 96.40-96.40, n=2)",
    )
    assert verdict.data["judged"] == "decode_tok_s" and verdict.data["change"] == -0.029


def test_the_compare_baseline_is_measured_but_not_judged_against_baseline_tok_s():
    slow = figures(sample(100, 1.3), sample(100, 1.3))
    verdict, _ = bench.judge(slow, Benchmark(output_tokens=100, baseline_tok_s=92.6), against_baseline=False)
    assert verdict.status == Status.PASS
    assert verdict.summary.startswith(
        "decode 79.20 tok/s (end-to-end 76.92): measured for the comparison, not judged against baseline_tok_s"
    )


def test_one_run_has_no_interval_and_the_json_says_null_not_infinity():
    one = benchstats.summarize([92.5])
    assert (one.to_dict()["ci_low"], one.to_dict()["ci_high"]) == (None, None)
    assert one.to_dict()["ci_note"] == "no confidence interval from 1 value(s): ci_low and ci_high are null"
    assert one.text() == "92.50 tok/s (median 92.50, CV 0.0%, 95% CI n/a (n=1), n=1)"
    level = bench.Level(1, (timed(10, 0.01, 100.0),))
    json.dumps(level.to_dict(), allow_nan=False)  # strict JSON: Infinity would raise
    diff = benchstats.difference(one, benchstats.summarize([90.0, 91.0]))
    assert not diff.significant and diff.to_dict()["ci"] == [None, None] and "no 95% CI" in diff.text()


def test_the_json_writer_refuses_what_is_not_json(tmp_path):
    with pytest.raises(ValueError, match="not JSON compliant"):
        write_json(tmp_path / "r.json", {"ci_low": float("-inf")})
    assert not (tmp_path / "r.json").exists()


def test_a_level_reports_ttft_and_inter_token_latency_percentiles():
    # Two streams: TTFT 0.1 and 0.3 s; one token per event 10 ms apart, then a 4-token burst after 40 ms.
    events = [(0.1, 1), (0.11, 2), (0.12, 3), (0.16, 7)]
    streams = []
    for shift in (0.0, 0.2):
        reader = bench._Reader(asked=7, incremental_ids=False)
        for arrival, count in events:
            reader.event(arrival + shift, b'{"meta_info":{"completion_tokens":%d}}' % count)
        reader.event(1.0, b"[DONE]")
        streams.append(reader.sample(0.0))
    assert streams[0].gaps == pytest.approx([0.01, 0.01, 0.01, 0.01, 0.01, 0.01])  # a burst's gap split over its tokens
    level = bench.Level(2, tuple(streams))
    assert level.ttft_s() == pytest.approx({"p50": 0.2, "p90": 0.28, "p99": 0.298})
    assert level.itl_s() == pytest.approx({"p50": 0.01, "p90": 0.01, "p99": 0.01})
    assert set(level.to_dict()) >= {"ttft_s", "itl_s"}


def test_without_a_baseline_the_figure_is_recorded_but_not_judged():
    verdict, _ = bench.judge(figures(sample(100, 1.0)), Benchmark(output_tokens=100))
    assert verdict.status == Status.SKIP and "no baseline_tok_s" in verdict.summary


def test_a_short_run_is_flagged_and_left_out_of_the_figures():
    done = figures(sample(100, 1.0), sample(90, 0.5))
    assert done.tok_s.n == 1 and done.tok_s.mean == 100.0
    _, short = bench.judge(done, Benchmark(output_tokens=100))
    assert short.status == Status.WARN and short.details == (
        "run 2: 90 tokens in 0.500 s = 180.00 tok/s; TTFT 50 ms; decode 197.78 tok/s  SHORT (90 of 100)",
    )


def test_a_stopped_benchmark_fails_with_its_reason():
    verdict, _ = bench.judge(
        figures(sample(10, 0.1, error="cut"), stopped="run 1 failed: the server exited with code -9"),
        Benchmark(output_tokens=100),
    )
    assert verdict.summary == "the benchmark stopped: run 1 failed: the server exited with code -9"


def test_the_reader_counts_tokens_from_completion_tokens_and_keeps_the_last_ids():
    reader = bench._Reader(asked=6, incremental_ids=False)
    events = [
        b'{"text":"a","output_ids":[1,2,3],"meta_info":{"completion_tokens":3}}',
        (
            b'{"text":"a '
            b'b","output_ids":[1,2,3,4,5,6],"meta_info":{"finish_reason":{"type":"length","length":6},"completion_tokens":6}}'
        ),
        b"[DONE]",
    ]
    for t, data in zip((1.0, 2.0, 2.0), events, strict=True):
        if reader.event(t, data):
            break
    got = reader.sample(0.0)
    assert (got.tokens, got.first_tokens, got.output_ids, got.finish_reason, got.error) == (
        6,
        3,
        (1, 2, 3, 4, 5, 6),
        {"type": "length", "length": 6},
        None,
    )
    assert got.decode_tok_s == 3.0  # three tokens after the first event, one second later


def test_the_reader_reports_a_server_error_and_a_missing_done():
    reader = bench._Reader(asked=6, incremental_ids=False)
    assert reader.event(1.0, b'{"error": {"message": "The input is too long"}}')
    assert reader.sample(0.0).error == "the server reported an error: The input is too long"
    cut = bench._Reader(asked=6, incremental_ids=True)
    cut.event(1.0, b'{"output_ids":[7,8],"meta_info":{"completion_tokens":2}}')
    cut.event(1.5, b'{"output_ids":[9],"meta_info":{"completion_tokens":3}}')
    got = cut.sample(0.0)
    assert got.output_ids == (7, 8, 9) and got.error == "the stream ended without [DONE] after 3 of 6 tokens"


# --- the quality guard ------------------------------------------------------------------------


def test_repeated_greedy_runs_must_agree():
    same = [sample(100, 1.0, ids=(1, 2, 3, 4))] * 3
    assert quality.check_repeatable(same).status == Status.PASS
    other = [*same, sample(100, 1.0, ids=(1, 2, 9, 9))]
    result = quality.check_repeatable(other)
    assert result.status == Status.WARN and result.details == (
        "run 4 vs run 1: first 2 of 4 tokens identical, then diverge (50.0% of positions agree)",
    )
    assert quality.check_repeatable(same[:1]).status == Status.SKIP


# --- processes and teardown -------------------------------------------------------------------

STUBBORN = "trap '' TERM; (trap '' TERM; setsid sleep 60) & sleep 60 & wait"


def test_teardown_escalates_to_sigkill_and_finds_a_worker_that_left_the_group(tmp_path):
    server = launch.start(["bash", "-c", STUBBORN], dict(os.environ), tmp_path / "server.log")
    deadline = time.monotonic() + 5
    while len(server.tree.scan()) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    seen = server.tree.scan()
    assert len(seen) >= 3
    done = launch.stop(server, grace_s=0.5)
    assert done.how.startswith("SIGKILL after 0.") and done.leftovers == () and done.exit_code == -signal.SIGKILL
    assert living(seen) == []


def test_an_interrupt_during_the_grace_period_goes_straight_to_sigkill(tmp_path):
    server = launch.start(["bash", "-c", "trap '' TERM; sleep 60 & wait"], dict(os.environ), tmp_path / "server.log")
    wait_for(lambda: ignores(server.pid, signal.SIGTERM))  # the trap is in place before stop's SIGTERM

    # The Ctrl-C is armed once stop is waiting out the grace period (its notice after NOTICE_S), so a
    # loaded machine cannot deliver it before stop began.
    def ctrl_c_soon(_grace_s: float) -> None:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()

    done = launch.stop(server, grace_s=30.0, on_wait=ctrl_c_soon)
    assert done.interrupted and done.how.startswith("SIGKILL after") and done.leftovers == ()
    assert server.teardown is done


def test_a_failed_request_s_last_look_is_taken_in_the_caller_s_thread(tmp_path):
    server = launch.start(["bash", "-c", "exit 3"], dict(os.environ), tmp_path / "server.log")
    server.process.wait()
    cut = []
    monitor = ready.Monitor(
        server, serverlog.LogWatcher(tmp_path / "server.log"), cut.append
    )  # its thread never started: a starved watcher
    assert monitor.wait_failure(0.0) == "the server exited with code 3"
    assert cut == ["the server exited with code 3"] and monitor.failed_at is not None


def test_teardown_says_when_the_server_had_already_ended_and_what_it_left_behind(tmp_path):
    server = launch.start(
        ["bash", "-c", "sleep 60 & sleep 60 & kill -KILL $$"], dict(os.environ), tmp_path / "server.log"
    )
    server.process.wait()
    done = launch.stop(server, grace_s=2.0)
    assert done.ended_before and done.exit_code == -signal.SIGKILL
    assert len(done.orphans) == 2 and all("sleep 60" in o for o in done.orphans)
    assert done.how == "SIGTERM" and done.stubborn == () and done.leftovers == ()


def test_a_process_tree_remembers_children_by_start_time(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        tree = ProcessTree(child.pid)
        assert tree.scan() == [child.pid] and tree.alive() == [child.pid]
    finally:
        child.kill()
        child.wait()
    assert tree.alive() == []
