"""The comparisons of what is (facts) with what the lock says that both judgement and action need.

verify's checks (:mod:`stackgate.checks`, the gate's environment checks among them) report them;
provision's plan (:mod:`stackgate.stack`) acts on them. Kept here, one layer below both, so that
what verify reports and what provision installs never disagree, and neither imports the other.
"""

from __future__ import annotations

import hashlib
import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from packaging.tags import parse_tag
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from stackgate.facts.values import Distribution, Missing, ProbeFacts, ToolkitFacts, ToolVersion
from stackgate.models import pylock
from stackgate.models.pylock import Locked, Resolution
from stackgate.models.spec import Package, Spec

if TYPE_CHECKING:  # packaging's marker and requirement parsers are imported by the comparisons that parse them
    from packaging.requirements import Requirement

__all__ = [
    "SEEDED",
    "Conflict",
    "conflicts",
    "environment_drift",
    "environment_spec",
    "locked_problems",
    "pin_problem",
    "spec_changes",
    "toolkit_problem",
]

#: Installed on purpose beside the pylock (unless it locks them): the environment's own pip, which
#: people use later, held by the guard's pip.conf; and the setuptools that ensurepip installs with
#: pip before Python 3.12, where no bundled pip wheel was found to install alone.
SEEDED = frozenset({"pip", "setuptools"})


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
    from packaging.markers import InvalidMarker, UndefinedComparison, UndefinedEnvironmentName
    from packaging.requirements import InvalidRequirement, Requirement

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


def environment_drift(spec: Spec, dists: ProbeFacts, resolution: Resolution | None = None) -> list[str]:
    """How an environment's installed distributions differ from the lock (empty: they do not):
    its Python version, each pin, requirement conflicts other than declared overrides, and, given
    the pylock, every distribution it holds (missing, extra, other version or file).
    Provision plans a rebuild from this; the gate's environment.drift reports it."""
    have = ".".join(dists.python_version.split(".")[:2])
    if have != spec.python.version:
        return [f"the environment runs Python {dists.python_version}, the lock wants {spec.python.version}"]
    drift = [problem for p in spec.python.packages if (problem := pin_problem(dists, p))]
    for conflict in conflicts(dists.distributions, dists.markers):
        override = spec.python.override(conflict.package)
        if not (override and conflict.installed and override.specifier.contains(conflict.installed, prereleases=True)):
            drift.append(str(conflict))
    if resolution is not None and not drift:
        drift += locked_problems(dists, resolution)
    return drift


def environment_spec(spec: Spec) -> dict[str, Any]:
    """The parts of the lock that decide an environment's contents (reasons and comments do not),
    and the sha256 of its pylock (a new resolution is a new environment): what provision writes
    into a generation's marker, and compares with it later."""
    python = spec.python
    return {
        "python": python.version,
        "installer": python.installer,
        "default_index": python.default_index,
        "indexes": {i.url: sorted(i.packages) for i in python.indexes},
        "packages": {p.name: {"version": str(p.specifier), "url": p.url, "sha256": p.sha256} for p in python.packages},
        "frozen": sorted(python.frozen),
        "overrides": {o.package: str(o.specifier) for o in python.overrides},
        "pylock": _sha256_of(pylock.path_for(spec.path)),
    }


def _sha256_of(path: Path) -> str | None:
    """The sha256 of a file's bytes; None when there is no such file."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def spec_changes(built: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    """What differs between two environment specs, as dotted keys.

    >>> spec_changes({"packages": {"sglang": {"version": "==0.5.8"}}}, {"packages": {"sglang": {"version": "==0.5.9"}}})
    ['packages.sglang.version: ==0.5.8 -> ==0.5.9']
    """
    old, new = _flatten(built), _flatten(wanted)
    return [
        f"{key}: {old.get(key, '(none)')} -> {new.get(key, '(none)')}"
        for key in sorted(old.keys() | new.keys())
        if old.get(key) != new.get(key)
    ]


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


def locked_problems(probe: ProbeFacts, resolution: Resolution) -> list[str]:
    """How an environment's distributions differ from a pylock: missing (a locked package whose
    marker holds here), extra (installed, not locked, not :data:`SEEDED`), another version, or
    another file (a direct URL or sha256 that is not the pylock's, or a build for other tags)."""
    problems = []
    for name, locked in resolution.packages.items():
        if not _applies(locked, probe.markers):
            continue
        dist = probe.dist(name)
        if dist is None:
            problems.append(f"{name} {locked.version} is locked but not installed")
        elif not _same_version(dist.version, locked.version):
            problems.append(f"{name} is {dist.version}, the pylock holds {locked.version}")
        elif (other := _other_file(dist, locked)) is not None:
            problems.append(
                f"{name} {dist.version} was installed from {other}, not from the pylock's "
                f"{', '.join(f.filename for f in locked.files)}"
            )
    for name, dist in sorted(probe.distributions.items()):
        if resolution.package(name) is None and name not in SEEDED:
            problems.append(f"{dist.name} {dist.version} is installed but not in the pylock")
    return problems


def _applies(locked: Locked, markers: Mapping[str, str]) -> bool:
    from packaging.markers import InvalidMarker, Marker, UndefinedComparison, UndefinedEnvironmentName

    try:
        return locked.marker is None or Marker(locked.marker).evaluate({**markers, "extra": ""})
    except (InvalidMarker, UndefinedComparison, UndefinedEnvironmentName):
        return True  # a marker this interpreter cannot judge: expect the package


def _same_version(installed: str, locked: str) -> bool:
    """PEP 440 equality (1.0 == 1.0.0), local labels included.

    >>> _same_version("2.9.1+cu130", "2.9.1+cu130"), _same_version("2.9.1", "2.9.1+cu130")
    (True, False)
    >>> _same_version("1.0", "1.0.0")
    True
    """
    try:
        return Version(installed) == Version(locked)
    except InvalidVersion:
        return installed == locked


def _other_file(dist: Distribution, locked: Locked) -> str | None:
    """What the installed files came from when that is not one of the locked files, else None:
    a direct URL (PEP 610) names its file and often its sha256; an index install leaves only its
    WHEEL tags, which must be a locked wheel's."""
    origin = dist.direct_url
    if origin:
        url = str(origin.get("url", ""))
        name = url.rsplit("/", 1)[-1]
        files = [f for f in locked.files if f.url == url or _unquoted(f.filename) == _unquoted(name)]
        sha256 = _direct_sha256(origin)
        if not files:
            return f"the direct URL {url}"
        if sha256 and all(f.sha256 != sha256 for f in files):
            return f"a file with sha256 {sha256}"
        return None
    if not dist.wheel_tags:
        return None  # not installed from a wheel by a standard installer: nothing to compare
    installed = _expanded(dist.wheel_tags)
    if any(_same_build(installed, _tags(f.filename)) for f in locked.files):
        return None
    return f"a wheel tagged {', '.join(sorted(dist.wheel_tags))}"


def _expanded(lines: Iterable[str]) -> set[str]:
    """WHEEL Tag lines as single tags: some builders (maturin) write a compressed set on one line.

    >>> sorted(_expanded(["cp38-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64"]))
    ['cp38-abi3-manylinux2014_x86_64', 'cp38-abi3-manylinux_2_17_x86_64']
    """
    tags: set[str] = set()
    for line in lines:
        try:
            tags |= {str(tag) for tag in parse_tag(line)}
        except ValueError:
            tags.add(line)
    return tags


def _same_build(installed: set[str], named: set[str]) -> bool:
    """Whether a wheel whose WHEEL file says ``installed`` is the file whose name says ``named``: a tag
    in common, or a plain linux_<arch> WHEEL tag under a manylinux file name of the same interpreter,
    ABI and architecture (a file renamed to its manylinux tag without its WHEEL file being rewritten,
    as sgl-kernel 0.3.21's and torch-memory-saver 0.0.9's are).

    >>> _same_build({"cp310-abi3-linux_x86_64"}, {"cp310-abi3-manylinux2014_x86_64"})
    True
    >>> _same_build({"cp310-abi3-linux_x86_64"}, {"cp310-abi3-manylinux2014_aarch64"})
    False
    """
    if installed & named:
        return True
    plain = {_build_of(tag) for tag in installed if "-linux_" in tag}
    return any(_build_of(tag) in plain for tag in named if "-manylinux" in tag)


def _build_of(tag: str) -> tuple[str, str]:
    """(interpreter-abi, architecture) of a tag.

    >>> _build_of("cp38-abi3-manylinux_2_17_x86_64")
    ('cp38-abi3', 'x86_64')
    """
    prefix, platform = tag.rsplit("-", 1)
    found = re.search(r"(x86_64|aarch64|i686|ppc64le|s390x|armv7l)$", platform)
    return prefix, found.group(1) if found else platform


def _unquoted(name: str) -> str:
    return urllib.parse.unquote(name)


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _direct_sha256(origin: Mapping[str, Any]) -> str | None:
    archive = _mapping(origin.get("archive_info"))
    hashes = _mapping(archive.get("hashes"))
    legacy = str(archive.get("hash", ""))
    return hashes.get("sha256") or (legacy.split("=", 1)[1] if legacy.startswith("sha256=") else None)


def _tags(filename: str) -> set[str]:
    try:
        return {str(tag) for tag in parse_wheel_filename(filename)[3]}
    except InvalidWheelFilename:
        return set()
