"""Tests of the deep checks: the judgement with plain numbers, then the real scripts under CPU torch
(gloo in place of NCCL, two real processes), then `invoke verify --deep` when torch is a CPU build."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from types import MappingProxyType, SimpleNamespace

import pytest
from fakes import fake_nvml
from fakes.fake_nvml import gpu, machine
from specs import THIS_PYTHON, write_spec
from support import processes_with

from stackgate.checks import deep
from stackgate.edges import nvml
from stackgate.facts import Facts, Missing, ProbeFacts
from stackgate.facts import deepruns as measure
from stackgate.facts.values import Distribution
from stackgate.flows.verify import plan
from stackgate.models.exitcodes import UsageError
from stackgate.models.result import Result, Status
from stackgate.models.spec import Spec, load_spec

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent


# --- per-GPU judgement, plain numbers ---------------------------------------------------------


def gpu_record(
    index: int, bf16: float = 790.0, fp32: float = 50.0, copy: float = 4300.0, err: float = 0.002, equal: bool = True
) -> dict:
    return {
        "event": "done",
        "index": index,
        "name": "NVIDIA H200",
        "seconds": 0.4,
        "bfloat16": {"n": 8192, "ms": 1.39, "tflops": bf16, "rel_err": err, "sample": 64},
        "float32": {"n": 4096, "ms": 2.7, "tflops": fp32, "rel_err": 1e-6, "sample": 64},
        "copy": {"bytes": 2 << 30, "ms": 1.0, "gbs": copy, "equal": equal},
    }


def gpu_work(records: list[dict], returncode: int | None = 0, running: int | None = None) -> measure.GpuWork:
    begin = {"event": "begin", "torch": "2.11.0+cu130", "devices": len(records), "seed": 5}
    return measure.GpuWork(
        begin, tuple(records), running, returncode, 300.0, ("last line",), Path("/tmp/gpu-work.log"), 4.2
    )


def test_relative_error_judgement() -> None:
    assert deep.within_tolerance(0.002, deep.TOLERANCE["bfloat16"])
    assert not deep.within_tolerance(0.02, deep.TOLERANCE["bfloat16"])
    assert not deep.within_tolerance(1e-3, deep.TOLERANCE["float32"])  # what TF32 would give
    assert not deep.within_tolerance(float("nan"), 1.0)
    assert not deep.within_tolerance(float("inf"), 1.0)


def test_slow_peers_compares_each_gpu_with_the_others() -> None:
    assert deep.slow_peers({"a": 790.0, "b": 400.0}) == {"b": (400.0, 790.0)}  # the slow one of two
    assert deep.slow_peers({"a": 790.0, "b": 760.0, "c": 781.0, "d": 700.0}) == {}  # a few percent is health
    assert deep.slow_peers({"a": 790.0}) == {}  # no peers
    assert set(deep.slow_peers({"a": 10.0, "b": 10.0, "c": 6.9}, floor=0.7)) == {"c"}


def test_healthy_gpus_pass_with_their_figures() -> None:
    result = deep.judge_gpu_work(gpu_work([gpu_record(0), gpu_record(1, bf16=785.0)]))
    assert result.status == Status.PASS
    assert "2 GPU(s) correct: bf16 785-790 TFLOP/s" in result.summary
    assert result.data["gpus"][1]["bfloat16"]["tflops"] == 785.0
    assert result.data["gpus"][0]["copy"]["gbs"] == 4300.0
    assert "bytes read + bytes written" in result.data["conventions"]["copy_gbs"]


def test_a_tf32_sized_fp32_error_says_so() -> None:
    record = gpu_record(0)
    record["float32"]["rel_err"] = 4e-4
    result = deep.judge_gpu_work(gpu_work([record]))
    assert result.summary.endswith(
        (
            "float32 product wrong: relative error 0.0004 > 0.0001 against float64 (TF32-sized: is "
            "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 "
            "set?)"
        )
    )


def test_a_wrong_product_fails_by_name() -> None:
    result = deep.judge_gpu_work(gpu_work([gpu_record(0), gpu_record(1, err=float("nan"))]))
    assert result.status == Status.FAIL
    assert "GPU 1 (NVIDIA H200): bfloat16 product wrong" in result.summary
    assert not any("GPU 0" in line for line in result.details)


def test_an_erroring_gpu_and_a_damaged_copy_fail_by_name() -> None:
    broken = {
        "event": "done",
        "index": 2,
        "error": "RuntimeError: CUDA error: no kernel image is available for execution on the device",
        "seconds": 0.1,
    }
    result = deep.judge_gpu_work(gpu_work([gpu_record(0), gpu_record(1, equal=False), broken]))
    assert result.status == Status.FAIL
    assert any(line.startswith("GPU 2 (unknown): RuntimeError: CUDA error: no kernel image") for line in result.details)
    assert any(line.startswith("GPU 1 (NVIDIA H200): a device-to-device copy") for line in result.details)
    assert result.data["gpus"][2] == {"index": 2, "error": broken["error"]}


def test_a_far_slower_gpu_fails_by_name() -> None:
    records = [gpu_record(0), gpu_record(1), gpu_record(2, copy=2000.0)]
    result = deep.judge_gpu_work(gpu_work(records))
    assert result.status == Status.FAIL
    assert result.details == ("GPU 2 (NVIDIA H200): copy 2000 GB/s, 47% of its peers' median 4300 GB/s",)


def test_a_gpu_that_never_finishes_is_a_hang() -> None:
    result = deep.judge_gpu_work(gpu_work([gpu_record(0)], returncode=None, running=1))
    assert result.status == Status.FAIL
    assert result.summary == "hang: GPU 1 did not finish its work within 300 s"
    assert result.data["hung"] is True
    assert result.details == ("log tail:", "last line")


def test_one_gpu_is_judged_against_an_idle_gpu_of_its_model_and_the_neighbour_is_named(tmp_path: Path) -> None:
    # The rates one H200 gave while another process kept it 100% busy (bf16 311.2, fp32 21.16, copy 2000).
    busy = gpu_record(0, bf16=311.2, fp32=21.16, copy=2000.0)
    neighbour = started(["sleep", "300"])
    try:
        busy_gpu = gpu(
            name="NVIDIA H200",
            cc=(9, 0),
            util=[100, 23],
            process_util=[{"pid": neighbour.pid, "sm": 90}],
            processes=[{"pid": neighbour.pid, "used": 874 * 2**20}],
        )
        fake_nvml.configure(machine([busy_gpu]))
        activity = measure.gpu_activity(fake_nvml)
        result = deep.judge_gpu_work(gpu_work([busy]), activity)
    finally:
        fake_nvml.configure(None)
        neighbour.kill()
        neighbour.wait()
    assert result.status == Status.FAIL
    assert result.summary == (
        "3 GPU problem(s): GPU 0 (NVIDIA H200): bfloat16 311.2 TFLOP/s, 40% of an idle NVIDIA H200's 781.2 "
        "TFLOP/s (floor 70%; MODEL_RATES row 'NVIDIA H200')"
    )
    assert (
        result.details[-1]
        == f"before measuring: GPU 0 (NVIDIA H200) was 100% busy; pid {neighbour.pid} (sleep 300) used 90% of its SMs"
    )
    assert f"ps -o pid,user,cmd -p {neighbour.pid}" in result.fix.commands and "reset" not in result.fix.text
    idle = deep.judge_gpu_work(
        gpu_work([gpu_record(0, bf16=781.0)]),
        measure.gpu_activity(configured(machine([gpu(name="NVIDIA H200", cc=(9, 0))]))),
    )
    fake_nvml.configure(None)
    assert (
        idle.status == Status.PASS
        and idle.details[-1] == "before measuring: GPU 0 (NVIDIA H200) was 0% busy; no other process on it"
    )


def test_verify_deep_names_the_model_rates_row_it_judged_against_and_how_it_was_measured() -> None:
    result = deep.judge_gpu_work(gpu_work([gpu_record(0, bf16=781.0)]))
    assert result.status == Status.PASS
    assert result.summary.endswith("; judged against MODEL_RATES row 'NVIDIA H200'")
    [how] = [line for line in result.details if line.startswith("MODEL_RATES row 'NVIDIA H200': ")]
    assert "'read': 4443.0" in how and "benchmarks/h200_deep.sh" in how and "driver 580.159.04" in how
    assert result.data["model_rates_how"]["NVIDIA H200"] == deep.MODEL_RATES_HOW["NVIDIA H200"]
    other = deep.judge_gpu_work(gpu_work([{**gpu_record(0), "name": "NVIDIA B200"}]))
    assert other.status == Status.PASS and "judged against" not in other.summary
    assert "no MODEL_RATES row for NVIDIA B200: judged against its peers alone" in other.details


def test_a_slow_gpu_with_nothing_else_on_it_says_the_cause_is_not_known() -> None:
    result = deep.judge_gpu_work(
        gpu_work([gpu_record(0, copy=2000.0)]),
        measure.gpu_activity(configured(machine([gpu(name="NVIDIA H200", cc=(9, 0))]))),
    )
    fake_nvml.configure(None)
    assert (
        result.details[0]
        == "GPU 0 (NVIDIA H200): copy 2000 GB/s, 47% of an idle NVIDIA H200's 4266 GB/s (floor 70%; MODEL_RATES row "
        "'NVIDIA H200')"
    )
    assert "the cause is not known" in result.fix.text and "reset" not in result.fix.text


def started(argv: list[str]) -> subprocess.Popen:
    """A process whose command line /proc already shows (it is empty for a moment while the exec completes)."""
    proc = subprocess.Popen(argv)
    deadline = time.monotonic() + 10
    while not Path(f"/proc/{proc.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
        time.sleep(0.01)
    return proc


def configured(spec: dict) -> object:
    fake_nvml.configure(spec)
    return fake_nvml


# --- collective judgement, plain numbers ------------------------------------------------------


def size_line(size: int, us: float, wrong: int = 0) -> dict:
    return {"event": "size", "bytes": size, "us": us, "wrong": wrong}


def test_aggregate_averages_time_over_ranks_like_all_reduce_perf() -> None:
    per_rank = {0: [size_line(1 << 20, 100.0)], 1: [size_line(1 << 20, 300.0, wrong=1)]}
    [figures] = measure.aggregate(2, per_rank)
    assert figures.time_us == 200.0
    assert figures.algbw_gbs == pytest.approx((1 << 20) / 200e-6 / 1e9)
    assert figures.busbw_gbs == pytest.approx(figures.algbw_gbs)  # 2(n-1)/n = 1 for two ranks
    assert figures.wrong == 1  # summed over ranks, as nccl-tests reports #wrong


def test_aggregate_uses_8_rank_bus_factor_and_drops_unfinished_sizes() -> None:
    per_rank = {r: [size_line(1 << 30, 4000.0)] + ([size_line(2 << 30, 8000.0)] if r else []) for r in range(8)}
    figures = measure.aggregate(8, per_rank)
    assert [f.bytes for f in figures] == [1 << 30]  # rank 0 never finished 2 GiB
    assert figures[0].busbw_gbs == pytest.approx(figures[0].algbw_gbs * 1.75)


def test_graph_timed_sizes_keep_the_eager_latency_beside() -> None:
    graphed = {"timing": "cuda-graph"}
    per_rank = {
        0: [{**size_line(8192, 10.0), **graphed, "eager_us": 60.0}],
        1: [{**size_line(8192, 12.0), **graphed, "eager_us": 64.0}],
    }
    [figures] = measure.aggregate(2, per_rank)
    assert (figures.time_us, figures.timing, figures.eager_us) == (11.0, "cuda-graph", 62.0)
    # One rank that could not capture makes the size eager: the figure is then the eager one.
    per_rank[1][0]["timing"] = "eager"
    assert measure.aggregate(2, per_rank)[0].timing == "eager"


def make_sweep(world: int, sizes: list[measure.SizeFigures], **changes: object) -> measure.Sweep:
    request = measure.AllReduceRequest(
        world, min_bytes=sizes[0].bytes if sizes else 8192, max_bytes=sizes[-1].bytes if sizes else 8192
    )
    fields = dict(
        request=request,
        sizes=tuple(sizes),
        progress={r: len(sizes) for r in range(world)},
        pids=(),
        nccl_version="2.28.9",
        returncode=0,
        timeout_s=300.0,
        tail=(),
        log=Path("/tmp/allreduce.log"),
        nccl_env={"NCCL_DEBUG": "INFO", "NCCL_NVLS_ENABLE": "0", "NCCL_P2P_LEVEL": "SYS"},
        transports={"P2P/CUMEM/read": 48},
        channels=24,
        duration_s=9.0,
    )
    fields.update(changes)
    return measure.Sweep(**fields)


def test_one_rank_passes_and_says_busbw_is_not_defined() -> None:
    sizes = [measure.SizeFigures(8192, 5.0, 1.6, None, 0), measure.SizeFigures(16384, 5.0, 3.3, None, 0)]
    result = deep.judge_collective(make_sweep(1, sizes), min_busbw=30.0)
    assert result.status == Status.PASS
    assert (
        "bus bandwidth is not defined for one rank (2(n-1)/n = 0): a correctness pass, not timed; min_busbw_gbs 30 "
        "not judged" in result.summary
    )
    assert result.data["busbw_judged"] is False and result.data["peak_busbw_gbs"] is None
    assert result.data["busbw_note"].startswith("bus bandwidth is not defined for one rank")
    assert "busbw n/a (1 rank)" in result.details[0]


def test_busbw_below_the_lock_fails_naming_the_nccl_variables() -> None:
    sizes = [measure.SizeFigures(1 << 30, 50000.0, 21.5, 37.6, 0), measure.SizeFigures(2 << 30, 95000.0, 22.6, 39.5, 0)]
    result = deep.judge_collective(make_sweep(8, sizes), min_busbw=45.0)
    assert result.status == Status.FAIL
    assert result.summary.startswith(
        (
            "peak busbw 39.5 GB/s at 2 GiB is below the lock's 45 GB/s (NCCL 2.28.9, 8 ranks; NCCL_P2P_LEVEL=SYS, "
            "NCCL_MIN_NCHANNELS=unset"
        )
    )
    assert "NCCL variables in force: NCCL_DEBUG=INFO NCCL_NVLS_ENABLE=0 NCCL_P2P_LEVEL=SYS" in result.details
    assert "transports in the INFO log: P2P/CUMEM/read x48" in result.details
    assert deep.judge_collective(make_sweep(8, sizes), min_busbw=39.0).status == Status.PASS


def test_a_crashed_sweep_fails_with_the_error_line() -> None:
    sweep = make_sweep(
        2, [], returncode=1, tail=("NCCL INFO comm 0x1 rank 0", "RuntimeError: NCCL error: unhandled cuda error")
    )
    result = deep.judge_collective(sweep, None)
    assert result.status == Status.FAIL
    assert result.summary == "the all-reduce failed (exit 1): RuntimeError: NCCL error: unhandled cuda error"
    assert result.fix.text == "The cause is not known from this output: read the full log."  # not P2P tuning on a guess


#: The tail of deep.collective's log on 1x H200 with NCCL_SOCKET_IFNAME=nope (2026-12-01).
NO_SOCKET_TAIL = (
    "torch.distributed.DistBackendError: NCCL error in: "
    "/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3135, invalid usage "
    "(run with NCCL_DEBUG=WARN for details), NCCL version 2.28.9",
    "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
    "Last error:",
    "Bootstrap : no socket interface found",
)


def test_a_bootstrap_without_a_socket_interface_names_the_variable_and_the_hosts_interfaces() -> None:
    nccl_env = {"NCCL_DEBUG": "INFO", "NCCL_NVLS_ENABLE": "0", "NCCL_SOCKET_IFNAME": "nope"}
    sweep = make_sweep(
        1, [], returncode=1, tail=NO_SOCKET_TAIL, nccl_env=nccl_env, interfaces=("eth0", "ifb0", "ifb1", "lo")
    )
    result = deep.judge_collective(sweep, None)
    assert result.summary == (
        "the all-reduce failed (exit 1): NCCL's bootstrap found no socket interface: NCCL_SOCKET_IFNAME=nope matches "
        "none of this host's "
        "interfaces (eth0, ifb0, ifb1, lo)"
    )
    assert result.fix.text.startswith(
        "Unset NCCL_SOCKET_IFNAME, or set it to interfaces this host has (eth0, ifb0, ifb1, lo;"
    )
    assert "P2P" not in result.fix.text and "NCCL_MIN_NCHANNELS" not in result.fix.text
    unset = deep.judge_collective(make_sweep(1, [], returncode=1, tail=NO_SOCKET_TAIL, interfaces=("lo",)), None)
    assert unset.summary.endswith("(NCCL_SOCKET_IFNAME is not set; this host has lo): the cause is not known from this")
    assert "lo" in measure.host_interfaces()  # this machine's own, read as the sweep reads them


# --- what deep stands on, and how verify plans it ---------------------------------------------


def result(name: str, status: Status, summary: str = "", **data: object) -> Result:
    return Result(name, status, summary or status.name.lower(), data=data)


STATIC_OK = [
    result(n, Status.PASS) for n in ("gpu.driver", "gpu.count", "gpu.capability", "torch.build", "nccl.version")
]


def test_deep_checks_run_only_on_passed_prerequisites() -> None:
    ok = [*STATIC_OK, result("torch.arch", Status.WARN, "compute capability 9.0 runs only through PTX JIT")]
    assert deep.not_run("deep.gpu_work", ok) is None  # a warning is a pass here
    cpu = [r for r in ok if r.check != "torch.build"] + [
        result("torch.build", Status.FAIL, "torch 2.13.0+cpu is a CPU build")
    ]
    skipped = deep.not_run("deep.collective", cpu)
    assert skipped is not None and skipped.status == Status.SKIP and skipped.check == "deep.collective"
    assert skipped.summary == "not run: torch.build failed: torch 2.13.0+cpu is a CPU build"
    missing = deep.not_run("deep.collective", [r for r in ok if r.check != "nccl.version"])
    assert missing is not None and missing.summary == "not run: nccl.version was not run"


def test_a_gpu_hang_keeps_the_collective_from_running() -> None:
    ok = [*STATIC_OK, result("torch.arch", Status.PASS)]
    hung = result("deep.gpu_work", Status.FAIL, "hang: GPU 3 did not finish", hung=True)
    skipped = deep.not_run("deep.collective", [*ok, hung])
    assert skipped is not None and "a GPU hung in deep.gpu_work" in skipped.summary
    assert deep.not_run("deep.collective", [*ok, result("deep.gpu_work", Status.FAIL, "slow GPU 2")]) is None


def test_plan_keeps_deep_checks_out_of_plain_verify() -> None:
    static, deep_checks = plan((), deep=False)
    assert deep_checks == [] and not any(c.slow for c in static)
    with pytest.raises(UsageError, match="deep.collective run only with --deep"):
        plan(("deep.collective",), deep=False)
    static, deep_checks = plan(("deep.collective",), deep=True)
    assert [c.name for c in deep_checks] == ["deep.collective"]
    assert {c.name for c in static} == set(deep.PREREQUISITES["deep.collective"])


def test_launch_env_forces_multicast_off_and_an_info_log() -> None:
    spec = SimpleNamespace(smoke=SimpleNamespace(env=MappingProxyType({"NCCL_MIN_NCHANNELS": "8"})))
    shell = {"PATH": "/bin", "NCCL_NVLS_ENABLE": "1", "NCCL_DEBUG": "WARN", "NCCL_DEBUG_FILE": "/tmp/x.%p"}
    facts = SimpleNamespace(env=SimpleNamespace(environ=shell))
    env = measure.launch_env(spec, facts)  # type: ignore[arg-type]
    assert (
        env["NCCL_NVLS_ENABLE"] == "0"
        and env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
        and env["NVSHMEM_DISABLE_NVLS"] == "1"
    )
    assert env["NCCL_DEBUG"] == "INFO" and "NCCL_DEBUG_FILE" not in env and env["NCCL_MIN_NCHANNELS"] == "8"


# --- the real scripts under CPU torch ---------------------------------------------------------


def cpu_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(measure.REQUIRED_ENV, NCCL_P2P_LEVEL="SYS", OMP_NUM_THREADS="1")
    return env


def plant(monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    """A deep.* fault point in stackgate's environment: the request hands it to deepwork.py."""
    monkeypatch.setenv("STACKGATE_FAULT", f"deep.{point}")


SMALL_GPU_WORK = measure.GpuWorkRequest(
    device="cpu", bf16_n=128, fp32_n=96, copy_bytes=1 << 20, warmup=1, iters=2, sample=32
)


@pytest.mark.torch
def test_gpu_work_runs_and_checks_real_products(torch_python: Path, _deep_dir: Path) -> None:
    work = measure.run_gpu_work(torch_python, SMALL_GPU_WORK, cpu_env(), timeout_s=120)
    assert (
        work.log.parent.parent == _deep_dir
    )  # the run's folder, kept for its log: the test's own, not the system's temp folder
    result = deep.judge_gpu_work(work)
    assert result.status == Status.PASS, result.details
    [gpu] = result.data["gpus"]
    assert gpu["bfloat16"]["n"] == 128 and gpu["float32"]["n"] == 96
    assert 0 < gpu["bfloat16"]["rel_err"] < deep.TOLERANCE["bfloat16"]
    assert 0 <= gpu["float32"]["rel_err"] < deep.TOLERANCE["float32"]
    assert gpu["bfloat16"]["tflops"] > 0 and gpu["copy"]["gbs"] > 0 and gpu["copy"]["equal"] is True
    assert result.data["seed"] == SMALL_GPU_WORK.seed and work.log.is_file()


@pytest.mark.torch
def test_gpu_work_catches_a_planted_wrong_product(torch_python: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plant(monkeypatch, "matmul:0")
    work = measure.run_gpu_work(torch_python, SMALL_GPU_WORK, cpu_env(), timeout_s=120)
    result = deep.judge_gpu_work(work)
    assert result.status == Status.FAIL
    assert result.details == (
        "GPU 0 (cpu): bfloat16 product wrong: relative error 2 > 0.01 against float64",
        "GPU 0 (cpu): float32 product wrong: relative error 2 > 0.0001 against float64",
    )


@pytest.mark.torch
def test_one_rank_gets_a_correctness_pass_in_its_own_process(torch_python: Path) -> None:
    one = dataclasses.replace(measure.AllReduceRequest.for_world(1), backend="gloo", device="cpu", max_bytes=64 << 10)
    assert (one.graphs, one.iters, one.warmup) == (False, 2, 1) and measure.AllReduceRequest.for_world(2).graphs
    sweep = measure.run_sweep(torch_python, one, cpu_env(), timeout_s=120)
    result = deep.judge_collective(sweep, None)
    assert result.status == Status.PASS, result.details
    assert (
        result.summary.startswith("1 rank, gloo: all-reduce exact at 4 sizes (8 KiB-64 KiB)")
        and "a correctness pass, not timed" in result.summary
    )
    assert "torch/multiprocessing/spawn.py" not in sweep.log.read_text()  # rank 0 ran in the script's own process


@pytest.mark.torch
def test_runs_started_ahead_are_taken_by_the_runs_they_were_started_for(torch_python: Path) -> None:
    env = cpu_env()
    one = dataclasses.replace(measure.AllReduceRequest.for_world(1), backend="gloo", device="cpu", max_bytes=64 << 10)
    with measure.ahead() as pool:
        pool.start(measure.Launch(torch_python, measure.SCRIPT, env))
        pool.start(measure.Launch(torch_python, measure.SCRIPT, env))
        work = measure.run_gpu_work(torch_python, SMALL_GPU_WORK, env, timeout_s=120)
        sweep = measure.run_sweep(torch_python, one, env, timeout_s=120)
    assert (pool.started, pool.taken) == (2, 2)
    assert deep.judge_gpu_work(work).status == Status.PASS and deep.judge_collective(sweep, None).status == Status.PASS
    for log, mode in ((work.log, "gpu"), (sweep.log, "allreduce")):
        header, ahead = log.read_text().splitlines()[:2]
        assert f"deepwork.py {mode} " in header
        assert ahead.startswith("# started ") and ahead.endswith("deepwork.py hold")


@pytest.mark.torch
def test_a_run_in_another_environment_starts_its_own_and_the_one_held_is_ended(torch_python: Path) -> None:
    marker = f"STACKGATE_TEST_HELD_{os.getpid()}_{time.monotonic_ns()}"
    held_env = dict(cpu_env(), **{marker: "1"})
    with measure.ahead() as pool:
        pool.start(measure.Launch(torch_python, measure.SCRIPT, held_env))
        assert processes_with(marker, "environ")  # started: it imports torch while the run below goes on
        work = measure.run_gpu_work(torch_python, SMALL_GPU_WORK, cpu_env(), timeout_s=120)
    assert (pool.started, pool.taken) == (1, 0)
    assert "# started" not in work.log.read_text() and deep.judge_gpu_work(work).status == Status.PASS
    assert processes_with(marker, "environ") == []  # the block's end killed the run never taken


def _launch_facts(spec: Spec, torch: str | None, gpus: int = 1) -> Facts:
    """Facts as verify --deep has them when it decides what to start ahead: NVML, the environment, the
    distributions' probe (no torch import) and torch's device count."""
    facts = Facts(spec, environ={})
    fake_nvml.configure(machine([gpu("NVIDIA H200", (9, 0)) for _ in range(gpus)]))
    try:
        facts.provide("nvml", nvml.snapshot(fake_nvml) if gpus else Missing("no NVIDIA driver"))
    finally:
        fake_nvml.configure(None)
    facts.provide("env", SimpleNamespace(environ={"PATH": "/usr/bin", "FLASHINFER_WORKSPACE_BASE": "/jit"}))
    found = {"torch": Distribution("torch", torch, (), "/site")} if torch else {}
    facts.provide("dists", ProbeFacts("/opt/sg/bin/python", "3.12.3", {}, found, None, 0.1))
    facts.provide("probe", ProbeFacts("/opt/sg/bin/python", "3.12.3", {}, found, {"device_count": gpus}, 0.1))
    return facts


def test_what_verify_starts_ahead_is_each_deep_checks_own_launch() -> None:
    spec = load_spec(ROOT / "lockfiles" / "hopper-sm90-cu130.toml")
    names = ("deep.gpu_work", "deep.collective", "deep.flashinfer_attention", "deep.allreduce_fusion")
    facts = _launch_facts(spec, "2.11.0+cu130")
    work, collective, attention, fusion = (deep.launch(name, spec, facts) for name in names)
    assert work is not None and work == collective and work.script == measure.SCRIPT
    assert work.env["NCCL_DEBUG"] == "INFO" and work.python == spec.python.target
    assert attention is not None and attention.script == measure.FLASHWORK and attention.env["PATH"] == "/usr/bin"
    assert fusion is None  # one GPU: no all-reduce to fuse, nothing would be started
    assert deep.launch("deep.allreduce_fusion", spec, _launch_facts(spec, "2.11.0+cu130", gpus=2)) is None  # tp 1
    tp2 = dataclasses.replace(spec, smoke=dataclasses.replace(spec.smoke, tp=2))
    two = deep.launch("deep.allreduce_fusion", tp2, _launch_facts(tp2, "2.11.0+cu130", gpus=2))
    assert two is not None and two.script == measure.FLASHWORK
    for torch, gpus in (("2.13.0+cpu", 1), (None, 1), ("2.11.0+cu130", 0)):  # what would only be ended unused
        facts = _launch_facts(spec, torch, gpus)
        assert [deep.launch(name, spec, facts) for name in names] == [None] * 4, (torch, gpus)


@pytest.mark.parametrize(("line", "code"), [("", 0), ("not json\n", 2), ('{"gpu": 1}\n', 2), ("[1, 2]\n", 2)])
def test_a_held_script_refuses_arguments_that_are_not_a_list_of_words(line: str, code: int) -> None:
    done = subprocess.run(
        [sys.executable, measure.SCRIPT, "hold"], input=line, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == code, done.stderr
    assert (done.stderr == "") == (code == 0)


SMALL_SWEEP = dict(backend="gloo", device="cpu", min_bytes=8 << 10, max_bytes=64 << 10, warmup=2, iters=3)


@pytest.mark.torch
def test_gloo_all_reduce_of_two_processes_is_exact(torch_python: Path) -> None:
    sweep = measure.run_sweep(torch_python, measure.AllReduceRequest(2, **SMALL_SWEEP), cpu_env(), timeout_s=120)
    assert sweep.returncode == 0, sweep.tail
    assert [s.bytes for s in sweep.sizes] == [8192, 16384, 32768, 65536]
    assert all(s.wrong == 0 and s.time_us > 0 and s.busbw_gbs == pytest.approx(s.algbw_gbs) for s in sweep.sizes)
    assert len(set(sweep.pids)) == 2 and sweep.nccl_version is None
    result = deep.judge_collective(sweep, None)
    assert result.status == Status.PASS and result.summary.startswith("2 ranks, gloo: peak busbw")
    assert result.data["wrong_total"] == 0 and len(result.data["sizes"]) == 4
    # Real figures against an unreachable floor: the failure names the NCCL settings in force.
    slow = deep.judge_collective(sweep, 1e6)
    assert slow.status == Status.FAIL and "NCCL_P2P_LEVEL=SYS" in slow.summary


@pytest.mark.torch
def test_a_planted_wrong_contribution_is_counted(torch_python: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plant(monkeypatch, "wrong:1")
    sweep = measure.run_sweep(torch_python, measure.AllReduceRequest(2, **SMALL_SWEEP), cpu_env(), timeout_s=120)
    assert sweep.returncode == 0, sweep.tail
    assert [s.wrong for s in sweep.sizes] == [2, 2, 2, 2]  # one element, seen wrong by both ranks
    result = deep.judge_collective(sweep, None)
    assert result.status == Status.FAIL
    assert result.summary == "all-reduce results wrong at 4 of 4 sizes (#wrong 8)"


def running(pid: int) -> bool:
    """A process that exists and is not a zombie (a killed child nobody has reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def all_gone(pids: tuple[int, ...], within_s: float = 10.0) -> bool:
    """SIGKILL is delivered at once but a process takes a moment to finish dying."""
    deadline = time.monotonic() + within_s
    while any(running(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.torch
def test_a_planted_hang_fails_as_a_hang_and_the_group_is_killed(
    torch_python: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plant(monkeypatch, "hang:1")
    sweep = measure.run_sweep(torch_python, measure.AllReduceRequest(2, **SMALL_SWEEP), cpu_env(), timeout_s=25)
    assert sweep.returncode is None
    result = deep.judge_collective(sweep, None)
    assert result.status == Status.FAIL and result.data["hung"] is True
    assert result.summary == "hang: the warm-up all-reduces did not finish within 25 s (2 of 2 rank(s) set up)", (
        result.details
    )
    assert "rank 1: stopped in the warm-up all-reduces" in result.details
    assert len(sweep.pids) == 2 and all_gone(sweep.pids)


# --- `invoke verify --deep` with a CPU build of torch -----------------------------------------

#: The CPU-torch spec's tables after ``[python]``'s version and interpreter.
CPU_LOCK_TAIL = 'torch_cuda = "13.0"\n[python.packages]\ntorch = "==2.13.0"\n[nccl]\nmin_busbw_gbs = 30.0\n'


@pytest.mark.torch
def test_verify_deep_does_not_run_deep_checks_on_a_cpu_torch(torch_python: Path, tmp_path: Path) -> None:
    spec = tmp_path / "cpu.toml"
    cpu_torch = {"compute_capability": "9.0", "gpu_name": "H200", "version": THIS_PYTHON, "interpreter": torch_python}
    write_spec(spec, name="cpu-torch", **cpu_torch, python=CPU_LOCK_TAIL)
    load_spec(spec)  # the test's lock is itself valid
    nvml_spec = tmp_path / "nvml.json"
    nvml_spec.write_text(json.dumps(machine([gpu("NVIDIA H200", (9, 0))])))  # the GPU checks pass: only torch blocks
    fake = {"STACKGATE_NVML_MODULE": "fakes.fake_nvml", "STACKGATE_FAKE_NVML": str(nvml_spec)}
    env = dict(os.environ, **fake, PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT)]), NO_COLOR="1")
    env.pop("STACKGATE_DEEP_AHEAD", None)
    argv = [
        sys.executable,
        "-m",
        "invoke",
        "verify",
        "--deep",
        "--check",
        "deep.*",
        "--lock",
        str(spec),
        "--json",
        str(tmp_path / "r.json"),
        "--junit",
        str(tmp_path / "r.xml"),
    ]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr  # torch.build fails: the gate fails
    doc = json.loads((tmp_path / "r.json").read_text())
    status = {r["check"]: r for r in doc["results"]}
    assert {status[n]["status"] for n in ("gpu.driver", "gpu.count", "gpu.capability")} == {"PASS"}
    assert status["torch.build"]["status"] == "FAIL"
    deep_checks = ["deep.gpu_work", "deep.collective", "deep.flashinfer_attention", "deep.allreduce_fusion"]
    for name in deep_checks:
        assert status[name]["status"] == "SKIP"
        assert status[name]["summary"].startswith("not run: torch.build failed: torch 2.13.0+cpu is a CPU build")
    # The deep checks wait only for what they stand on; the other static checks run beside them.
    assert list(doc["phases_s"])[0] == "prerequisites"
    assert set(doc["phases_s"]) == {"prerequisites", *deep_checks, "static (beside the deep checks)"}
    # Nothing was started ahead: torch is a CPU build (its version says so before it is imported).
    assert doc["deep_ahead"] == {"started": 0, "taken": 0}
    cases = {c.get("name"): c for c in ET.parse(tmp_path / "r.xml").getroot().iter("testcase")}
    assert cases["deep.collective"].find("skipped") is not None
    assert "wall time" in done.stdout and "deep.gpu_work" in done.stdout
