"""`invoke gate`: the stages and their dependencies, the command on this machine, and end to end
against the stand-in SGLang server with a fake NVML."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import exposition
import pytest
from smoke_support import ROOT, Rig, assert_nothing_left, dead_runs_server, group_members, living, wait_for
from support import run_program

from stackgate.checks.all import REGISTRY
from stackgate.checks.core import run_checks, select
from stackgate.commands import gate as command
from stackgate.edges import runner
from stackgate.facts import Distribution, Facts, Missing, ProbeFacts
from stackgate.facts.compare import environment_spec
from stackgate.flows import gate
from stackgate.models.exitcodes import ExitCode
from stackgate.models.result import Result, Status, failed, passed, skipped, warned
from stackgate.models.spec import Spec, load_spec
from stackgate.render import summaries
from stackgate.render.ui import UI
from stackgate.runs import rundiff
from stackgate.stack import generations

TESTS = ROOT / "tests"
STAGES = ["lock", "environment", "verify", "fast_smoke", "benchmark"]
#: The verify checks this machine can pass with the fake NVML and a plain interpreter.
VERIFIABLE = ("gpu.*", "python.interpreter", "python.pins", "python.frozen", "python.consistency")
BENCH = {"output_tokens": 200, "runs": 2, "warmup": 1, "baseline_tok_s": 190.0, "max_regression": 0.05}


def invoke(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return run_program(*args, program="invoke", env=env, timeout=timeout)


def statuses(doc: dict) -> dict[str, str]:
    return {s["name"]: s["status"] for s in doc["gate"]["stages"]}


def stage(doc: dict, name: str) -> dict:
    return next(s for s in doc["gate"]["stages"] if s["name"] == name)


def kept(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


@pytest.fixture(autouse=True)
def _runner_opened_again():
    """An interrupted gate run in this process closes the runner (runner.terminate_all); the
    tests after it start commands again."""
    yield
    runner.reopen()


# --- the stages, with stage functions injected -------------------------------------------------


def fixed(*results: Result):
    """A stage function that returns these results (each named after its summary's first word)."""
    return lambda ctx: [r if r.check else Result(f"t.{r.summary.split()[0]}", r.status, r.summary) for r in results]


def run_stages(*stages: gate.Stage, **request: object) -> gate.GateRun:
    return gate.run_gate(gate.GateRequest(**request), UI(stream=io.StringIO(), force_plain=True), stages=stages)


def test_a_gate_first_ends_what_a_dead_run_left_and_says_so(capsys):
    pids, record = dead_runs_server()
    run_stages(gate.Stage("a", "a", (), fixed(passed("a ok"))))
    err = capsys.readouterr().err
    assert "ended 3 process(es) that a dead stackgate run left running (launched " in err, err
    assert all(f"  {pid} (" in err for pid in pids)
    assert living(pids) == [] and not record.exists()


def test_a_failed_stage_stops_the_stages_that_stand_on_it_with_the_reason():
    done = run_stages(
        gate.Stage("a", "a", (), fixed(passed("a ok"))),
        gate.Stage("b", "b", ("a",), fixed(failed("b broke"))),
        gate.Stage("c", "c", ("a",), fixed(passed("c ok"))),
        gate.Stage("d", "d", ("b", "c"), fixed(passed("d ok"))),
        gate.Stage("e", "e", ("d",), fixed(passed("e ok"))),
    )
    assert [(s.name, s.status) for s in done.stages] == [
        ("a", "passed"),
        ("b", "failed"),
        ("c", "passed"),
        ("d", "not run"),
        ("e", "not run"),
    ]
    assert done.stage("b").reason == "1 check(s) failed: t.b: b broke"
    (d,) = done.stage("d").results
    assert d.check == "gate.d" and d.status == Status.SKIP
    assert d.summary == "not run: b failed"  # b's own row says why, once
    assert done.stage("e").reason == "d not run: b failed"
    assert done.exit_code == ExitCode.FAILED


def test_verify_runs_even_when_the_environment_drifted_but_nothing_launches():
    ran = []
    stages = [
        gate.Stage(
            s.name,
            s.title,
            s.needs,
            (
                lambda name: (
                    lambda ctx: (
                        ran.append(name)
                        or [Result(f"t.{name}", Status.FAIL if name == "environment" else Status.PASS, name)]
                    )
                )
            )(s.name),
            s.left_out,
        )
        for s in gate.STAGES
    ]
    done = run_stages(*stages)
    assert ran == ["lock", "environment", "verify"]
    assert [s.status for s in done.stages] == ["passed", "failed", "passed", "not run", "not run"]


def test_fast_only_leaves_the_benchmark_out_and_still_passes():
    stages = [gate.Stage(s.name, s.title, s.needs, fixed(passed(f"{s.name} ok")), s.left_out) for s in gate.STAGES]
    done = run_stages(*stages, fast_only=True)
    assert done.exit_code == ExitCode.PASSED
    assert done.stage("benchmark").status == "not run"
    assert done.stage("benchmark").reason == "--fast-only: the gate stops after the fast smoke"


def test_a_gate_where_everything_was_skipped_is_not_a_pass():
    done = run_stages(
        gate.Stage("a", "a", (), fixed(skipped("a skipped"))), gate.Stage("b", "b", (), fixed(skipped("b skipped")))
    )
    assert done.exit_code == ExitCode.FAILED
    assert done.verdict.reason == "nothing was checked: every check was skipped"
    assert done.stage("a").status == "failed"


def test_strict_fails_a_stage_on_a_warning():
    stages = (gate.Stage("a", "a", (), fixed(warned("a wobbly"))), gate.Stage("b", "b", ("a",), fixed(passed("b ok"))))
    assert run_stages(*stages).exit_code == ExitCode.PASSED
    strict = run_stages(*stages, strict=True)
    assert strict.exit_code == ExitCode.FAILED and strict.stage("b").status == "not run"


def test_an_interrupted_stage_keeps_what_it_learned_and_stops_the_rest():
    def interrupted(ctx):
        raise gate.StageInterrupted([Result("t.half", Status.PASS, "half way")])

    done = run_stages(
        gate.Stage("a", "a", (), fixed(passed("a ok"))),
        gate.Stage("b", "b", ("a",), interrupted),
        gate.Stage("c", "c", (), fixed(passed("c ok"))),
    )
    assert done.interrupted and done.exit_code == ExitCode.INTERRUPTED
    assert [s.status for s in done.stages] == ["passed", "interrupted", "not run"]
    assert [r.check for r in done.stage("b").results] == ["t.half", "gate.b"]
    assert done.stage("c").reason == "the gate was interrupted"
    assert done.document()["gate"]["interrupted"] is True


# --- the command on this machine ---------------------------------------------------------------


def test_the_default_lock_on_this_machine_fails_lists_verify_failures_and_writes_every_report(tmp_path, _runs_dir):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    out = {kind: tmp_path / f"gate.{kind}" for kind in ("json", "xml", "md", "prom")}
    done = invoke(
        "gate",
        "--model",
        str(model),
        "--json",
        str(out["json"]),
        "--junit",
        str(out["xml"]),
        "--markdown",
        str(out["md"]),
        "--prom",
        str(out["prom"]),
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL  gpu.driver" in done.stdout  # verify's failures are listed, with their fixes
    assert "$ nvidia-smi" in done.stdout
    doc = json.loads(out["json"].read_text())
    assert statuses(doc) == {
        "lock": "passed",
        "environment": "failed",
        "verify": "failed",
        "fast_smoke": "not run",
        "benchmark": "not run",
    }
    (not_run,) = stage(doc, "fast_smoke")["results"]
    assert not_run["check"] == "gate.fast_smoke" and not_run["status"] == "SKIP"
    assert not_run["summary"] == "not run: environment failed; verify failed"
    assert (
        not_run["details"] == ["environment failed", "verify failed"] and "gpu.driver" in stage(doc, "verify")["reason"]
    )
    assert "fast_smoke   not run      0.0  environment failed; verify failed" in done.stdout
    assert doc["gate"]["schema"] == "stackgate.gate/1" and doc["schema"] == "stackgate.report/1"
    assert doc["gate"]["benchmark"] is None and doc["gate"]["fingerprint"]["components"]["gpu"] == {
        "unavailable": "NVML not usable: NVML Shared Library Not Found"
    }
    failing = [r for r in doc["results"] if r["status"] in ("FAIL", "ERROR")]

    suites = ET.parse(out["xml"]).getroot().findall("testsuite")
    assert [s.attrib["name"] for s in suites] == [f"stackgate.gate.{name}" for name in STAGES]
    by_suite = {s.attrib["name"].rsplit(".", 1)[1]: s for s in suites}
    assert int(by_suite["verify"].attrib["failures"]) >= 1
    assert by_suite["verify"].find("testcase[@name='gpu.driver']/failure") is not None
    skipped_case = by_suite["fast_smoke"].find("testcase[@name='gate.fast_smoke']/skipped")
    assert skipped_case is not None and skipped_case.attrib["message"] == not_run["summary"]

    families = exposition.parse(out["prom"].read_text())
    labels = {"lock": "blackwell-sm120-cu130", "host": doc["host"]["hostname"]}
    assert families["stackgate_gate_passed"].value(**labels) == 0
    assert families["stackgate_gate_exit_code"].value(**labels) == 1
    assert families["stackgate_gate_checks_failed"].value(**labels) == len(failing)
    assert families["stackgate_gate_stage_status"].value(stage="fast_smoke", status="not_run") == 1
    assert families["stackgate_gate_stage_status"].value(stage="fast_smoke", status="passed") == 0
    assert "stackgate_gate_decode_tokens_per_second" not in families  # nothing was measured
    assert all(f.type == "gauge" and f.help for f in families.values())
    assert out["prom"].stat().st_mode & 0o044 == 0o044  # node_exporter's own user can read it

    markdown = out["md"].read_text()
    assert markdown.startswith("## ❌ stackgate gate: FAILED\n")
    assert "| fast_smoke | ⏭️ not run | 0.0 | environment failed; verify failed |" in markdown
    assert "- **FAIL** verify `gpu.driver`: " in markdown and "    nvidia-smi" in markdown
    (stored,) = kept(_runs_dir)
    assert stored["run_id"] == doc["run_id"] and stored["results"] == doc["results"]


def test_a_gate_without_a_model_exits_2_and_the_reports_say_so(tmp_path, _runs_dir):
    report, prom = tmp_path / "gate.json", tmp_path / "gate.prom"
    done = invoke("gate", "--json", str(report), "--prom", str(prom))
    assert done.returncode == 2
    # The report says why once, in the failing row with its fix, and its last line names that row; standard error
    # has the exit-2 message, as every usage error.
    assert done.stdout.count("no model to launch") == 1, done.stdout
    assert done.stderr.count("no model to launch") == 1
    assert "stackgate: no model to launch: set [smoke] model in" in done.stderr
    assert "  FAIL  lock.model  no model to launch: set [smoke] model in" in done.stdout
    assert "$ stackgate gate --model /path/to/model --lock " in done.stdout
    assert (
        done.stdout.rstrip()
        .splitlines()[-1]
        .endswith(": FAILED (the gate cannot run: lock.model above; no stage after it ran)")
    )
    doc = json.loads(report.read_text())
    assert doc["exit_code"] == 2 and statuses(doc) == {"lock": "failed", **{name: "not run" for name in STAGES[1:]}}
    assert doc["gate"]["usage_error"].startswith("no model to launch")
    assert exposition.parse(prom.read_text())["stackgate_gate_exit_code"].samples[0][1] == 2
    assert kept(_runs_dir) == []  # nothing about the stack was judged
    # The report's stage table tells the reason once, in the lock's row; the stages after it say "lock failed".
    assert [s["name"] for s in doc["gate"]["stages"] if "no model to launch" in s["reason"]] == ["lock"]
    assert [stage(doc, name)["reason"] for name in STAGES[1:]] == [
        "lock failed",
        "lock failed",
        "lock failed",
        "fast_smoke not run: lock failed",
    ]


@pytest.mark.parametrize("problem", ["missing", "a-file", "no-config"])
def test_a_model_that_cannot_be_read_fails_the_lock_stage_and_runs_nothing(tmp_path, _runs_dir, problem):
    model = tmp_path / "model"
    if problem == "a-file":
        model.write_text("")
    elif problem == "no-config":
        model.mkdir()
    report = tmp_path / "gate.json"
    done = invoke("gate", "--model", str(model), "--json", str(report))
    assert done.returncode == 2, done.stdout + done.stderr
    why = {
        "missing": "no such file or directory",
        "a-file": "is not a directory",
        "no-config": "has no config.json (not a Hugging Face model directory)",
    }[problem]
    assert f"stackgate: model {model}: {why}" in done.stderr
    doc = json.loads(report.read_text())
    assert statuses(doc) == {"lock": "failed", **{name: "not run" for name in STAGES[1:]}}
    (model_result,) = [r for r in stage(doc, "lock")["results"] if r["check"] == "lock.model"]
    assert model_result["status"] == "FAIL" and model_result["summary"].startswith(f"model {model}: {why}")
    assert kept(_runs_dir) == []


def test_a_bad_lockfile_exits_2_lists_its_problems_in_the_reports_and_runs_nothing(tmp_path, _runs_dir):
    bad = tmp_path / "bad.toml"
    bad.write_text(
        (ROOT / "lockfiles" / "hopper-sm90-cu130.toml").read_text().replace('torch = "==2.11.0"', 'torch = "=2.11.0"')
    )
    report, xml = tmp_path / "gate.json", tmp_path / "gate.xml"
    done = invoke("gate", "--lock", str(bad), "--json", str(report), "--junit", str(xml))
    assert done.returncode == 2
    assert f"{bad}: 1 problem in the lockfile:" in done.stderr and "Traceback" not in done.stderr
    doc = json.loads(report.read_text())
    (load,) = stage(doc, "lock")["results"]
    assert load["status"] == "FAIL" and load["details"] == [
        "python.packages.torch: invalid specifier '=2.11.0' (expected e.g. '==2.9.1+cu130')"
    ]
    assert doc["lock"] == {"name": None, "path": str(bad), "sha256": None}
    assert ET.parse(xml).getroot().find("testsuite[@name='stackgate.gate.lock']/testcase/failure") is not None
    assert kept(_runs_dir) == []


@pytest.mark.parametrize("where", ["a-directory", "under-a-file"])
def test_an_output_that_cannot_be_written_is_refused_before_anything_runs(tmp_path, _runs_dir, where):
    (tmp_path / "file").write_text("")
    target = tmp_path if where == "a-directory" else tmp_path / "file" / "gate.prom"
    done = invoke("gate", "--model", str(tmp_path), "--prom", str(target))
    assert done.returncode == 2 and "--prom" in done.stderr
    assert done.stdout == "" and kept(_runs_dir) == []


def hanging(path: Path, name: str, started: Path) -> Path:
    """A program that records that it started (its name and pid), then hangs for ten minutes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho {name} $$ >> {started}\nexec sleep 600\n")
    path.chmod(0o755)
    return path


def test_ctrl_c_ends_the_gate_at_once_starts_nothing_more_and_leaves_no_process(tmp_path, _runs_dir):
    """Ctrl-C while the facts are being gathered: the environment stage waits on the stack's
    interpreter (hanging) and the toolkit part on the first of its tools (hanging), the other
    still to come. The gate reports, keeps the run and exits 130; the second tool never starts
    (nothing new starts after the interrupt) and no process is left. A gate that went on starting probes would
    outlast the generous timeout below (each hangs for ten minutes)."""
    started = tmp_path / "started"
    python = hanging(tmp_path / "python", "python", started)
    prefix = tmp_path / "cuda"
    for tool in ("nvcc", "ptxas"):
        hanging(prefix / "bin" / tool, tool, started)
    text = (
        (ROOT / "lockfiles" / "hopper-sm90-cu130.toml").read_text().replace("/opt/torch/.venv/bin/python3", str(python))
    )
    spec = tmp_path / "hang.toml"
    spec.write_text(text.replace('prefix = "/usr/local/cuda-13.0"', f'prefix = "{prefix}"'))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    report = tmp_path / "gate.json"
    environ = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{TESTS}", "NO_COLOR": "1"}
    argv = [sys.executable, "-m", "invoke", "gate", "--lock", str(spec), "--model", str(model), "--json", str(report)]
    process = subprocess.Popen(
        argv, cwd=ROOT, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        wait_for(
            lambda: (
                started.exists()
                and {"python", "tool"}
                <= {
                    line.split()[0].replace("nvcc", "tool").replace("ptxas", "tool")
                    for line in started.read_text().splitlines()
                }
            ),
            60,
        )
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130 and "stackgate: interrupted" in err
    doc = json.loads(report.read_text())
    assert doc["gate"]["interrupted"] is True and doc["exit_code"] == 130
    assert (
        statuses(doc)["environment"] == "interrupted" and stage(doc, "verify")["reason"] == "the gate was interrupted"
    )
    assert [d["run_id"] for d in kept(_runs_dir)] == [doc["run_id"]]
    ran = [line.split() for line in started.read_text().splitlines()]
    assert len([name for name, _ in ran if name in ("nvcc", "ptxas")]) == 1
    wait_for(lambda: not living([int(pid) for _, pid in ran]), 10)  # each probe's process group was killed
    assert group_members(process.pid) == []


# --- end to end against the stand-in -----------------------------------------------------------


@pytest.fixture
def standin(rig, tmp_path, monkeypatch):
    """The stand-in's rig, with the fake NVML named for every part of the gate that asks."""
    monkeypatch.setenv("STACKGATE_NVML_MODULE", "fakes.fake_nvml")
    monkeypatch.setenv("STACKGATE_FAKE_NVML", str(rig.nvml_path))
    monkeypatch.setenv("STACKGATE_LOG_DIR", str(tmp_path / "logs"))
    return rig


def gate_spec(rig: Rig, python: Path, backend: str = "flashinfer") -> Path:
    """The stand-in's lock, pointed at a plain interpreter (the stand-in needs only the standard
    library; an empty environment has nothing to drift)."""
    path = rig.spec(benchmark=BENCH)
    text = path.read_text().replace(f'interpreter = "{sys.executable}"', f'interpreter = "{python}"')
    path.write_text(text.replace('attention_backend = "flashinfer"', f'attention_backend = "{backend}"'))
    return path


def run_gate(spec: Path, out: Path, **request: object) -> tuple[int, dict, str]:
    reports = {
        "json_path": out.with_suffix(".json"),
        "junit_path": out.with_suffix(".xml"),
        "markdown_path": out.with_suffix(".md"),
        "prom_path": out.with_suffix(".prom"),
    }
    stream = io.StringIO()
    code = command.run(
        gate.GateRequest(spec_path=spec, verify_checks=VERIFIABLE, **reports, **request),
        UI(stream=stream, force_plain=True),
    )
    return code, json.loads(reports["json_path"].read_text()), stream.getvalue()


def test_a_gate_against_the_standin_passes_then_regresses_and_report_names_the_change(
    standin, plain_python, tmp_path, _runs_dir
):
    rig = standin
    # The stand-in decodes 200 tok/s per stream, 150 with the triton backend (as the
    # reference deployment saw triton cost speed); the lock's floor is 190 * 0.95 = 180.5.
    rig.behave(rate=200.0, profiles=[{"when": {"attention_backend": "triton"}, "set": {"rate": 150.0}}])
    code, good, out = run_gate(gate_spec(rig, plain_python), tmp_path / "good")
    assert code == ExitCode.PASSED, out
    assert statuses(good) == dict.fromkeys(STAGES, "passed")
    assert good["gate"]["benchmark"]["decode_tok_s"]["mean"] == pytest.approx(
        200.0, rel=0.05
    )  # the stand-in paces by its sleeps; its accuracy is measured in benchmarks/client_accuracy.py
    assert good["gate"]["benchmark"]["status"] == "PASS" and good["gate"]["benchmark"]["floor_tok_s"] == 180.5
    components = good["gate"]["fingerprint"]["components"]
    assert (
        components["server"]["attention_backend"] == "flashinfer"
        and components["gpu"]["gpu0"] == "NVIDIA H200, compute capability 9.0"
    )
    assert (
        "load_format" not in components["server"]
        and "port" not in components["server"]
        and "random_seed" not in components["server"]
    )
    assert f"fingerprint {good['gate']['fingerprint']['short']}" in out
    assert re.search(
        r"^decode \d+\.\d\d tok/s vs baseline 190 \([-+]\d+\.\d%, floor 180\.50\): PASS; end-to-end \d+\.\d\d tok/s$",
        out,
        re.M,
    )

    families = exposition.parse((tmp_path / "good.prom").read_text())
    assert families["stackgate_gate_passed"].value(lock="standin") == 1
    assert families["stackgate_gate_decode_tokens_per_second"].value(lock="standin") == pytest.approx(
        200.0, rel=0.05
    )  # the stand-in paces by its sleeps; its accuracy is measured in benchmarks/client_accuracy.py
    assert families["stackgate_gate_baseline_tokens_per_second"].value(lock="standin") == 190
    suites = ET.parse(tmp_path / "good.xml").getroot().findall("testsuite")
    assert [s.attrib["failures"] for s in suites] == ["0"] * 5 and int(suites[-1].attrib["tests"]) > 5
    markdown = (tmp_path / "good.md").read_text()
    assert (
        markdown.startswith("## ✅ stackgate gate: PASSED\n")
        and "| 2 | 200 |" in markdown
        and "vs baseline 190" in markdown
    )

    code, again, _ = run_gate(gate_spec(rig, plain_python), tmp_path / "again")
    assert code == ExitCode.PASSED
    assert again["gate"]["fingerprint"]["digest"] == good["gate"]["fingerprint"]["digest"]  # stable on the same stack

    code, fast, _ = run_gate(gate_spec(rig, plain_python), tmp_path / "fast", fast_only=True)
    assert code == ExitCode.PASSED and statuses(fast)["benchmark"] == "not run"
    assert (
        fast["gate"]["fingerprint"]["digest"] == good["gate"]["fingerprint"]["digest"]
    )  # fast mode's own arguments are left out

    code, slow, out = run_gate(gate_spec(rig, plain_python, backend="triton"), tmp_path / "slow")
    assert code == ExitCode.FAILED
    assert statuses(slow) == {**dict.fromkeys(STAGES, "passed"), "benchmark": "failed"}
    assert "below the baseline 190 tok/s (allowed: 5.0%, floor 180.50)" in stage(slow, "benchmark")["reason"]
    assert slow["gate"]["fingerprint"]["digest"] != good["gate"]["fingerprint"]["digest"]
    assert (
        exposition.parse((tmp_path / "slow.prom").read_text())["stackgate_gate_stage_status"].value(
            stage="benchmark", status="failed"
        )
        == 1
    )
    assert_nothing_left(rig)

    listing = invoke("report", env={"PYTHONIOENCODING": "utf-8"})
    assert listing.returncode == 0, listing.stderr
    assert [line.split()[3] for line in listing.stdout.splitlines() if "-gate-" in line] == [
        "passed",
        "passed",
        "passed",
        "failed",
    ]
    assert "trend standin (decode tok/s, last 4 run(s)): ██ ▁" in listing.stdout

    diff = invoke("report", "--", good["run_id"], slow["run_id"])
    assert diff.returncode == 0, diff.stderr
    lines = diff.stdout.splitlines()
    (speed,) = [SPEED_LINE.match(line) for line in lines if line.startswith("decode tok/s")]
    assert speed is not None and speed[0].endswith("%; 95% CI "), diff.stdout
    old, new, percent = float(speed[1]), float(speed[2]), float(speed[3])
    assert [old, new] == pytest.approx([200.0, 150.0], rel=0.05)  # the stand-in's rates, as measured
    assert percent == pytest.approx(percent_of(old, new), abs=PERCENT_ROUNDING)
    assert "    attention_backend: flashinfer -> triton" in lines
    assert "  server:" in lines and "  lock:" in lines
    assert any(line.startswith("  benchmark smoke.benchmark: PASS -> FAIL") for line in lines)


#: `report RUN RUN`'s line for decode tok/s: the two figures, the change in tok/s, its percentage (and its CI).
SPEED_LINE = re.compile(r"decode tok/s: ([\d.]+) -> ([\d.]+): -[\d.]+ tok/s \((-[\d.]+)%(?:; 95% CI |\)$)")
#: How far a change's printed percentage (one decimal) may lie from the one computed from the two printed
#: figures (two decimals each, both above 100 here): 0.05 points of its own rounding and under 0.01 of theirs.
PERCENT_ROUNDING = 0.06


def percent_of(old: float, new: float) -> float:
    """The change from ``old`` to ``new`` in percent: what `report`'s diff line derives from its two figures.

    Each figure is measured within 5% of the stand-in's rate, so the percentage moves with both
    (200 -> 150 is -25%, 190 -> 157.5 is -17.1%): the line's percentage is held to its own figures.
    """
    return (new / old - 1) * 100


def test_a_change_s_percentage_is_held_to_the_figures_on_its_own_line():
    """Measured figures at the edges of their 5% tolerance: the percentage the diff line prints from them
    is accepted; a percentage that does not follow from them is not."""
    for old, new in ((200.0, 150.0), (190.0, 157.5), (210.0, 142.5)):
        line = rundiff.SpeedChange("decode_tok_s", old, new).text()
        printed = SPEED_LINE.match(line)
        assert printed is not None, line
        assert float(printed[3]) == pytest.approx(
            percent_of(float(printed[1]), float(printed[2])), abs=PERCENT_ROUNDING
        )
    assert -25.0 != pytest.approx(percent_of(190.0, 157.5), abs=PERCENT_ROUNDING)


def test_a_gate_interrupted_in_its_benchmark_says_so_under_the_table(standin, plain_python, tmp_path):
    """The stage table says "interrupted": the benchmark line and the Markdown say the same, not "not run"."""
    rig = standin
    rig.behave(rate=20.0)  # 200 tokens take 10 s: the interrupt lands mid-stream
    interrupter = threading.Thread(target=_interrupt_the_benchmark_stage, args=(rig,), daemon=True)
    interrupter.start()
    with pytest.raises(KeyboardInterrupt):
        run_gate(gate_spec(rig, plain_python), tmp_path / "cut")
    interrupter.join()
    doc = json.loads((tmp_path / "cut.json").read_text())
    assert statuses(doc)["benchmark"] == "interrupted" and doc["exit_code"] == 130
    assert summaries.headline_lines(doc)[-1] == "benchmark: interrupted before a figure was measured"
    markdown = (tmp_path / "cut.md").read_text()
    assert "Interrupted before a figure was measured." in markdown and "Not run." not in markdown
    assert_nothing_left(rig)


def _interrupt_the_benchmark_stage(rig: Rig) -> None:
    """Ctrl-C once the second launch (the benchmark stage's) streams."""

    def streaming() -> bool:
        starts = [e["t"] for e in rig.events("started")]
        return len(starts) == 2 and any(e["t"] > starts[1] for e in rig.events("stream"))

    wait_for(streaming, 120)
    os.kill(os.getpid(), signal.SIGINT)


# --- the environment stage against a root's generations ----------------------------------------


def root_lock(tmp_path: Path, **replace: str) -> Spec:
    text = (
        (ROOT / "lockfiles" / "blackwell-sm120-cu130.toml")
        .read_text()
        .replace('root = "/opt/stackgate"', f'root = "{tmp_path / "root"}"')
    )
    for old, new in replace.items():
        text = text.replace(old, new)
    path = tmp_path / "lock.toml"
    path.write_text(text)
    return load_spec(path)


def provisioned(spec: Spec, environment: dict | None = None, sha256: str | None = None) -> None:
    """A root whose current generation was built from ``spec`` (default: this lock's)."""
    home = generations.generations_dir(spec.python.root) / "0001-built"
    about = {
        "spec": environment or environment_spec(spec),
        "lock": {"path": str(spec.path), "sha256": sha256 or spec.sha256},
    }
    generations.switch(spec.python.root, generations.mark(generations.create(home, about), "ready"))


def environment_check(name: str, spec: Spec, facts: Facts | None = None) -> Result:
    """One of the environment stage's checks, run by name through the registry as the gate runs it."""
    (result,) = run_checks(select([name], REGISTRY), spec, facts or Facts(spec, environ={}))
    assert result.check == name
    return result


def installed(spec: Spec, **changes: str) -> Facts:
    found = {
        p.name: Distribution(p.name, changes.get(p.name, p.pinned_version or "0"), (), "/site-packages")
        for p in spec.python.packages
    }
    facts = Facts(spec, environ={})
    facts.provide(
        "dists", ProbeFacts("/root/current/bin/python", "3.12.3", {"python_version": "3.12"}, found, None, 0.0)
    )
    facts.provide("patches", ())
    return facts


def test_the_live_generation_built_from_this_lock_passes(tmp_path):
    spec = root_lock(tmp_path)
    provisioned(spec, sha256="b" * 64)
    result = environment_check("environment.generation", spec)
    assert (
        result.status == Status.PASS
        and result.summary
        == f"{tmp_path / 'root' / 'current'} -> generation 0001-built, built from this lock's Python stack"
    )
    assert result.details == (
        "built from another version of the lockfile (sha256 bbbbbbbbbbbb) with the same Python stack",
    )
    assert environment_check("environment.drift", spec, installed(spec)).status == Status.PASS


def test_a_lock_whose_stack_changed_since_the_generation_was_built_fails_naming_the_change(tmp_path):
    spec = root_lock(tmp_path)
    provisioned(spec)
    changed = root_lock(tmp_path, **{'sglang = "==0.5.9"': 'sglang = "==0.5.10"'})
    result = environment_check("environment.generation", changed)
    assert result.status == Status.FAIL
    assert result.summary == (
        "the lock's Python stack changed since generation 0001-built was built: packages.sglang.version: "
        "==0.5.9 "
        "-> "
        "==0.5.10"
    )
    assert result.fix.commands == (f"stackgate provision --lock {changed.path}",)


def test_no_generation_fails_and_drift_cannot_be_judged(tmp_path):
    spec = root_lock(tmp_path)
    assert (
        environment_check("environment.generation", spec).summary
        == f"no live environment: {tmp_path / 'root' / 'current'} does not exist"
    )
    facts = Facts(spec, environ={})
    facts.provide("dists", Missing("no stack environment"))
    assert environment_check("environment.drift", spec, facts).status == Status.SKIP


def test_a_moved_package_is_drift(tmp_path):
    spec = root_lock(tmp_path)
    result = environment_check("environment.drift", spec, installed(spec, torch="2.10.0"))
    assert result.status == Status.FAIL
    assert result.summary == "1 difference(s) from the lock: torch is 2.10.0, locked ==2.9.1+cu130"


def test_a_lock_naming_an_interpreter_has_no_generation_to_compare():
    spec = load_spec(ROOT / "lockfiles" / "hopper-sm90-cu130.toml")
    result = environment_check("environment.generation", spec)
    assert result.status == Status.SKIP and "there is no generation to compare" in result.summary
