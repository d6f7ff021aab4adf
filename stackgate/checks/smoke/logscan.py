"""What the server log's findings mean for a smoke run: one result per known failure seen.

The log itself is followed by :class:`stackgate.facts.serverlog.LogWatcher`; this module judges
what it found.
"""

from __future__ import annotations

import dataclasses

from stackgate.facts.serverlog import excerpt
from stackgate.models.finding import Fix
from stackgate.models.knowledge import Finding
from stackgate.models.result import Result, Status, failed, passed, warned

__all__ = ["finding_results"]


def finding_results(findings: list[Finding], check: str, *, lock_backend: str) -> list[Result]:
    """One result per finding, named ``<check>.<signature id>``: its title, then its cause, the
    lines that matched and the signature's fix.

    The attention backend chosen by default is a failure when the lock names another backend,
    a warning otherwise (the lock's backend was what SGLang would have picked anyway).
    """
    results = []
    for finding in findings:
        match = finding.match
        status = {"error": Status.FAIL, "warning": Status.WARN, "info": Status.PASS}[finding.signature.severity]
        if finding.signature.id == "sglang-attention-backend-default" and match.groups.get("backend") not in (None, lock_backend):
            status = Status.FAIL
        where = f"{finding.source}:{finding.line}" + (f" (x{finding.count})" if finding.count > 1 else "")
        details = [match.cause, f"log: {where}", *(f"> {excerpt(line)}" for line in finding.lines[-6:]), f"source: {finding.signature.source}"]
        fix = Fix(match.fix, match.commands)
        make = {Status.FAIL: failed, Status.WARN: warned}.get(status)
        data = {"signature": finding.signature.id, "line": finding.line, "count": finding.count, "text": match.text[-2000:], "cause": match.cause}
        result = make(match.title, details, fix=fix, data=data) if make else passed(match.title, details, data=data)
        results.append(dataclasses.replace(result, check=f"{check}.{finding.signature.id}"))
    return results
