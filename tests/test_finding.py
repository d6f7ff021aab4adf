"""One finding, one JSON form: what the knowledge base's scan makes round-trips through JSON, and
diagnose's report, smoke's log results and sessions, and verify's import check all write it the
same way."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from stackgate import scan
from stackgate.checks.abi import explain_import
from stackgate.checks.smoke import logscan
from stackgate.facts import ImportOutcome
from stackgate.flows import diagnose
from stackgate.models import knowledge
from stackgate.models.finding import Finding, FindingError, Fix
from stackgate.models.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
LOCK = load_spec(ROOT / "lockfiles" / "blackwell-sm120-cu130.toml")
LINE = "ImportError: libcudart.so.12: cannot open shared object file: No such file or directory"
KEYS = {
    "id",
    "title",
    "severity",
    "component",
    "consequence",
    "cause",
    "fix",
    "learned_from",
    "references",
    "evidence",
    "values",
}


def scanned(text: str, source: str) -> list[Finding]:
    scanner = scan.Scanner(context=knowledge.spec_context(LOCK), source=source)
    scanner.feed_text(text)
    scanner.finish()
    return scanner.findings


@pytest.mark.parametrize("signature", knowledge.load(), ids=lambda s: s.id)
def test_every_finding_the_knowledge_base_makes_round_trips_through_json(signature: knowledge.Signature) -> None:
    for finding in scanned("\n".join(signature.examples), "example.log"):
        written = json.loads(json.dumps(finding.to_dict()))
        assert set(written) == KEYS and Finding.from_dict(written) == finding


def test_diagnose_smoke_and_verify_write_the_same_form() -> None:
    (finding,) = scanned(f"starting\n{LINE}\n", "server.log")
    done = diagnose.diagnose(
        [("server.log", lambda: io.BytesIO(f"starting\n{LINE}\n".encode()))], knowledge.spec_context(LOCK)
    )
    (in_diagnose,) = diagnose.document(done)["findings"]
    (in_smoke,) = logscan.finding_results([finding], "log", lock_backend="flashinfer")
    in_verify = explain_import(
        ImportOutcome("sgl_kernel", False, 0.1, f"Traceback (most recent call last):\n{LINE}"), LOCK
    )
    assert in_verify is not None
    assert in_diagnose == in_smoke.data["finding"] == finding.to_dict()
    assert in_verify.to_dict() == {
        **finding.to_dict(),
        "evidence": {"file": "import sgl_kernel", "line": 2, "start_line": 2, "count": 1, "lines": [LINE]},
    }
    assert in_smoke.fix == finding.fix == Fix.from_dict(in_diagnose["fix"])


def test_the_evidence_of_a_multi_line_event_names_its_first_and_last_line() -> None:
    example = next(s for s in knowledge.load() if s.id == "sglang-symm-mem-keyerror").examples[0]
    (finding,) = [f for f in scanned(f"one\ntwo\n{example}\n", "server.log") if f.id == "sglang-symm-mem-keyerror"]
    evidence = finding.evidence
    assert (
        evidence.start_line >= 3
        and evidence.line == evidence.start_line + len(evidence.lines) - 1 > evidence.start_line
    )
    assert (
        evidence.where == f"server.log:{evidence.start_line}-{evidence.line}"
        and evidence.lines[-1] == example.splitlines()[-1]
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"severity": "fatal"}, "severity: 'fatal' is not one of info, warn, fail"),
        ({"fix": "Reinstall."}, "fix: missing or not an object"),
        ({"evidence": {"file": "x", "line": "7"}}, "line: missing or not a whole number"),
        ({"learned_from": None}, "learned_from: missing or not text"),
        ({"values": {"lib": 12}}, "values: not a mapping of names to text"),
    ],
)
def test_a_finding_not_in_the_one_form_is_refused_naming_the_key(change: dict, message: str) -> None:
    (finding,) = scanned(LINE, "x.log")
    with pytest.raises(FindingError, match=f"^{message}"):
        Finding.from_dict({**finding.to_dict(), **change})


def test_one_severity_vocabulary_the_words_of_a_results_status() -> None:
    from stackgate.models.finding import SEVERITIES
    from stackgate.models.kernelevents import CATALOG
    from stackgate.models.result import Status
    from stackgate.models.spec.deepshapes import FUSION_SEVERITIES

    words = {status.name.lower() for status in Status}
    assert SEVERITIES == ("info", "warn", "fail") and set(SEVERITIES) - {"info"} <= words
    assert set(FUSION_SEVERITIES) <= set(SEVERITIES) and {x.severity for x in CATALOG.values()} <= set(SEVERITIES)
    assert {entry.severity for entry in knowledge.load()} <= set(SEVERITIES)
    (finding,) = scanned(LINE, "x.log")
    for old, new in (("error", "fail"), ("warning", "warn")):  # a document written before reads as it meant
        assert Finding.from_dict({**finding.to_dict(), "severity": old}).severity == new
