"""A flow's stages as data: a tuple of named stages, run in order by one small loop.

Every flow (lock, verify, provision, gate, upgrade, smoke's sessions, a fleet node's actions) is a
tuple of :class:`Stage` run by :func:`run_stages` on the flow's own state. The loop, for each stage:

- leaves it out, recorded ``not run`` with the reasons, when ``left_out`` gives one (the request
  leaves it out, a decision says not to), when a stage it ``needs`` did not pass (each named with
  its status: its own record says why, once), or when an earlier stage raised or was interrupted;
- otherwise calls ``begin`` (the flow's progress: a line shown, the step it is in recorded), trips
  the stage's fault point, if it has one (edges/faults.py, inert unless set), and runs it;
- records what happened: ``passed``; ``failed`` (the stage returned False: by its own judgement it
  did not pass, and what needs it does not run); ``raised`` (an exception, which goes on to the
  caller); ``interrupted`` (Ctrl-C or SIGTERM: the stage's ``interrupt`` is called with the state,
  which is what an interrupt at that stage means, and the interrupt goes on to the caller).

A stage marked ``always`` runs however the stages before it ended (teardown, clean-up), as a
``finally`` does; after a stage that raised or was interrupted, the exception goes on once the
``always`` stages have run. The records are appended to ``records`` as they happen, so a caller that
catches the exception still reads where the flow stopped and why.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Sequence, TypeVar

from stackgate.edges import faults

__all__ = ["FAILED", "INTERRUPTED", "NOT_RUN", "PASSED", "RAISED", "Stage", "StageRecord", "run_stages"]

S = TypeVar("S")

PASSED, FAILED, RAISED, INTERRUPTED, NOT_RUN = "passed", "failed", "raised", "interrupted", "not run"


@dataclass(frozen=True)
class StageRecord:
    """What one stage did: its status, the reason in one line, its wall time, what it raised."""

    name: str
    status: str  #: passed | failed | raised | interrupted | not run
    reason: str = ""
    seconds: float = 0.0
    reasons: tuple[str, ...] = ()  #: a stage not run: each reason (``reason`` joins them)
    error: BaseException | None = field(default=None, repr=False, compare=False)  #: what it raised, if it did

    @property
    def ran(self) -> bool:
        return self.status != NOT_RUN

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "reason": self.reason, "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class Stage(Generic[S]):
    """One named step of a flow: ``run`` reads and fills the flow's state ``S``; False: it did not pass."""

    name: str
    run: Callable[[S], bool | None]
    title: str = ""  #: what the stage proves or does, in a few words (a report's row)
    needs: tuple[str, ...] = ()  #: the stages that must have passed for it to run
    left_out: Callable[[S], str | None] | None = None  #: why the flow leaves it out, or None: it runs
    #: What an interrupt (Ctrl-C, SIGTERM) during this stage means for the state: called before the
    #: ``always`` stages run and the interrupt goes on (stop what it started, note that it was stopping).
    interrupt: Callable[[S], None] | None = None
    fault: str | None = None  #: the fault point tripped before it runs (edges/faults.py)
    always: bool = False  #: runs however the stages before it ended, as a ``finally`` does


def run_stages(
    stages: Sequence[Stage[S]],
    state: S,
    *,
    begin: Callable[[Stage[S]], None] | None = None,
    records: list[StageRecord] | None = None,
) -> list[StageRecord]:
    """Run each stage on ``state`` in order, as the module says; return the records, one a stage."""
    done: list[StageRecord] = [] if records is None else records
    ended: StageRecord | None = None  #: the stage that raised or was interrupted
    for stage in stages:
        reasons = _not_run(stage, state, done, ended)
        if reasons:
            done.append(StageRecord(stage.name, NOT_RUN, "; ".join(reasons), reasons=tuple(reasons)))
            continue
        record = _run_one(stage, state, begin)
        done.append(record)
        if record.error is not None:
            ended = record  # a later one replaces it, as in a ``finally``
    if ended is not None and ended.error is not None:
        raise ended.error
    return done


def _not_run(stage: Stage[S], state: S, done: Sequence[StageRecord], ended: StageRecord | None) -> list[str]:
    """Why a stage does not run, in a few words each; none when it runs.

    A stage it needs is named with its status only; that stage's own record says why, so a long
    reason is told once, not again in every stage after it. One that did not run only because an
    earlier one failed is left out when that failure is named already.
    """
    if stage.always:
        return []
    if ended is not None:
        return [f"{ended.name} {ended.status}"]
    left_out = stage.left_out(state) if stage.left_out is not None else None
    if left_out is not None:
        return [left_out]
    by_name = {r.name: r for r in done}
    blocking = [by_name[need] for need in stage.needs if by_name[need].status != PASSED]
    ran = [need for need in blocking if need.ran]
    return [f"{r.name} {r.status}" if r.ran else f"{r.name} not run: {r.reason}" for r in ran or blocking]


def _run_one(stage: Stage[S], state: S, begin: Callable[[Stage[S]], None] | None) -> StageRecord:
    clock = time.monotonic()
    try:
        if begin is not None:
            begin(stage)
        if stage.fault is not None:
            faults.trip(stage.fault)
        verdict = stage.run(state)
    except KeyboardInterrupt as stop:
        if stage.interrupt is not None:
            stage.interrupt(state)
        return StageRecord(
            stage.name, INTERRUPTED, "interrupted (Ctrl-C or SIGTERM)", time.monotonic() - clock, error=stop
        )
    except Exception as exc:
        return StageRecord(stage.name, RAISED, f"{type(exc).__name__}: {exc}", time.monotonic() - clock, error=exc)
    return StageRecord(stage.name, FAILED if verdict is False else PASSED, "", time.monotonic() - clock)
