"""The rendered report, exact to the character; JUnit parsed back as XML; JSON round trips."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET

from stackgate.edges.files import write_json
from stackgate.models.finding import Fix
from stackgate.models.result import Result, Status
from stackgate.models.verdict import document, judge
from stackgate.render.reporting import junit_xml
from stackgate.render.ui import UI, render_plain

RESULTS = [
    Result("gpu.driver", Status.PASS, "driver 580.82.07 (>= 580.82.7)", duration_s=0.01),
    Result(
        "gpu.capability",
        Status.FAIL,
        "1 of 8 GPU(s) are not compute capability 12.0: NVIDIA H200 is 9.0",
        ("GPU 2 (NVIDIA H200): compute capability 9.0, the lock wants 12.0",),
        Fix(
            "Run with the lock for this machine's GPUs (--lock).",
            ("invoke verify --lock lockfiles/hopper-sm90-cu130.toml",),
        ),
        {"want": "12.0"},
        0.02,
    ),
    Result(
        "gpu.processes",
        Status.WARN,
        "1 process(es) hold GPU memory",
        ("GPU 0 (X): pid 7 holds 10 MiB",),
        Fix("Stop them."),
    ),
    Result(
        "python.pins",
        Status.SKIP,
        "no probe of the stack's interpreter (see python.interpreter)",
        ("no stack environment",),
    ),
    Result("abi.imports", Status.ERROR, "the check crashed: ValueError: boom", duration_s=0.5),
]

PLAIN = """\
stackgate verify: t

gpu
  PASS  gpu.driver      driver 580.82.07 (>= 580.82.7)
  FAIL  gpu.capability  1 of 8 GPU(s) are not compute capability 12.0: NVIDIA H200 is 9.0
                        GPU 2 (NVIDIA H200): compute capability 9.0, the lock wants 12.0
                        fix: Run with the lock for this machine's GPUs (--lock).
                        $ invoke verify --lock lockfiles/hopper-sm90-cu130.toml
  WARN  gpu.processes   1 process(es) hold GPU memory
                        GPU 0 (X): pid 7 holds 10 MiB
                        fix: Stop them.
python
  SKIP  python.pins     no probe of the stack's interpreter (see python.interpreter)
abi
  ERROR abi.imports     the check crashed: ValueError: boom

1 passed, 1 warning, 1 failed, 1 error, 1 skipped in 1.50 s: FAILED (2 check(s) failed)
"""


def test_the_plain_report_exactly():
    assert render_plain("stackgate verify: t", RESULTS, judge(RESULTS), 1.5) == PLAIN


def test_verbose_shows_details_of_passing_and_skipped_checks():
    text = render_plain("t", RESULTS, judge(RESULTS), 1.5, verbose=1)
    assert (
        "  SKIP  python.pins     no probe of the stack's interpreter (see "
        "python.interpreter)\n                        "
        "no stack environment\n"
    ) in text


def test_the_ui_writes_plain_lines_without_a_terminal(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    stream = io.StringIO()
    UI(stream=stream).results("stackgate verify: t", RESULTS, judge(RESULTS), 1.5)
    assert stream.getvalue() == PLAIN


TABLE = """\
stackgate verify: t
┏━━━━━━━━┳━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┓
┃ status ┃ check          ┃ result                                                            ┃
┡━━━━━━━━╇━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┩
│        │ gpu            │                                                                   │
│ PASS   │ gpu.driver     │ driver 580.82.07 (>= 580.82.7)                                    │
│ FAIL   │ gpu.capability │ 1 of 8 GPU(s) are not compute capability 12.0: NVIDIA H200 is 9.0 │
│        │                │ GPU 2 (NVIDIA H200): compute capability 9.0, the lock wants 12.0  │
│        │                │ fix: Run with the lock for this machine's GPUs (--lock).          │
│        │                │ $ invoke verify --lock lockfiles/hopper-sm90-cu130.toml           │
│ WARN   │ gpu.processes  │ 1 process(es) hold GPU memory                                     │
│        │                │ GPU 0 (X): pid 7 holds 10 MiB                                     │
│        │                │ fix: Stop them.                                                   │
│        │ python         │                                                                   │
│ SKIP   │ python.pins    │ no probe of the stack's interpreter (see python.interpreter)      │
│        │ abi            │                                                                   │
│ ERROR  │ abi.imports    │ the check crashed: ValueError: boom                               │
└────────┴────────────────┴───────────────────────────────────────────────────────────────────┘
1 passed, 1 warning, 1 failed, 1 error, 1 skipped in 1.50 s: FAILED (2 check(s) failed)
"""


def test_the_rich_table_exactly(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    stream = io.StringIO()
    ui = UI(stream=stream, force_plain=False)
    ui.console.width = 100
    ui.results("stackgate verify: t", RESULTS, judge(RESULTS), 1.5)
    assert "".join(line.rstrip() + "\n" for line in stream.getvalue().splitlines()) == TABLE


def test_junit_has_one_testcase_per_check_and_parses_as_xml():
    root = ET.fromstring(junit_xml({"stackgate.verify.t": RESULTS}))
    (suite,) = root.findall("testsuite")
    assert suite.attrib == {
        "name": "stackgate.verify.t",
        "tests": "5",
        "failures": "1",
        "errors": "1",
        "skipped": "1",
        "time": "0.530",
    }
    cases = {c.attrib["name"]: c for c in suite.findall("testcase")}
    assert set(cases) == {r.check for r in RESULTS}
    failure = cases["gpu.capability"].find("failure")
    assert failure.attrib["message"].startswith("1 of 8 GPU(s)") and "$ invoke verify --lock" in failure.text
    assert cases["abi.imports"].find("error") is not None
    assert cases["python.pins"].find("skipped") is not None
    assert cases["gpu.processes"].find("failure") is None


def test_strict_junit_fails_warnings():
    root = ET.fromstring(junit_xml({"s": RESULTS}, strict=True))
    assert root.find("testsuite").attrib["failures"] == "2"


def test_control_characters_from_logs_do_not_break_the_xml():
    bad = [Result("smoke.log", Status.FAIL, "saw \x1b[31mred\x1b[0m and \x00", ("\x07bell",))]
    root = ET.fromstring(junit_xml({"s": bad}))
    assert root.find("testsuite/testcase/failure").attrib["message"] == "saw [31mred[0m and "


def test_results_round_trip_through_json(tmp_path):
    for result in RESULTS:
        assert Result.from_dict(json.loads(json.dumps(result.to_dict()))) == result
    doc = document("verify", RESULTS, judge(RESULTS), started=0.0, duration_s=1.5)
    write_json(tmp_path / "out" / "r.json", doc)
    loaded = json.loads((tmp_path / "out" / "r.json").read_text())
    assert loaded["schema"] == "stackgate.report/1" and loaded["exit_code"] == 1 and loaded["verdict"] == "failed"
    assert loaded["counts"] == {"PASS": 1, "SKIP": 1, "WARN": 1, "FAIL": 1, "ERROR": 1}
    assert loaded["results"][1]["fix"]["commands"] == ["invoke verify --lock lockfiles/hopper-sm90-cu130.toml"]
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["r.json"]  # no temporary file left behind
