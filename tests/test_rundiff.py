"""What changed between two kept runs (stackgate/runs/rundiff.py), through its public functions: gate
runs compare their whole fingerprint, smoke runs their lock and server; the speed with its
interval when both sides have the runs for one; the checks whose status changed."""

from __future__ import annotations

import pytest
from history_support import SERVER, gate_doc, keep, smoke_doc

from stackgate.models.result import Status
from stackgate.runs import fingerprint, history, rundiff
from stackgate.serve import benchstats

DAY1, DAY2 = "2025-01-01T10:00:00+00:00", "2025-01-02T10:00:00+00:00"


def loose(folder, doc, started):
    """A run as the comparison may be handed one that no reader checked (a kept run is checked:
    this one is refused, see models/rundoc.py): the comparison tolerates it anyway."""
    with pytest.raises(history.HistoryError, match="is damaged: "):
        keep(folder, doc, started)
    return history.Run(f"loose-{started}", folder / "loose.json", {**doc, "started": started})


def test_two_gate_runs_differ_by_component_with_the_speed_interval_and_the_status_changes(tmp_path):
    a = keep(tmp_path, gate_doc(decode=92.6), DAY1)
    b = keep(
        tmp_path,
        gate_doc(decode=83.9, backend="triton", torch="2.10.0", status=Status.FAIL, summary="torch moved"),
        DAY2,
    )
    done = rundiff.compare(a, b)
    assert (done.old, done.new) == (a, b) and not done.same_stack
    assert done.sections == ("lock", "gpu", "distributions", "server")
    assert [str(c) for c in done.changes] == ["torch: 2.9.1+cu130 -> 2.10.0", "attention_backend: flashinfer -> triton"]
    assert [c.section for c in done.changes] == ["distributions", "server"]
    decode, tok = done.speed
    assert (decode.name, decode.old, decode.new) == ("decode_tok_s", pytest.approx(92.6), pytest.approx(83.9))
    assert decode.difference == benchstats.difference(
        rundiff.summary_of(a, "decode_tok_s"), rundiff.summary_of(b, "decode_tok_s")
    )
    assert decode.text().startswith("decode tok/s: 92.60 -> 83.90: -8.70 tok/s (-9.4%; 95% CI -")
    assert tok.name == "tok_s" and tok.text().startswith("tok/s: 91.21 -> 82.64: ")
    assert done.statuses == (rundiff.StatusChange("verify", "verify.check", "PASS", "FAIL", "torch moved"),)
    assert str(done.statuses[0]) == "verify verify.check: PASS -> FAIL: torch moved"


def test_the_same_stack_is_the_same_and_a_run_without_a_benchmark_has_no_speed_change(tmp_path):
    a = keep(tmp_path, gate_doc(decode=92.6), DAY1)
    b = keep(tmp_path, gate_doc(decode=None), DAY2)
    done = rundiff.compare(a, b)
    assert done.same_stack and done.changes == () and done.statuses == ()
    assert [s.text() for s in done.speed] == ["decode tok/s: 92.60 -> (none)", "tok/s: 91.21 -> (none)"]
    assert all(s.difference is None for s in done.speed)
    assert rundiff.compare(b, b).speed[0].text() == "decode tok/s: (none) -> (none)"


def test_with_a_single_run_on_a_side_the_change_is_plain_without_an_interval(tmp_path):
    one = gate_doc(decode=80.0)
    one["gate"]["benchmark"]["decode_tok_s"] = {
        **benchstats.summarize([80.0]).to_dict(),
        "ci_low": None,
        "ci_high": None,
    }
    a = keep(tmp_path, one, DAY1)
    b = keep(tmp_path, gate_doc(decode=100.0), DAY2)
    decode = rundiff.compare(a, b).speed[0]
    assert decode.difference is None
    assert decode.text() == "decode tok/s: 80.00 -> 100.00: +20.00 tok/s (+25.0%)"


def test_smoke_runs_are_compared_on_their_lock_and_their_servers_arguments(tmp_path):
    a = keep(tmp_path / "runs", smoke_doc(tmp_path / "a"), DAY1)
    b = keep(tmp_path / "runs", smoke_doc(tmp_path / "b", backend="triton", decode=150.0), DAY2)
    parts = rundiff.components(a)
    assert parts == {
        "lock": {"name": "standin", "sha256": a.doc["lock"]["sha256"]},
        "server": fingerprint.server_section({**SERVER, "port": 30000, "random_seed": 7}),
    }
    assert "port" not in parts["server"] and "random_seed" not in parts["server"]  # a launch's own choices
    done = rundiff.compare(a, b)
    assert done.sections == ("lock", "server")
    assert [(c.section, c.name, c.old, c.new) for c in done.changes] == [
        ("lock", "sha256", a.doc["lock"]["sha256"], b.doc["lock"]["sha256"]),
        ("server", "attention_backend", "flashinfer", "triton"),
    ]
    assert done.speed[0].text().startswith("decode tok/s: 200.00 -> 150.00: -50.00 tok/s (-25.0%; 95% CI -")


def test_a_gate_and_a_smoke_run_are_compared_on_what_both_recorded(tmp_path):
    gate = keep(tmp_path / "runs", gate_doc(decode=200.0), DAY1)
    smoke = keep(tmp_path / "runs", smoke_doc(tmp_path / "s"), DAY2)
    done = rundiff.compare(gate, smoke)
    assert done.sections == ("lock", "server")
    assert [(c.section, c.name) for c in done.changes] == [("lock", "sha256")]  # the same server arguments
    assert {(s.check, s.old, s.new) for s in done.statuses} >= {
        ("smoke.benchmark", None, "PASS"),
        ("verify.check", "PASS", None),
    }
    gone = next(s for s in done.statuses if s.check == "verify.check")
    assert gone.summary == "all good" and str(gone) == "verify verify.check: PASS -> (absent): all good"


def test_extra_sections_of_a_newer_fingerprint_are_compared_after_the_known_ones(tmp_path):
    docs = [gate_doc(decode=90.0), gate_doc(decode=90.0)]
    for doc, value in zip(docs, ("1", "2"), strict=True):
        doc["gate"]["fingerprint"]["components"]["zeta"] = {"knob": value}
        doc["gate"]["fingerprint"]["components"]["alpha"] = {"knob": "same"}
        doc["gate"]["fingerprint"]["components"]["broken"] = "not a table"
    done = rundiff.compare(loose(tmp_path, docs[0], DAY1), loose(tmp_path, docs[1], DAY2))
    assert done.sections == ("lock", "gpu", "distributions", "server", "alpha", "zeta")
    assert [str(c) for c in done.changes] == ["knob: 1 -> 2"]


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "fast",
        [],
        {"mean": 90.0},
        {**benchstats.summarize([1.0, 2.0]).to_dict(), "n": "two"},
        {**benchstats.summarize([1.0, 2.0]).to_dict(), "values": [None]},
    ],
    ids=["absent", "text", "list", "fields-missing", "n-not-a-number", "value-not-a-number"],
)
def test_a_malformed_stored_figure_reads_as_absent_never_a_crash(tmp_path, raw):
    doc = gate_doc(decode=90.0)
    doc["gate"]["benchmark"]["decode_tok_s"] = raw
    run = keep(tmp_path, doc, DAY1) if raw is None or raw == {"mean": 90.0} else loose(tmp_path, doc, DAY1)
    assert rundiff.summary_of(run, "decode_tok_s") is None
    assert rundiff.compare(run, keep(tmp_path, gate_doc(decode=90.0), DAY2)).speed[0].difference is None


@pytest.mark.parametrize(
    "damage",
    [
        lambda doc: doc["smoke"].update(sessions=[]),
        lambda doc: doc["smoke"].update(sessions="none"),
        lambda doc: doc["smoke"].update(sessions=["not a session"]),
        lambda doc: doc["smoke"]["sessions"][-1].update(server_info=["not", "a", "table"]),
        lambda doc: doc.update(smoke="not a table"),
    ],
    ids=["no-session", "sessions-not-a-list", "session-not-a-table", "server-info-not-a-table", "smoke-not-a-table"],
)
def test_a_smoke_run_without_a_readable_server_is_compared_on_its_lock_alone(tmp_path, damage):
    doc = smoke_doc(tmp_path / "s")
    damage(doc)
    sessions = doc["smoke"].get("sessions") if isinstance(doc["smoke"], dict) else None
    run = keep(tmp_path / "runs", doc, DAY1) if sessions == [] else loose(tmp_path / "runs", doc, DAY1)
    assert rundiff.components(run) == {"lock": {"name": "standin", "sha256": doc["lock"]["sha256"]}}
    unlocked = {**doc, "lock": {"name": "standin", "sha256": None}}
    assert rundiff.components(loose(tmp_path / "runs", unlocked, DAY2)) == {}
