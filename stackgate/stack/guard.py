"""The guard: constraints that hold the frozen packages (torch and its family) at their locked
versions through every install, and the explanation of a resolution the guard blocked.

Constraints, not index order, are what keep torch in place: pip merges indexes and takes the
highest version, uv's default index strategy shields torch only by accident (FACTS.md). When a
constraint blocks a resolution, pip lists every requirer of torch (the innocent unbounded
``torch`` ones too) and uv folds the constraint into some requirer's text; the culprit is the
requirement whose specifier EXCLUDES the locked version, so that is what :func:`blocked` finds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from stackgate.models.spec import Spec

__all__ = [
    "PIP_CONF",
    "Blocked",
    "GuardError",
    "GuardFiles",
    "blocked",
    "constraints",
    "overrides",
    "pip_conf",
    "write",
    "write_pip_conf",
]

CONSTRAINTS = "constraints.txt"
OVERRIDES = "overrides.txt"
#: pip's "site" configuration file: pip reads ``<sys.prefix>/pip.conf`` whether or not the
#: environment is activated, so ``<root>/current/bin/pip install`` is guarded too. uv has no
#: such per-environment file (only project, user and system uv.toml, and UV_CONSTRAINT).
PIP_CONF = "pip.conf"


class GuardError(Exception):
    """A resolution that needed another version of a frozen package; ``log`` holds the resolver's output."""

    def __init__(self, message: str, log: Path | None = None, tail: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.log = log
        self.tail = tail


@dataclass(frozen=True)
class GuardFiles:
    constraints: Path  #: passed to every install, and exported as PIP_CONSTRAINT/UV_CONSTRAINT
    overrides: Path  #: uv's --override file (pip applies overrides in a --no-deps step instead)


def constraints(spec: Spec) -> list[str]:
    """One exact pin per frozen package.

    The lock loader has already refused a frozen name without a pin.
    """
    lines = []
    for name in spec.python.frozen:
        package = spec.python.package(name)
        assert package is not None
        lines.append(f"{package.name}{package.specifier}")
    return lines


def overrides(spec: Spec) -> list[str]:
    return [f"{o.package}{o.specifier}" for o in spec.python.overrides]


def pip_conf(constraints_file: Path) -> str:
    """The environment's own pip configuration: every ``pip install`` there takes the guard.

    The file is named as a ``file:`` URL because pip splits a configured constraint on
    whitespace, and a URL has none.

    >>> print(pip_conf(Path("/srv/my stack/generations/0001-x/constraints.txt")))
    [install]
    constraint = file:///srv/my%20stack/generations/0001-x/constraints.txt
    <BLANKLINE>
    """
    return f"[install]\nconstraint = {constraints_file.as_uri()}\n"


def write(spec: Spec, directory: Path) -> GuardFiles:
    """Write the guard's files into a generation; the header says where they come from. (Its
    pip.conf is written with the environment file: :func:`write_pip_conf`.)"""
    header = _header(spec)
    files = GuardFiles(directory / CONSTRAINTS, directory / OVERRIDES)
    files.constraints.write_text(header + "".join(f"{line}\n" for line in constraints(spec)))
    reasons = {f"{o.package}{o.specifier}": o.reason for o in spec.python.overrides}
    files.overrides.write_text(header + "".join(f"{line}  # {reasons[line]}\n" for line in overrides(spec)))
    return files


def write_pip_conf(spec: Spec, directory: Path) -> Path:
    """Write an environment's pip.conf, naming the constraints beside it."""
    path = directory / PIP_CONF
    path.write_text(_header(spec) + pip_conf((directory / CONSTRAINTS).absolute()))
    return path


def _header(spec: Spec) -> str:
    return f"# Written by stackgate from {spec.path} (sha256 {spec.sha256[:12]}); do not edit.\n"


@dataclass(frozen=True)
class Blocked:
    """A requirement the guard refused: who asked for what, and what the lock holds."""

    requirer: str
    requirer_version: str | None  #: None: uv said "all versions of" the requirer
    requirement: str
    package: str
    locked: str

    def __str__(self) -> str:
        who = (
            f"{self.requirer} {self.requirer_version}" if self.requirer_version else f"every version of {self.requirer}"
        )
        return f"{who} requires {self.requirement}, but the lock holds {self.package} at {self.locked}"


# "eager-upgrader 1.0 depends on torch>=2.10" (pip) and "all versions of eager-upgrader depend on
# torch>=2.10", "eager-upgrader==1.0 depends on torch>=2.10" (uv). A specifier may be a list
# ("torch>=2.10,<3"); the sentence's own commas are followed by a space and a word, not an operator.
_DEPENDS = re.compile(
    r"(?:all versions of |only )?(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)"
    r"(?:==(?P<pinned>[^\s,]+)| (?P<version>\d[^\s,]*))?"
    r" depends? on (?P<requirement>[A-Za-z0-9][A-Za-z0-9._-]*(?:\[[^\]]*\])?"
    r"(?:\s*[<>=!~]=?=?\s*[^\s,;]+(?:,\s*[<>=!~]=?=?\s*[^\s,;]+)*)?)"
)


def blocked(output: str, spec: Spec) -> list[Blocked]:
    """The requirements in a resolver's failure that exclude a frozen package's locked version.

    Requirements that admit the locked version (an unbounded ``torch``, or a requirer into which
    uv folded the constraint) are innocent and left out.
    """
    locked = {name: _locked_version(spec, name) for name in spec.python.frozen}
    found: list[Blocked] = []
    for match in _DEPENDS.finditer(output):
        try:
            requirement = Requirement(match["requirement"])
        except InvalidRequirement:
            continue
        package = canonicalize_name(requirement.name)
        version = locked.get(package)
        if version is None or canonicalize_name(match["name"]) == package:
            continue
        if requirement.specifier.contains(version, prereleases=True):
            continue
        hit = Blocked(
            match["name"],
            match["pinned"] or match["version"],
            match["requirement"].replace(" ", ""),
            package,
            str(version),
        )
        if hit not in found:
            found.append(hit)
    return found


def _locked_version(spec: Spec, name: str) -> Version | None:
    package = spec.python.package(name)
    pinned = package.pinned_version if package else None
    try:
        return Version(pinned) if pinned else None
    except InvalidVersion:
        return None
