"""A failure whose own output does not say why, told with what the evidence sweep finds
(:mod:`stackgate.facts.evidencesweep`): the cause and its fix where something is abnormal, else what was checked."""

from __future__ import annotations

import dataclasses

from stackgate.facts import Facts
from stackgate.facts.evidencesweep import explain
from stackgate.models.finding import Fix
from stackgate.models.result import Result, Status

__all__ = ["swept", "unexplained"]


def swept(facts: Facts, output: str = "") -> tuple[str, Fix | None]:
    """The sweep's account of a failure with ``output``: (its cause or what was checked, the cause's fix or None)."""
    return explain(facts.sweep, output)


def unexplained(result: Result, facts: Facts, output: str = "") -> Result:
    """``result`` (a failure whose cause its output did not show) with the sweep's cause and fix in front, or with what
    the sweep checked added to its details (its own fix kept: where to look)."""
    if result.status < Status.FAIL:
        return result
    text, fix = swept(facts, output)
    data = {**result.data, "evidence_sweep": text}
    if fix is None:
        return dataclasses.replace(result, details=(*result.details, f"Evidence sweep: {text}"), data=data)
    commands = tuple(dict.fromkeys((*fix.commands, *(result.fix.commands if result.fix else ()))))
    return dataclasses.replace(
        result,
        summary=f"{result.summary}: cause: {text}",
        fix=Fix(fix.text, commands),
        data=data,
    )
