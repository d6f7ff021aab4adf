"""What a pylock must hold together, and what an installed environment's shared folders must be.

- One kernel package: ``sgl-kernel`` (to 0.3.21) and its successor ``sglang-kernel`` (0.4 on) both
  install ``sgl_kernel/``. Installed together, one overwrites the other's files, and removing either
  later deletes the files of the one that stays. A generation is a new environment, so the kernel of
  the generation it replaces never meets the new one there; a pylock that holds both is refused.
- flashinfer-cubin equal to flashinfer-python: flashinfer checks the two versions at import and a
  stale cubin (it left PyPI after 0.6.13) stops ``import flashinfer``.
- After an install, the files under ``sgl_kernel/`` are exactly those the RECORD of the installed
  kernel distribution lists, each with its sha256: nothing left by another distribution, nothing
  missing, nothing changed.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from stackgate.models import pylock
from stackgate.models.finding import Fix

__all__ = ["SHARED_FOLDERS", "Refusal", "folder_problems", "refusals"]

#: Import folders that more than one distribution installs, and those distributions (the old name first).
SHARED_FOLDERS: dict[str, tuple[str, ...]] = {"sgl_kernel": ("sgl-kernel", "sglang-kernel")}


@dataclass(frozen=True)
class Refusal:
    """A pylock that must not be installed: what is wrong with it and what to do."""

    message: str
    fix: Fix


def refusals(resolution: pylock.Resolution, lock_command: str) -> list[Refusal]:
    """What makes ``resolution`` unsafe to install, each with its fix (``lock_command`` re-locks)."""
    found = []
    for folder, names in SHARED_FOLDERS.items():
        held = [p for name in names if (p := resolution.package(name)) is not None]
        if len(held) > 1:
            both = " and ".join(f"{p.name} {p.version}" for p in held)
            old, new = held[0].name, held[-1].name
            found.append(
                Refusal(
                    f"{resolution.path.name} holds {both}: both install {folder}/, so one would overwrite the "
                    "other's files and removing either would delete the other's",
                    Fix(
                        f"Drop {old} from the spec's [python.packages] ({new} replaces it) and lock again.",
                        (lock_command,),
                    ),
                )
            )
    python, cubin = resolution.package("flashinfer-python"), resolution.package("flashinfer-cubin")
    if python is not None and cubin is not None and not _same(python.version, cubin.version):
        found.append(
            Refusal(
                f"{resolution.path.name} holds flashinfer-cubin {cubin.version} beside flashinfer-python "
                f"{python.version}: flashinfer refuses a cubin of another version at import",
                Fix(
                    f'Pin flashinfer-cubin = "=={python.version}" in the spec (or drop it where the engine does not '
                    "require it: flashinfer-cubin left PyPI after 0.6.13) and lock again.",
                    (lock_command,),
                ),
            )
        )
    return found


def _same(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def folder_problems(site: Path) -> list[str]:
    """Each way a shared folder in ``site`` (site-packages) differs from its installed owner's RECORD."""
    installed = _installed(site)
    problems = []
    for folder, names in SHARED_FOLDERS.items():
        owners = [(name, installed[name]) for name in map(canonicalize_name, names) if name in installed]
        if not (site / folder).exists() and not owners:
            continue
        if len(owners) != 1:
            said = ", ".join(name for name, _ in owners) or "no distribution"
            problems.append(f"{folder}/ is installed by {said}: exactly one of {', '.join(names)} must own it")
            continue
        name, info = owners[0]
        problems += [f"{folder}/ ({name}): {p}" for p in _against_record(site, folder, info)]
    return problems


def _installed(site: Path) -> dict[str, Path]:
    """The distributions in ``site`` by canonical name: their .dist-info folders."""
    found: dict[str, Path] = {}
    for info in sorted(site.glob("*.dist-info")):
        name = info.name[: -len(".dist-info")].rsplit("-", 1)[0]
        found[canonicalize_name(name)] = info
    return found


def _against_record(site: Path, folder: str, info: Path) -> list[str]:
    record = info / "RECORD"
    try:
        rows = list(csv.reader(io.StringIO(record.read_text(encoding="utf-8"))))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        return [f"{record} cannot be read: {exc}"]
    listed = {row[0]: row[1] if len(row) > 1 else "" for row in rows if row and row[0].startswith(f"{folder}/")}
    on_disk = {
        path.relative_to(site).as_posix()
        for path in (site / folder).rglob("*")
        if (path.is_file() or path.is_symlink()) and "__pycache__" not in path.parts
    }
    wanted = {name for name in listed if "__pycache__" not in name.split("/")}
    problems = [
        f"{name} is not in {info.name}/RECORD (another distribution's file)" for name in sorted(on_disk - wanted)
    ]
    problems += [f"{name} is listed in {info.name}/RECORD but missing" for name in sorted(wanted - on_disk)]
    for name in sorted(wanted & on_disk):
        digest = listed[name]
        if digest.startswith("sha256=") and _digest(site / name) != digest:
            problems.append(f"{name} does not match the sha256 {info.name}/RECORD lists")
    return problems


def _digest(path: Path) -> str:
    """A file's digest as RECORD writes it (PEP 376: urlsafe base64 without padding)."""
    sha = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            sha.update(block)
    return "sha256=" + base64.urlsafe_b64encode(sha.digest()).rstrip(b"=").decode()
