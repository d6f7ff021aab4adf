"""What a pylock asks of the host before any of it is installed: the Python version its wheels'
tags and Requires-Python name, the glibc of their manylinux tags, and the NVIDIA driver of the CUDA
runtime it carries. Provision and upgrade judge these in the plan, so a host that cannot take the
stack stops before a generation is created, with the floor, the file that sets it and what to do.

A package is refused only when none of its locked files fits: an installer takes the file that
fits (aiohttp's cp312 manylinux wheel or its py3-none-any one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from stackgate.models import pylock
from stackgate.models.finding import Fix

__all__ = ["DRIVER_FLOORS", "Floor", "Host", "cuda_runtime", "driver_floor", "refusals"]

#: The NVIDIA Linux driver each CUDA release needs (CUDA Toolkit release notes, "CUDA Toolkit and
#: Corresponding Driver Versions"): a runtime newer than the driver fails at its first CUDA call.
DRIVER_FLOORS: dict[tuple[int, int], str] = {
    (12, 4): "550.54.14",
    (12, 6): "560.28.03",
    (12, 8): "570.26",
    (12, 9): "575.51.03",
    (13, 0): "580.65.06",
    (13, 1): "590.44.01",
}
#: The distributions that carry the CUDA runtime (from CUDA 13 the wheels lose their -cuXY suffix).
CUDA_RUNTIME = ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12")
#: The legacy manylinux names and the glibc each stands for (PEP 600).
_LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
#: A glibc newer than any wheel asks for: "the platform does not limit this file".
_ANY_GLIBC = (2, 99)


@dataclass(frozen=True)
class Host:
    """This machine as the floors see it (None: not known here)."""

    python: str | None  #: the base interpreter's version, e.g. "3.12.1"
    glibc: tuple[int, int] | None
    driver: str | None  #: the NVIDIA driver NVML reports
    arch: str = "x86_64"


@dataclass(frozen=True)
class Floor:
    """One floor the host does not meet: what is needed, what is here, and what to do."""

    message: str
    fix: Fix


def refusals(resolution: pylock.Resolution, host: Host, spec_name: str) -> list[Floor]:
    """Every floor of ``resolution`` this host does not meet (a floor whose host value is unknown
    is not judged here: the Python's absence is the plan's own blocker, a missing driver only
    means the stack cannot run yet)."""
    found: list[Floor] = []
    if host.python is not None:
        found += _one(_python_floors(resolution, host.python))
    if host.python is not None and host.glibc is not None and not found:
        found += _one(_glibc_floors(resolution, host, spec_name))
    needed = driver_floor(resolution)
    if needed is not None and host.driver is not None and _older(host.driver, needed[1]):
        runtime, floor = needed
        found.append(
            Floor(
                f"{runtime} needs NVIDIA driver >= {floor}; this machine's driver is {host.driver}",
                Fix(
                    f"Install NVIDIA driver {floor} or newer (then reboot), then provision again; "
                    "nothing was installed.",
                    ("nvidia-smi --query-gpu=driver_version --format=csv,noheader",),
                ),
            )
        )
    return found


def _one(floors: list[Floor]) -> list[Floor]:
    """Floors of one kind as one: the first named, the others counted (a Python a whole stack's wheels
    are not for would otherwise be a line per package)."""
    if len(floors) <= 1:
        return floors
    first = floors[0]
    return [Floor(f"{first.message} (and {len(floors) - 1} more packages)", first.fix)]


def cuda_runtime(resolution: pylock.Resolution) -> pylock.Locked | None:
    """The locked distribution that carries the CUDA runtime, if any."""
    return next((p for name in CUDA_RUNTIME if (p := resolution.package(name)) is not None), None)


def driver_floor(resolution: pylock.Resolution) -> tuple[str, str] | None:
    """("nvidia-cuda-runtime 13.0.96 (CUDA 13.0)", the driver it needs), or None without a CUDA runtime.

    A CUDA release absent from :data:`DRIVER_FLOORS` takes the newest floor of its major below it."""
    runtime = cuda_runtime(resolution)
    if runtime is None:
        return None
    try:
        release = Version(runtime.version).release[:2]
    except InvalidVersion:
        return None
    known = [cuda for cuda in DRIVER_FLOORS if cuda[0] == release[0] and cuda <= release]
    if not known:
        return None
    return f"{runtime.name} {runtime.version} (CUDA {release[0]}.{release[1]})", DRIVER_FLOORS[max(known)]


def _older(have: str, need: str) -> bool:
    """Whether driver ``have`` is older than ``need`` (an unreadable version is not judged).

    >>> _older("575.57.08", "580.65.06"), _older("580.82.07", "580.65.06")
    (True, False)
    """
    try:
        return Version(have) < Version(need)
    except InvalidVersion:
        return False


# --- Python and glibc --------------------------------------------------------------------------


def _wheel_tags(file: pylock.LockedFile) -> frozenset[Tag]:
    try:
        return parse_wheel_filename(file.filename)[3]
    except InvalidWheelFilename:
        return frozenset()


def _supported(python: tuple[int, int], glibc: tuple[int, int], arch: str) -> frozenset[Tag]:
    """The tags an interpreter of ``python`` on a glibc ``glibc`` Linux of ``arch`` installs."""
    platforms = [f"manylinux_2_{minor}_{arch}" for minor in range(glibc[1], 4, -1)]
    platforms += [f"{name}_{arch}" for name, floor in _LEGACY.items() if floor <= glibc]
    platforms.append(f"linux_{arch}")
    interpreter = f"cp{python[0]}{python[1]}"
    return frozenset(
        [
            *cpython_tags(python, platforms=platforms),
            *compatible_tags(python, interpreter=interpreter, platforms=platforms),
        ]
    )


def _python_floors(resolution: pylock.Resolution, version: str) -> list[Floor]:
    try:
        have = Version(version)
    except InvalidVersion:
        return []
    python = (have.major, have.minor)
    fits = _supported(python, _ANY_GLIBC, "x86_64") | _supported(python, _ANY_GLIBC, "aarch64")
    found = []
    for package in resolution.packages.values():
        asked = _requires_python(package.requires_python)
        wheels = [f for f in package.files if _wheel_tags(f)]
        if asked is not None and not asked.contains(have, prereleases=True):
            why = f"Requires-Python {asked}"
        elif wheels and not any(_wheel_tags(f) & fits for f in wheels):
            why = f"its locked wheels are for {_interpreters(wheels)} ({wheels[0].filename})"
        else:
            continue
        found.append(
            Floor(
                f"{package.name} {package.version}: {why}; the base interpreter is Python {version}",
                Fix(
                    "Build from an interpreter the stack's wheels are for (set python.version in the spec, install "
                    "that Python, lock again), then provision; nothing was installed.",
                    (f"pyenv install {_first_python(wheels) or version}",),
                ),
            )
        )
    return found


def _requires_python(text: str | None) -> SpecifierSet | None:
    try:
        return SpecifierSet(text) if text else None
    except InvalidSpecifier:
        return None


def _interpreters(wheels: Iterable[pylock.LockedFile]) -> str:
    names = sorted({tag.interpreter for f in wheels for tag in _wheel_tags(f)})
    return ", ".join(names)


def _first_python(wheels: Iterable[pylock.LockedFile]) -> str | None:
    """The Python a cpXY wheel is for ("3.12"), if one names it."""
    for file in wheels:
        for tag in _wheel_tags(file):
            digits = tag.interpreter[2:]
            if tag.interpreter.startswith("cp") and len(digits) >= 2 and digits.isdigit():
                return f"{digits[0]}.{digits[1:]}"
    return None


def _glibc_floors(resolution: pylock.Resolution, host: Host, spec_name: str) -> list[Floor]:
    assert host.python is not None and host.glibc is not None
    have = Version(host.python)
    python = (have.major, have.minor)
    here = _supported(python, host.glibc, host.arch)
    anywhere = _supported(python, _ANY_GLIBC, host.arch)
    found = []
    for package in resolution.packages.values():
        wheels = [f for f in package.files if _wheel_tags(f) & anywhere]
        if not wheels or any(_wheel_tags(f) & here for f in wheels):
            continue
        need = min(_glibc_of(f) for f in wheels)
        lowest = next(f for f in wheels if _glibc_of(f) == need)
        glibc = f"{host.glibc[0]}.{host.glibc[1]}"
        found.append(
            Floor(
                f"{package.name} {package.version}: {lowest.filename} needs glibc >= {need[0]}.{need[1]} "
                f"(its manylinux tag); this machine has glibc {glibc}",
                Fix(
                    f"Provision {spec_name} on a host with glibc {need[0]}.{need[1]} or newer (Ubuntu 22.04, "
                    f"Debian 12, RHEL 9 or later), or pin a release of {package.name} with wheels for glibc "
                    f"{glibc} and lock again; nothing was installed.",
                    ("ldd --version",),
                ),
            )
        )
    return found


def _glibc_of(file: pylock.LockedFile) -> tuple[int, int]:
    """The oldest glibc any of the file's platform tags accepts ((0, 0): not limited).

    >>> _glibc_of(pylock.LockedFile("a-1-cp312-cp312-manylinux_2_34_x86_64.whl", "0" * 64, "u"))
    (2, 34)
    """
    floors = []
    for tag in _wheel_tags(file):
        platform = tag.platform
        legacy = next((floor for name, floor in _LEGACY.items() if platform.startswith(f"{name}_")), None)
        if legacy is not None:
            floors.append(legacy)
        elif platform.startswith("manylinux_"):
            major, minor = platform.split("_")[1:3]
            floors.append((int(major), int(minor)))
        else:
            floors.append((0, 0))
    return min(floors, default=(0, 0))
