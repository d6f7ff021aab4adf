"""`invoke report` (stackgate/commands/report.py) in process, through ``reporting.run``: the history
with its trend, one run, two runs compared, the HTML page, which runs directory is read, and
every usage error; and once through invoke, with runs named after ``--``."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from history_support import gate_doc, keep, smoke_doc
from support import run_program

from stackgate.commands import report as reporting
from stackgate.models.exitcodes import UsageError
from stackgate.models.result import Status
from stackgate.models.spec import SpecError
from stackgate.render.ui import UI

ROOT = Path(__file__).resolve().parents[1]
DAYS = [f"2025-01-0{day}T10:00:00+00:00" for day in range(1, 10)]


def report(*runs: str, **request: Path | None) -> list[str]:
    """``invoke report RUNS...``'s plain output, as lines."""
    out = io.StringIO()
    assert reporting.run(reporting.ReportRequest(runs=runs, **request), UI(stream=out, force_plain=True)) == 0
    return out.getvalue().splitlines()


@pytest.fixture
def runs(tmp_path):
    """Two gate runs (the second slower, on another torch and backend, a check failed) and two
    smoke runs (the second on triton), in one runs directory."""
    folder = tmp_path / "runs"
    kept = [
        keep(folder, gate_doc(decode=92.6), DAYS[0]),
        keep(
            folder,
            gate_doc(decode=83.9, backend="triton", torch="2.10.0", status=Status.FAIL, summary="torch moved"),
            DAYS[1],
        ),
        keep(folder, smoke_doc(tmp_path / "s1"), DAYS[2]),
        keep(folder, smoke_doc(tmp_path / "s2", backend="triton", decode=150.0), DAYS[3]),
    ]
    return folder, kept


def test_the_history_lists_every_run_and_a_trend_per_lock(runs):
    folder, (a, b, s1, s2) = runs
    lines = report(runs_dir=folder)
    assert lines[:2] == [
        f"4 run(s) in {folder}, oldest first",
        "run                            command  lock     verdict  decode tok/s   tok/s  fingerprint",
    ]
    assert lines[2].split() == [a.id, "gate", "standin", "passed", "92.60", "91.21", a.fingerprint["short"]]
    assert lines[3].split() == [b.id, "gate", "standin", "failed", "83.90", "82.64", b.fingerprint["short"]]
    assert lines[4].split() == [s1.id, "smoke", "standin", "passed", "200.00", "197.00"]
    assert lines[6] == "trend standin (decode tok/s, last 4 run(s)): ▂▁█▅  92.60 → 150.00 (min 83.90, max 200.00)"
    assert len(lines) == 7


def test_a_lock_whose_runs_have_no_benchmark_of_the_real_weights_says_so(tmp_path):
    keep(tmp_path, gate_doc(decode=None, spec="bare"), DAYS[0])
    keep(tmp_path, smoke_doc(tmp_path / "fast", fast=True), DAYS[1])  # a fast-mode figure is not the stack's speed
    lines = report(runs_dir=tmp_path)
    assert [line.split()[4:6] for line in lines[2:4]] == [["-", "-"], ["-", "-"]]
    assert lines[4:] == [
        "trend bare: no run with a benchmark of the real weights yet",
        "trend standin: no run with a benchmark of the real weights yet",
    ]


def test_an_empty_or_missing_runs_directory_says_where_runs_will_be_kept(tmp_path):
    expected = f"no runs kept in {tmp_path / 'none'} yet: `stackgate gate` and `stackgate smoke` keep theirs there"
    assert report(runs_dir=tmp_path / "none") == [expected]


def test_damaged_files_are_skipped_with_a_warning_on_stderr(runs, capsys):
    folder, kept = runs
    (folder / "broken.json").write_text("{")
    lines = report(runs_dir=folder)
    assert lines[0].startswith("4 run(s)")
    assert capsys.readouterr().err.startswith(f"warning: skipped {folder / 'broken.json'}: damaged: not JSON")


def test_one_gate_run_shows_its_stages_failures_with_their_fix_benchmark_and_fingerprint(runs):
    folder, (_, b, _, _) = runs
    assert report("-3", runs_dir=folder) == [
        f"run {b.id} (gate of standin, failed, decode 83.90 tok/s)",
        "  started 2025-01-02T10:00:00+00:00 on " + b.host + "; 1 check(s) failed",
        "stages",
        "stage        status  seconds  reason",
        "lock         passed      0.0  1 passed",
        "environment  passed      0.0  1 passed",
        "verify       failed      0.0  1 check(s) failed: verify.check: torch moved",
        "fast_smoke   passed      0.0  1 passed",
        "  FAIL  verify verify.check: torch moved",
        "        fix: Do the thing.",
        "        $ echo fix",
        "decode 83.90 tok/s vs baseline 190 (-55.8%, floor 180.50): FAIL; end-to-end 82.64 tok/s",
        f"fingerprint {b.fingerprint['short']} (lock, gpu, distributions, server)",
        f"file: {b.path}",
    ]


def test_one_smoke_run_shows_its_figures_and_one_without_a_benchmark_none(runs, tmp_path):
    folder, (_, _, s1, _) = runs
    assert report(s1.id[:20], runs_dir=folder)[2:] == ["decode 200.00 tok/s; 197.00 tok/s", f"file: {s1.path}"]
    bare = keep(tmp_path / "other", smoke_doc(tmp_path / "bare", decode=None), DAYS[5])
    assert report(str(bare.path), runs_dir=folder)[2:] == [f"file: {bare.path}"]  # named by its file, from elsewhere


def test_two_gate_runs_compared(runs):
    folder, (a, b, _, _) = runs
    lines = report(a.id, b.id, runs_dir=folder)
    assert lines[0] == f"A: {a.label()}, started {a.started}" and lines[1] == f"B: {b.label()}, started {b.started}"
    assert lines[2].startswith("decode tok/s: 92.60 -> 83.90: -8.70 tok/s (-9.4%; 95% CI -") and lines[3].startswith(
        "tok/s: 91.21 -> 82.64: "
    )
    assert lines[4:] == [
        f"what changed from A to B (2 component(s); fingerprint {a.fingerprint['short']} -> {b.fingerprint['short']}):",
        "  distributions:",
        "    torch: 2.9.1+cu130 -> 2.10.0",
        "  server:",
        "    attention_backend: flashinfer -> triton",
        "  (not compared: toolkits, patches: not recorded by both runs)",
        "checks whose status changed (1):",
        "  verify verify.check: PASS -> FAIL: torch moved",
    ]


def test_two_smoke_runs_compared_on_what_a_smoke_records(runs):
    folder, (_, _, s1, s2) = runs
    lines = report("-2", "-1", runs_dir=folder)
    assert lines[2].startswith("decode tok/s: 200.00 -> 150.00: -50.00 tok/s (-25.0%; 95% CI -")
    assert lines[4:] == [
        "what changed from A to B (2 component(s)):",
        "  lock:",
        f"    sha256: {s1.doc['lock']['sha256']} -> {s2.doc['lock']['sha256']}",
        "  server:",
        "    attention_backend: flashinfer -> triton",
        "  (not compared: gpu, toolkits, distributions, patches: a smoke run records only its lock and its server)",
    ]
    same = report("-1", "-1", runs_dir=folder)
    assert same[4:] == [
        "the stack is the same in what both runs recorded (lock, server)",
        "  (not compared: gpu, toolkits, distributions, patches: a smoke run records only its lock and its server)",
    ]


def test_many_status_changes_are_cut_at_thirty(tmp_path):
    many = gate_doc(decode=90.0)
    many["results"] = [{**many["results"][0], "check": f"extra.{i:02d}", "status": "WARN"} for i in range(35)]
    a, b = keep(tmp_path, gate_doc(decode=90.0), DAYS[0]), keep(tmp_path, many, DAYS[1])
    lines = report(a.id, b.id, runs_dir=tmp_path)
    start = lines.index("checks whose status changed (39):")
    assert len(lines) - start - 1 == 30 and lines[-1].endswith("extra.25: (absent) -> WARN: lock ok")


@pytest.mark.parametrize(
    ("runs_named", "html", "message"),
    [
        (("a", "b", "c"), False, "name at most two runs (A, or A B to compare), not 3"),
        (("-1", "-2"), True, "--html takes at most one run (none: the history)"),
        (("nope",), False, "no run 'nope' (4 run(s) kept; `stackgate report` lists them)"),
        (("-5",), False, "-5: there are only 4 run(s)"),
        (("2025",), False, "'2025' names 4 runs"),
        (("missing.json",), False, "no run file missing.json"),
    ],
)
def test_usage_errors_name_the_problem(runs, tmp_path, runs_named, html, message):
    folder, _ = runs
    request = reporting.ReportRequest(
        runs=runs_named, html_path=tmp_path / "page.html" if html else None, runs_dir=folder
    )
    with pytest.raises(UsageError) as caught:
        reporting.run(request, UI(stream=io.StringIO(), force_plain=True))
    assert str(caught.value).startswith(message)
    assert not (tmp_path / "page.html").exists()


def test_the_runs_directory_comes_from_the_lock_or_the_state_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("STACKGATE_HISTORY_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    text = (
        (ROOT / "lockfiles" / "blackwell-sm120-cu130.toml")
        .read_text()
        .replace('root = "/opt/stackgate"', f'root = "{tmp_path / "root"}"')
    )
    (tmp_path / "lock.toml").write_text(text)
    kept = keep(tmp_path / "root" / "runs", gate_doc(decode=90.0), DAYS[0])
    assert report(spec_path=tmp_path / "lock.toml")[2].split()[0] == kept.id
    state = tmp_path / "state" / "stackgate" / "runs"
    monkeypatch.setenv(
        "STACKGATE_LOCK", str(tmp_path / "broken.toml")
    )  # the default lock does not load: its history still shows
    (tmp_path / "broken.toml").write_text("[stack\n")
    assert report() == [f"no runs kept in {state} yet: `stackgate gate` and `stackgate smoke` keep theirs there"]
    with pytest.raises(SpecError):  # a lock named on purpose must load
        report(spec_path=tmp_path / "broken.toml")


def test_the_html_page_of_the_history_and_of_one_run(runs, tmp_path):
    folder, (a, b, s1, s2) = runs
    assert report(html_path=tmp_path / "all.html", runs_dir=folder) == [f"wrote {tmp_path / 'all.html'} (4 run(s))"]
    page = (tmp_path / "all.html").read_text()
    assert all(r.id in page for r in (a, b, s1, s2)) and "stackgate: 4 run(s) of standin" in page
    other = keep(tmp_path / "elsewhere", gate_doc(decode=50.0, spec="other"), DAYS[6])
    assert report(str(other.path), html_path=tmp_path / "one.html", runs_dir=folder) == [
        f"wrote {tmp_path / 'one.html'} (1 run(s), focus {other.id})"
    ]
    assert f"stackgate: run {other.id}" in (tmp_path / "one.html").read_text()
    assert report(html_path=tmp_path / "none.html", runs_dir=tmp_path / "empty") == [
        f"wrote {tmp_path / 'none.html'} (0 run(s))"
    ]
    assert "stackgate: 0 run(s) of no lock" in (tmp_path / "none.html").read_text()


def test_invoke_report_takes_runs_after_a_double_dash_even_negative_ones(runs):
    """Item 30 of issue 11: `c.remainder` crashed on invoke 2.2.1; the floor is now 3.0."""
    folder, (_, _, s1, s2) = runs
    done = run_program(
        "report", "--", "-2", "-1", program="invoke", env={"STACKGATE_HISTORY_DIR": str(folder)}, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:2] == [
        f"A: {s1.label()}, started {s1.started}",
        f"B: {s2.label()}, started {s2.started}",
    ]


def test_the_fingerprint_line_counts_what_it_lists() -> None:
    """ "over 11 components" names each group with its count, so the figures add up to the total."""
    from stackgate.render import summaries

    components = {"hardware": {"gpu": "H200", "count": 1}, "python": {"torch": "2.9.1", "sglang": "0.5.9", "x": "1"}}
    doc = {"gate": {"fingerprint": {"short": "abc123", "digest": "f" * 64, "components": components}}}
    assert summaries.headline_lines(doc)[0] == (
        f"fingerprint abc123 (sha256 {'f' * 64} over 5 components: hardware 2, python 3)"
    )
