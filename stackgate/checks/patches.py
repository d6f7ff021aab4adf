"""Checks of the patches the lock applies to installed packages."""

from __future__ import annotations

from stackgate.checks.core import check
from stackgate.facts import Facts, Missing
from stackgate.models.finding import Fix
from stackgate.models.result import Result, failed, passed, skipped
from stackgate.models.spec import Spec

__all__: list[str] = []

_PROVISION = "stackgate provision --only patches"


@check("patches.applied", needs=("patches",))
def applied(spec: Spec, facts: Facts) -> Result:
    """Every locked patch is applied to its package, and the files it patched are unchanged."""
    if not spec.patches:
        return skipped("the lock declares no patches")
    found = facts.patches
    if isinstance(found, Missing):
        return skipped("no probe of the stack's interpreter (see python.interpreter)", [found.reason])
    data = {
        s.patch.file.name: {
            "package": s.patch.package,
            "version": str(s.patch.version),
            "installed": s.installed,
            "problem": s.problem,
            "files": dict(s.files),
        }
        for s in found
    }
    wrong = [s for s in found if s.problem]
    if wrong:
        details = [f"{s.patch.file.name} ({s.patch.reason}): {s.problem}" for s in wrong]
        fix = Fix(
            "Apply the lock's patches again; a patched file edited by hand needs a fresh environment (provision "
            "builds one).",
            (_PROVISION,),
        )
        return failed(f"{len(wrong)} of {len(found)} patch(es) not in force: {wrong[0].problem}", details, fix, data)
    names = ", ".join(f"{s.patch.file.name} on {s.patch.package} {s.patch.version}" for s in found)
    return passed(f"{len(found)} patch(es) applied and intact: {names}", data=data)
