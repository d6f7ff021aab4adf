"""`invoke smoke` as a person runs it: exit codes, Ctrl-C and SIGTERM, the printed report."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading

import pytest
from smoke_support import ROOT, Rig, assert_nothing_left, living, wait_for


def invoke(rig: Rig, *args: str) -> subprocess.Popen[str]:
    env = {**rig.environ(), "STACKGATE_LOG_DIR": str(rig.runs)}
    return subprocess.Popen(
        [sys.executable, "-m", "invoke", "smoke", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=60)
    return process.returncode, out, err


def log_text(rig: Rig) -> str:
    logs = list(rig.runs.rglob("*.log"))
    return logs[0].read_text(errors="replace") if logs else ""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupt_while_the_server_loads_tears_it_down(rig, sig):
    rig.behave(load_s=120.0)  # each of the stand-in's loading phases takes 24 s
    report = rig.tmp / "smoke.json"
    process = invoke(rig, "--lock", str(rig.spec()), "--json", str(report))
    wait_for(lambda: "Init torch distributed begin" in log_text(rig))  # the first phase of loading
    process.send_signal(sig)
    code, out, err = finish(process)
    assert code == 130, err
    assert "stackgate: interrupted" in err
    assert "smoke.interrupted" in out and "[interrupted]" in out
    assert (
        ": INTERRUPTED (interrupted (Ctrl-C or SIGTERM); every server was torn down)" in out
        and "check(s) failed" not in out
    )
    # The log ends mid-load because smoke stopped the server: how it ends is no hang, no silent failure.
    assert "never became ready" not in out and "sglang-hang-at-dist-init" not in out, out
    doc = json.loads(report.read_text())
    assert doc["smoke"]["interrupted"] is True and doc["verdict"] == "failed"
    assert doc["exit_code"] == code == 130 and doc["reason"].startswith("interrupted")
    assert_nothing_left(rig)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupt_during_the_benchmark_tears_the_server_down(rig, sig):
    rig.behave(rate=50.0, ignore_sigterm=True)  # a stubborn server: teardown must escalate
    spec = rig.spec(benchmark={"output_tokens": 2000, "runs": 2, "warmup": 0})
    process = invoke(rig, "--lock", str(spec), "--benchmark")
    wait_for(lambda: rig.events("stream"))
    process.send_signal(sig)
    code, out, err = finish(process)
    assert code == 130, err
    assert "smoke.teardown" in out and "SIGKILL after" in out
    assert_nothing_left(rig)


def test_after_ctrl_c_a_server_ignoring_sigterm_is_waited_for_aloud_and_a_second_ctrl_c_kills_it(rig):
    """No silent grace: smoke says it waits for the server and that another Ctrl-C ends the wait."""
    rig.behave(rate=50.0, ignore_sigterm=True)
    spec = rig.spec(benchmark={"output_tokens": 2000, "runs": 2, "warmup": 0})
    spec.write_text(spec.read_text().replace("stop_grace_s = 3", "stop_grace_s = 300"))  # only a Ctrl-C ends it soon
    report = rig.tmp / "smoke.json"
    process = invoke(rig, "--lock", str(spec), "--benchmark", "--json", str(report))
    err: list[str] = []
    lines = iter(process.stderr.readline, "")  # type: ignore[union-attr]
    reader = threading.Thread(target=lambda: err.extend(lines), daemon=True)
    reader.start()
    wait_for(lambda: rig.events("stream"))
    process.send_signal(signal.SIGINT)
    wait_for(lambda: any("waiting up to 300 s for the server" in line for line in err))
    process.send_signal(signal.SIGINT)
    out, _ = process.communicate(timeout=60)
    reader.join(timeout=10)
    assert process.returncode == 130
    pid = rig.events("started")[0]["pid"]
    notice = next(line for line in err if "waiting up to" in line)
    wanted = f"waiting up to 300 s for the server (pid {pid}) to stop after SIGTERM; press Ctrl-C again to kill it now"
    assert notice.strip() == wanted
    doc = json.loads(report.read_text())
    teardown = doc["smoke"]["sessions"][0]["teardown"]
    assert teardown["interrupted"] is True and teardown["how"].startswith("SIGKILL after")
    (result,) = [r for r in doc["results"] if r["check"] == "smoke.teardown"]
    assert result["status"] == "WARN", result  # not a plain PASS: the server ignored SIGTERM
    assert (
        "process(es) ignore SIGTERM (their signal mask says so) and ended only when the second Ctrl-C"
        in (result["summary"])
    )
    assert any(line.startswith(f"{pid} (") for line in result["details"])  # the server itself, named
    assert_nothing_left(rig)


def test_a_smoke_killed_outright_takes_its_server_with_it(rig):
    spec = rig.spec(benchmark={"output_tokens": 2000, "runs": 2, "warmup": 0})
    process = invoke(rig, "--lock", str(spec), "--benchmark")
    wait_for(lambda: rig.events("stream"))
    process.kill()  # SIGKILL: no teardown can run; the kernel's parent-death signal does it
    process.communicate(timeout=30)
    assert_nothing_left(rig)


def test_workers_a_smoke_killed_outright_left_are_ended_by_the_next_run_which_says_so(rig):
    """Workers that set no parent-death signal outlive a SIGKILLed smoke; its record names them."""
    rig.behave(rate=50.0, orphan_workers=True)
    spec = rig.spec(benchmark={"output_tokens": 2000, "runs": 2, "warmup": 0})
    process = invoke(rig, "--lock", str(spec), "--benchmark")
    wait_for(lambda: rig.events("stream"))
    process.kill()
    process.communicate(timeout=30)
    (workers,) = [e["pids"] for e in rig.events("workers")]
    wait_for(lambda: living([rig.events("started")[0]["pid"]]) == [])  # the leader died with smoke
    assert living(workers) == workers  # its workers did not
    rig.behave()  # the next run's server is a well-behaved one
    code, out, err = finish(invoke(rig, "--lock", str(spec)))
    assert code == 0, out + err
    assert "ended 2 process(es) that a dead stackgate run left running (launched " in err, err
    assert all(f"  {pid} (" in err for pid in workers), err
    # Each worker's command line (a whole `python -c` script) stays on its own line, escaped.
    assert all(re.search(rf"^  {pid} \(.*\\n.*\)$", err, re.M) for pid in workers), err
    assert living(workers) == []
    assert_nothing_left(rig)


def test_a_passing_smoke_exits_0_and_prints_the_table(rig):
    code, out, err = finish(invoke(rig, "--lock", str(rig.spec()), "--benchmark"))
    assert code == 0, out + err
    assert out.startswith("benchmark (lock)\nrun     tokens  seconds")
    assert "PASS  smoke.launch" in out and ": PASSED" in out
    assert "waiting for SGLang (lock, TP 1, pid " in err  # progress on stderr
    assert_nothing_left(rig)


def test_a_failing_smoke_exits_1(rig):
    rig.behave(
        crash_at_start={
            "phase": "load",
            "lines": ["RuntimeError: CUDA error: no kernel image is available for execution on the device"],
        }
    )
    code, out, _ = finish(invoke(rig, "--lock", str(rig.spec())))
    assert code == 1
    assert "FAIL  smoke.log.cuda-no-kernel-image" in out
    assert_nothing_left(rig)


def test_keep_server_prints_how_to_stop_it(rig):
    code, out, _ = finish(invoke(rig, "--lock", str(rig.spec()), "--keep-server"))
    assert code == 0
    pid = rig.events("started")[0]["pid"]
    assert f"stop it with: kill -TERM -- -{pid}" in out
    assert living([pid]) == [pid]
    os.killpg(pid, signal.SIGTERM)
    assert_nothing_left(rig)


@pytest.mark.parametrize(
    "args, message",
    [
        ((), "no model to launch: set [smoke] model in"),
        (("--concurrency", "1,x"), "--concurrency takes stream counts separated by commas, e.g. 1,10,30, not '1,x'"),
        (("--tp", "eight"), "--tp takes a whole number, not 'eight'"),
        (("--compare",), "--compare needs a baseline that differs from the lock's configuration"),
    ],
    ids=["no-model", "bad-levels", "bad-tp", "compare-without-baseline"],
)
def test_bad_usage_exits_2_and_launches_nothing(rig, args, message):
    spec = rig.spec()
    if not args:
        spec.write_text(spec.read_text().replace(f'model = "{rig.model}"', 'model = ""'))
    code, _, err = finish(invoke(rig, "--lock", str(spec), *args))
    assert code == 2
    assert message in err
    assert rig.events() == []
