"""Tests of the flashinfer deep checks (deep.flashinfer_attention, deep.allreduce_fusion) and of the
collective's timing: the judgement from recorded outputs of the real runs on 2x H200
(tests/data/device), the arch gate read from the released flashinfer 0.6.4 and sglang 0.5.9 wheels'
own code, and the target script's paths that need no GPU, run for real under CPU torch."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import zipfile
from pathlib import Path
from typing import Any, Iterator

import pytest
from fakes import fake_nvml
from fakes.fake_nvml import gpu, machine
from support import released_wheel

from stackgate.checks import deep
from stackgate.checks.core import REGISTRY, run_checks
from stackgate.checks.fusiongate import engine_refusal
from stackgate.edges import flashwork as script
from stackgate.facts import Facts
from stackgate.facts import deepruns as measure
from stackgate.facts.machine import observe
from stackgate.flows.verify import plan
from stackgate.models.result import Result, Status
from stackgate.models.spec import DEFAULT_SPEC, Capability, DeepAttention, Spec, SpecError, load_spec, loads_spec
from stackgate.models.spec.reader import Table
from stackgate.render.spectext import machine_spec
from stackgate.runs import fingerprint, rundiff

ROOT = Path(__file__).resolve().parents[1]
DEVICE = Path(__file__).resolve().parent / "data" / "device"
JIT = deep.JitContext("/opt/stackgate/cache/flashinfer", "the stack's root", 600.0, None, None, None)
H200 = "NVIDIA H200"


def recorded(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (DEVICE / name).read_text().splitlines()]


# --- the lock's [deep] tables -----------------------------------------------------------------


def test_deep_tables_default_to_the_reference_models_shapes_and_validate_with_key_paths() -> None:
    spec = load_spec(DEFAULT_SPEC)
    assert (spec.deep.attention.q_heads, spec.deep.attention.kv_heads, spec.deep.attention.head_dim) == (64, 8, 128)
    assert (spec.deep.fusion.hidden, spec.deep.fusion.tokens, spec.deep.fusion.unsupported) == (
        7168,
        (1, 4, 16, 64, 128, 256, 512),
        "fail",
    )
    text = (ROOT / "lockfiles" / "hopper-sm90-cu130.toml").read_text()
    hostile = text + (
        "[deep.attention]\nq_heads = 60\nkv_len = 100\njit_timeout_s = 99999\n[deep.fusion]\ntokens = [4, "
        '1]\nunsupported = "ignore"\nhiden = 1\n'
    )
    with pytest.raises(SpecError) as caught:
        loads_spec(hostile)
    assert caught.value.problems == [
        "deep.attention.jit_timeout_s: must be at most 3600 s, not 99999",
        "deep.attention.q_heads: 60 query heads do not group over 8 KV heads (q_heads must be a multiple of kv_heads)",
        "deep.attention.kv_len: 100 KV tokens do not fill whole pages of 16 (kv_len must be a multiple of page_size)",
        "deep.attention.prefill_len: 2048 query tokens exceed the 100 KV tokens they attend to",
        "deep.fusion.tokens: must be distinct token counts in increasing order, not [4, 1]",
        "deep.fusion.unsupported: must be one of fail, warn, not 'ignore'",
        "deep.fusion.hiden: unknown key (did you mean 'hidden'?)",
    ]
    shaped = loads_spec(
        text
        + '[deep.attention]\nkv_heads = 4\nkv_len = 4096\n[deep.fusion]\ntokens = [8, 2048]\nunsupported = "warn"\n'
    )
    assert (
        shaped.deep.attention.kv_heads,
        shaped.deep.attention.kv_len,
        shaped.deep.fusion.tokens,
        shaped.deep.fusion.unsupported,
    ) == (4, 4096, (8, 2048), "warn")


def test_the_hopper_lock_enables_the_fusion_flag() -> None:
    assert deep.FUSION_FLAG in load_spec(ROOT / "lockfiles" / "hopper-sm90-cu130.toml").smoke.flags


# --- attention judgement, from the H200 run -----------------------------------------------------

KINDS = {
    ("decode", False): "decode",
    ("decode", True): "decode_tensor_cores",
    ("prefill", None): "prefill",
    ("paged_decode", None): "paged_decode",
}


def attention_kernels() -> list[dict[str, Any]]:
    """The recorded kernels as flashwork.py writes them. The run kept each kernel's largest absolute
    error but not its reference's magnitude there, so the worst element is given |ref| = 0: only
    the absolute part of the tolerance allows it (the strictest reading). Every kernel's first
    call JIT-compiled its module on that run (a cold cache)."""
    kernels = []
    for line in recorded("run2_flashinfer.jsonl"):
        if line.get("part") == "attention" and "kind" in line:
            record = {
                "event": "kernel",
                "index": 0,
                "name": H200,
                "kind": KINDS[(line["kind"], line.get("tensor_cores"))],
                "us": line["us"],
                "first_call_s": line["first_call_s"],
                "compiled": 1,
            }
            record.update(max_abs_err=line["max_abs_err"], worst=[line["max_abs_err"], 0.0])
            record.update(
                {"gbs": line["gbs"]} if "gbs" in line else {"tflops": line["tflops_dense"] * 0.9375}
            )  # causal: 15/16 of the dense pairs
            kernels.append(record)
    return [*kernels, *bandwidth("idle")[0]]


def bandwidth(run: str) -> tuple[list[dict[str, Any]], tuple[dict[str, Any], ...]]:
    """The bandwidth-bound decode and the read kernel of one H200 run (h200_attention_bandwidth.json: cold, idle,
    degraded), as flashwork.py writes them."""
    recorded_run = json.loads((DEVICE / "h200_attention_bandwidth.json").read_text())[run]
    decode = [{"event": "kernel", **k} for k in recorded_run["kernels"] if k["kind"] == "bandwidth_decode"]
    return decode, tuple({"event": "read", **r} for r in recorded_run["reads"])


def attention_run(kernels: list[dict[str, Any]], **changes: Any) -> measure.AttentionRun:
    fields: dict[str, Any] = dict(
        request=measure.AttentionRequest(seed=5),
        begin={"event": "begin", "flashinfer": "0.6.4", "torch": "2.11.0+cu130", "devices": 1},
        kernels=tuple(kernels),
        running=None,
        returncode=0,
        timeout_s=900.0,
        tail=("last line",),
        log=Path("/tmp/attention.log"),
        duration_s=71.0,
        reads=bandwidth("idle")[1],
    )
    fields.update(changes)
    return measure.AttentionRun(**fields)


HOPPER = load_spec(ROOT / "lockfiles" / "hopper-sm90-cu130.toml")


def test_the_recorded_attention_passes_with_its_bandwidth_and_the_cold_jit_against_its_timeout() -> None:
    result = deep.judge_attention(attention_run(attention_kernels()), JIT, HOPPER)
    assert result.status == Status.PASS, result.details
    assert result.summary.startswith(
        "flashinfer 0.6.4 on 1 GPU(s): decode GB/s 1280, decode (tensor cores) GB/s 2208, paged decode GB/s 1382, "
        "prefill TFLOP/s 705.5, bandwidth decode GB/s 4415; max abs error 0.00045; "
    )
    assert result.summary.endswith(
        "JIT (cold) took 70 s of the 600 s allowed (4 module(s) compiled into /opt/stackgate/cache/flashinfer)"
    )
    assert result.data["figures"] == {
        "decode GB/s": 1279.922,
        "decode (tensor cores) GB/s": 2207.993,
        "paged decode GB/s": 1382.16,
        "prefill TFLOP/s": 705.468,
        "bandwidth decode GB/s": 4414.541,
        "read GB/s": 4385.512,
        "bandwidth decode read fraction": 0.9936,
    }
    assert result.data["defines"] == {
        "flashinfer_attention": (
            "decode, decode_tensor_cores, prefill, paged_decode, bandwidth_decode correct against float32; "
            "JIT-compiled (no flashinfer-jit-cache)"
        )
    }
    assert "kernels: JIT-compiled (no flashinfer-jit-cache); the lock ships no flashinfer-jit-cache" in result.details
    warm = [{**k, "compiled": 0, "first_call_s": 0.05} for k in attention_kernels()]
    assert deep.judge_attention(attention_run(warm), JIT, HOPPER).summary.endswith(
        "no JIT: every module came from the JIT cache (first calls 0.2 s)"
    )


# --- the bandwidth-bound decode, judged against the GPU's read bandwidth (issue 36) ---------------


def small_kernels() -> list[dict[str, Any]]:
    return [k for k in attention_kernels() if k["kind"] != "bandwidth_decode"]


def judged(run: str, spec: Spec = HOPPER, name: str | None = None) -> Result:
    """The recorded kernels with one H200 run's bandwidth decode and read (``name``: the GPU called so instead)."""
    decode, reads = bandwidth(run)
    if name is not None:
        decode = [{**k, "name": name} for k in decode]
        reads = tuple({**r, "name": name} for r in reads)
    return deep.judge_attention(attention_run([*small_kernels(), *decode], reads=reads), JIT, spec)


def test_the_bandwidth_bound_decode_passes_on_an_idle_h200_and_fails_beside_a_process_streaming_memory() -> None:
    idle = judged("idle")
    assert idle.status == Status.PASS, idle.details
    assert "; bandwidth decode 0.99 of read 4443 GB/s (floor 0.6; MODEL_RATES row 'NVIDIA H200'); " in idle.summary
    assert idle.details[0] == (
        "GPU 0 (NVIDIA H200) bandwidth decode 4415 GB/s = 0.99 of 4443 GB/s read (an idle NVIDIA H200's 4443 GB/s, "
        "MODEL_RATES row 'NVIDIA H200'; this run's read 4386 GB/s); floor 0.6"
    )
    degraded = judged("degraded")  # the same GPU while another process copied 2 GiB in a loop
    assert degraded.status == Status.FAIL
    assert degraded.summary == (
        "GPU 0 (NVIDIA H200): the bandwidth-bound decode reads its KV at 2038 GB/s, 0.46 of the GPU's read bandwidth "
        "4443 GB/s (an idle NVIDIA H200's 4443 GB/s, MODEL_RATES row 'NVIDIA H200'; this run's read 2030 GB/s), below "
        "the floor 0.6"
    )
    assert degraded.fix is not None and degraded.fix.commands[0].startswith("nvidia-smi --query-compute-apps")
    assert "reset" not in degraded.fix.text and "min_read_fraction" in degraded.fix.text
    [gpu0] = degraded.data["read_fraction"]["gpus"]
    assert (gpu0["model_row"], gpu0["reference_gbs"], gpu0["fraction"], gpu0["passes"]) == (
        "MODEL_RATES row 'NVIDIA H200'",
        4443.0,
        0.4586,
        False,
    )


def test_the_fraction_is_of_the_larger_of_this_runs_read_and_the_table_rows() -> None:
    row = deep.MODEL_RATES["NVIDIA H200"]["read"]
    slow_memory = deep.ReadFraction(0, "NVIDIA H200", 2000.0, 2100.0, row, 0.6)  # both of this run's figures low
    assert slow_memory.reference_gbs == row and not slow_memory.passes
    fast = deep.ReadFraction(0, "NVIDIA H200", 4500.0, 4600.0, row, 0.6)  # a faster read than the row's
    assert fast.reference_gbs == 4600.0 and round(fast.fraction, 3) == 0.978 and fast.passes
    unknown = deep.ReadFraction(1, "NVIDIA B200", 1600.0, 4400.0, None, 0.6)  # no row: this run's read alone
    assert unknown.reference_gbs == 4400.0 and not unknown.passes
    assert unknown.against() == "this run's read 4400 GB/s; no MODEL_RATES row for NVIDIA B200"
    assert not deep.ReadFraction(0, "X", float("nan"), 4400.0, None, 0.6).passes
    assert deep.model_row("NVIDIA H200") == ("NVIDIA H200", deep.MODEL_RATES["NVIDIA H200"])
    assert deep.model_row("NVIDIA H100 80GB HBM3") is None


def test_the_floor_is_the_locks_and_a_gpu_without_a_row_is_judged_by_its_own_read() -> None:
    text = (ROOT / "lockfiles" / "hopper-sm90-cu130.toml").read_text()
    strict = loads_spec(text + "[deep.attention]\nmin_read_fraction = 1.0\n")
    result = judged("idle", strict)
    assert result.status == Status.FAIL and result.summary.endswith("below the floor 1")
    assert result.data["read_fraction"]["floor"] == 1.0
    unknown = judged("idle", name="NVIDIA B200")  # 4415 of its own 4386 GB/s
    assert unknown.status == Status.PASS
    assert "bandwidth decode 1.01 of read 4386 GB/s (floor 0.6; this run read alone: no MODEL_RATES row)" in (
        unknown.summary
    )
    decode, reads = bandwidth("idle")
    no_read = ({**reads[0], "gbs": None, "error": "OutOfMemoryError: CUDA out of memory"},)
    failed = deep.judge_attention(
        attention_run(
            [*small_kernels(), *decode], reads=tuple({k: v for k, v in r.items() if k != "gbs"} for r in no_read)
        ),
        JIT,
        HOPPER,
    )
    assert failed.status == Status.FAIL
    assert failed.summary == (
        "GPU 0 (NVIDIA H200): the read-bandwidth kernel failed: OutOfMemoryError: CUDA out of memory"
    )


def test_the_bandwidth_keys_of_the_lock_validate_with_key_paths() -> None:
    text = (ROOT / "lockfiles" / "hopper-sm90-cu130.toml").read_text()
    with pytest.raises(SpecError) as caught:
        loads_spec(
            text + '[deep.attention]\nmin_read_fraction = 1.5\nbandwidth_kv_len = 1000\nprefill_backend = "fa3"\n'
        )
    assert caught.value.problems == [
        "deep.attention.min_read_fraction: must be a fraction of the read bandwidth, at most 1, not 1.5",
        "deep.attention.prefill_backend: must be one of fa2, auto, not 'fa3'",
        "deep.attention.bandwidth_kv_len: 1000 KV tokens do not fill whole pages of 16 (bandwidth_kv_len must be a "
        "multiple of page_size)",
    ]
    shaped = loads_spec(
        text + '[deep.attention]\nmin_read_fraction = 0.8\nbandwidth_batch = 128\nprefill_backend = "auto"\n'
    ).deep.attention
    assert (shaped.min_read_fraction, shaped.bandwidth_batch, shaped.bandwidth_kv_len, shaped.prefill_backend) == (
        0.8,
        128,
        16384,
        "auto",
    )
    request = measure.AttentionRequest.from_lock(shaped)
    assert (request.bandwidth_batch, request.prefill_backend, request.read_bytes) == (128, "auto", 4 << 30)


def test_a_shape_added_to_deep_attention_is_read_from_the_spec_and_reaches_the_attention_request() -> None:
    """[deep.attention]'s shape keys are DeepAttention's whole-number fields, and the request takes every field it
    shares with DeepAttention: a new shape is one field on each dataclass, no list of names to keep in step."""

    @dataclasses.dataclass(frozen=True)
    class Shapes(DeepAttention):
        groups: int = 2

    @dataclasses.dataclass(frozen=True)
    class Request(measure.AttentionRequest):
        groups: int = 1

    errors: list[str] = []
    shapes = Shapes._from_table(Table({"groups": 4, "q_heads": 32}, "deep.attention", errors))
    assert errors == []
    assert (shapes.groups, shapes.q_heads) == (4, 32)
    zero: list[str] = []
    Shapes._from_table(Table({"groups": 0}, "deep.attention", zero))
    assert zero == ["deep.attention.groups: must be greater than 0, not 0"]
    assert (Request.from_lock(shapes).groups, Request.from_lock(shapes).q_heads) == (4, 32)


# --- the modules, built up front, side by side ------------------------------------------------


def test_the_build_plan_skips_prebuilt_and_cached_modules_and_gives_each_ninja_max_jobs_or_the_cores() -> None:
    modules = [("single_decode", "missing"), ("batch_prefill", "prebuilt"), ("batch_decode", "cached")]
    modules.append(("single_prefill", "missing"))
    assert script.build_plan(modules, 16, None) == {
        "prebuilt": ["batch_prefill"],
        "cached": ["batch_decode"],
        "build": ["single_decode", "single_prefill"],
        "side_by_side": 2,
        "jobs": 16,
        "jobs_from": "cores",
    }
    assert script.build_plan(modules, 16, "4")["jobs"] == 4
    assert script.build_plan(modules, 16, "0")["jobs_from"] == "cores"
    assert script.build_plan(modules, 16, "-j8")["jobs"] == 16
    assert script.build_plan([("a", "cached")], 16, None)["build"] == []
    assert script.decode_tensor_cores({"q_heads": 64, "kv_heads": 8}) is True
    assert script.decode_tensor_cores({"q_heads": 24, "kv_heads": 8}) is False


class StandIn:
    """A module whose build starts a real process, as ninja is, then waits at a barrier that opens only when every
    module's build has reached it: one after another, the first would wait alone until the barrier breaks."""

    def __init__(self, name: str, barrier: threading.Barrier, fails: bool = False) -> None:
        self.name, self.barrier, self.fails, self.built = name, barrier, fails, False

    def build(self, verbose: bool) -> None:
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        self.barrier.wait()
        if self.fails:
            raise RuntimeError("Ninja build failed. Ninja output:\nnvcc fatal")
        self.built = True


def test_the_modules_are_built_side_by_side_and_a_failed_one_stops_none_of_the_others() -> None:
    barrier = threading.Barrier(4, timeout=120)
    modules = [StandIn(f"module{i}", barrier, fails=i == 2) for i in range(4)]
    errors = script.build_side_by_side(modules)
    assert errors == {"module2": "RuntimeError: Ninja build failed. Ninja output:\nnvcc fatal"}
    assert [m.built for m in modules] == [True, True, False, True] and not barrier.broken


def test_the_slowest_files_come_from_each_modules_own_ninja_log(tmp_path: Path) -> None:
    modules = []
    for name in ("single_prefill_sm90", "batch_prefill"):
        (tmp_path / name).mkdir()
        shutil.copy(DEVICE / f"h200_ninja_log_{name}", tmp_path / name / ".ninja_log")
        modules.append(dataclasses.make_dataclass("Spec", ["name", "build_dir"])(name, tmp_path / name))
    (tmp_path / "never_built").mkdir()
    modules.append(dataclasses.make_dataclass("Spec", ["name", "build_dir"])("never_built", tmp_path / "never_built"))
    assert script.slowest_files(modules, 3) == [
        ["single_prefill_sm90", "single_prefill_sm90_kernel_mask_0.cuda.o", 101.544],
        ["single_prefill_sm90", "single_prefill_sm90_kernel_mask_2.cuda.o", 99.124],
        ["single_prefill_sm90", "single_prefill_sm90_kernel_mask_3.cuda.o", 95.602],
    ]
    assert max(script.ninja_times((DEVICE / "h200_ninja_log_batch_prefill").read_text()).values()) < 40


def test_the_cold_build_side_by_side_is_reported_and_a_build_past_the_timeout_says_so() -> None:
    recorded_run = json.loads((DEVICE / "h200_attention_bandwidth.json").read_text())["cold"]
    kernels = [{"event": "kernel", **k} for k in recorded_run["kernels"]]
    run = attention_run(kernels, reads=bandwidth("cold")[1], prebuild=recorded_run["prebuild"])
    result = deep.judge_attention(run, JIT, HOPPER)
    assert result.status == Status.PASS, result.details
    assert result.summary.endswith(
        "JIT (cold): 5 module(s) built side by side in 99 s of the 600 s allowed (ninja -j 16 each, 16 cores) into "
        "/opt/stackgate/cache/flashinfer; first calls 0.1 s"
    )
    assert (
        "modules: 0 prebuilt (flashinfer-jit-cache), 0 in the JIT cache, 5 built side by side, one ninja each with "
        "-j 16 (from the 16 cores), in 98.6 s"
    ) in result.details
    assert result.data["jit"]["compiled"] == 5 and result.data["jit"]["prebuild"]["slowest"][0][2] == 98.453
    hung = deep.judge_attention(attention_run([], returncode=None, building=True), JIT, HOPPER)
    assert hung.summary == (
        "flashinfer's JIT build of the attention modules (side by side) did not finish within 900 s (the lock's "
        "jit_timeout_s 600 s included)"
    )


def test_a_run_killed_by_sigbus_names_the_signal_and_the_module_cut_short(tmp_path: Path) -> None:
    # A JIT cache holding one module cut short (as a killed build or a full disk leaves it: here half of a real
    # shared library), and a stand-in for the stack's interpreter that dies of SIGBUS, as the H200's run did
    # mapping the truncated paged-decode module (exit -7, nothing printed).
    module = (
        tmp_path / "ws" / ".cache" / "flashinfer" / "0.6.4" / "90a" / "cached_ops" / "batch_decode" / "batch_decode.so"
    )
    module.parent.mkdir(parents=True)
    whole = Path(sys.executable).resolve().read_bytes()
    module.write_bytes(whole[: len(whole) // 2])
    (module.parent.parent / "single_decode").mkdir()
    (module.parent.parent / "single_decode" / "single_decode.so").write_bytes(whole)
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nkill -BUS $$\n")
    python.chmod(0o755)
    env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "ws")}
    run = measure.run_attention(python, measure.AttentionRequest(seed=5), env, timeout_s=60)
    assert run.returncode == -7 and [d["file"] for d in run.damaged] == [str(module)]
    result = deep.judge_attention(run, JIT, HOPPER)
    assert result.status == Status.FAIL
    assert result.summary.startswith(
        "the attention run was killed by SIGBUS (exit -7): 1 module(s) of flashinfer's JIT cache are cut short, "
        f"first {module} ("
    )
    assert (
        result.fix.commands[0] == f"rm -r {module.parent}"
        and "reset" not in result.fix.text
        and "drain" not in result.fix.text
    )
    module.write_bytes(whole)
    healthy = deep.judge_attention(
        measure.run_attention(python, measure.AttentionRequest(seed=5), env, timeout_s=60), JIT, HOPPER
    )
    assert (
        "killed by SIGBUS (exit -7); no module of the JIT cache" in healthy.summary
        and "the cause is not known" in healthy.summary
    )
    assert healthy.fix.commands[0].startswith("less ") and "reset" not in healthy.fix.text


def test_a_jit_cache_on_a_full_filesystem_says_so_with_the_room_it_needs() -> None:
    kernels = recorded("h200_jit_no_space.jsonl")  # ninja's pages of output, "No space left on device" inside
    result = deep.judge_attention(attention_run(kernels, returncode=0, cache_free_bytes=0), JIT, HOPPER)
    assert result.status == Status.FAIL
    assert result.summary == (
        "flashinfer's JIT cache /opt/stackgate/cache/flashinfer is out of space (No space left on device): its "
        "filesystem has 0.0 MiB free, "
        "and a cold build of these kernels takes about 32 MiB there; 4 kernel(s) could not be built"
    )
    assert result.details[-1] == "first: /usr/bin/ld: final link failed: No space left on device"
    assert (
        "FLASHINFER_WORKSPACE_BASE" in result.fix.text
        and result.fix.commands[0] == "df -h /opt/stackgate/cache/flashinfer"
    )


def test_a_wrong_or_nan_attention_output_fails_by_kernel() -> None:
    kernels = attention_kernels()
    kernels[2].update(max_abs_err=0.011, worst=[0.011, 0.03])  # a prefill that lost half its keys would look like this
    kernels[3].update(max_abs_err=float("nan"), worst=[float("nan"), 0.05])
    result = deep.judge_attention(attention_run(kernels), JIT, HOPPER)
    assert result.status == Status.FAIL
    assert result.summary == (
        "2 kernel problem(s): GPU 0 prefill: wrong: error 0.011 where |ref| is 0.03 (allowed 0.00223; max abs "
        "error 0.011) against float32"
    )
    assert result.details[1].startswith("GPU 0 paged_decode: wrong: error nan")
    assert result.data["kernels"][3]["max_abs_err"] is None  # the JSON report holds no NaN
    assert "defines" not in result.data


def test_an_attention_that_does_not_import_or_compile_fails_with_the_knowledge_bases_cause_and_fix() -> None:
    mismatch = (
        "RuntimeError: flashinfer-cubin version (0.6.3) does not match flashinfer version (0.6.4). Please "
        "install the same version of both packages."
    )
    result = deep.judge_attention(
        attention_run(
            [], begin={"event": "begin", "error": mismatch, "trace": f"Traceback ...\n{mismatch}"}, returncode=1
        ),
        JIT,
        HOPPER,
    )
    assert (
        result.status == Status.FAIL
        and result.summary == f"{mismatch} -> flashinfer-cubin 0.6.3 beside flashinfer 0.6.4"
    )
    assert result.fix is not None and "stackgate verify --check flashinfer.cubin --lock " in " ".join(
        result.fix.commands
    )
    ninja = {
        "event": "kernel",
        "index": 0,
        "name": H200,
        "kind": "prefill",
        "error": "RuntimeError: Ninja build failed. Ninja output:",
        "trace": (
            "RuntimeError: Ninja build failed. Ninja output:\nfatal error: curand_kernel.h: No such file or directory"
        ),
    }
    built = deep.judge_attention(attention_run([*attention_kernels()[:2], ninja]), JIT, HOPPER)
    assert built.status == Status.FAIL
    assert built.summary == (
        "1 kernel problem(s): GPU 0 prefill: RuntimeError: Ninja build failed. Ninja output: -> A JIT build "
        "cannot find the CUDA header curand_kernel.h"
    )
    assert built.fix is not None and built.fix.commands[0].startswith("stackgate provision --only toolkit")


def test_a_kernel_killed_in_its_cold_jit_says_so_with_the_timeout() -> None:
    run = attention_run(attention_kernels()[:2], running=(0, "prefill"), returncode=None)
    result = deep.judge_attention(run, JIT, HOPPER)
    assert result.status == Status.FAIL and result.data["hung"] is True
    assert result.summary == (
        "GPU 0's prefill kernel did not finish within 900 s: its first call JIT-compiles (cold) with the lock's "
        "jit_timeout_s 600 s allowed"
    )
    assert result.fix is not None and "jit_timeout_s" in result.fix.text
    later = deep.judge_attention(
        attention_run(attention_kernels(), running=(1, "decode"), returncode=None), JIT, HOPPER
    )
    assert later.summary == "hang: GPU 1's decode kernel did not finish within 900 s"


# --- fusion judgement, from the 2x H200 run ---------------------------------------------------


def fusion_lines() -> dict[int, list[dict[str, Any]]]:
    """The recorded ranks as flashwork.py writes them. The run compared against a bf16 reference and
    kept the largest error, one bf16 ulp: its element is given the smallest |ref| with that ulp
    (err x 2^7, the start of its binade), the strictest reading. One graph replay was timed."""
    per_rank: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
    for line in recorded("run2_flashinfer.jsonl"):
        if line.get("part") != "fusion" or "rank" not in line:
            continue
        if line.get("event") == "workspace":
            per_rank[line["rank"]].append(
                {"event": "workspace", "rank": line["rank"], "seconds": line["s"], "compiled": 1}
            )
        elif "tokens" in line:
            parts = {
                p: {"max_abs_err": line[f"err_{p}"], "worst": [line[f"err_{p}"], line[f"err_{p}"] * 128]}
                for p in ("residual", "norm")
            }
            paths = {
                p: {
                    "eager_us": line[p]["eager_us"],
                    "us": line[p]["graph_us"],
                    "us_min": line[p]["graph_us"],
                    "us_replays": [line[p]["graph_us"]],
                }
                for p in ("fused", "unfused")
            }
            per_rank[line["rank"]].append(
                {"event": "tokens", "rank": line["rank"], "tokens": line["tokens"], **parts, **paths}
            )
    return per_rank


REQUEST = measure.FusionRequest(2, 7168, (1, 4, 16, 64, 128, 256, 512), seed=5)


def fusion_run(per_rank: dict[int, list[dict[str, Any]]], **changes: Any) -> measure.FusionRun:
    lines = [line for rank in per_rank.values() for line in rank]
    fields: dict[str, Any] = dict(
        request=REQUEST,
        begin={"event": "begin", "flashinfer": "0.6.4", "world": 2},
        tokens=tuple(measure.aggregate_fusion(REQUEST, per_rank)),
        workspace_s={line["rank"]: line["seconds"] for line in lines if line["event"] == "workspace"},
        compiled=1,
        failures=(),
        progress={0: "done", 1: "done"},
        returncode=0,
        timeout_s=900.0,
        tail=(),
        log=Path("/tmp/fusion.log"),
        duration_s=97.9,
    )
    fields.update(changes)
    return measure.FusionRun(**fields)


def test_the_recorded_fusion_passes_with_its_speedup_per_token_count() -> None:
    run = fusion_run(fusion_lines())
    assert [t.tokens for t in run.tokens] == list(REQUEST.tokens)
    one = run.tokens[0]
    assert one.fused_us == pytest.approx((4.8672 + 4.8528) / 2, abs=1e-3) and one.unfused_us == pytest.approx(
        (25.824 + 25.8688) / 2, abs=1e-3
    )
    result = deep.judge_fusion(run, JIT, HOPPER)
    assert result.status == Status.PASS, result.details
    assert result.summary.startswith(
        "2 ranks, hidden 7168: fused = NCCL + residual + RMSNorm (max abs error norm 0.062); fused vs unfused, "
        "graph-captured, per token count: "
        "1: 4.9 vs 25.8 us (5.3x), 4: 4.9 vs 29.4 us (6.0x), "
    )
    assert "512: 33.0 vs 128.6 us (3.9x)" in result.summary
    assert result.summary.endswith(
        "workspace JIT (cold) took 94 s of the 600 s allowed (1 module(s) compiled into "
        "/opt/stackgate/cache/flashinfer)"
    )
    assert result.data["figures"]["fused speedup at 1 tokens"] == pytest.approx(5.31, abs=0.01)
    assert result.data["defines"] == {
        "allreduce_fusion": "runs on 2 ranks: fused outputs match NCCL + residual + RMSNorm"
    }
    assert (
        result.data["tolerance"]["atol"] == 2.0**-6
        and "unfused: NCCL all-reduce, then torch's add and RMSNorm" in result.data["method"]
    )


def test_wrong_fused_outputs_fail_and_a_slower_fused_path_warns() -> None:
    per_rank = fusion_lines()
    per_rank[1][3]["norm"] = {"max_abs_err": 0.5, "worst": [0.5, 1.0]}  # 16 tokens
    wrong = deep.judge_fusion(fusion_run(per_rank), JIT, HOPPER)
    assert wrong.status == Status.FAIL
    assert wrong.summary == (
        "the fused outputs differ from NCCL + residual + RMSNorm at 1 point(s): 16 token(s): norm wrong: error "
        "0.5 where |ref| is 1 (allowed 0.0234)"
    )
    per_rank = fusion_lines()
    for rank in (0, 1):
        per_rank[rank][-1]["fused"]["us"] = 200.0
    slower = deep.judge_fusion(fusion_run(per_rank), JIT, HOPPER)
    assert slower.status == Status.WARN and slower.summary.startswith(
        "the fused path is slower than the unfused one at 512 token(s): "
    )


def test_a_fusion_that_fails_or_hangs_in_its_jit_says_where() -> None:
    error = "RuntimeError: No supported CUDA architectures found for major versions [9, 10]."
    failure = {"event": "failed", "rank": 0, "stage": "workspace", "error": error, "trace": f"Traceback ...\n{error}"}
    failed = deep.judge_fusion(
        fusion_run(
            {0: [], 1: []}, failures=(failure,), returncode=1, workspace_s={}, progress={0: "failed", 1: "init"}
        ),
        JIT,
        HOPPER,
    )
    assert failed.status == Status.FAIL
    assert failed.summary == (
        f"the allreduce fusion failed (exit 1): rank 0 (workspace): {error} -> flashinfer's allreduce-fusion "
        "module has no build for this GPU"
    )
    hung = deep.judge_fusion(
        fusion_run({0: [], 1: []}, returncode=None, workspace_s={}, progress={0: "init", 1: "init"}), JIT, HOPPER
    )
    assert hung.summary == (
        "the IPC workspace (its first creation JIT-compiles the comm module, cold) was not ready within 900 s "
        "(the lock's jit_timeout_s 600 s included)"
    )
    assert "rank 1: last init" in hung.details and hung.data["hung"] is True


# --- the arch gate, read from the released wheels' own code -----------------------------------


@pytest.fixture(scope="session")
def released_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """flashinfer-python 0.6.4 and sglang 0.5.9 as released on PyPI, unpacked into one folder that
    PYTHONPATH puts on a stack interpreter's path (as `pip install --target` would lay them out)."""
    site = tmp_path_factory.mktemp("released-site")
    for name, version in (("flashinfer-python", "0.6.4"), ("sglang", "0.5.9")):
        with zipfile.ZipFile(released_wheel(name, version)) as wheel:
            wheel.extractall(site)
    return site


@pytest.fixture
def nvml() -> Iterator[Any]:
    yield fake_nvml
    fake_nvml.configure(None)


def interpreter_lock(
    tmp_path: Path, python: Path, *, base: Path = DEFAULT_SPEC, edits: tuple[tuple[str, str], ...] = ()
) -> Spec:
    """A shipped lock whose stack is ``python`` (an existing interpreter) instead of a root."""
    text = base.read_text()
    text = text.replace('root = "/opt/stackgate"', f'interpreter = "{python}"').replace(
        'interpreter = "/opt/torch/.venv/bin/python3"', f'interpreter = "{python}"'
    )
    text = text.replace('version = "3.12"', f'version = "{sys.version_info.major}.{sys.version_info.minor}"')
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / base.name
    path.write_text(text)
    return load_spec(path)


def run_check(name: str, spec: Spec, site: Path | None, nvml: Any, gpus: list[dict[str, Any]], **env: str) -> Result:
    nvml.configure(machine(gpus))
    environ = {**os.environ, **env, "PYTHONPATH": str(site) if site else ""}
    facts = Facts(spec, environ=environ, nvml_lib=nvml)
    try:
        [result] = run_checks([REGISTRY[name]], spec, facts)
    finally:
        facts.close()
    return result


def test_the_gate_is_read_from_the_released_flashinfer_and_sglang_code(
    plain_python: Path, released_site: Path, _deep_dir: Path
) -> None:
    gate = measure.read_gate(plain_python, {**os.environ, "PYTHONPATH": str(released_site)})
    assert list(_deep_dir.iterdir()) == []  # the gate's folder is gone once read: no result names it
    assert gate.returncode == 0, gate.tail
    assert gate.flashinfer == {
        "version": "0.6.4",
        "file": str(released_site / "flashinfer" / "jit" / "comm.py"),
        "function": "gen_trtllm_comm_module",
        "supported_majors": [9, 10],
    }
    assert gate.sglang is not None and gate.sglang["supported_majors"] == [9, 10] and gate.sglang["version"] == "0.5.9"
    assert gate.sglang["file"].endswith("sglang/srt/layers/communicator.py")
    missing = measure.read_gate(plain_python, {**os.environ, "PYTHONPATH": ""})
    assert (
        missing.flashinfer
        == {"error": "flashinfer is not installed in this interpreter (no 'flashinfer' package on its sys.path)"}
        and missing.sglang is None
    )


def test_reading_the_gate_imports_no_torch(torch_python: Path, released_site: Path, tmp_path: Path) -> None:
    # A torch that leaves a mark when imported, first on the path: the gate must read flashinfer's code without it
    # (a CUDA torch's import took seconds of the one-GPU skip on the H200).
    marked = tmp_path / "marked"
    (marked / "torch").mkdir(parents=True)
    (marked / "torch" / "__init__.py").write_text(
        f"open({str(tmp_path / 'imported')!r}, 'w').close()\nraise ImportError('marked')\n"
    )
    gate = measure.read_gate(
        torch_python, {**os.environ, "PYTHONPATH": os.pathsep.join([str(marked), str(released_site)])}
    )
    assert gate.flashinfer["supported_majors"] == [9, 10], gate.tail
    assert not (tmp_path / "imported").exists()


def test_on_the_sm120_lock_the_fusion_check_says_the_fused_path_cannot_run(
    plain_python: Path, released_site: Path, tmp_path: Path, nvml: Any
) -> None:
    spec = interpreter_lock(tmp_path, plain_python)
    assert spec.hardware.compute_capability == Capability(12, 0) and deep.FUSION_FLAG in spec.smoke.flags
    result = run_check(
        "deep.allreduce_fusion", spec, released_site, nvml, [gpu() for _ in range(8)], FLASHINFER_CUDA_ARCH_LIST="12.0a"
    )
    assert result.status == Status.FAIL
    assert result.summary == (
        "the fused path cannot run here: compute capability major 12 is not among the majors flashinfer builds the "
        "fusion module "
        "for ([9, 10]): --enable-flashinfer-allreduce-fusion is a no-op on this machine"
    )
    comm = released_site / "flashinfer" / "jit" / "comm.py"
    assert result.details[:2] == (
        "GPUs: compute capability 8 x 12.0 (from NVML)",
        f"flashinfer 0.6.4: gen_trtllm_comm_module() builds for supported_major_versions=[9, 10] (read from {comm})",
    )
    assert result.details[2].startswith(
        "sglang 0.5.9: apply_flashinfer_allreduce_fusion() admits majors [9, 10], elsewhere the flag is a no-op "
        "(read from "
    )
    assert result.details[3] == "FLASHINFER_CUDA_ARCH_LIST=12.0a (flashinfer compiles for these archs, not the GPUs')"
    assert result.details[4].startswith("no compile was tried: ")
    assert result.data["defines"] == {
        "allreduce_fusion": (
            "no-op: compute capability major 12 is not among the majors flashinfer builds the "
            "fusion module for ([9, 10])"
        )
    }
    assert result.fix is not None and 'unsupported = "warn"' in result.fix.text
    warn = interpreter_lock(
        tmp_path, plain_python, edits=(("[benchmark]", '[deep.fusion]\nunsupported = "warn"\n\n[benchmark]'),)
    )
    assert (
        run_check("deep.allreduce_fusion", warn, released_site, nvml, [gpu() for _ in range(8)]).status == Status.WARN
    )


def test_on_hopper_the_gate_passes_and_one_rank_has_nothing_to_fuse(
    plain_python: Path, released_site: Path, tmp_path: Path, nvml: Any
) -> None:
    hopper = ROOT / "lockfiles" / "hopper-sm90-cu130.toml"
    spec = interpreter_lock(tmp_path, plain_python, base=hopper)
    one = run_check("deep.allreduce_fusion", spec, released_site, nvml, [gpu(H200, (9, 0))])
    assert one.status == Status.SKIP
    assert one.summary == (
        "1 rank(s) (the lock's [smoke] tp 1): there is no all-reduce to fuse (SGLang skips the fusion on one "
        "GPU); the arch gate passed: [9, 10]"
    )
    forced = run_check(
        "deep.allreduce_fusion", spec, released_site, nvml, [gpu(H200, (9, 0))], FLASHINFER_CUDA_ARCH_LIST="12.0a"
    )
    assert forced.status == Status.FAIL and "FLASHINFER_CUDA_ARCH_LIST=12.0a names no major" in forced.summary
    plain = interpreter_lock(
        tmp_path, plain_python, base=hopper, edits=(('flags = ["--enable-flashinfer-allreduce-fusion"]', "flags = []"),)
    )
    assert run_check("deep.allreduce_fusion", plain, released_site, nvml, [gpu(H200, (9, 0))]).summary.startswith(
        "the lock's [smoke] flags do not include"
    )
    absent = run_check("deep.allreduce_fusion", spec, None, nvml, [gpu(H200, (9, 0))])
    assert absent.status == Status.FAIL and absent.summary.startswith(
        "flashinfer's allreduce-fusion module cannot be located: flashinfer is not installed"
    )


# --- the next stack's gates: sglang 0.5.23 beside flashinfer 0.6.17 (issue 32) ---------------------------
# Read from the released wheels (sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl,
# flashinfer_python-0.6.17-py3-none-any.whl): flashinfer/jit/comm.py:192 gen_trtllm_comm_module builds for
# supported_major_versions=[9, 10, 12]; sglang/srt/layers/flashinfer_comm_fusion.py:48-51 _resolve_backend raises
# ValueError("FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs.") unless get_platform().is_sm90 or
# .is_sm100, which srt/runtime_context.py:1831-1832 maps to utils/common.py's is_sm90_supported (majors [9], :333)
# and is_sm100_supported (majors [10], :309).
SGLANG_REFUSAL = "ValueError: FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs."


@pytest.fixture(scope="session")
def next_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """flashinfer-python 0.6.17 and sglang 0.5.23 as released on PyPI (the real registry), unpacked
    into one folder, with a small installed sglang-kernel 0.4.10 beside them (its metadata only)."""
    site = tmp_path_factory.mktemp("next-site")
    for name, version in (("flashinfer-python", "0.6.17"), ("sglang", "0.5.23")):
        with zipfile.ZipFile(released_wheel(name, version)) as wheel:
            wheel.extractall(site)
    kernel = site / "sglang_kernel-0.4.10.dist-info"
    kernel.mkdir()
    (kernel / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang-kernel\nVersion: 0.4.10\n")
    (site / "sgl_kernel").mkdir(exist_ok=True)
    (site / "sgl_kernel" / "__init__.py").write_text("")
    return site


def test_the_gate_is_read_from_the_released_sglang_0_5_23_and_flashinfer_0_6_17(
    plain_python: Path, next_site: Path
) -> None:
    gate = measure.read_gate(plain_python, {**os.environ, "PYTHONPATH": str(next_site)})
    assert gate.returncode == 0, gate.tail
    assert gate.flashinfer["version"] == "0.6.17" and gate.flashinfer["supported_majors"] == [9, 10, 12]
    assert gate.sglang == {
        "version": "0.5.23",
        "file": str(next_site / "sglang" / "srt" / "layers" / "flashinfer_comm_fusion.py"),
        "function": "_resolve_backend",
        "supported_majors": [9, 10],
        "helpers": str(next_site / "sglang" / "srt" / "utils" / "common.py"),
        "refusal": "raises",
        "message": SGLANG_REFUSAL,
    }


def test_before_any_launch_verify_says_sglang_0_5_23_refuses_fusion_on_sm120(
    plain_python: Path, next_site: Path, released_site: Path, tmp_path: Path, nvml: Any
) -> None:
    spec = interpreter_lock(tmp_path, plain_python)
    result = run_check("engine.fusion_gate", spec, next_site, nvml, [gpu() for _ in range(8)])
    assert result.status == Status.FAIL
    assert result.summary == (
        "sglang 0.5.23 admits the fused all-reduce on majors [9, 10] only (its _resolve_backend()): on major 12 its "
        f"start-up raises {SGLANG_REFUSAL}: `stackgate smoke` with --enable-flashinfer-allreduce-fusion will fail at "
        "start-up; flashinfer 0.6.17 alone would allow it (its comm module builds for majors [9, 10, 12])"
    )
    assert result.data["refused_by"] == ["sglang"]
    assert result.fix is not None and "Drop --enable-flashinfer-allreduce-fusion" in result.fix.text
    # sglang 0.5.9 with flashinfer 0.6.4: both refuse, silently: the flag is a no-op, not a failed start
    old = run_check("engine.fusion_gate", spec, released_site, nvml, [gpu() for _ in range(8)])
    assert old.status == Status.WARN and old.data["refused_by"] == ["sglang", "flashinfer"]
    assert old.summary.startswith(
        "sglang 0.5.9 admits the fused all-reduce on majors [9, 10] only (its apply_flashinfer_allreduce_fusion()): "
        "on major 12 apply_flashinfer_allreduce_fusion() returns False: the flag is a no-op"
    )
    # on Hopper both gates admit the GPU
    hopper = interpreter_lock(tmp_path, plain_python, base=ROOT / "lockfiles" / "hopper-sm90-cu130.toml")
    h200 = run_check("engine.fusion_gate", hopper, next_site, nvml, [gpu(H200, (9, 0))])
    assert h200.status == Status.PASS and h200.data["refused_by"] == []
    assert h200.summary.startswith("flashinfer 0.6.17 and sglang 0.5.23 both admit the fused all-reduce on compute")


def test_an_sglang_whose_gate_cannot_be_read_is_said_never_assumed(
    plain_python: Path, released_site: Path, tmp_path: Path, nvml: Any
) -> None:
    odd = tmp_path / "odd"
    (odd / "sglang" / "srt" / "layers").mkdir(parents=True)
    (odd / "sglang" / "__init__.py").write_text("")
    (odd / "sglang" / "srt" / "layers" / "flashinfer_comm_fusion.py").write_text(
        "def _resolve_backend(b):\n    if not p().is_sm90:\n        raise ValueError(f'built {b}')\n"
    )
    hopper = interpreter_lock(tmp_path, plain_python, base=ROOT / "lockfiles" / "hopper-sm90-cu130.toml")
    site = f"{odd}{os.pathsep}{released_site}"
    nvml.configure(machine([gpu(H200, (9, 0))]))
    gate = measure.read_gate(plain_python, {**os.environ, "PYTHONPATH": site})
    assert gate.sglang is not None and gate.sglang["error"].startswith("ValueError: ")  # an f-string: no literal
    result = run_check("engine.fusion_gate", hopper, odd, nvml, [gpu(H200, (9, 0))])
    assert result.status == Status.SKIP and "flashinfer's gate could not be read" in result.summary  # no flashinfer
    result = run_check("engine.fusion_gate", hopper, Path(site), nvml, [gpu(H200, (9, 0))])
    assert result.status == Status.SKIP
    assert result.summary.startswith("flashinfer admits major 9; sglang: its gate could not be read: ValueError: ")


def test_the_deep_fusion_runs_where_flashinfer_admits_and_names_sglang_as_the_refuser() -> None:
    refusal = engine_refusal(
        {
            "version": "0.5.23",
            "function": "_resolve_backend",
            "supported_majors": [9, 10],
            "refusal": "raises",
            "message": SGLANG_REFUSAL,
        },
        {12},
    )
    result = deep.judge_fusion(fusion_run(fusion_lines()), JIT, HOPPER, refusal)
    assert result.status == Status.WARN and result.data["refused_by"] == "sglang"
    assert result.summary.startswith("flashinfer's fused kernel runs here (2 ranks, hidden ")
    assert result.summary.endswith(f"but in production {refusal}")
    assert result.data["figures"] and result.data["runs"] is True
    assert deep.judge_fusion(fusion_run(fusion_lines()), JIT, HOPPER).data["refused_by"] is None


def test_init_on_the_next_stack_names_sglang_kernel_and_keeps_the_fusion_flag_out(
    plain_python: Path, next_site: Path, nvml: Any
) -> None:
    nvml.configure(machine([gpu() for _ in range(8)]))
    environ = {**os.environ, "PYTHONPATH": str(next_site)}
    spec = machine_spec(observe(environ, python=plain_python, nvml_lib=nvml), "now")
    packages = spec.split("[python.packages]\n")[1].split("\n\n")[0].splitlines()
    assert [line.split(" ")[0] for line in packages] == ["flashinfer-python", "sglang-kernel", "sglang"]
    assert 'sglang-kernel = "==0.4.10"' in packages[1] and '"sgl_kernel"' in spec
    flags = next(line for line in spec.splitlines() if line.startswith("flags = "))
    assert flags.startswith("flags = []") and flags.endswith(
        "# no fusion flag: sglang 0.5.23 admits the fused all-reduce on majors [9, 10] only (its _resolve_backend()): "
        f"on major 12 its start-up raises {SGLANG_REFUSAL}"
    )


# --- the target script's paths that need no GPU, under CPU torch ------------------------------


@pytest.mark.torch
def test_two_ranks_on_a_machine_without_gpus_fail_before_spawning(
    torch_python: Path, released_site: Path, tmp_path: Path, nvml: Any
) -> None:
    spec = interpreter_lock(
        tmp_path,
        torch_python,
        base=ROOT / "lockfiles" / "hopper-sm90-cu130.toml",
        edits=(("tp = 1 ", "tp = 2 "), ("gpu_count = 1", "gpu_count = 2")),
    )
    result = run_check("deep.allreduce_fusion", spec, released_site, nvml, [gpu(H200, (9, 0)), gpu(H200, (9, 0))])
    assert result.status == Status.FAIL
    assert result.summary == "the allreduce fusion failed (exit 1): 2 ranks asked for, torch sees 0 GPU(s)"


@pytest.mark.torch
def test_attention_reports_a_flashinfer_that_does_not_import(
    torch_python: Path, released_site: Path, tmp_path: Path, nvml: Any
) -> None:
    """The released wheel installed without its dependencies (as `pip install --no-deps` leaves it)."""
    spec = interpreter_lock(tmp_path, torch_python, base=ROOT / "lockfiles" / "hopper-sm90-cu130.toml")
    result = run_check(
        "deep.flashinfer_attention",
        spec,
        released_site,
        nvml,
        [gpu(H200, (9, 0))],
        FLASHINFER_WORKSPACE_BASE=str(tmp_path / "jit"),
    )
    assert result.status == Status.FAIL
    assert result.summary == "ModuleNotFoundError: No module named 'tvm_ffi' -> Module tvm_ffi is not installed"
    assert result.fix is not None and result.fix.commands[0].startswith("stackgate provision --only python")
    assert f"JIT cache: {tmp_path / 'jit'} (from FLASHINFER_WORKSPACE_BASE)" in result.details
    missing = run_check("deep.flashinfer_attention", spec, None, nvml, [gpu(H200, (9, 0))])
    assert missing.summary == "ModuleNotFoundError: No module named 'flashinfer' -> Module flashinfer is not installed"


def flashwork(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), str(measure.FLASHWORK), *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_the_target_script_refuses_bad_usage_and_says_when_torch_is_missing(plain_python: Path, tmp_path: Path) -> None:
    usage = flashwork(plain_python, "bogus", str(tmp_path / "x.jsonl"), "{}")
    assert usage.returncode == 2 and "flashwork.py attention OUT.jsonl REQUEST-JSON" in usage.stderr
    assert flashwork(plain_python, "attention", str(tmp_path / "x.jsonl"), "{not json").returncode == 2
    done = flashwork(plain_python, "attention", str(tmp_path / "a.jsonl"), "{}")
    [line] = [json.loads(text) for text in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert done.returncode == 1 and line == {
        "event": "begin",
        "error": "torch does not import: No module named 'torch'",
    }


def test_jit_workspace_follows_the_environment_then_the_stack() -> None:
    assert measure.jit_workspace(HOPPER, {"FLASHINFER_WORKSPACE_BASE": "/fast/fi"}) == (
        Path("/fast/fi"),
        "FLASHINFER_WORKSPACE_BASE",
    )
    assert measure.jit_workspace(HOPPER, {"XDG_CACHE_HOME": "/xdg"})[0] == Path("/xdg/stackgate/flashinfer")
    root = load_spec(DEFAULT_SPEC)
    assert measure.jit_workspace(root, {"HOME": "/h"}) == (Path("/opt/stackgate/cache/flashinfer"), "the stack's root")


# --- where the checks stand, and where their figures go ---------------------------------------


def test_flashinfer_checks_stand_on_the_static_checks_and_a_missing_flashinfer_is_not_a_skip() -> None:
    static, deep_checks = plan(("deep.allreduce_fusion",), deep=True)
    assert [c.name for c in deep_checks] == ["deep.allreduce_fusion"]
    assert {c.name for c in static} == {
        "gpu.driver",
        "gpu.count",
        "gpu.capability",
        "torch.build",
        "torch.arch",
        "nccl.version",
        "flashinfer.cubin",
    }
    passed = [
        Result(n, Status.PASS, "ok") for n in deep.PREREQUISITES["deep.allreduce_fusion"] if n != "flashinfer.cubin"
    ]
    absent = Result("flashinfer.cubin", Status.SKIP, "flashinfer-python is not installed")
    assert deep.not_run("deep.flashinfer_attention", [*passed, absent]) is None  # the check itself fails, saying so
    mismatch = Result("flashinfer.cubin", Status.FAIL, "flashinfer-cubin 0.6.3 != flashinfer-python 0.6.4")
    blocked = deep.not_run("deep.allreduce_fusion", [*passed, mismatch])
    assert (
        blocked is not None
        and blocked.summary == "not run: flashinfer.cubin failed: flashinfer-cubin 0.6.3 != flashinfer-python 0.6.4"
    )


def kept_gate(folder: Path, started: str, attention: Result, fusion: Result) -> Any:
    """A kept gate run whose verify stage holds the two results, named as the check runner names them."""
    from history_support import gate_doc, keep

    attention, fusion = (
        dataclasses.replace(attention, check="deep.flashinfer_attention"),
        dataclasses.replace(fusion, check="deep.allreduce_fusion"),
    )
    doc = gate_doc()
    doc["results"] += [{**r.to_dict(), "stage": "verify"} for r in (attention, fusion)]
    doc["gate"]["fingerprint"]["components"]["kernels"] = fingerprint.kernels_section([attention, fusion])
    return keep(folder, doc, started)


def test_the_figures_reach_the_fingerprint_and_report_a_b(tmp_path: Path) -> None:
    attention = deep.judge_attention(attention_run(attention_kernels()), JIT, HOPPER)
    fusion = deep.judge_fusion(fusion_run(fusion_lines()), JIT, HOPPER)
    slower = attention_kernels()
    slower[0]["gbs"] = 1000.0
    cached = deep.JitContext(JIT.workspace, JIT.workspace_from, 600.0, "==0.6.4+cu130", "0.6.4+cu130", None)
    a = kept_gate(tmp_path, "2025-01-01T10:00:00+00:00", attention, fusion)
    b = kept_gate(
        tmp_path, "2025-01-02T10:00:00+00:00", deep.judge_attention(attention_run(slower), cached, HOPPER), fusion
    )
    done = rundiff.compare(a, b)
    assert [str(c) for c in done.changes] == [
        (
            "flashinfer_attention: decode, decode_tensor_cores, prefill, paged_decode, bandwidth_decode correct "
            "against float32; JIT-compiled (no flashinfer-jit-cache) -> "
            "decode, decode_tensor_cores, prefill, paged_decode, bandwidth_decode correct against float32; "
            "precompiled: flashinfer-jit-cache 0.6.4+cu130"
        )
    ]
    texts = [f.text() for f in done.figures]
    assert texts[0] == "deep.flashinfer_attention decode GB/s: 1280 -> 1000 (-21.9%)"
    assert "deep.allreduce_fusion fused speedup at 1 tokens: 5.318 -> 5.318 (+0.0%)" in texts
    assert fingerprint.kernels_section(
        [Result("deep.flashinfer_attention", Status.SKIP, "not run: torch.build failed")]
    ) == {"flashinfer_attention": "SKIP: not run: torch.build failed"}


# --- the collective's timing (item 29) --------------------------------------------------------


def test_the_recorded_aligned_replays_give_each_ranks_median_and_the_fastest() -> None:
    """The standalone run's replays, as deepwork.py now writes them: at 1 MiB each rank's median of
    5 replays is 16.6 us (nccl-tests read 14.97 us beside it: the multi-process transport)."""
    [aligned] = [line for line in recorded("run2_ar_align.jsonl") if line["cfg"]["name"] == "align"]
    per_rank = {
        rank: [
            {
                "event": "size",
                "bytes": int(size),
                "us": statistics.median(us),
                "us_min": min(us),
                "us_replays": us,
                "eager_us": 50.0,
                "timing": "cuda-graph",
                "wrong": 0,
            }
            for size, us in replays.items()
        ]
        for rank, replays in enumerate(aligned["us_per_rank"])
    }
    figures = {f.bytes: f for f in measure.aggregate(2, per_rank)}
    mib = figures[1 << 20]
    assert mib.time_us == pytest.approx((16.62 + 16.58) / 2) and mib.min_us == 16.52
    assert mib.busbw_gbs == pytest.approx((1 << 20) / 16.6e-6 / 1e9, rel=1e-3)
    sweep_lines = deep.sweep._size_lines(SimpleSweep(tuple(figures.values())))  # type: ignore[arg-type]
    assert sweep_lines[2] == (
        "   1 MiB:       16.6 us (min 16.5)  algbw    63.17 GB/s  busbw    63.17 GB/s  #wrong 0  (launched one "
        "by one: 50.0 us)"
    )


class SimpleSweep:
    def __init__(self, sizes: tuple[measure.SizeFigures, ...]) -> None:
        self.sizes = sizes
