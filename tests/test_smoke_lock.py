"""The lock fields smoke added: [smoke.speculative], [smoke.compare], fast_layers, stop_grace_s, flag rules."""

from __future__ import annotations

from pathlib import Path

import pytest
from specs import minimal_spec

from stackgate.models.spec import Spec, SpecError, load_spec, loads_spec

ROOT = Path(__file__).resolve().parents[1]
BASE = minimal_spec(gpu_count=8, min_driver="580.82.07", interpreter="/usr/bin/python3")


def load(smoke: str) -> Spec:
    return loads_spec(BASE + smoke)


def problems(smoke: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        load(smoke)
    return caught.value.problems


@pytest.mark.parametrize("name", ["blackwell-sm120-cu130.toml", "hopper-sm90-cu130.toml"])
def test_the_shipped_lockfiles_still_load_with_the_new_defaults(name):
    smoke = load_spec(ROOT / "lockfiles" / name).smoke
    assert (smoke.speculative, smoke.compare, smoke.fast_layers, smoke.stop_grace_s) == (None, None, 4, 15.0)


FUSION = "--enable-flashinfer-allreduce-fusion"


def test_the_fusion_flag_carries_its_evidence_and_a_spec_can_only_replace_it():
    plain = load(f'[smoke]\nflags = ["{FUSION}"]\n').smoke  # as init writes it: no evidence table
    assert dict(plain.evidence) == {FUSION: "FlashInfer workspace initialized for rank"}
    replaced = load(f'[smoke]\nflags = ["{FUSION}"]\nevidence = {{ "{FUSION}" = "fused allreduce ready" }}\n').smoke
    assert dict(replaced.evidence) == {FUSION: "fused allreduce ready"}
    assert dict(load('[smoke]\nflags = ["--enable-x"]\n').smoke.evidence) == {}  # no known evidence, none asked
    hopper = load_spec(ROOT / "lockfiles" / "hopper-sm90-cu130.toml").smoke  # the flag, no evidence table
    assert dict(hopper.evidence) == {FUSION: "FlashInfer workspace initialized for rank"}


def test_the_load_silence_limit_comes_from_the_lock():
    assert load("[smoke]\nready_timeout_s = 600\n").smoke.load_silence_s == 150.0
    assert load("[smoke]\nready_timeout_s = 600\nsilence_s = 40\n").smoke.load_silence_s == 40.0


def test_speculative_decoding_becomes_sglang_s_flags():
    spec = load(
        '[smoke]\nflags = []\n[smoke.speculative]\nalgorithm = "EAGLE3"\ndraft_model = "/m/eagle3"\nnum_steps = '
        "3\neagle_topk = 1\nnum_draft_tokens = 4\n"
    )
    assert spec.smoke.speculative.flags == (
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        "/m/eagle3",
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "4",
    )


def test_an_ngram_speculation_needs_no_draft_model():
    assert load('[smoke.speculative]\nalgorithm = "NGRAM"\n').smoke.speculative.flags == (
        "--speculative-algorithm",
        "NGRAM",
    )


def test_the_compare_table_and_the_other_new_fields_load():
    spec = load(
        "[smoke]\nfast_layers = 2\nstop_grace_s = 20\n"
        '[smoke.compare]\nname = "no-fusion"\nflags = ["--disable-cuda-graph"]\nattention_backend = '
        '"triton"\nspeculative = false\n[smoke.compare.env]\nNCCL_ALGO = "Ring"\n'
    )
    compare = spec.smoke.compare
    assert (compare.name, compare.flags, compare.attention_backend, compare.speculative, dict(compare.env)) == (
        "no-fusion",
        ("--disable-cuda-graph",),
        "triton",
        False,
        {"NCCL_ALGO": "Ring"},
    )
    assert (spec.smoke.fast_layers, spec.smoke.stop_grace_s) == (2, 20.0)


def test_the_stream_idle_limit_comes_from_the_expected_inter_token_time_and_a_floor():
    """100 expected inter-token gaps at baseline_tok_s, never below [benchmark] stream_idle_floor_s."""
    assert load("[benchmark]\nbaseline_tok_s = 92.6\n").benchmark.stream_idle_s == 15.0  # the default floor
    assert load("[benchmark]\nbaseline_tok_s = 92.6\nstream_idle_floor_s = 4\n").benchmark.stream_idle_s == 4.0
    slow = load("[benchmark]\nbaseline_tok_s = 2\nstream_idle_floor_s = 4\n")
    assert slow.benchmark.stream_idle_s == 50.0  # 0.5 s a token
    assert load("").benchmark.stream_idle_s == 15.0  # no baseline: the floor alone
    refused = problems("[benchmark]\nstream_idle_floor_s = 0\n")
    assert "benchmark.stream_idle_floor_s: must be greater than 0, not 0" in refused


def test_the_run_cap_defaults_to_twice_the_runs_and_is_never_below_them():
    assert load("[benchmark]\nruns = 5\n").benchmark.run_cap == 10
    assert load("[benchmark]\nruns = 5\nmax_runs = 12\n").benchmark.run_cap == 12
    assert "benchmark.max_runs: must be at least runs (5), not 3" in problems("[benchmark]\nruns = 5\nmax_runs = 3\n")


def test_a_compare_table_without_flags_means_the_default_baseline():
    assert load("[smoke.compare]\n").smoke.compare.flags is None


@pytest.mark.parametrize(
    "smoke, problem",
    [
        (
            '[smoke.speculative]\nalgorithm = "MEDUSA"\n',
            "smoke.speculative.algorithm: must be one of EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM, not 'MEDUSA'",
        ),
        (
            '[smoke.speculative]\nalgorithm = "EAGLE3"\n',
            "smoke.speculative.draft_model: EAGLE3 needs the draft model's path",
        ),
        ("[smoke.speculative]\nnum_steps = 3\n", "smoke.speculative.algorithm: missing (required)"),
        (
            '[smoke.speculative]\nalgorithm = "NGRAM"\nnum_steps = 0\n',
            "smoke.speculative.num_steps: must be greater than 0, not 0",
        ),
        (
            '[smoke]\nflags = ["--tp", "8"]\n',
            "smoke.flags[0]: --tp is set by smoke from smoke.tp; do not repeat it in flags",
        ),
        (
            '[smoke]\nflags = ["--attention-backend=triton"]\n',
            "smoke.flags[0]: --attention-backend is set by smoke from smoke.attention_backend; do not repeat it in "
            "flags",
        ),
        (
            '[smoke]\nflags = ["--load-format", "dummy"]\n',
            "smoke.flags[0]: --load-format is set by smoke from fast mode (--fast); do not repeat it in flags",
        ),
        (
            '[smoke]\nflags = ["--speculative-algorithm", "EAGLE3"]\n',
            "smoke.flags[0]: --speculative-algorithm: describe speculative decoding in [smoke.speculative], not in "
            "flags",
        ),
        (
            '[smoke]\nflags = ["--x"]\nevidence = { "--x" = "bad (" }\n',
            "smoke.evidence.--x: invalid regular expression 'bad (': missing ), unterminated subpattern at position 4",
        ),
        (
            '[smoke]\nflags = ["--enable-flashinfer-allreduce-fusion"]\n'
            'evidence = { "--enable-flashinfer-allreduce-fusion" = "" }\n',
            "smoke.evidence.--enable-flashinfer-allreduce-fusion: '' matches an empty line, so every log would prove "
            "the flag: give the line that shows its path ran",
        ),
        (
            '[smoke]\nflags = ["--x"]\nevidence = { "--x" = ".*" }\n',
            "smoke.evidence.--x: '.*' matches an empty line, so every log would prove the flag: give the line that "
            "shows its path ran",
        ),
        ("[smoke]\nfast_layers = 0\n", "smoke.fast_layers: must be greater than 0, not 0"),
        ("[smoke]\nsilence_s = 0\n", "smoke.silence_s: must be greater than 0, not 0"),
        ("[smoke]\nstop_grace_s = -1\n", "smoke.stop_grace_s: must be greater than 0, not -1"),
        (
            '[smoke.compare]\nname = "Base Line"\n',
            "smoke.compare.name: 'Base Line' must be lowercase letters, digits, '_' or '-' (it names the baseline's "
            "checks)",
        ),
        (
            '[smoke.compare]\nflags = ["--port", "1"]\n',
            "smoke.compare.flags[0]: --port is set by smoke from smoke.port; do not repeat it in flags",
        ),
        ("[smoke.compare]\nspeculate = false\n", "smoke.compare.speculate: unknown key (did you mean 'speculative'?)"),
    ],
)
def test_bad_smoke_tables_are_refused_with_their_key_path(smoke, problem):
    assert problem in problems(smoke)
