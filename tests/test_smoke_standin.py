"""smoke against the stand-in SGLang server: real processes, real HTTP, real log files.

Every test ends by checking that no process of any server it launched is left, whatever happened.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from smoke_support import FAKES, Rig, assert_nothing_left, by_name, free_port, living, wait_for

from stackgate.edges import httpclient
from stackgate.edges.files import write_json
from stackgate.models.finding import Finding
from stackgate.models.result import Status

FUSION = "--enable-flashinfer-allreduce-fusion"
EVIDENCE = {FUSION: "FlashInfer workspace initialized for rank"}
SYMM_MEM_CRASH = [
    "Scheduler hit an exception: Traceback (most recent call last):",
    "  File "
    '"/opt/stackgate/current/lib/python3.12/site-packages/sglang/srt/distributed/'
    'device_communicators/torch_symm_mem.py", '
    "line 83, in __init__",
    "    not in TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES[self.device_capability]",
    "           ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~^^^^^^^^^^^^^^^^^^^^^^^^",
    "KeyError: 12",
]


@pytest.fixture
def rig(tmp_path, monkeypatch):
    made = Rig(tmp_path, free_port())
    monkeypatch.setenv("STACKGATE_FAKE_NVML", str(made.nvml_path))
    yield made
    for pid in living(made.processes()):  # a failed test must not leave servers behind either
        os.kill(pid, signal.SIGKILL)


def statuses(run):
    return {r.check: r.status.name for r in run.results}


def test_a_plain_smoke_passes_proves_what_runs_and_leaves_nothing(rig):
    done = rig.run(rig.spec(flags=("--mem-fraction-static", "0.8")))
    results = by_name(done.results)
    assert done.verdict.passed, statuses(done)
    assert [r.check for r in done.results] == [
        "smoke.preflight.python",
        "smoke.preflight.model",
        "smoke.preflight.port",
        "smoke.preflight.gpus",
        "smoke.launch",
        "smoke.server_info",
        "smoke.attention_backend",
        "smoke.tp_size",
        "smoke.flags",
        "smoke.log",
        "smoke.teardown",
    ]
    assert results["smoke.flags"].summary == "1 flag(s) run as asked"
    assert done.server_info["version"] == "0.5.9" and done.server_info["attention_backend"] == "flashinfer"
    session = done.sessions[0]
    assert session.argv[1:] == (
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(rig.model),
        "--tp-size",
        "1",
        "--host",
        "127.0.0.1",
        "--port",
        str(rig.port),
        "--attention-backend",
        "flashinfer",
        "--mem-fraction-static",
        "0.8",
    )
    assert session.teardown.how == "SIGTERM" and session.teardown.leftovers == ()
    assert "SGLang" in results["smoke.teardown"].summary
    assert session.to_dict()["readiness"]["proof"] == results["smoke.launch"].details[0]
    proof = results["smoke.launch"].details[0]  # the answering socket is the server's own
    assert re.fullmatch(r"its listening socket belongs to pid \d+, a process of the server", proof)
    assert_nothing_left(rig)


@pytest.mark.parametrize(
    "rate, burst, ttft_s",
    [(200.0, 1, 0.02), (120.0, 1, 0.5), (200.0, 4, 0.02)],
    ids=["steady", "slow-first-token", "bursts"],
)
def test_each_run_is_timed_from_the_events_the_server_sent(rig, rate, burst, ttft_s):
    # Only bounds that hold however loaded the machine is: the client and the stand-in read the
    # same clock (CLOCK_MONOTONIC), and nothing arrives before it was sent. How close the measured
    # rate is to the true one is measured in benchmarks/client_accuracy.py, not asserted here.
    rig.behave(rate=rate, burst=burst, ttft_s=ttft_s)
    done = rig.run(rig.spec(benchmark={"output_tokens": 240, "runs": 2, "warmup": 0}), benchmark=True)
    figures = done.figures
    assert len(figures.good) == 2
    sent = {e["number"]: e for e in rig.events("stream_done")}
    for number, sample in enumerate(figures.runs, 1):
        assert sample.tokens == 240  # from completion_tokens, not from the events
        assert sample.events == sent[number]["events"] == 240 // burst
        assert sample.first_tokens == burst  # the decode rate leaves the first event's tokens out
        # causal: the stand-in sends its first event ttft_s after the request, and the client reads it after that
        assert sample.started + ttft_s <= sent[number]["first_sent"] <= sample.first  # causal: load only widens it
        assert sent[number]["last_sent"] <= sample.ended
        assert sample.ttft_s >= ttft_s  # causal: the server waits ttft_s before its first event
        assert len(sample.gaps) == 240 - burst and sum(sample.gaps) == pytest.approx(sample.ended - sample.first)
        assert sample.decode_tok_s == pytest.approx((240 - burst) / (sample.ended - sample.first))
    assert by_name(done.results)["smoke.benchmark"].status == Status.SKIP  # no baseline in this lock
    assert_nothing_left(rig)


def test_the_baseline_judges_decode_so_a_slow_first_token_does_not_fail_it(rig):
    rig.behave(rate=200.0, ttft_s=0.5)  # end-to-end about 100 tok/s: half the baseline
    done = rig.run(
        rig.spec(
            benchmark={"output_tokens": 100, "runs": 1, "warmup": 0, "baseline_tok_s": 200.0, "max_regression": 0.2}
        ),
        benchmark=True,
    )
    verdict = by_name(done.results)["smoke.benchmark"]
    assert verdict.status == Status.PASS, verdict.summary
    assert re.fullmatch(
        r"decode \d+\.\d\d tok/s vs baseline 200 \([-+]\d+\.\d%; allowed -20\.0%\); end-to-end \d+\.\d\d tok/s with "
        r"time to first token",
        verdict.summary,
    )
    assert done.figures.tok_s.mean < 0.8 * 200.0  # what the old verdict judged, and failed
    assert_nothing_left(rig)


def test_a_regression_beyond_the_allowed_one_fails_naming_both_numbers(rig):
    rig.behave(rate=200.0)
    done = rig.run(rig.spec(benchmark={"baseline_tok_s": 300.0, "max_regression": 0.03}), benchmark=True)
    verdict = by_name(done.results)["smoke.benchmark"]
    mean = done.figures.decode_tok_s.mean
    assert verdict.status == Status.FAIL
    assert (
        verdict.summary.startswith(f"decode {mean:.2f} tok/s is ")
        and "below the baseline 300 tok/s (allowed: 3.0%, floor 291.00); end-to-end " in verdict.summary
    )
    assert by_name(done.results)["smoke.quality"].status == Status.PASS
    assert_nothing_left(rig)


@pytest.mark.parametrize("strict", [False, True], ids=["warn", "strict-fails"])
def test_an_interval_that_spans_the_floor_earns_more_runs_then_is_inconclusive(rig, strict):
    """Runs at 125 and 75 tok/s in turn: a mean of 100 over a floor of 90 says nothing when the
    95% interval reaches below the floor; smoke runs more, up to max_runs, then says so."""
    rig.behave(rate_cycle=[125.0, 75.0])
    bench = {"output_tokens": 100, "runs": 2, "max_runs": 4, "warmup": 0}
    spec = rig.spec(benchmark={**bench, "baseline_tok_s": 100.0, "max_regression": 0.1})
    done = rig.run(spec, benchmark=True, strict=strict)
    verdict = by_name(done.results)["smoke.benchmark"]
    decode = done.figures.decode_tok_s
    assert len(done.figures.runs) == 4 and decode.n == 4  # two more than asked: the cap
    assert decode.ci_low < 90.0 < decode.ci_high
    assert verdict.status == (Status.FAIL if strict else Status.WARN)
    assert verdict.summary.startswith(
        f"inconclusive: decode {decode.mean:.2f} tok/s, but the 95% interval {decode.interval()} tok/s "
        "spans the floor 90.00 after 4 runs (2 asked, up to max_runs 4 while it spanned)"
    ), verdict.summary
    assert verdict.data["inconclusive"] is True and verdict.data["floor_tok_s"] == 90.0
    assert int(done.verdict.exit_code) == (1 if strict else 0)
    assert_nothing_left(rig)


def test_a_flag_whose_path_never_initialised_fails_with_that_explanation(rig):
    rig.gpus(2)
    rig.behave(evidence=False)
    done = rig.run(rig.spec(tp=2, flags=(FUSION,), evidence=EVIDENCE))
    result = by_name(done.results)["smoke.evidence.enable-flashinfer-allreduce-fusion"]
    assert result.status == Status.FAIL
    assert result.summary == (
        "--enable-flashinfer-allreduce-fusion was accepted (enable_flashinfer_allreduce_fusion=True in /server_info) "
        "but the log never shows 'FlashInfer workspace initialized for rank': the path it enables never initialised"
    )
    assert by_name(done.results)["smoke.flags"].status == Status.PASS  # the flag itself was reported on
    assert_nothing_left(rig)


def test_a_fusion_flag_without_an_evidence_table_still_has_to_prove_its_path(rig):
    """A spec as init writes it: the flag, no [smoke] evidence. The fused path never runs (TP 2 here,
    but the server takes no fused path): smoke must not pass."""
    rig.gpus(2)
    rig.behave(evidence=False)
    done = rig.run(rig.spec(tp=2, flags=(FUSION,)))
    result = by_name(done.results)["smoke.evidence.enable-flashinfer-allreduce-fusion"]
    assert result.status == Status.FAIL and "the path it enables never initialised" in result.summary
    assert not done.verdict.passed
    assert_nothing_left(rig)


def test_at_log_level_warning_the_evidence_cannot_be_told_and_smoke_says_so(rig):
    rig.gpus(2)
    done = rig.run(
        rig.spec(tp=2, flags=(FUSION, "--log-level", "warning"), evidence=EVIDENCE)
    )  # the fused path does run
    result = by_name(done.results)["smoke.evidence.enable-flashinfer-allreduce-fusion"]
    assert result.status == Status.WARN
    assert "whether its path ran cannot be told: the server logs at --log-level warning" in result.summary
    assert "never initialised" not in result.summary
    assert (
        "FlashInfer workspace initialized" not in done.sessions[0].log_path.read_text()
    )  # an INFO line, hidden at that level
    assert by_name(done.results)["smoke.launch"].status == Status.PASS  # readiness does not need the INFO lines
    assert_nothing_left(rig)


def test_a_flag_with_its_evidence_in_the_log_passes(rig):
    rig.gpus(2)
    done = rig.run(rig.spec(tp=2, flags=(FUSION,), evidence=EVIDENCE))
    result = by_name(done.results)["smoke.evidence.enable-flashinfer-allreduce-fusion"]
    assert result.status == Status.PASS and "FlashInfer workspace initialized for rank" in result.details[0]
    assert done.verdict.passed
    assert_nothing_left(rig)


def installed_sglang(folder: Path, version: str) -> Path:
    """A folder holding an installed sglang distribution's metadata (no code: the stand-in serves)."""
    info = folder / f"sglang-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    return folder


def test_the_fusion_evidence_line_is_the_installed_sglang_release_s(rig):
    """sglang 0.5.23 writes another line than 0.5.9 once the fused workspace exists: smoke expects the
    line of the release installed in the stack (its distribution's version), read before launch."""
    rig.gpus(2)
    rig.behave(release="0.5.23")
    site = installed_sglang(rig.tmp / "site-0.5.23", "0.5.23")
    done = rig.run(rig.spec(tp=2, flags=(FUSION,), env={"PYTHONPATH": f"{FAKES}{os.pathsep}{site}"}))
    result = by_name(done.results)["smoke.evidence.enable-flashinfer-allreduce-fusion"]
    assert result.status == Status.PASS, result.summary
    assert "FlashInfer AllReduce Fusion enabled and workspace initialized: backend=trtllm" in result.details[0]
    assert done.verdict.passed
    assert_nothing_left(rig)


def test_an_installed_0_5_9_is_held_to_its_own_line(rig):
    rig.gpus(2)
    rig.behave(release="0.5.23")  # a server that speaks 0.5.23 where 0.5.9 is installed: its line is not 0.5.9's
    site = installed_sglang(rig.tmp / "site-0.5.9", "0.5.9")
    done = rig.run(rig.spec(tp=2, flags=(FUSION,), env={"PYTHONPATH": f"{FAKES}{os.pathsep}{site}"}))
    result = by_name(done.results)["smoke.evidence.enable-flashinfer-allreduce-fusion"]
    assert result.status == Status.FAIL and "the path it enables never initialised" in result.summary
    assert_nothing_left(rig)


def test_a_backend_chosen_by_default_is_found_in_the_log_and_in_server_info(rig):
    rig.behave(ignore_backend_flag=True, default_backend="triton")
    done = rig.run(rig.spec())
    results = by_name(done.results)
    finding = results["smoke.log.sglang-attention-backend-default"]
    assert finding.status == Status.FAIL  # the lock names flashinfer
    assert finding.summary == "No --attention-backend: the server chose triton by itself"
    assert "chose triton by itself; the stack runs flashinfer" in finding.details[0]
    assert (
        results["smoke.attention_backend"].summary
        == "the server runs the triton attention backend, the lock asks for flashinfer"
    )
    assert_nothing_left(rig)


#: sglang 0.5.23 on SM120 with --enable-flashinfer-allreduce-fusion, as its released wheel
#: (sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl) raises it: srt/model_executor/runner/base_runner.py:329
#: pre_initialize_workspaces -> srt/layers/flashinfer_comm_fusion.py:778 resolve_flashinfer_allreduce_fusion_backend
#: -> :48-51 _resolve_backend.
FUSION_REFUSED_CRASH = [
    "Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/opt/stackgate/current/lib/python3.12/site-packages/sglang/srt/layers/flashinfer_comm_fusion.py", '
    "line 49, in _resolve_backend",
    "    raise ValueError(",
    "ValueError: FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs.",
]


def test_sglang_0_5_23_refusing_the_fusion_at_start_is_named(rig):
    rig.behave(crash_at_start={"phase": "graphs", "lines": FUSION_REFUSED_CRASH})
    done = rig.run(rig.spec())
    results = by_name(done.results)
    assert "known failure sglang-fusion-arch-refused" in results["smoke.launch"].summary
    refused = results["smoke.log.sglang-fusion-arch-refused"]
    assert refused.status == Status.FAIL
    assert refused.summary == "sglang refuses the fused all-reduce on this GPU: it raised at start-up"
    assert refused.fix.commands[0].startswith("stackgate verify --check engine.fusion_gate")
    assert_nothing_left(rig)


def test_a_crash_at_start_is_reported_with_exit_code_last_lines_and_the_known_cause(rig):
    rig.behave(crash_at_start={"phase": "distributed", "lines": SYMM_MEM_CRASH})
    done = rig.run(rig.spec(), benchmark=True)
    results = by_name(done.results)
    launch = results["smoke.launch"]
    assert launch.status == Status.FAIL
    assert launch.summary.startswith(
        "the server exited (killed by SIGKILL, status 137; SGLang kills its own process tree on a fatal error)"
    )
    assert "known failure sglang-symm-mem-keyerror" in launch.summary
    assert any("KeyError: 12" in line for line in launch.details)
    keyerror = results["smoke.log.sglang-symm-mem-keyerror"]
    assert (
        keyerror.status == Status.FAIL
        and keyerror.summary == "--enable-torch-symm-mem has no size table for compute capability 12"
    )
    assert (
        keyerror.fix.commands[0] == f"stackgate provision --only patches --lock {rig.tmp / 'lock.toml'}"
    )  # the fix names this lock
    (session,) = done.document()["smoke"]["sessions"]
    written = next(f for f in session["findings"] if f["id"] == "sglang-symm-mem-keyerror")
    assert (
        keyerror.data == {"finding": written} and Finding.from_dict(written).fix == keyerror.fix
    )  # one form, in the results and the session
    assert written["evidence"]["file"] == session["log_path"] and written["evidence"]["lines"][-1].endswith(
        "KeyError: 12"
    )
    assert "smoke.benchmark" not in results  # nothing to measure
    assert done.sessions[0].teardown.how == "exited by itself"
    assert_nothing_left(rig)


def test_a_fatal_log_line_while_loading_stops_the_wait_at_once(rig):
    line = (
        "torch.distributed.DistBackendError: NCCL error in: "
        "../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, unhandled cuda error"
    )
    rig.behave(fatal_line={"phase": "load", "line": line})
    done = rig.run(rig.spec())  # ready_timeout_s is 60: the wait must end on the line, not the clock
    ready = done.sessions[0].readiness
    assert ready.reason == "fatal" and ready.finding.id == "nccl-error"
    results = by_name(done.results)
    assert "fatal error" in results["smoke.launch"].summary and results["smoke.log.nccl-error"].status == Status.FAIL
    # Still loading, the server has not installed its drain handler: SIGTERM ends it at once.
    assert (done.sessions[0].teardown.how, done.sessions[0].teardown.exit_code) == ("SIGTERM", -signal.SIGTERM)
    assert_nothing_left(rig)


def test_a_server_that_hangs_while_loading_times_out_with_its_last_phase(rig):
    rig.behave(hang=True)
    done = rig.run(_short_timeout(rig, silence_s=60))
    launch = by_name(done.results)["smoke.launch"]
    assert launch.status == Status.FAIL
    assert launch.summary.startswith(
        "not ready after 1.5 s (last phase: CUDA graphs captured; /health: still loading (connection refused))"
    )
    assert "ready_timeout_s" in launch.fix.text
    assert_nothing_left(rig)


def test_a_server_silent_while_loading_is_named_by_the_phase_it_hung_in_long_before_the_timeout(rig):
    rig.behave(hang=True)  # the stand-in stops writing after its graphs are captured, the port never opens
    done = rig.run(rig.spec(smoke_extra="silence_s = 8"))  # ready_timeout_s is 60
    ready = done.sessions[0].readiness
    launch = by_name(done.results)["smoke.launch"]
    assert (ready.reason, ready.phase) == ("silent", "CUDA graphs captured")
    assert ready.seconds < 60 and launch.status == Status.FAIL  # causal: only the 60 s timeout ends a wait later
    assert launch.summary.startswith("the server hung while CUDA graphs captured: no output for 8.")
    assert "(this phase's limit: 8 s)" in launch.summary
    assert "raise [smoke] silence_s (now 8 s)" in launch.fix.text and f"--pid {done.sessions[0].pid}" in launch.fix.text
    assert_nothing_left(rig)


def _short_timeout(rig, **smoke):
    path = rig.spec(smoke_extra="\n".join(f"{k} = {v}" for k, v in smoke.items()))
    path.write_text(path.read_text().replace("ready_timeout_s = 60", "ready_timeout_s = 1.5"))
    return path


def test_a_server_dying_mid_stream_stops_the_benchmark_with_its_cause(rig):
    oom = [
        "Scheduler hit an exception: Traceback (most recent call last):",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "139.80 GiB",
    ]
    rig.behave(die_mid_stream={"after_tokens": 60, "lines": oom})
    done = rig.run(rig.spec(benchmark={"warmup": 0}), benchmark=True)
    results = by_name(done.results)
    bench = results["smoke.benchmark"]
    assert bench.status == Status.FAIL
    # Whichever the watcher saw first: the fatal lines it wrote, or its death just after them.
    assert re.match(
        r"the benchmark stopped: run 1 failed: the server (exited with code -9|logged a fatal error "
        r"\((sglang-scheduler-exception|cuda-out-of-memory))",
        bench.summary,
    )
    assert results["smoke.log.cuda-out-of-memory"].status == Status.FAIL
    assert results["smoke.log.cuda-out-of-memory"].data["finding"]["evidence"]["lines"][-1].endswith(oom[1])
    assert done.figures.runs[0].tokens < 200
    assert_nothing_left(rig)


def test_a_fatal_log_line_mid_stream_cuts_the_stream_at_once(rig):
    watchdog = (
        "[rank0]:[E ProcessGroupNCCL.cpp:523] [Rank 0] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
        "ran for 600012 milliseconds before timing out."
    )
    rig.behave(rate=100.0, fatal_mid_stream={"after_tokens": 20, "line": watchdog})
    done = rig.run(rig.spec(benchmark={"warmup": 0, "output_tokens": 3000}), benchmark=True)  # 30 s if not cut
    bench = by_name(done.results)["smoke.benchmark"]
    assert bench.status == Status.FAIL
    assert "the server logged a fatal error (nccl-watchdog-timeout" in bench.summary
    sample = done.figures.runs[0]
    assert sample.tokens < 3000 and "cut on purpose" in sample.error
    assert_nothing_left(rig)


def _grace(rig, seconds, **spec):
    path = rig.spec(**spec)
    path.write_text(path.read_text().replace("stop_grace_s = 3", f"stop_grace_s = {seconds}"))
    return path


def test_a_server_ignoring_sigterm_and_an_escaped_worker_are_killed_with_a_warning(rig):
    rig.behave(ignore_sigterm=True, escape=True)
    done = rig.run(_grace(rig, 1))  # [smoke] stop_grace_s: a short grace keeps the test quick
    teardown = done.sessions[0].teardown
    assert teardown.how.startswith("SIGKILL after 1.") and teardown.leftovers == ()
    escaped = rig.events("workers")[0]["pids"][0]  # it left the group for a session of its own
    assert living([escaped]) == []
    result = by_name(done.results)["smoke.teardown"]
    assert result.status == Status.WARN
    assert result.summary.endswith(
        "; 3 process(es) ignored SIGTERM for the whole 1 s grace: a production drain (SIGTERM) would hang"
    )
    assert result.details[0].startswith(f"{done.sessions[0].pid} (") and "sglang.launch_server" in result.details[0]
    assert done.verdict.passed and done.verdict.counts["WARN"] == 1  # a warning: the server did stop
    assert_nothing_left(rig)


def test_a_server_killed_from_outside_is_reported_with_what_it_left_behind(rig):
    rig.behave(rate=50.0, orphan_workers=True)  # workers that outlive their parent
    spec = rig.spec(benchmark={"output_tokens": 2000, "runs": 1, "warmup": 0})
    killer = threading.Thread(target=_kill_leader_once_streaming, args=(rig,), daemon=True)
    killer.start()
    done = rig.run(spec, benchmark=True)
    killer.join()
    results = by_name(done.results)
    assert results["smoke.benchmark"].summary.startswith(
        "the benchmark stopped: run 1 failed: the server exited with code -9"
    )
    teardown = results["smoke.teardown"]
    assert teardown.status == Status.WARN
    assert re.fullmatch(
        r"server stopped \(it had already ended \(killed by SIGKILL, status 137\), leaving 2 process\(es\) behind; "
        r"smoke ended them with SIGTERM\) "
        r"in \d+\.\d s; none of its processes is left",
        teardown.summary,
    )
    assert "SGLang" not in teardown.summary and len(teardown.details) == 2
    assert_nothing_left(rig)


def _kill_leader_once_streaming(rig):
    wait_for(lambda: rig.events("stream"))
    os.kill(rig.events("started")[0]["pid"], signal.SIGKILL)


def test_a_stream_cut_while_the_server_stays_up_fails_and_says_the_server_is_up(rig):
    rig.behave(rate=100.0, cut_mid_stream={"after_tokens": 20})
    done = rig.run(rig.spec(benchmark={"warmup": 0, "output_tokens": 3000}), benchmark=True)
    bench = by_name(done.results)["smoke.benchmark"]
    assert bench.status == Status.FAIL
    assert re.fullmatch(
        r"the benchmark stopped: run 1 failed: http://127\.0\.0\.1:\d+/generate: the server closed the connection "
        r"\(\w+\) after \d+ of 3000 tokens; "
        r"the server is still up \(no exit, no fatal log line\)",
        bench.summary,
    )
    assert done.sessions[0].teardown.how == "SIGTERM" and not done.sessions[0].teardown.ended_before
    assert "smoke.log" in by_name(done.results)  # nothing in the log: the cut left no trace there
    assert_nothing_left(rig)


def test_a_server_stopped_mid_stream_is_named_after_the_locks_idle_limit(rig):
    """A server stopped (SIGSTOP: state T) after ready answers nothing: the stream ends after the
    lock's idle limit (here its 1 s floor), the verdict names the stopped process, and teardown's
    SIGCONT lets it act on SIGTERM, so it drains instead of waiting out the grace for SIGKILL."""
    rig.behave(rate=50.0)
    spec = _grace(rig, 10, benchmark={"output_tokens": 2000, "runs": 1, "warmup": 0, "stream_idle_floor_s": 1})
    stopper = threading.Thread(target=_stop_leader_once_streaming, args=(rig,), daemon=True)
    stopper.start()
    done = rig.run(spec, benchmark=True)
    stopper.join()
    bench = by_name(done.results)["smoke.benchmark"]
    pid = rig.events("started")[0]["pid"]
    assert bench.status == Status.FAIL
    assert re.fullmatch(
        r"the benchmark stopped: run 1 failed: http://127\.0\.0\.1:\d+/generate: "
        r"the server sent nothing for 1 s \(the stream's idle limit\) after \d+ of 2000 tokens; "
        rf"the server stopped answering: process {pid} \([^)]*sglang\.launch_server[^)]*\) is stopped \(state T: .*\)",
        bench.summary,
    ), bench.summary
    assert "still up" not in bench.summary
    assert done.sessions[0].teardown.how == "SIGTERM"  # it ran again, drained and ended itself
    assert_nothing_left(rig)


def _stop_leader_once_streaming(rig):
    wait_for(lambda: rig.events("stream"))
    os.kill(rig.events("started")[0]["pid"], signal.SIGSTOP)


def test_sglang_s_real_drain_poll_fits_in_the_grace_period(rig):
    rig.behave(drain_poll_s=5.0)
    path = rig.spec()
    path.write_text(path.read_text().replace("stop_grace_s = 3", "stop_grace_s = 15"))
    done = rig.run(path)
    teardown = done.sessions[0].teardown
    assert teardown.how == "SIGTERM"  # it drained and ended itself: no SIGKILL from smoke
    assert teardown.exit_code == -signal.SIGKILL
    assert_nothing_left(rig)


def test_a_taken_port_is_refused_before_launch(rig):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", rig.port))
        squatter.listen()
        done = rig.run(rig.spec())
    port = by_name(done.results)["smoke.preflight.port"]
    assert port.status == Status.FAIL
    assert port.summary == (
        f"port {rig.port} on 127.0.0.1 is taken; nothing was launched (SGLang would find out only after loading "
        "the weights)"
    )
    assert port.fix.commands == (f"ss -ltnp 'sport = :{rig.port}'",)
    assert rig.events() == [] and not rig.runs.exists()  # nothing started, no log


def test_a_port_taken_while_the_server_loads_is_named_and_not_called_a_silent_hang(rig):
    """SGLang binds its port only after loading: a port taken meanwhile is its logged error, so the
    generic "never became ready, and logged no error" must not stand beside it."""
    loaded = rig.tmp / "loaded"
    rig.behave(load_until=str(loaded))
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taker = threading.Thread(target=_take_port_while_loading, args=(rig, squatter, loaded), daemon=True)
        taker.start()
        done = rig.run(rig.spec())
        taker.join()
    results = by_name(done.results)
    assert results["smoke.preflight.port"].status == Status.PASS  # free when smoke looked
    assert results["smoke.log.sglang-http-port-in-use"].status == Status.FAIL
    assert "known failure sglang-http-port-in-use" in results["smoke.launch"].summary
    assert "smoke.log.sglang-never-ready" not in results, results["smoke.log.sglang-never-ready"].summary
    assert_nothing_left(rig)


def _take_port_while_loading(rig, squatter, loaded):
    wait_for(lambda: rig.events("started"))
    squatter.bind(("127.0.0.1", rig.port))
    squatter.listen()
    loaded.touch()


#: Another server: answers 200 to every GET, /health included (a plain http.server).
_OTHER_SERVER = """
import http.server, sys
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def test_another_server_that_binds_the_port_while_ours_loads_is_named_and_never_benchmarked(rig):
    """The shared-machine case: our server is slow to load (its port not bound yet) and another
    process binds the port and answers /health 200. That is not readiness: smoke names the holder."""
    rig.behave(load_until=str(rig.tmp / "never"))  # ours never finishes loading
    others: list[subprocess.Popen[bytes]] = []

    def take_the_port() -> None:
        wait_for(lambda: rig.events("started"))  # after smoke's own check that the port is free
        others.append(subprocess.Popen([sys.executable, "-c", _OTHER_SERVER, str(rig.port)]))

    taker = threading.Thread(target=take_the_port, daemon=True)
    taker.start()
    try:
        done = rig.run(rig.spec(smoke_extra="silence_s = 60"), benchmark=True)  # ours is silent while it waits
    finally:
        taker.join()
        for other in others:
            other.kill()
            other.wait()
    results, session = by_name(done.results), done.sessions[0]
    assert not done.verdict.passed
    assert results["smoke.preflight.port"].status == Status.PASS  # free when smoke looked
    assert session.readiness.reason == "not ours" and not session.readiness.ready
    launch = results["smoke.launch"]
    assert launch.status == Status.FAIL
    assert (
        launch.summary.startswith(f"port {rig.port} answered /health after ")
        and f"but from a socket that pid {session.pid} never bound: it belongs to pid {others[0].pid} ("
        in launch.summary
    )
    assert launch.data["holder"].startswith(f"pid {others[0].pid} (") and "http.server" in launch.data["holder"]
    assert "\n" not in launch.data["holder"]  # the holder's script, on one line
    assert launch.fix.commands == (f"ss -ltnp 'sport = :{rig.port}'",)
    assert session.figures is None and "smoke.server_info" not in results and rig.events("stream_done") == []
    assert session.to_dict()["readiness"]["detail"] == launch.data["holder"]  # the JSON report names the holder
    assert_nothing_left(rig)


def test_a_server_reporting_another_identity_is_not_benchmarked(rig):
    another = rig.tmp / "another"
    another.mkdir()
    another.joinpath("config.json").write_text(rig.model.joinpath("config.json").read_text())
    rig.behave(resolve={"model_path": str(another)})
    done = rig.run(rig.spec(), benchmark=True)
    results = by_name(done.results)
    assert results["smoke.launch"].status == Status.PASS  # its own socket: it is our process
    assert results["smoke.server_info"].status == Status.FAIL and "another server answered" in (
        results["smoke.server_info"].summary
    )
    assert results["smoke.benchmark"].status == Status.SKIP
    assert results["smoke.benchmark"].summary.startswith(
        f"not run: the server on port {rig.port} reports port {rig.port} and model {another}: another server"
    )
    assert done.sessions[0].figures is None and rig.events("stream_done") == []
    assert_nothing_left(rig)


@pytest.mark.parametrize("wrong", ["backend", "fusion"])
def test_a_wrong_backend_or_a_fused_path_not_taken_fails_before_the_benchmark(rig, wrong):
    if wrong == "backend":
        rig.behave(ignore_backend_flag=True, default_backend="triton")
        spec, want = rig.spec(), "the server runs the triton attention backend, the lock asks for flashinfer"
    else:
        rig.gpus(2)
        rig.behave(evidence=False)
        spec, want = rig.spec(tp=2, flags=(FUSION,)), f"{FUSION}: its path never initialised while the server started"
    done = rig.run(spec, benchmark=True, concurrency=(2,))
    results, session = by_name(done.results), done.sessions[0]
    assert results["smoke.benchmark"].status == Status.SKIP
    assert results["smoke.benchmark"].summary.startswith(f"not run: {want}")
    assert session.figures is None and session.levels == [] and rig.events("stream_done") == []
    assert session.failure == f"not measured: {want}" and not done.verdict.passed
    if wrong == "fusion":  # judged again on the whole log: still the flag's own failure
        assert results["smoke.evidence.enable-flashinfer-allreduce-fusion"].status == Status.FAIL
    assert_nothing_left(rig)


@pytest.mark.parametrize("problem", ["missing", "no-config", "bad-config"])
def test_a_missing_or_unreadable_model_is_refused_before_launch(rig, problem):
    if problem == "missing":
        rig.model.joinpath("config.json").unlink()
        rig.model.rmdir()
        want = "no such file or directory"
    elif problem == "no-config":
        rig.model.joinpath("config.json").unlink()
        want = "has no config.json (not a Hugging Face model directory)"
    else:
        rig.model.joinpath("config.json").write_text("{not json")
        want = "config.json is not JSON"
    done = rig.run(rig.spec())
    model = by_name(done.results)["smoke.preflight.model"]
    assert model.status == Status.FAIL and want in model.summary and model.summary.endswith("; nothing was launched")
    assert rig.events() == []
    assert not done.verdict.passed


COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _hub_cache(rig, hub_id: str) -> Path:
    """A Hugging Face Hub cache holding ``hub_id`` as huggingface_hub lays it out: refs/main names a
    commit whose snapshot holds the model."""
    repo = rig.tmp / "hf" / "hub" / f"models--{hub_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    snapshot.joinpath("config.json").write_text(rig.model.joinpath("config.json").read_text())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot


def test_a_hub_id_is_launched_from_the_hugging_face_cache(rig):
    snapshot = _hub_cache(rig, "acme/tiny-llama")
    done = rig.run(rig.spec(env={"HF_HOME": str(rig.tmp / "hf"), "HF_HUB_OFFLINE": "1"}), model="acme/tiny-llama")
    results, session = by_name(done.results), done.sessions[0]
    assert (
        results["smoke.preflight.model"].summary == f"model acme/tiny-llama is readable (Hub id, cached at {snapshot})"
    )
    assert session.argv[3:5] == ("--model-path", str(snapshot))  # what was checked is what the server loads
    assert done.verdict.passed, statuses(done)
    assert_nothing_left(rig)


@pytest.mark.parametrize("offline", ["variable", "unreachable"])
def test_a_hub_id_not_cached_on_an_offline_host_is_refused_before_launch_and_says_so(rig, offline):
    _hub_cache(rig, "acme/other")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections to it are refused
        env = {"HF_HUB_CACHE": str(rig.tmp / "hf" / "hub")}
        if offline == "variable":
            env["HF_HUB_OFFLINE"] = "1"
        else:
            env["HF_ENDPOINT"] = f"http://127.0.0.1:{closed.getsockname()[1]}"
        done = rig.run(rig.spec(env=env), model="acme/tiny-llama")
    model = by_name(done.results)["smoke.preflight.model"]
    assert model.status == Status.FAIL
    why = "HF_HUB_OFFLINE=1 is set" if offline == "variable" else f"{env.get('HF_ENDPOINT')} cannot be reached ("
    assert model.summary.startswith(
        "model acme/tiny-llama: not a local path, and as a Hugging Face Hub id it is not in the Hugging Face cache "
        f"{rig.tmp / 'hf' / 'hub'}, and this host is offline: {why}"
    ), model.summary
    assert model.summary.endswith("; nothing was launched") and "no such file" not in model.summary
    assert rig.events() == []


def test_fewer_gpus_than_tp_are_refused_before_launch(rig):
    rig.gpus(2)
    done = rig.run(rig.spec(tp=2, env={"CUDA_VISIBLE_DEVICES": "1"}))
    gpus = by_name(done.results)["smoke.preflight.gpus"]
    assert gpus.status == Status.FAIL
    assert gpus.summary == "TP 2 needs 2 GPUs but 1 are visible (CUDA_VISIBLE_DEVICES='1'); nothing was launched"
    assert rig.events() == []


def test_an_older_server_is_read_through_get_server_info(rig):
    rig.behave(server_info_404=True)
    done = rig.run(rig.spec())
    assert done.sessions[0].info_endpoint == "/get_server_info"
    assert (
        by_name(done.results)["smoke.server_info"].summary
        == "SGLang 0.5.9 reports its configuration (/get_server_info)"
    )
    assert_nothing_left(rig)


def test_a_flag_the_server_changed_fails(rig):
    rig.behave(resolve={"mem_fraction_static": 0.7})
    done = rig.run(rig.spec(flags=("--mem-fraction-static", "0.8")))
    flags = by_name(done.results)["smoke.flags"]
    assert flags.status == Status.FAIL
    assert flags.details == ("--mem-fraction-static: asked '0.8', the server runs mem_fraction_static=0.7",)
    assert_nothing_left(rig)


def test_keep_server_leaves_it_up_and_the_printed_command_stops_it(rig):
    done = rig.run(rig.spec(), keep_server=True)
    session = done.sessions[0]
    assert session.kept and session.teardown is None
    assert living([session.pid]) == [session.pid]
    teardown = by_name(done.results)["smoke.teardown"]
    assert teardown.summary == (
        f"left running on purpose (--keep-server): process group {session.pid}; stop it with `kill -TERM -- "
        f"-{session.pid}`"
    )
    subprocess.run(["bash", "-c", f"kill -TERM -- -{session.pid}"], check=True)
    assert_nothing_left(rig)


def test_fast_mode_launches_random_weights_and_a_few_layers_and_labels_its_figure(rig):
    done = rig.run(rig.spec(benchmark={"baseline_tok_s": 10000.0}), fast=True, benchmark=True)
    session = done.sessions[0]
    assert session.argv[-4:] == ("--load-format", "dummy", "--json-model-override-args", '{"num_hidden_layers": 4}')
    assert session.server_info["load_format"] == "dummy"
    assert session.server_info["json_model_override_args"] == '{"num_hidden_layers": 4}'
    results = by_name(done.results)
    assert results["smoke.flags"].status == Status.PASS
    bench = results["smoke.benchmark"]
    assert bench.status == Status.PASS  # never compared with the baseline of 10000 tok/s
    assert bench.summary.startswith("fast mode: random weights, 4 of 32 layers of LlamaForCausalLM: ")
    assert re.search(
        r": decode [\d.]+ tok/s \(end-to-end [\d.]+\), a fast-mode figure never compared with the baseline$",
        bench.summary,
    )
    assert results["smoke.quality"].status == Status.SKIP
    assert_nothing_left(rig)


def test_fast_mode_refuses_a_model_whose_layers_are_nested(rig):
    rig.write_model(
        architectures=["KimiK25ForConditionalGeneration"],
        text_config={"num_hidden_layers": 61, "num_attention_heads": 64},
    )
    done = rig.run(rig.spec(), fast=True)
    refused = by_name(done.results)["smoke.fast_mode"]
    assert refused.status == Status.FAIL and "counts its layers in text_config" in refused.summary
    assert rig.events() == []


def test_the_quality_guard_warns_when_greedy_runs_differ_and_strict_fails(rig):
    rig.behave(diverge_from=37)
    spec = rig.spec(benchmark={"runs": 3, "warmup": 0})
    done = rig.run(spec, benchmark=True)
    guard = by_name(done.results)["smoke.quality"]
    assert guard.status == Status.WARN
    assert guard.details == (
        "run 2 vs run 1: first 37 of 200 tokens identical, then diverge (18.5% of positions agree)",
    )
    assert done.verdict.passed
    strict = rig.run(spec, benchmark=True, strict=True)
    assert not strict.verdict.passed and strict.verdict.reason == "1 warning(s) with --strict"
    assert_nothing_left(rig)


def test_short_runs_are_flagged_and_left_out(rig):
    rig.behave(short_by=5)
    done = rig.run(rig.spec(), benchmark=True)
    results = by_name(done.results)
    assert results["smoke.benchmark.short_runs"].status == Status.WARN
    assert results["smoke.benchmark.short_runs"].summary.startswith(
        "2 run(s) returned fewer tokens than the 200 asked (runs 1, 2)"
    )
    assert results["smoke.benchmark"].summary == "no run returned the 200 tokens asked"
    assert_nothing_left(rig)


def test_the_json_report_records_the_run_and_redacts_secrets(rig, tmp_path):
    done = rig.run(rig.spec(env={"HF_TOKEN": "hf_abc", "MY_API_KEY": "k", "NCCL_DEBUG": "INFO"}), benchmark=True)
    doc = done.document()
    write_json(tmp_path / "smoke.json", doc)
    reread = json.loads((tmp_path / "smoke.json").read_text())
    session = reread["smoke"]["sessions"][0]
    assert reread["schema"] == "stackgate.report/1" and reread["smoke"]["schema"] == "stackgate.smoke/2"
    assert session["environment"]["HF_TOKEN"] == "<redacted>" and session["environment"]["MY_API_KEY"] == "<redacted>"
    assert session["set_by_stackgate"]["NCCL_DEBUG"] == "INFO"
    assert "hf_abc" not in json.dumps(reread)
    assert session["command"][1:4] == ["-m", "sglang.launch_server", "--model-path"]
    assert session["server_info"]["version"] == "0.5.9"
    assert os.path.exists(session["log_path"])
    assert len(session["benchmark"]["runs"]) == 2 and session["benchmark"]["tok_s"]["n"] == 2
    assert {r["check"] for r in reread["results"]} >= {"smoke.launch", "smoke.benchmark", "smoke.teardown"}
    assert_nothing_left(rig)


def test_gpu_memory_still_held_after_teardown_is_a_warning(rig):
    rig.behave(leak=True)
    done = rig.run(rig.spec())
    leaked = rig.events("leaked")[0]["pid"]
    try:
        memory = by_name(done.results)["smoke.gpu_memory"]
        assert memory.status == Status.WARN
        assert memory.summary == "GPU memory not released after teardown: GPU 0: +2.00 GiB since launch"
    finally:
        os.kill(leaked, signal.SIGKILL)
    assert_nothing_left(rig)


def _speculative_tables(rig, compare=True):
    draft = rig.tmp / "draft"
    draft.mkdir(exist_ok=True)
    draft.joinpath("config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1})
    )
    tables = f'[smoke.speculative]\nalgorithm = "EAGLE3"\ndraft_model = "{draft}"\nnum_steps = 3\n'
    return tables + ('\n[smoke.compare]\nname = "plain"\nspeculative = false\n' if compare else ""), draft


def test_compare_reports_both_the_difference_and_where_speculation_stops_paying(rig):
    tables, draft = _speculative_tables(rig)
    rig.behave(
        rate=100.0,
        profiles=[
            {
                "when": {"speculative_algorithm": "EAGLE3"},
                "set": {"rate": 150.0, "burst": 3, "rate_by_streams": {"3": 60.0}},
            }
        ],
    )
    # baseline_tok_s describes the lock's (speculative) configuration; the plain one is slower on purpose.
    benchmark = {"output_tokens": 150, "runs": 2, "warmup": 0, "baseline_tok_s": 140.0, "max_regression": 0.25}
    done = rig.run(rig.spec(tables=tables, benchmark=benchmark), compare=True, concurrency=(1, 3))
    results = by_name(done.results)
    assert done.verdict.passed, statuses(done)
    plain = results["smoke.plain.benchmark"]
    assert (
        plain.status == Status.PASS
        and "measured for the comparison, not judged against baseline_tok_s" in plain.summary
    )
    assert (
        results["smoke.benchmark"].summary.startswith("decode ")
        and " vs baseline 140 " in results["smoke.benchmark"].summary
    )
    assert [s.config.title for s in done.sessions] == ["plain", "lock"]
    assert "--speculative-algorithm" not in done.sessions[0].argv
    assert done.sessions[1].argv[-6:] == (
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        str(draft),
        "--speculative-num-steps",
        "3",
    )
    assert results["smoke.plain.launch"].status == Status.PASS and results["smoke.launch"].status == Status.PASS
    compare = results["smoke.compare"]
    assert compare.status == Status.PASS and compare.summary.startswith("lock vs plain: decode +")
    assert results["smoke.compare.quality"].summary == "plain and lock agree: all 150 tokens identical"
    crossover = results["smoke.compare.concurrency"]
    assert crossover.summary == "speculative decoding stops paying at 3 concurrent streams"
    assert crossover.data["stops_paying_at"] == 3
    doc = json.loads(
        json.dumps(done.document(), allow_nan=False)
    )  # strict JSON: one stream has no interval, and says so
    level = doc["smoke"]["sessions"][1]["concurrency"][0]
    assert (
        level["streams"] == 1 and level["per_stream_tok_s"]["ci_low"] is None and "ci_note" in level["per_stream_tok_s"]
    )
    for each in doc["smoke"]["sessions"][1]["concurrency"]:
        assert all(isinstance(each[k][p], float) for k in ("ttft_s", "itl_s") for p in ("p50", "p90", "p99"))
    assert_nothing_left(rig)


def test_a_speculative_sweep_without_compare_says_why_it_has_no_crossover(rig, capsys):
    tables, _ = _speculative_tables(rig, compare=False)
    rig.behave(profiles=[{"when": {"speculative_algorithm": "EAGLE3"}, "set": {"burst": 3}}])
    done = rig.run(rig.spec(tables=tables, benchmark={"output_tokens": 60, "warmup": 0}), concurrency=(1, 2))
    results = by_name(done.results)
    crossover = results["smoke.compare.concurrency"]
    assert crossover.status == Status.SKIP
    assert crossover.summary == (
        "no crossover estimate without --compare: run with --compare to measure the non-speculative "
        "configuration at the same levels"
    )
    levels = results["smoke.concurrency"].details
    assert len(levels) == 2 and all(
        re.search(r"TTFT p50/p90/p99 [\d.]+/[\d.]+/[\d.]+ ms, ITL p50/p90/p99 [\d.]+/[\d.]+/[\d.]+ ms$", line)
        for line in levels
    )
    assert done.verdict.passed
    assert_nothing_left(rig)


def test_a_server_with_an_api_key_gets_it_from_the_environment_and_it_is_never_shown(rig, tmp_path):
    key = "sk-standin-0123456789"
    spec = rig.spec(flags=("--api-key", "${SERVE_AUTH}"), env={"SERVE_AUTH": key})
    done = rig.run(spec, benchmark=True, concurrency=(2,))
    results = by_name(done.results)
    assert done.verdict.passed, statuses(done)
    assert results["smoke.flags"].details == ("--api-key: api_key='<redacted>'",)
    session = done.sessions[0]
    assert session.argv[-2:] == ("--api-key", "${SERVE_AUTH}")  # what is shown: the reference
    write_json(tmp_path / "smoke.json", done.document())
    assert key not in (tmp_path / "smoke.json").read_text()
    (written,) = json.loads((tmp_path / "smoke.json").read_text())["smoke"]["sessions"]
    assert written["command"][-2:] == ["--api-key", "${SERVE_AUTH}"] and written["command_line"].endswith(
        " --api-key '${SERVE_AUTH}'"
    )  # the reference, as shown
    assert session.to_dict()["environment"]["SERVE_AUTH"] == "<redacted>"
    assert_nothing_left(rig)


def test_the_standin_refuses_requests_without_the_key_as_sglang_does(rig):
    rig.run(rig.spec(flags=("--api-key", "sk-literal")), keep_server=True)
    base = f"http://127.0.0.1:{rig.port}"
    try:
        assert httpclient.request("GET", base + "/health").status == 200  # /health* and /metrics* are exempt
        assert httpclient.request("GET", base + "/server_info").status == 401
        wrong = httpclient.request("GET", base + "/server_info", headers=httpclient.bearer("sk-other"))
        assert (wrong.status, wrong.json()) == (401, {"error": "Unauthorized"})
        assert (
            httpclient.request("GET", base + "/server_info", headers={"Authorization": "bearer sk-literal"}).status
            == 200
        )
    finally:
        os.killpg(rig.events("started")[0]["pid"], signal.SIGTERM)
    assert_nothing_left(rig)


def test_an_api_key_naming_an_unset_variable_is_refused_before_launch(rig):
    done = rig.run(rig.spec(flags=("--api-key", "$SERVE_AUTH_UNSET")))
    refused = by_name(done.results)["smoke.preflight.api_key"]
    assert refused.status == Status.FAIL
    assert (
        refused.summary
        == "--api-key refers to $SERVE_AUTH_UNSET, which the server's environment does not set; nothing was launched"
    )
    assert rig.events() == []


def test_compare_warns_when_the_configurations_disagree(rig):
    rig.gpus(2)
    rig.behave(profiles=[{"when": {"enable_flashinfer_allreduce_fusion": True}, "set": {"shift_from": 120}}])
    done = rig.run(rig.spec(tp=2, flags=(FUSION,), evidence=EVIDENCE), compare=True)
    results = by_name(done.results)
    assert "smoke.baseline.evidence.enable-flashinfer-allreduce-fusion" not in results
    assert FUSION not in done.sessions[0].argv and FUSION in done.sessions[1].argv
    quality = results["smoke.compare.quality"]
    assert quality.status == Status.WARN
    assert quality.summary == (
        "baseline and lock give different greedy outputs: first 120 of 200 tokens identical, then diverge (60.0% "
        "of positions agree)"
    )
    assert_nothing_left(rig)


def test_an_interpreter_without_sglang_fails_with_the_known_cause(rig):
    done = rig.run(rig.spec(env={"PYTHONPATH": ""}))  # the real interpreter, no stand-in on its path
    results = by_name(done.results)
    assert results["smoke.launch"].summary.startswith("the server exited (exit code 1) after ")
    missing = results["smoke.log.module-not-installed"]
    assert missing.summary == "Module sglang is not installed"
    assert missing.fix.commands[0].startswith("stackgate provision --only python --lock ")
    assert rig.events() == []


def test_a_flag_this_sglang_does_not_know_is_refused_by_its_parser(rig):
    done = rig.run(rig.spec(flags=("--enable-allreduce-fusion",)))
    results = by_name(done.results)
    assert results["smoke.launch"].summary.startswith("the server exited (exit code 2) after ")
    refused = results["smoke.log.sglang-bad-arguments"]
    assert refused.summary == "SGLang refused its command line: unrecognized arguments: --enable-allreduce-fusion"
    assert_nothing_left(rig)


def test_a_crash_of_no_known_cause_is_told_with_what_the_evidence_sweep_finds(rig, monkeypatch):
    blocker = rig.tmp / "triton-cache"
    blocker.write_text("a file, not a folder\n")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(blocker))
    rig.behave(crash_at_start={"phase": "load", "lines": ["Scheduler hit an exception: RuntimeError: odd"]})
    done = rig.run(rig.spec())
    launch = by_name(done.results)["smoke.launch"]
    assert launch.status == Status.FAIL
    assert f"cause: TRITON_CACHE_DIR={blocker}: it is a file, not a folder" in launch.summary, launch.summary
    assert launch.fix.commands[0] == f"ls -ld {blocker}"
    assert_nothing_left(rig)
