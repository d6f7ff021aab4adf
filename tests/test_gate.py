"""`invoke gate`: the stages and their dependencies, the command on this machine, and end to end
against the stand-in SGLang server with a fake NVML."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import exposition
import pytest
from smoke_support import ROOT, Rig, assert_nothing_left, living, wait_for

from stackgate import gate
from stackgate.checks.core import Result, Status, failed, passed, skipped, warned
from stackgate.checks.facts import Distribution, Facts, Missing, ProbeFacts
from stackgate.exitcodes import ExitCode
from stackgate.stack import generations, pyenv
from stackgate.stack import lock as lockmodel
from stackgate.ui import UI

TESTS = ROOT / "tests"
STAGES = ["lock", "environment", "verify", "fast_smoke", "benchmark"]
#: The verify checks this machine can pass with the fake NVML and a plain interpreter.
VERIFIABLE = ("gpu.*", "python.interpreter", "python.pins", "python.frozen", "python.consistency")
BENCH = {"output_tokens": 200, "runs": 2, "warmup": 1, "baseline_tok_s": 190.0, "max_regression": 0.05}


def invoke(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{TESTS}", "NO_COLOR": "1", **(env or {})}
    environ.pop("STACKGATE_LOCK", None)
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=timeout)


def statuses(doc: dict) -> dict[str, str]:
    return {s["name"]: s["status"] for s in doc["gate"]["stages"]}


def stage(doc: dict, name: str) -> dict:
    return next(s for s in doc["gate"]["stages"] if s["name"] == name)


def kept(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


# --- the stages, with stage functions injected -------------------------------------------------


def fixed(*results: Result):
    """A stage function that returns these results (each named after its summary's first word)."""
    return lambda ctx: [r if r.check else Result(f"t.{r.summary.split()[0]}", r.status, r.summary) for r in results]


def run_stages(*stages: gate.Stage, **request: object) -> gate.GateRun:
    return gate.run_gate(gate.GateRequest(**request), UI(stream=io.StringIO(), force_plain=True), stages=stages)


def test_a_failed_stage_stops_the_stages_that_stand_on_it_with_the_reason():
    done = run_stages(
        gate.Stage("a", "a", (), fixed(passed("a ok"))),
        gate.Stage("b", "b", ("a",), fixed(failed("b broke"))),
        gate.Stage("c", "c", ("a",), fixed(passed("c ok"))),
        gate.Stage("d", "d", ("b", "c"), fixed(passed("d ok"))),
        gate.Stage("e", "e", ("d",), fixed(passed("e ok"))),
    )
    assert [(s.name, s.status) for s in done.stages] == [("a", "passed"), ("b", "failed"), ("c", "passed"), ("d", "not run"), ("e", "not run")]
    assert done.stage("b").reason == "1 check(s) failed: t.b: b broke"
    (d,) = done.stage("d").results
    assert d.check == "gate.d" and d.status == Status.SKIP
    assert d.summary == "not run: b failed: 1 check(s) failed: t.b: b broke"
    assert done.stage("e").reason == "d not run: b failed: 1 check(s) failed: t.b: b broke"
    assert done.exit_code == ExitCode.FAILED


def test_verify_runs_even_when_the_environment_drifted_but_nothing_launches():
    ran = []
    stages = [
        gate.Stage(s.name, s.title, s.needs, (lambda name: lambda ctx: ran.append(name) or [Result(f"t.{name}", Status.FAIL if name == "environment" else Status.PASS, name)])(s.name), s.left_out)
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
    done = run_stages(gate.Stage("a", "a", (), fixed(skipped("a skipped"))), gate.Stage("b", "b", (), fixed(skipped("b skipped"))))
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

    done = run_stages(gate.Stage("a", "a", (), fixed(passed("a ok"))), gate.Stage("b", "b", ("a",), interrupted), gate.Stage("c", "c", (), fixed(passed("c ok"))))
    assert done.interrupted and done.exit_code == ExitCode.INTERRUPTED
    assert [s.status for s in done.stages] == ["passed", "interrupted", "not run"]
    assert [r.check for r in done.stage("b").results] == ["t.half", "gate.b"]
    assert done.stage("c").reason == "the gate was interrupted"
    assert done.document()["gate"]["interrupted"] is True


# --- the command on this machine ---------------------------------------------------------------


def test_the_default_lock_on_this_machine_fails_lists_verify_failures_and_writes_every_report(tmp_path, _runs_dir):
    model = tmp_path / "model"
    model.mkdir()
    out = {kind: tmp_path / f"gate.{kind}" for kind in ("json", "xml", "md", "prom")}
    done = invoke("gate", "--model", str(model), "--json", str(out["json"]), "--junit", str(out["xml"]), "--markdown", str(out["md"]), "--prom", str(out["prom"]))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL  gpu.driver" in done.stdout  # verify's failures are listed, with their fixes
    assert "$ nvidia-smi" in done.stdout
    doc = json.loads(out["json"].read_text())
    assert statuses(doc) == {"lock": "passed", "environment": "failed", "verify": "failed", "fast_smoke": "not run", "benchmark": "not run"}
    (not_run,) = stage(doc, "fast_smoke")["results"]
    assert not_run["check"] == "gate.fast_smoke" and not_run["status"] == "SKIP"
    assert not_run["summary"].startswith("not run: environment failed: ")
    assert any(d.startswith("verify failed: ") and "gpu.driver" in d for d in not_run["details"])
    assert "fast_smoke   not run" in done.stdout and "environment failed: " in done.stdout
    assert doc["gate"]["schema"] == "stackgate.gate/1" and doc["schema"] == "stackgate.report/1"
    assert doc["gate"]["benchmark"] is None and doc["gate"]["fingerprint"]["components"]["gpu"] == {"unavailable": "NVML not usable: NVML Shared Library Not Found"}
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
    assert "| fast_smoke | ⏭️ not run | 0.0 | environment failed: " in markdown
    assert "- **FAIL** verify `gpu.driver`: " in markdown and "    nvidia-smi" in markdown
    (stored,) = kept(_runs_dir)
    assert stored["run_id"] == doc["run_id"] and stored["results"] == doc["results"]


def test_a_gate_without_a_model_exits_2_and_the_reports_say_so(tmp_path, _runs_dir):
    report, prom = tmp_path / "gate.json", tmp_path / "gate.prom"
    done = invoke("gate", "--json", str(report), "--prom", str(prom))
    assert done.returncode == 2
    assert "stackgate: no model to launch: set [smoke] model in" in done.stderr and "or pass --model PATH" in done.stderr
    doc = json.loads(report.read_text())
    assert doc["exit_code"] == 2 and statuses(doc) == {"lock": "failed", **{name: "not run" for name in STAGES[1:]}}
    assert doc["gate"]["usage_error"].startswith("no model to launch")
    assert exposition.parse(prom.read_text())["stackgate_gate_exit_code"].samples[0][1] == 2
    assert kept(_runs_dir) == []  # nothing about the stack was judged


def test_a_bad_lockfile_exits_2_lists_its_problems_in_the_reports_and_runs_nothing(tmp_path, _runs_dir):
    bad = tmp_path / "bad.toml"
    bad.write_text((ROOT / "lockfiles" / "hopper-sm90-cu130.toml").read_text().replace('torch = "==2.11.0"', 'torch = "=2.11.0"'))
    report, xml = tmp_path / "gate.json", tmp_path / "gate.xml"
    done = invoke("gate", "--lock", str(bad), "--json", str(report), "--junit", str(xml))
    assert done.returncode == 2
    assert f"{bad}: 1 problem in the lockfile:" in done.stderr and "Traceback" not in done.stderr
    doc = json.loads(report.read_text())
    (load,) = stage(doc, "lock")["results"]
    assert load["status"] == "FAIL" and load["details"] == ["python.packages.torch: invalid specifier '=2.11.0' (expected e.g. '==2.9.1+cu130')"]
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


#: How long the Ctrl-C test's stand-in probe sleeps: far beyond any wait of a loaded machine.
HANG_S = 600


def test_ctrl_c_exits_130_writes_the_reports_and_keeps_the_run(tmp_path, _runs_dir):
    hang = tmp_path / "python"
    marker = tmp_path / "started"
    # The stand-in's probes never end on their own, nor by the gate's timeouts, while the test
    # runs (HANG_S): a gate that waits for one after Ctrl-C (issue 11, item 21) cannot exit within
    # the hang guard below, however fast the machine; one that kills them exits in a second or
    # two, however loaded.
    hang.write_text(f"#!/bin/sh\necho $$ >> {marker}.pids\ntouch {marker}\nexec sleep {HANG_S}\n")
    hang.chmod(0o755)
    text = (ROOT / "lockfiles" / "hopper-sm90-cu130.toml").read_text().replace("/opt/torch/.venv/bin/python3", str(hang))
    lock = tmp_path / "hang.toml"
    lock.write_text(text)
    report = tmp_path / "gate.json"
    timeouts = {"STACKGATE_PROBE_TIMEOUT_S": str(HANG_S), "STACKGATE_IMPORT_TIMEOUT_S": str(HANG_S)}
    environ = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{TESTS}", "NO_COLOR": "1", **timeouts}
    argv = [sys.executable, "-m", "invoke", "gate", "--lock", str(lock), "--model", str(tmp_path), "--json", str(report)]
    process = subprocess.Popen(argv, cwd=ROOT, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    wait_for(marker.exists, HANG_S / 5)  # the environment stage's probe hangs in the stand-in interpreter
    process.send_signal(signal.SIGINT)
    try:
        _, err = process.communicate(timeout=HANG_S / 5)  # a hang guard, not a speed limit
    except subprocess.TimeoutExpired:
        for pid in [process.pid, *(int(p) for p in Path(f"{marker}.pids").read_text().split())]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)  # the gate and its probes: each leads its own group
        raise AssertionError(f"the gate waited for a probe after Ctrl-C ({HANG_S / 5:.0f} s; its probes sleep {HANG_S} s)") from None
    assert process.returncode == 130 and "stackgate: interrupted" in err
    doc = json.loads(report.read_text())
    assert doc["gate"]["interrupted"] is True and doc["exit_code"] == 130
    assert statuses(doc)["environment"] == "interrupted" and stage(doc, "verify")["reason"] == "the gate was interrupted"
    assert [d["run_id"] for d in kept(_runs_dir)] == [doc["run_id"]]
    pids = [int(p) for p in Path(f"{marker}.pids").read_text().split()]
    wait_for(lambda: not living(pids), HANG_S / 5)  # killed: left alone they would live HANG_S


# --- end to end against the stand-in -----------------------------------------------------------


@pytest.fixture
def standin(rig, tmp_path, monkeypatch):
    """The stand-in's rig, with the fake NVML named for every part of the gate that asks."""
    monkeypatch.setenv("STACKGATE_NVML_MODULE", "fakes.fake_nvml")
    monkeypatch.setenv("STACKGATE_FAKE_NVML", str(rig.nvml_path))
    monkeypatch.setenv("STACKGATE_RUN_DIR", str(tmp_path / "logs"))
    return rig


def gate_lock(rig: Rig, python: Path, backend: str = "flashinfer") -> Path:
    """The stand-in's lock, pointed at a plain interpreter (the stand-in needs only the standard
    library; an empty environment has nothing to drift)."""
    path = rig.lock(benchmark=BENCH)
    text = path.read_text().replace(f'interpreter = "{sys.executable}"', f'interpreter = "{python}"')
    path.write_text(text.replace('attention_backend = "flashinfer"', f'attention_backend = "{backend}"'))
    return path


def run_gate(lock: Path, out: Path, **request: object) -> tuple[int, dict, str]:
    reports = {"json_path": out.with_suffix(".json"), "junit_path": out.with_suffix(".xml"), "markdown_path": out.with_suffix(".md"), "prom_path": out.with_suffix(".prom")}
    stream = io.StringIO()
    code = gate.run(gate.GateRequest(lock_path=lock, verify_checks=VERIFIABLE, **reports, **request), UI(stream=stream, force_plain=True))
    return code, json.loads(reports["json_path"].read_text()), stream.getvalue()


def test_a_gate_against_the_standin_passes_then_regresses_and_report_names_the_change(standin, plain_python, tmp_path, _runs_dir):
    rig = standin
    # The stand-in decodes 200 tok/s per stream, 150 with the triton backend (as the
    # reference deployment saw triton cost speed); the lock's floor is 190 * 0.95 = 180.5.
    rig.behave(rate=200.0, profiles=[{"when": {"attention_backend": "triton"}, "set": {"rate": 150.0}}])
    code, good, out = run_gate(gate_lock(rig, plain_python), tmp_path / "good")
    assert code == ExitCode.PASSED, out
    assert statuses(good) == dict.fromkeys(STAGES, "passed")
    assert good["gate"]["benchmark"]["decode_tok_s"]["mean"] == pytest.approx(200.0, rel=0.01)
    assert good["gate"]["benchmark"]["status"] == "PASS" and good["gate"]["benchmark"]["floor_tok_s"] == 180.5
    components = good["gate"]["fingerprint"]["components"]
    assert components["server"]["attention_backend"] == "flashinfer" and components["gpu"]["gpu0"] == "NVIDIA H200, compute capability 9.0"
    assert "load_format" not in components["server"] and "port" not in components["server"] and "random_seed" not in components["server"]
    assert f"fingerprint {good['gate']['fingerprint']['short']}" in out and "decode 2" in out

    families = exposition.parse((tmp_path / "good.prom").read_text())
    assert families["stackgate_gate_passed"].value(lock="standin") == 1
    assert families["stackgate_gate_decode_tokens_per_second"].value(lock="standin") == pytest.approx(200.0, rel=0.01)
    assert families["stackgate_gate_baseline_tokens_per_second"].value(lock="standin") == 190
    suites = ET.parse(tmp_path / "good.xml").getroot().findall("testsuite")
    assert [s.attrib["failures"] for s in suites] == ["0"] * 5 and int(suites[-1].attrib["tests"]) > 5
    markdown = (tmp_path / "good.md").read_text()
    assert markdown.startswith("## ✅ stackgate gate: PASSED\n") and "| 2 | 200 |" in markdown and "vs baseline 190" in markdown

    code, again, _ = run_gate(gate_lock(rig, plain_python), tmp_path / "again")
    assert code == ExitCode.PASSED
    assert again["gate"]["fingerprint"]["digest"] == good["gate"]["fingerprint"]["digest"]  # stable on the same stack

    code, fast, _ = run_gate(gate_lock(rig, plain_python), tmp_path / "fast", fast_only=True)
    assert code == ExitCode.PASSED and statuses(fast)["benchmark"] == "not run"
    assert fast["gate"]["fingerprint"]["digest"] == good["gate"]["fingerprint"]["digest"]  # fast mode's own arguments are left out

    code, slow, out = run_gate(gate_lock(rig, plain_python, backend="triton"), tmp_path / "slow")
    assert code == ExitCode.FAILED
    assert statuses(slow) == {**dict.fromkeys(STAGES, "passed"), "benchmark": "failed"}
    assert "below the baseline 190 tok/s (allowed: 5.0%, floor 180.50)" in stage(slow, "benchmark")["reason"]
    assert slow["gate"]["fingerprint"]["digest"] != good["gate"]["fingerprint"]["digest"]
    assert exposition.parse((tmp_path / "slow.prom").read_text())["stackgate_gate_stage_status"].value(stage="benchmark", status="failed") == 1
    assert_nothing_left(rig)

    listing = invoke("report", env={"PYTHONIOENCODING": "utf-8"})
    assert listing.returncode == 0, listing.stderr
    assert [line.split()[3] for line in listing.stdout.splitlines() if "-gate-" in line] == ["passed", "passed", "passed", "failed"]
    assert "trend standin (decode tok/s, last 4 run(s)): ██ ▁" in listing.stdout

    diff = invoke("report", "--", good["run_id"], slow["run_id"])
    assert diff.returncode == 0, diff.stderr
    lines = diff.stdout.splitlines()
    (speed,) = [re.match(r"decode tok/s: ([\d.]+) -> ([\d.]+): -[\d.]+ tok/s \((-[\d.]+)%; 95% CI ", line) for line in lines if line.startswith("decode tok/s")]
    assert speed is not None, diff.stdout
    assert [float(speed[1]), float(speed[2]), float(speed[3])] == pytest.approx([200.0, 150.0, -25.0], rel=0.01)
    assert "    attention_backend: flashinfer -> triton" in lines
    assert "  server:" in lines and "  lock:" in lines
    assert any(line.startswith("  benchmark smoke.benchmark: PASS -> FAIL") for line in lines)


# --- the environment stage against a root's generations ----------------------------------------


def root_lock(tmp_path: Path, **replace: str) -> lockmodel.Lock:
    text = (ROOT / "lockfiles" / "blackwell-sm120-cu130.toml").read_text().replace('root = "/opt/stackgate"', f'root = "{tmp_path / "root"}"')
    for old, new in replace.items():
        text = text.replace(old, new)
    path = tmp_path / "lock.toml"
    path.write_text(text)
    return lockmodel.load(path)


def provisioned(lock: lockmodel.Lock, spec: dict | None = None, sha256: str | None = None) -> None:
    """A root whose current generation was built from ``spec`` (default: this lock's)."""
    home = generations.generations_dir(lock.python.root) / "0001-built"
    about = {"spec": spec or pyenv.spec(lock), "lock": {"path": str(lock.path), "sha256": sha256 or lock.sha256}}
    generations.switch(lock.python.root, generations.mark(generations.create(home, about), "ready"))


def installed(lock: lockmodel.Lock, **changes: str) -> Facts:
    found = {p.name: Distribution(p.name, changes.get(p.name, p.pinned_version or "0"), (), "/site-packages") for p in lock.python.packages}
    facts = Facts(lock, environ={})
    facts.provide("dists", ProbeFacts("/root/current/bin/python", "3.12.3", {"python_version": "3.12"}, found, None, 0.0))
    facts.provide("patches", ())
    return facts


def test_the_live_generation_built_from_this_lock_passes(tmp_path):
    lock = root_lock(tmp_path)
    provisioned(lock, sha256="b" * 64)
    result = gate._generation(lock)
    assert result.status == Status.PASS and result.summary == f"{tmp_path / 'root' / 'current'} -> generation 0001-built, built from this lock's Python stack"
    assert result.details == ("built from another version of the lockfile (sha256 bbbbbbbbbbbb) with the same Python stack",)
    assert gate._drift(lock, installed(lock)).status == Status.PASS


def test_a_lock_whose_stack_changed_since_the_generation_was_built_fails_naming_the_change(tmp_path):
    lock = root_lock(tmp_path)
    provisioned(lock)
    changed = root_lock(tmp_path, **{'sglang = "==0.5.9"': 'sglang = "==0.5.10"'})
    result = gate._generation(changed)
    assert result.status == Status.FAIL
    assert result.summary == "the lock's Python stack changed since generation 0001-built was built: packages.sglang.version: ==0.5.9 -> ==0.5.10"
    assert result.fix.commands == (f"invoke provision --lock {changed.path}",)


def test_no_generation_fails_and_drift_cannot_be_judged(tmp_path):
    lock = root_lock(tmp_path)
    assert gate._generation(lock).summary == f"no live environment: {tmp_path / 'root' / 'current'} does not exist"
    facts = Facts(lock, environ={})
    facts.provide("dists", Missing("no stack environment"))
    assert gate._drift(lock, facts).status == Status.SKIP


def test_a_moved_package_is_drift(tmp_path):
    lock = root_lock(tmp_path)
    result = gate._drift(lock, installed(lock, torch="2.10.0"))
    assert result.status == Status.FAIL
    assert result.summary == "1 difference(s) from the lock: torch is 2.10.0, locked ==2.9.1+cu130"


def test_a_lock_naming_an_interpreter_has_no_generation_to_compare():
    lock = lockmodel.load(ROOT / "lockfiles" / "hopper-sm90-cu130.toml")
    result = gate._generation(lock)
    assert result.status == Status.SKIP and "there is no generation to compare" in result.summary
