"""A failure whose own output does not say why, told with what the evidence sweep finds
(:mod:`stackgate.facts.evidencesweep`): the cause and its fix where something is abnormal, else what was checked."""

from __future__ import annotations

import re
from typing import Iterable

from stackgate.facts import Facts
from stackgate.facts.evidencesweep import explain, with_cause
from stackgate.models.finding import Fix
from stackgate.models.result import Result, Status

__all__ = ["looked_up", "missing_piece", "swept", "unexplained"]


def swept(facts: Facts, output: str = "") -> tuple[str, Fix | None]:
    """The sweep's account of a failure with ``output``: (its cause or what was checked, the cause's fix or None)."""
    return explain(facts.sweep, output)


def unexplained(result: Result, facts: Facts, output: str = "") -> Result:
    """``result`` (a failure whose cause its output did not show) told with the sweep's cause and fix, or with what
    the sweep checked (:func:`stackgate.facts.evidencesweep.with_cause`)."""
    if result.status < Status.FAIL:
        return result
    return with_cause(result, facts.sweep, output)


_MISSING = re.compile(
    r"No module named '?(?P<module>[\w.]+)'?|(?P<library>[\w.+-]+\.so[\w.]*): cannot open shared object file: No such "
    r"file"
)


def missing_piece(output: str) -> str | None:
    """The module or shared library ``output`` says is not installed (evidence for an install), or None.

    >>> missing_piece("ModuleNotFoundError: No module named 'tvm_ffi'")
    'tvm_ffi'
    >>> missing_piece("OSError: libnccl.so.2: cannot open shared object file: No such file or directory")
    'libnccl.so.2'
    >>> missing_piece("NotADirectoryError: [Errno 20] Not a directory: '/tmp/ws/flashinfer'") is None
    True
    """
    match = _MISSING.search(output)
    return None if match is None else match["module"] or match["library"]


def looked_up(result: Result, facts: Facts, output: str, looks: Iterable[str]) -> Result:
    """:func:`unexplained` for a result whose fix is one of ``looks`` (the texts of fixes that only say where to look:
    its cause was not known); any other result as it is."""
    if result.fix is None or result.fix.text not in set(looks):
        return result
    return unexplained(result, facts, output)
