"""The history of runs and `invoke report`: where runs are kept, reading them back whatever is
in the folder, naming them, listing, comparing; smoke keeps its runs too."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import subprocess
from pathlib import Path

import pytest
from history_support import gate_doc, keep, smoke_doc
from smoke_support import ROOT, assert_nothing_left
from support import run_program

from stackgate.commands import report as reporting
from stackgate.models.result import Status
from stackgate.models.spec import Spec, load_spec
from stackgate.render.ui import UI
from stackgate.runs import history

TESTS = ROOT / "tests"


def invoke(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_program(*args, program="invoke", env=env, timeout=120)


def root_lock(tmp_path: Path, root: Path) -> Spec:
    text = (
        (ROOT / "lockfiles" / "blackwell-sm120-cu130.toml")
        .read_text()
        .replace('root = "/opt/stackgate"', f'root = "{root}"')
    )
    path = tmp_path / "lock.toml"
    path.write_text(text)
    return load_spec(path)


def test_runs_are_kept_under_the_root_only_when_it_holds_a_stack_and_is_writable(tmp_path):
    spec = root_lock(tmp_path, tmp_path / "root")
    home = {"HOME": str(tmp_path / "home")}
    state = tmp_path / "home" / ".local" / "state" / "stackgate" / "runs"
    assert history.runs_dir(spec, home) == state  # no root yet: not created for a report
    assert (
        history.runs_dir(spec, {**home, "XDG_STATE_HOME": str(tmp_path / "state")})
        == tmp_path / "state" / "stackgate" / "runs"
    )
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / ".provision.lock").write_text("")  # all that a refused provision leaves
    assert history.runs_dir(spec, home) == state
    (tmp_path / "root" / "generations").mkdir()
    assert history.runs_dir(spec, home) == tmp_path / "root" / "runs"
    assert (
        history.runs_dir(spec, {**home, "STACKGATE_HISTORY_DIR": str(tmp_path / "elsewhere")}) == tmp_path / "elsewhere"
    )
    interpreter = load_spec(ROOT / "lockfiles" / "hopper-sm90-cu130.toml")
    assert history.runs_dir(interpreter, home) == tmp_path / "home" / ".local" / "state" / "stackgate" / "runs"


def test_a_run_round_trips_and_is_named_by_id_prefix_position_or_path(tmp_path):
    first = keep(tmp_path, gate_doc(decode=200.0), "2025-01-01T10:00:00+00:00")
    second = keep(tmp_path, gate_doc(decode=150.0, backend="triton"), "2025-01-02T10:00:00+00:00")
    runs, warnings = history.load(tmp_path)
    assert warnings == [] and [r.id for r in runs] == [first.id, second.id]
    assert runs[0].decode_tok_s == pytest.approx(200.0) and runs[1].verdict == "passed" and runs[0].command == "gate"
    assert history.find("-1", runs).id == second.id and history.find(first.id[:12], runs).id == first.id
    assert history.find(str(second.path), runs).id == second.id
    with pytest.raises(history.HistoryError, match="names 2 runs"):
        history.find("2025", runs)
    with pytest.raises(history.HistoryError, match="there are only 2 run"):
        history.find("-3", runs)


def damage(folder: Path) -> dict[str, str]:
    """Files that must never crash a report, and what the warning says about each."""
    files = {
        "garbage.json": (b"\x00\xff\xfe binary", "unreadable"),
        "empty.json": (b"", "damaged: not JSON"),
        "truncated.json": (json.dumps(gate_doc())[:200].encode(), "damaged: not JSON"),
        "array.json": (b"[1, 2, 3]", "not a stackgate run: a JSON list"),
        "foreign.json": (
            json.dumps({"schema": "someone.else/3", "results": []}).encode(),
            "not a stackgate run (schema 'someone.else/3'",
        ),
        "verify.json": (json.dumps({**gate_doc(), "command": "verify"}).encode(), "command 'verify'"),
        "wrong-types.json": (
            json.dumps({**gate_doc(), "results": "none", "verdict": 3}).encode(),
            "damaged: verdict: 3, not text; results: text ('none'), not a list",
        ),
        "odd-inside.json": (
            json.dumps(
                {**gate_doc(), "gate": "not a table", "run_id": None, "started": "2025-01-03T00:00:00+00:00"}
            ).encode(),
            "damaged: run_id: null, not text; gate: text ('not a table'), not an object",
        ),
        "deep.json": (b"[" * 100_000 + b"]" * 100_000, "damaged: nested too deeply"),
    }
    for name, (data, _) in files.items():
        (folder / name).write_bytes(data)
    (folder / "a-folder.json").mkdir()
    (folder / "notes.txt").write_text("not a run")
    return {name: why for name, (_, why) in files.items() if why}


def test_damaged_and_foreign_files_are_skipped_with_a_warning_never_a_crash(tmp_path):
    good = keep(tmp_path, gate_doc(decode=200.0), "2025-01-01T10:00:00+00:00")
    later = keep(tmp_path, gate_doc(decode=190.0), "2025-01-02T10:00:00+00:00")
    why = damage(tmp_path)
    env = {"STACKGATE_HISTORY_DIR": str(tmp_path)}
    listing = invoke("report", env=env)
    assert listing.returncode == 0, listing.stderr
    warnings = [line for line in listing.stderr.splitlines() if line.startswith("warning: skipped ")]
    assert len(warnings) == len(why)
    for name, text in why.items():
        assert any(f"{tmp_path / name}: " in w and text in w for w in warnings), (name, listing.stderr)
    assert "Traceback" not in listing.stderr
    rows = [line.split()[0] for line in listing.stdout.splitlines() if line.split()[1:2] == ["gate"]]
    assert rows == [good.id, later.id]  # a run whose inner parts are not a run's is skipped, with the key path
    assert invoke("report", "--", good.id, later.id, env=env).returncode == 0
    assert invoke("report", "--html", str(tmp_path / "page.html"), env=env).returncode == 0
    named = invoke("report", "--", str(tmp_path / "truncated.json"), env=env)
    assert named.returncode == 2 and "damaged: not JSON" in named.stderr
    odd = invoke("report", "--", str(tmp_path / "odd-inside.json"), env=env)
    assert odd.returncode == 2 and "gate: text ('not a table'), not an object" in odd.stderr


def test_report_a_b_names_each_changed_component_next_to_the_change_in_tok_s(tmp_path):
    a = keep(tmp_path, gate_doc(decode=92.6), "2025-01-01T10:00:00+00:00")
    b = keep(
        tmp_path,
        gate_doc(decode=83.9, backend="triton", torch="2.10.0", status=Status.FAIL, summary="torch moved"),
        "2025-01-02T10:00:00+00:00",
    )
    done = invoke("report", "--run", a.id, "--run", b.id, env={"STACKGATE_HISTORY_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[2].startswith("decode tok/s: 92.60 -> 83.90: -8.70 tok/s (-9.4%; 95% CI -")
    assert "  server:" in lines and "    attention_backend: flashinfer -> triton" in lines
    assert "  distributions:" in lines and "    torch: 2.9.1+cu130 -> 2.10.0" in lines
    assert "  verify verify.check: PASS -> FAIL: torch moved" in lines
    assert lines.index("    torch: 2.9.1+cu130 -> 2.10.0") < lines.index("  server:")  # sections in their order


def test_the_listing_shows_a_trend_per_lock_plain_without_unicode(tmp_path):
    for day, decode in enumerate([90.0, 92.0, None, 96.0], 1):
        keep(tmp_path, gate_doc(decode=decode), f"2025-01-0{day}T10:00:00+00:00")
    keep(tmp_path, gate_doc(decode=50.0, spec="other"), "2025-01-05T10:00:00+00:00")
    env = {"STACKGATE_HISTORY_DIR": str(tmp_path)}
    unicode = invoke("report", env={**env, "PYTHONIOENCODING": "utf-8"})
    assert "trend standin (decode tok/s, last 4 run(s)): ▁▃ █  90.00 → 96.00 (min 90.00, max 96.00)" in unicode.stdout
    assert "trend other (decode tok/s, last 1 run(s)): ▅  50.00 → 50.00" in unicode.stdout
    plain = invoke("report", env={**env, "PYTHONIOENCODING": "ascii"})
    assert "trend standin (decode tok/s, last 4 run(s)): _- #  90.00 -> 96.00" in plain.stdout


def test_report_usage_errors_exit_2(tmp_path):
    env = {"STACKGATE_HISTORY_DIR": str(tmp_path)}
    assert "no runs kept in" in invoke("report", env=env).stdout
    for args, text in [
        (("--", "a", "b", "c"), "name at most two runs"),
        (("--", "nope"), "no run 'nope'"),
        (("--html", str(tmp_path / "x.html"), "--", "a", "b"), "--html takes at most one run"),
    ]:
        done = invoke("report", *args, env=env)
        assert done.returncode == 2 and text in done.stderr, done.stderr


def test_smoke_keeps_its_runs_and_report_compares_them_on_what_they_recorded(rig, tmp_path):
    env = {**rig.environ(), "STACKGATE_LOG_DIR": str(rig.runs), "STACKGATE_HISTORY_DIR": str(tmp_path / "history")}
    rig.behave(rate=200.0, profiles=[{"when": {"attention_backend": "triton"}, "set": {"rate": 150.0}}])
    spec = rig.spec()
    first = invoke("smoke", "--lock", str(spec), "--benchmark", "--json", str(tmp_path / "smoke.json"), env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    spec.write_text(spec.read_text().replace('attention_backend = "flashinfer"', 'attention_backend = "triton"'))
    assert invoke("smoke", "--lock", str(spec), "--benchmark", env=env).returncode == 0
    (one, two) = sorted((tmp_path / "history").glob("*.json"))
    assert (
        json.loads(one.read_text())["run_id"] == json.loads((tmp_path / "smoke.json").read_text())["run_id"] == one.stem
    )
    assert f"run {one.stem} kept in {tmp_path / 'history'}" in first.stderr
    listing = invoke("report", env=env)
    rows = [line.split() for line in listing.stdout.splitlines() if "-smoke-" in line]
    assert [(r[1], r[3]) for r in rows] == [("smoke", "passed"), ("smoke", "passed")]
    assert float(rows[0][4]) == pytest.approx(200.0, rel=0.05) and float(rows[1][4]) == pytest.approx(150.0, rel=0.05)
    diff = invoke("report", "--", "-2", "-1", env=env)
    assert "    attention_backend: flashinfer -> triton" in diff.stdout.splitlines()
    assert (
        "(not compared: gpu, toolkits, distributions, patches: a smoke run records only its lock and its server)"
        in diff.stdout
    )
    assert_nothing_left(rig)


OOM = (
    "[2026-01-12 10:00:27 TP0] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 "
    "has "
    "a "
    "total capacity of 23.53 GiB of which 20.38 MiB is free."
)


def as_smoke_1(doc: dict) -> dict:
    """The document as stackgate wrote it before findings had one form: smoke/1's flat findings."""
    old = json.loads(json.dumps(doc))
    old["smoke"]["schema"] = "stackgate.smoke/1"
    for session in old["smoke"]["sessions"]:
        session["findings"] = [
            {
                "id": f["id"],
                "severity": f["severity"],
                "line": f["evidence"]["line"],
                "count": f["evidence"]["count"],
                "text": "\n".join(f["evidence"]["lines"]),
                "title": f["title"],
                "cause": f["cause"],
                "fix": f["fix"]["text"],
                "commands": f["fix"]["commands"],
                "source": f["learned_from"],
            }
            for f in session["findings"]
        ]
    return old


def report_a(folder: Path, ref: str) -> tuple[list[str], str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        assert (
            reporting.run(reporting.ReportRequest(runs=(ref,), runs_dir=folder), UI(stream=out, force_plain=True)) == 0
        )
    return out.getvalue().splitlines(), err.getvalue()


def test_report_a_shows_the_findings_of_a_run_kept_in_either_shape(tmp_path):
    doc = smoke_doc(tmp_path / "rig", decode=None, log=f"starting\n{OOM}\n")
    (finding,) = doc["smoke"]["sessions"][0]["findings"]
    assert (
        doc["smoke"]["schema"] == "stackgate.smoke/2"
        and finding["evidence"]["file"] == "/logs/server.log"
        and finding["fix"]["commands"]
    )
    runs = tmp_path / "runs"
    runs.mkdir()
    new = keep(runs, doc, "2025-01-01T10:00:00+00:00")
    old = keep(runs, as_smoke_1(doc), "2025-01-02T10:00:00+00:00")
    worded = json.loads(json.dumps(doc))  # kept before findings said fail/warn: "error" reads as fail
    worded["smoke"]["sessions"][0]["findings"][0]["severity"] = "error"
    older = keep(runs, worded, "2025-01-03T10:00:00+00:00")
    shown = f"  FAIL    cuda-out-of-memory: {finding['title']} (/logs/server.log:2)"
    for run in (new, old, older):
        lines, err = report_a(runs, run.id)
        assert "known failures in the server logs (1):" in lines and shown in lines, lines
        assert err == ""
    assert old.findings()[0][0] == dataclasses.replace(
        new.findings()[0][0],
        references=(),
        values={},
        evidence=dataclasses.replace(new.findings()[0][0].evidence, start_line=0),
    )


def test_a_finding_that_cannot_be_read_is_a_warning_not_a_crash(tmp_path):
    doc = smoke_doc(tmp_path / "rig", decode=None, log=f"{OOM}\n")
    doc["smoke"]["sessions"][0]["findings"].append({"id": "half", "severity": "fatal"})
    run = keep(tmp_path, doc, "2025-01-01T10:00:00+00:00")
    lines, err = report_a(tmp_path, run.id)
    assert "known failures in the server logs (1):" in lines
    assert f"warning: a finding of run {run.id} cannot be read: severity: 'fatal' is not one of info, warn, fail" in err


def test_report_of_one_run_shows_a_nodes_reason_and_hostname_without_their_escape_sequences(tmp_path):
    doc = gate_doc(decode=92.0)
    doc["reason"], doc["host"]["hostname"] = "ok\x1b]0;pwned\x07\x1b[2J", "gpu\x1b]8;;http://evil.example\x1b\\01"
    keep(tmp_path, doc, "2025-01-01T10:00:00+00:00")
    out = io.StringIO()
    assert (
        reporting.run(reporting.ReportRequest(runs=("-1",), runs_dir=tmp_path), UI(stream=out, force_plain=True)) == 0
    )
    assert "on gpu?]8;;http://evil.example?\\01; ok?]0;pwned??[2J" in out.getvalue() and "\x1b" not in out.getvalue()
