"""The gate's Prometheus, Markdown and JUnit renderings, read back by strict parsers."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import exposition
import pytest
from history_support import gate_doc

from stackgate.models.result import Status
from stackgate.render import reporting, summaries

HOSTILE = 'node "7"\\a\nb'


def test_metrics_read_back_exactly_through_a_strict_parser_even_with_odd_labels():
    doc = gate_doc(decode=92.6, status=Status.FAIL, summary="torch moved")
    doc["host"]["hostname"] = HOSTILE
    doc["lock"]["name"] = 'lock "x"'
    families = exposition.parse(summaries.prometheus(doc))
    labels = {"lock": 'lock "x"', "host": HOSTILE}
    assert families["stackgate_gate_passed"].value(**labels) == 0
    assert families["stackgate_gate_checks_failed"].value(**labels) == 1
    assert families["stackgate_gate_checks"].value(status="fail") == 1
    assert families["stackgate_gate_decode_tokens_per_second"].value(**labels) == pytest.approx(92.6)
    assert families["stackgate_gate_tokens_per_second"].value() == pytest.approx(92.6 * 0.985)
    assert families["stackgate_gate_baseline_tokens_per_second"].value() == 190
    assert families["stackgate_gate_stage_status"].value(stage="verify", status="failed") == 1
    assert sum(v for _, v in families["stackgate_gate_stage_status"].samples) == 4  # one status per stage
    info = families["stackgate_gate_info"].samples[0][0]
    assert info["run_id"] == doc["run_id"] and info["fingerprint"] == doc["gate"]["fingerprint"]["short"]
    assert families["stackgate_gate_last_run_timestamp_seconds"].value() > 1.6e9


def test_prometheus_own_parser_reads_the_same_series():
    parser = pytest.importorskip(
        "prometheus_client.parser", reason="prometheus_client (the test extra) is not installed"
    )
    doc = gate_doc(decode=150.0)
    doc["host"]["hostname"] = HOSTILE
    text = summaries.prometheus(doc)
    ours = {
        (name, tuple(sorted(labels.items()))): value
        for name, family in exposition.parse(text).items()
        for labels, value in family.samples
    }
    theirs = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in parser.text_string_to_metric_families(text)
        for s in f.samples
    }
    assert theirs == ours and len(ours) > 20


def test_the_strict_parser_refuses_what_the_format_refuses():
    good = '# HELP a x\n# TYPE a gauge\na{l="v"} 1\n'
    assert exposition.parse(good)["a"].value(l="v") == 1
    for bad in [
        "a 1",
        'a{l="v} 1\n',
        'a{l="\\q"} 1\n',
        "a 1\nb 2\na 3\n",
        "a 1\n# TYPE a gauge\n",
        "a one\n",
        "2a 1\n",
        'a{l="v"} 1\na{l="v"} 2\n',
    ]:
        with pytest.raises(exposition.ExpositionError):
            exposition.parse(bad)


def test_a_gate_without_a_benchmark_writes_no_speed_series():
    families = exposition.parse(summaries.prometheus(gate_doc(decode=None)))
    assert not {"stackgate_gate_decode_tokens_per_second", "stackgate_gate_tokens_per_second"} & set(families)
    assert families["stackgate_gate_passed"].value() == 1


def test_the_markdown_summary_has_the_verdict_stages_failures_and_the_speed_against_the_baseline():
    doc = gate_doc(decode=83.9, status=Status.FAIL, summary="a | pipe\nand a newline")
    text = summaries.markdown(doc)
    lines = text.splitlines()
    assert lines[0] == "## ❌ stackgate gate: FAILED"
    assert "| stage | status | seconds | reason |" in lines
    assert any(
        line.startswith("| verify | ❌ failed | 0.0 | 1 check(s) failed: verify.check: a \\| pipe and a newline |")
        for line in lines
    )
    assert "- **FAIL** verify `verify.check`: a \\| pipe and a newline" in lines
    assert "    echo fix" in lines
    assert "decode 83.90 tok/s vs baseline 190 (-55.8%, floor 180.50): FAIL; end-to-end 82.64 tok/s" in lines
    assert f"### Fingerprint `{doc['gate']['fingerprint']['short']}`" in lines
    assert all(line.count("|") - line.count("\\|") in (0, 5, 7, 3) for line in lines if line.startswith("|"))


def test_junit_has_a_testsuite_per_stage_and_reads_back_as_xml():
    root = ET.fromstring(
        reporting.junit_xml(summaries.suites(gate_doc(status=Status.FAIL, summary="broke"))).split("\n", 1)[1]
    )
    suites = {s.attrib["name"]: s for s in root.findall("testsuite")}
    assert list(suites) == [
        "stackgate.gate.lock",
        "stackgate.gate.environment",
        "stackgate.gate.verify",
        "stackgate.gate.fast_smoke",
    ]
    assert suites["stackgate.gate.verify"].attrib["failures"] == "1"
    assert suites["stackgate.gate.verify"].find("testcase/failure").attrib["message"] == "broke"


def test_a_hostile_hostname_and_gpu_name_stay_text_in_the_markdown():
    doc = gate_doc(decode=92.6, status=Status.FAIL, summary="GPU 0 is NVIDIA <script>alert(1)</script> | x")
    doc["host"]["hostname"] = "node\\xff`x"
    doc["gate"]["fingerprint"]["components"]["gpu"]["gpu0"] = "NVIDIA <script>alert(1)</script>"
    doc["gate"]["stages"][2]["results"][0]["fix"]["commands"] = ["echo ```", "echo done"]
    text = summaries.markdown(doc)
    assert "<script" not in text and text.count("&lt;script>alert(1)&lt;/script>") == 3
    assert "host ``node\\xff`x``" in text and "GPU 0 is NVIDIA &lt;script>alert(1)&lt;/script> \\| x" in text
    assert "    ````sh\n    echo ```\n    echo done\n    ````" in text  # a fence no command closes


def test_junit_of_a_log_line_with_unicode_noncharacters_and_surrogates_parses():
    doc = gate_doc(decode=92.6, status=Status.FAIL, summary="server said \ufffe\uffff\udcff\x1b[2J")
    doc["gate"]["stages"][2]["results"][0]["details"] = ["> a log line \uffff with \ufffe in it"]
    root = ET.fromstring(reporting.junit_text(summaries.suites(doc)).encode("utf-8"))
    failure = root.find(".//failure")
    assert failure is not None and failure.get("message") == "server said [2J"
    assert failure.text is not None and "> a log line  with  in it" in failure.text
