"""What the server log's findings mean for a smoke run: one result per known failure seen.

The log itself is followed by :class:`stackgate.facts.serverlog.LogWatcher`; this module judges
what it found.
"""

from __future__ import annotations

import dataclasses

from stackgate.facts.serverlog import excerpt
from stackgate.models.engines import ENGINES
from stackgate.models.finding import Finding
from stackgate.models.result import Result, Status, failed, passed, warned

__all__ = ["BACKEND_FINDING", "finding_results"]

#: The default engine's finding for a backend it chose by itself (an engine describes its own).
BACKEND_FINDING = ENGINES["sglang"].backend_finding


def finding_results(
    findings: list[Finding], check: str, *, lock_backend: str, backend_finding: str = BACKEND_FINDING
) -> list[Result]:
    """One result per finding, named ``<check>.<finding id>``: its title, then its cause, the
    lines that matched and where the knowledge was learned; the finding's fix; the finding
    itself, in its one JSON form, as the result's data.

    The attention backend chosen by default is a failure when the lock names another backend,
    a warning otherwise (the lock's backend was what SGLang would have picked anyway).
    """
    results = []
    for finding in findings:
        status = {"fail": Status.FAIL, "warn": Status.WARN, "info": Status.PASS}[finding.severity]
        if (
            backend_finding
            and finding.id == backend_finding
            and finding.values.get("backend")
            not in (
                None,
                lock_backend,
            )
        ):
            status = Status.FAIL
        evidence = finding.evidence
        where = f"{evidence.file}:{evidence.line}" + (f" (x{evidence.count})" if evidence.count > 1 else "")
        details = [
            finding.cause,
            f"log: {where}",
            *(f"> {excerpt(line)}" for line in evidence.lines[-6:]),
            f"learned from: {finding.learned_from}",
        ]
        make = {Status.FAIL: failed, Status.WARN: warned}.get(status)
        data = {"finding": finding.to_dict()}
        result = (
            make(finding.title, details, fix=finding.fix, data=data)
            if make
            else passed(finding.title, details, data=data)
        )
        results.append(dataclasses.replace(result, check=f"{check}.{finding.id}"))
    return results
