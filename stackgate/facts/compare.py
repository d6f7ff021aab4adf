"""The comparisons of what is (facts) with what the lock says that both judgement and action need.

verify's checks (:mod:`stackgate.checks`, the gate's environment checks among them) report them;
provision's plan (:mod:`stackgate.stack`) acts on them. Kept here, one layer below both, so that
what verify reports and what provision installs never disagree, and neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from packaging.markers import InvalidMarker, UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from stackgate.facts.model import Missing, ProbeFacts, ToolkitFacts, ToolVersion
from stackgate.models.spec import Lock, Package

__all__ = ["Conflict", "conflicts", "environment_drift", "environment_spec", "pin_problem", "spec_changes", "toolkit_problem"]


def pin_problem(probe: ProbeFacts, package: Package) -> str | None:
    """What is wrong with one locked package in a probed environment; None when nothing is
    (provision plans from this, as python.pins and python.frozen judge by it)."""
    dist = probe.dist(package.name)
    if dist is None:
        return f"{package.name} is not installed (locked {package.specifier})"
    if not package.specifier.contains(dist.version, prereleases=True):
        return f"{package.name} is {dist.version}, locked {package.specifier}"
    return None


@dataclass(frozen=True)
class Conflict:
    """One requirement that the installed distributions do not meet (what `pip check` reports)."""

    requirer: str
    requirer_version: str
    requirement: str
    package: str
    installed: str | None

    def __str__(self) -> str:
        have = f"{self.package} {self.installed} is installed" if self.installed else f"{self.package} is not installed"
        return f"{self.requirer} {self.requirer_version} requires {self.requirement}, but {have}"


def conflicts(distributions: Mapping[str, Any], markers: Mapping[str, str]) -> list[Conflict]:
    """Requirements of installed distributions that the installed set does not satisfy.

    Requirements behind an extra are not checked, as `pip check` does not.
    """
    environment = {**markers, "extra": ""}
    found = []
    for dist in distributions.values():
        for line in dist.requires:
            try:
                requirement = Requirement(line)
                if requirement.marker is not None and not requirement.marker.evaluate(environment):
                    continue
            except (InvalidRequirement, InvalidMarker, UndefinedComparison, UndefinedEnvironmentName):
                continue
            target = distributions.get(canonicalize_name(requirement.name))
            if target is None:
                found.append(Conflict(dist.name, dist.version, str(requirement), requirement.name, None))
            elif not _satisfies(requirement, target.version):
                found.append(Conflict(dist.name, dist.version, str(requirement), target.name, target.version))
    return found


def _satisfies(requirement: Requirement, version: str) -> bool:
    try:
        Version(version)
    except InvalidVersion:
        return True  # a legacy version string: pip check cannot judge it either
    return requirement.specifier.contains(version, prereleases=True)


def environment_drift(lock: Lock, dists: ProbeFacts) -> list[str]:
    """How an environment's installed distributions differ from the lock (empty: they do not):
    its Python version, each pin, and requirement conflicts other than declared overrides.
    Provision plans a rebuild from this; the gate's environment.drift reports it."""
    have = ".".join(dists.python_version.split(".")[:2])
    if have != lock.python.version:
        return [f"the environment runs Python {dists.python_version}, the lock wants {lock.python.version}"]
    drift = [problem for p in lock.python.packages if (problem := pin_problem(dists, p))]
    for conflict in conflicts(dists.distributions, dists.markers):
        override = lock.python.override(conflict.package)
        if not (override and conflict.installed and override.specifier.contains(conflict.installed, prereleases=True)):
            drift.append(str(conflict))
    return drift


def environment_spec(lock: Lock) -> dict[str, Any]:
    """The parts of the lock that decide an environment's contents (reasons and comments do not):
    what provision writes into a generation's marker, and compares with it later."""
    python = lock.python
    return {
        "python": python.version,
        "installer": python.installer,
        "default_index": python.default_index,
        "indexes": {i.url: sorted(i.packages) for i in python.indexes},
        "packages": {p.name: {"version": str(p.specifier), "url": p.url, "sha256": p.sha256} for p in python.packages},
        "frozen": sorted(python.frozen),
        "overrides": {o.package: str(o.specifier) for o in python.overrides},
    }


def spec_changes(built: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    """What differs between two environment specs, as dotted keys.

    >>> spec_changes({"packages": {"sglang": {"version": "==0.5.8"}}}, {"packages": {"sglang": {"version": "==0.5.9"}}})
    ['packages.sglang.version: ==0.5.8 -> ==0.5.9']
    """
    old, new = _flatten(built), _flatten(wanted)
    return [f"{key}: {old.get(key, '(none)')} -> {new.get(key, '(none)')}" for key in sorted(old.keys() | new.keys()) if old.get(key) != new.get(key)]


def _flatten(value: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(value, Mapping):
        flat: dict[str, str] = {}
        for key, item in value.items():
            flat.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: str(value)} if value is not None else {}


def toolkit_problem(t: ToolkitFacts) -> str | None:
    """What is wrong with the toolkit at a prefix, judged against its lock entry; None if nothing.

    Provision's plan asks the same question (stackgate.stack.toolkit.toolkit_state), so that
    what verify reports and what provision installs never disagree.
    """
    toolkit = t.toolkit
    if not t.exists:
        return "missing" + (" (a kept toolkit must stay installed)" if toolkit.keep else "")
    detected = t.detected
    if isinstance(detected, Missing):
        return f"neither nvcc nor ptxas works: {detected.reason}"
    if detected.release != toolkit.release:
        return f"{detected.path.name} reports release {detected.release}, the lock wants {toolkit.release}"
    if toolkit.nvcc and isinstance(t.nvcc, ToolVersion) and t.nvcc.build != toolkit.nvcc:
        return f"nvcc is V{t.nvcc.build}, the lock wants V{toolkit.nvcc}"
    if t.version_json and len(toolkit.version.release) >= 3 and t.version_json != str(toolkit.version):
        return f"version.json says CUDA {t.version_json}, the lock wants {toolkit.version}"
    if not toolkit.keep and isinstance(t.nvcc, Missing):
        return f"no working nvcc: {t.nvcc.reason}"
    return None
