"""Checks that the live environment is the one the lock describes: the gate's environment stage.

They run when named (``stackgate verify --check 'environment.*'``) and in ``stackgate gate``, never in
a plain verify, whose python.* checks already judge the same distributions one by one.
"""

from __future__ import annotations

from stackgate.checks.core import check
from stackgate.facts import Facts, Missing
from stackgate.facts.compare import environment_drift, environment_spec, spec_changes
from stackgate.models.finding import Fix
from stackgate.models.result import Result, failed, passed, skipped
from stackgate.models.spec import Spec

__all__: list[str] = []


@check("environment.generation", needs=("generation",), named_only=True)
def generation(spec: Spec, facts: Facts) -> Result:
    """The live generation was built from this lock's Python stack."""
    root = spec.python.root
    if root is None:
        return skipped(
            f"python.interpreter names an existing environment ({spec.python.interpreter}): there is no generation "
            "to compare; drift is judged from its installed distributions"
        )
    provision = Fix("Build the lock's environment and switch to it.", (f"stackgate provision --lock {spec.path}",))
    state = facts.generation
    if isinstance(state, Missing):
        return failed(f"the generations under {root} cannot be read: {state.reason}", fix=provision)
    current = state.current
    if current is None:
        missing = state.current_error or f"{root / 'current'} does not exist"
        return failed(f"no live environment: {missing}", fix=provision)
    if current.marker is None or not current.ready:
        return failed(f"the live generation {current.id} is {current.state}: not one provision finished", fix=provision)
    changed = spec_changes(current.marker.get("spec", {}), environment_spec(spec))
    data = {
        "generation": current.id,
        "built": current.marker.get("finished"),
        "built_from": current.marker.get("lock", {}),
    }
    if changed:
        return failed(
            f"the lock's Python stack changed since generation {current.id} was built: {changed[0]}",
            changed,
            provision,
            data,
        )
    built_from = (current.marker.get("lock") or {}).get("sha256")
    note = (
        []
        if built_from is None or built_from == spec.sha256
        else [f"built from another version of the lockfile (sha256 {built_from[:12]}) with the same Python stack"]
    )
    return passed(
        f"{root / 'current'} -> generation {current.id}, built from this lock's Python stack", note, data=data
    )


@check("environment.drift", needs=("dists", "patches", "pylock"), named_only=True)
def drift(spec: Spec, facts: Facts) -> Result:
    """The installed distributions and the patches are as locked."""
    dists = facts.dists
    if isinstance(dists, Missing):
        return skipped(f"cannot be judged: {dists.reason}")
    resolution = facts.pylock
    problems = environment_drift(spec, dists, None if isinstance(resolution, Missing) else resolution)
    found = facts.patches
    if not isinstance(found, Missing):
        problems += [f"patch {s.patch.file.name}: {s.problem}" for s in found if s.problem]
    data = {
        "pins": len(spec.python.packages),
        "patches": len(spec.patches),
        "distributions": len(dists.distributions),
        "drift": problems,
    }
    if problems:
        how = (
            f"stackgate provision --lock {spec.path}"
            if spec.python.root
            else f"reinstall the locked versions into {spec.python.target}"
        )
        return failed(
            f"{len(problems)} difference(s) from the lock: {problems[0]}",
            problems,
            Fix("Bring the environment back to the lock.", (how,)),
            data,
        )
    return passed(
        f"{len(spec.python.packages)} pin(s) and {len(spec.patches)} patch(es) as locked; requirements of "
        f"{len(dists.distributions)} distributions consistent",
        data=data,
    )
