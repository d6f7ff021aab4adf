"""The serving-engine registry (stackgate/models/engines) and vLLM, the second engine, end to end.

vLLM runs as tests/fakes/vllm's stand-in, started with the real command line the registry builds
(``python -m vllm.entrypoints.cli.main serve MODEL ...``), speaking vLLM 0.33.0's log lines,
/health, /v1/models and the streaming /v1/completions API; the rig is smoke's own
(tests/smoke_support.py), with the same behaviour file as the SGLang stand-in.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest
from smoke_support import ROOT, Rig, assert_nothing_left, free_port, living
from specs import minimal_spec

from stackgate.checks.smoke import serverinfo
from stackgate.models import engines
from stackgate.models.result import Status
from stackgate.models.spec import SpecError, loads_spec

FUSION = "--compilation-config.pass_config.fuse_allreduce_rms"


@pytest.fixture
def rig(tmp_path, monkeypatch):
    made = Rig(tmp_path, free_port())
    monkeypatch.setenv("STACKGATE_FAKE_NVML", str(made.nvml_path))
    yield made
    for pid in living(made.processes()):
        os.kill(pid, signal.SIGKILL)


def cli(rig: Rig, *args: str) -> tuple[int, str, str]:
    env = {**rig.environ(), "STACKGATE_LOG_DIR": str(rig.runs)}
    done = subprocess.run(
        [sys.executable, "-m", "invoke", "smoke", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=90
    )
    return done.returncode, done.stdout, done.stderr


def results(done) -> dict[str, object]:
    return {r.check: r for r in done.results}


# --- the registry and the spec ------------------------------------------------------------------


def test_each_engine_spells_its_own_launch():
    vllm = engines.get("vllm")
    assert vllm.argv("py", "/m", 2, "127.0.0.1", 8000, "flashinfer") == [
        "py", "-m", "vllm.entrypoints.cli.main", "serve", "/m", "--tensor-parallel-size", "2",
        "--host", "127.0.0.1", "--port", "8000", "--attention-backend", "flashinfer",
    ]  # fmt: skip
    assert engines.get("sglang").argv("py", "/m", 1, "h", 1, "fa3")[1:5] == [
        "-m", "sglang.launch_server", "--model-path", "/m",
    ]  # fmt: skip
    assert (vllm.memory_flag, vllm.default_port, vllm.ready_line) == (
        "--gpu-memory-utilization",
        8000,
        "Application startup complete.",
    )
    assert vllm.fast_flags({"num_hidden_layers": 4}) == (
        "--load-format",
        "dummy",
        "--hf-overrides",
        '{"num_hidden_layers": 4}',
    )


def test_sglang_s_fusion_evidence_follows_the_installed_release():
    # sglang-0.5.9 wheel: srt/layers/flashinfer_comm_fusion.py:73 logs "FlashInfer workspace initialized for rank
    # {rank}, world_size {world_size}"; sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl, the same file, :580
    # logs "FlashInfer AllReduce Fusion enabled and workspace initialized: backend=..., rank=..., ...".
    sglang = engines.get("sglang")
    old, new = sglang.at("0.5.9"), sglang.at("0.5.23")
    assert old is sglang and old.fusion_evidence == "FlashInfer workspace initialized for rank"
    assert new.version == "0.5.23" and new.label == "SGLang 0.5.23" and new.source.startswith("sglang-0.5.23 wheel")
    line = "FlashInfer AllReduce Fusion enabled and workspace initialized: backend=trtllm, rank=0, world_size=2"
    assert re.search(new.fusion_evidence, line) and not re.search(old.fusion_evidence, line)
    assert sglang.at("0.6.1").fusion_evidence == new.fusion_evidence  # a later release keeps the latest known line
    assert sglang.at(None) is sglang and sglang.at("not a version") is sglang  # nothing installed: as described
    assert new.fusion_flag == sglang.fusion_flag and new.phases == sglang.phases


def test_an_unknown_engine_is_refused_when_the_spec_loads_with_a_suggestion():
    with pytest.raises(SpecError) as caught:
        loads_spec(minimal_spec(gpu_count=1, interpreter="/usr/bin/python3") + '\n[smoke]\nengine = "sglng"\n')
    assert caught.value.problems == [
        "smoke.engine: unknown engine 'sglng': did you mean 'sglang'? (known: sglang, vllm)"
    ]


@pytest.mark.parametrize(
    "value, problem",
    [
        ("3", "smoke.engine: must be a string, not an integer"),
        ('["vllm"]', "smoke.engine: must be a string, not an array"),
        ('"VLLM"', "smoke.engine: unknown engine 'VLLM': did you mean 'vllm'? (known: sglang, vllm)"),
    ],
    ids=["integer", "array", "wrong-case"],
)
def test_a_hostile_engine_value_is_a_bad_spec_naming_the_key(value, problem):
    with pytest.raises(SpecError) as caught:
        loads_spec(minimal_spec(gpu_count=1, interpreter="/usr/bin/python3") + f"\n[smoke]\nengine = {value}\n")
    assert caught.value.problems == [problem]


def test_a_vllm_spec_takes_vllm_s_port_fusion_evidence_and_managed_flags():
    spec = loads_spec(
        minimal_spec(gpu_count=2, interpreter="/usr/bin/python3")
        + f'\n[smoke]\nengine = "vllm"\nflags = ["{FUSION}=true"]\n'
    )
    assert (spec.smoke.engine, spec.smoke.port) == ("vllm", 8000)
    assert dict(spec.smoke.evidence) == {FUSION: engines.get("vllm").fusion_evidence}
    with pytest.raises(SpecError) as caught:
        loads_spec(
            minimal_spec(gpu_count=2, interpreter="/usr/bin/python3")
            + '\n[smoke]\nengine = "vllm"\nflags = ["--hf-overrides", "{}"]\n'
        )
    assert "--hf-overrides is set by smoke from fast mode (--fast)" in caught.value.problems[0]


def test_the_flag_check_names_the_endpoint_that_answered():
    result = serverinfo.check_flags({"root": "/m"}, ["--max-num-seqs", "8"], "/v1/models")
    assert list(result.details) == ["--max-num-seqs: /v1/models has no field 'max_num_seqs'"]


# --- the command line -----------------------------------------------------------------------------


def test_sglng_is_exit_2_with_a_suggestion_and_launches_nothing(rig):
    spec = rig.spec()
    spec.write_text(spec.read_text().replace("[smoke]\n", '[smoke]\nengine = "sglng"\n', 1))
    code, _, err = cli(rig, "--lock", str(spec), "--dry-run")
    assert code == 2
    assert "smoke.engine: unknown engine 'sglng': did you mean 'sglang'?" in err
    assert rig.events() == []


def test_dry_run_prints_vllm_s_command_environment_and_checks_and_launches_nothing(rig):
    spec = rig.spec(
        engine="vllm",
        tp=2,
        flags=(f"{FUSION}=true", "--api-key", "sk-live-123"),
        env={"HF_TOKEN": "hf_secret_value"},
    )
    code, out, err = cli(rig, "--lock", str(spec), "--dry-run", "--benchmark")
    assert code == 0, out + err
    assert (
        f"  command: {sys.executable} -m vllm.entrypoints.cli.main serve {rig.model} --tensor-parallel-size 2 "
        f"--host 127.0.0.1 --port {rig.port} --attention-backend flashinfer {FUSION}=true --api-key <redacted>"
    ) in out
    assert "[lock] engine: vLLM 0.33.0" in out
    assert "  VLLM_LOGGING_LEVEL=DEBUG" in out  # the fusion pass's proof is written at DEBUG only
    assert "hf_secret_value" not in out and "sk-live-123" not in out + err
    assert f"smoke.evidence.{FUSION.lstrip('-')}, smoke.log, smoke.benchmark, smoke.teardown" in out
    assert rig.events() == [] and not list(rig.runs.rglob("*.log"))


def test_dry_run_for_sglang_prints_the_command_smoke_launches(rig):
    code, out, _ = cli(rig, "--lock", str(rig.spec()), "--dry-run")
    assert code == 0
    assert f" -m sglang.launch_server --model-path {rig.model} --tp-size 1 --host 127.0.0.1 --port {rig.port}" in out
    assert rig.events() == []


def test_smoke_benchmark_passes_against_vllm_exit_0(rig):
    spec = rig.spec(engine="vllm", benchmark={"output_tokens": 40, "baseline_tok_s": 5})
    code, out, err = cli(rig, "--lock", str(spec), "--benchmark")
    assert code == 0, out + err
    assert "PASS  smoke.benchmark" in out and "PASS  smoke.server_info" in out
    assert "waiting for vLLM (lock, TP 1, pid " in err
    assert_nothing_left(rig)


# --- vLLM end to end ----------------------------------------------------------------------------


def test_vllm_launches_streams_and_is_told_ready_from_its_own_log(rig):
    rig.behave(rate=4000)
    spec = rig.spec(engine="vllm", flags=("--api-key", "sk-vllm"), benchmark={"output_tokens": 40, "baseline_tok_s": 5})
    done = rig.run(spec, benchmark=True)
    found = results(done)
    assert done.verdict.exit_code == 0, [(r.check, r.summary) for r in done.results]
    session = done.sessions[0]
    assert session.argv[1:5] == ("-m", "vllm.entrypoints.cli.main", "serve", str(rig.model))
    assert session.readiness is not None and session.readiness.phase == "ready"
    assert found["smoke.server_info"].summary == "vLLM reports its configuration (/v1/models)"
    assert found["smoke.tp_size"].status == Status.SKIP
    runs = session.figures.runs if session.figures else []
    assert runs and all(r.tokens == 40 and r.finish_reason == "length" for r in runs)
    assert_nothing_left(rig)


def test_vllm_too_slow_fails_the_benchmark(rig):
    rig.behave(rate=400)
    spec = rig.spec(engine="vllm", benchmark={"output_tokens": 20, "baseline_tok_s": 50000, "runs": 2})
    done = rig.run(spec, benchmark=True)
    assert done.sessions[0].argv[2] == "vllm.entrypoints.cli.main"
    assert done.verdict.exit_code == 1
    assert results(done)["smoke.benchmark"].status == Status.FAIL
    assert "below the baseline 50000 tok/s" in results(done)["smoke.benchmark"].summary
    assert_nothing_left(rig)


def test_vllm_fusion_declined_on_sm120_fails_and_names_the_pass_that_declined(rig):
    rig.gpus(2)
    rig.behave(capability=120)
    spec = rig.spec(engine="vllm", tp=2, flags=(f"{FUSION}=true",), benchmark={"baseline_tok_s": 5})
    done = rig.run(spec, benchmark=True)
    found = results(done)
    evidence = found[f"smoke.evidence.{FUSION.lstrip('-')}"]
    assert done.verdict.exit_code == 1
    assert evidence.status == Status.FAIL
    assert "the engine declined the fused path: vLLM's AllReduceFusionPass" in evidence.summary
    assert "FI_ALLREDUCE_FUSION_MAX_SIZE_MB has sizes for compute capability 90 and 100 only" in evidence.summary
    assert "Flashinfer allreduce fusion is not supported for world size 2" in evidence.data["declined"]
    assert found["smoke.benchmark"].status == Status.SKIP  # decided at ready time: nothing is measured
    assert_nothing_left(rig)


def test_vllm_fusion_on_sm90_is_proven_by_its_debug_line(rig):
    rig.gpus(2)
    rig.behave(capability=90, rate=4000)
    spec = rig.spec(
        engine="vllm", tp=2, flags=(f"{FUSION}=true",), benchmark={"output_tokens": 40, "baseline_tok_s": 5}
    )
    done = rig.run(spec, benchmark=True)
    evidence = results(done)[f"smoke.evidence.{FUSION.lstrip('-')}"]
    assert evidence.status == Status.PASS, evidence.summary
    assert done.sessions[0].set_by_stackgate["VLLM_LOGGING_LEVEL"] == "DEBUG"
    assert results(done)["smoke.benchmark"].status in (Status.PASS, Status.WARN)
    assert_nothing_left(rig)
