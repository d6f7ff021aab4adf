"""Tests of flows/stages.py: the one Stage type and the one loop that every flow's stages run in.

The loop's own behaviour, on small flows written here: the order, a stage that does not pass and what
stands on it, a stage the flow leaves out, a stage that raises, a real Ctrl-C in the middle of a
stage (SIGINT, in a process of its own), the ``always`` stage that runs however the others ended, and
the records it leaves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field

import pytest
from support import ROOT

from stackgate.flows.stages import Stage, StageRecord, run_stages


@dataclass
class Trace:
    """A flow's state for these tests: what ran, in order."""

    ran: list[str] = field(default_factory=list)
    leave_out: bool = False


def step(name: str, verdict: bool | None = None):
    def run(state: Trace) -> bool | None:
        state.ran.append(name)
        return verdict

    return run


def statuses(records: list[StageRecord]) -> list[tuple[str, str, str]]:
    return [(r.name, r.status, r.reason) for r in records]


def test_stages_run_in_order_and_what_stands_on_a_failed_one_does_not_run_with_the_reason() -> None:
    state = Trace()
    records = run_stages(
        (
            Stage("a", step("a")),
            Stage("b", step("b", False), needs=("a",)),
            Stage("c", step("c", True), needs=("a",)),
            Stage("d", step("d"), needs=("b", "c")),
            Stage("e", step("e"), needs=("d",)),
        ),
        state,
    )
    assert state.ran == ["a", "b", "c"]
    assert statuses(records) == [
        ("a", "passed", ""),
        ("b", "failed", ""),
        ("c", "passed", ""),
        ("d", "not run", "b failed"),  # b's own record says why, once
        ("e", "not run", "d not run: b failed"),
    ]
    assert records[3].reasons == ("b failed",) and not records[3].ran and records[0].ran


def test_a_stage_the_flow_leaves_out_is_recorded_with_the_reason_and_begin_sees_each_stage_that_runs() -> None:
    state, begun = Trace(leave_out=True), []
    stages = (
        Stage("a", step("a")),
        Stage("b", step("b"), left_out=lambda s: "the request leaves it out" if s.leave_out else None),
        Stage("c", step("c")),
    )
    records = run_stages(stages, state, begin=lambda stage: begun.append(stage.name))
    assert begun == state.ran == ["a", "c"]
    assert statuses(records)[1] == ("b", "not run", "the request leaves it out")
    assert [r.to_dict()["status"] for r in records] == ["passed", "not run", "passed"]


def test_a_stage_that_raises_stops_the_flow_the_always_stage_still_runs_and_the_exception_goes_on() -> None:
    state = Trace()
    problem = ValueError("the plan is stale")

    def broken(s: Trace) -> None:
        s.ran.append("b")
        raise problem

    records: list[StageRecord] = []
    with pytest.raises(ValueError) as caught:
        run_stages(
            (
                Stage("a", step("a")),
                Stage("b", broken),
                Stage("c", step("c")),
                Stage("cleanup", step("cleanup"), always=True),
            ),
            state,
            records=records,
        )
    assert caught.value is problem  # the exception itself, not a wrapper
    assert state.ran == ["a", "b", "cleanup"]
    assert statuses(records) == [
        ("a", "passed", ""),
        ("b", "raised", "ValueError: the plan is stale"),
        ("c", "not run", "b raised"),
        ("cleanup", "passed", ""),
    ]
    assert records[1].error is problem


def test_a_fault_point_is_tripped_before_its_stage_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    state = Trace()
    monkeypatch.setenv("STACKGATE_FAULT", "before:t.b=ENOSPC")
    records: list[StageRecord] = []
    with pytest.raises(OSError):
        run_stages((Stage("a", step("a")), Stage("b", step("b"), fault="before:t.b")), state, records=records)
    assert state.ran == ["a"]  # b never began its work
    assert records[1].status == "raised" and "No space left on device" in records[1].reason


#: A flow in a process of its own: stage b sends the process SIGINT (a real Ctrl-C) half way through its
#: work; the records and what the state learned are printed as JSON, then the interrupt goes on.
_INTERRUPTED_FLOW = """
import json, os, signal, sys
from stackgate.flows.stages import Stage, run_stages

state = {"ran": [], "stopping": False}
records = []

def half_way(s):
    s["ran"].append("b: first half")
    os.kill(os.getpid(), signal.SIGINT)
    s["ran"].append("b: second half")

stages = (
    Stage("a", lambda s: s["ran"].append("a")),
    Stage("b", half_way, needs=("a",), interrupt=lambda s: s.update(stopping=True)),
    Stage("c", lambda s: s["ran"].append("c")),
    Stage("teardown", lambda s: s["ran"].append("teardown"), always=True),
)
try:
    run_stages(stages, state, records=records)
except KeyboardInterrupt:
    print(json.dumps({"state": state, "records": [r.to_dict() for r in records]}))
    sys.exit(130)
sys.exit(0)
"""


def test_an_interrupt_mid_stage_tells_the_stage_runs_the_always_stage_and_goes_on_to_the_caller() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_FLOW],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 130, done.stderr
    seen = json.loads(done.stdout)
    assert seen["state"] == {"ran": ["a", "b: first half", "teardown"], "stopping": True}
    assert [(r["name"], r["status"], r["reason"]) for r in seen["records"]] == [
        ("a", "passed", ""),
        ("b", "interrupted", "interrupted (Ctrl-C or SIGTERM)"),
        ("c", "not run", "b interrupted"),
        ("teardown", "passed", ""),
    ]
