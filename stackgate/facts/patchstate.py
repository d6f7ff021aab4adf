"""Whether the lock's ``[[patch]]`` entries are applied: read-only, for verify and provision's plan.

:mod:`stackgate.stack.patching` applies a patch and records, in ``<site-packages>/stackgate-patches.json``,
each file it wrote with its hash; this module reads that record back and compares it with the
files and the package's installed version. Nothing here writes.

``patch_state(patch, site_packages) -> str | None``
    None when the patch is applied and its files unchanged, else why it must be (re)applied.
``inspect_patch(patch, site_packages) -> PatchStatus``
    The same, as data for verify (site_packages may be None: the package is not installed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from packaging.utils import canonicalize_name

from stackgate.models.spec import Patch

if TYPE_CHECKING:  # importlib.metadata (with email's parsers) is imported when a distribution is read
    from importlib import metadata

__all__ = [
    "RECORD",
    "PatchStatus",
    "distribution",
    "final_hashes",
    "inspect_patch",
    "installed_version",
    "patch_state",
    "read_record",
    "recorded_entry",
]

#: The file in site-packages that lists the applied patches and the hashes of what they wrote.
RECORD = "stackgate-patches.json"


def read_record(site_packages: Path) -> list[dict[str, object]]:
    """The applied patches recorded in ``site_packages`` (empty when none or unreadable)."""
    try:
        data = json.loads((site_packages / RECORD).read_text())
    except (OSError, ValueError):
        return []
    patches = data.get("patches") if isinstance(data, dict) else None
    return [p for p in patches if isinstance(p, dict)] if isinstance(patches, list) else []


@dataclass(frozen=True)
class PatchStatus:
    """One locked patch as found in an environment: None problem means applied and intact."""

    patch: Patch
    site_packages: Path | None
    installed: str | None  #: the package's installed version
    problem: str | None
    files: Mapping[str, str] = field(default_factory=dict)  #: recorded path -> sha256


def inspect_patch(patch: Patch, site_packages: Path | None) -> PatchStatus:
    """Whether ``patch`` is applied in ``site_packages`` and its files are as it left them."""
    if site_packages is None:
        return PatchStatus(patch, None, None, f"{patch.package} is not installed")
    installed = installed_version(site_packages, patch.package)
    entry = recorded_entry(site_packages, patch)
    files = _recorded_files(entry) if entry else {}
    return PatchStatus(patch, site_packages, installed, _problem(patch, site_packages, installed, entry), files)


def patch_state(patch: Patch, site_packages: Path | None) -> str | None:
    """None when ``patch`` is applied and intact, else why it must be applied."""
    return inspect_patch(patch, site_packages).problem


def recorded_entry(site_packages: Path, patch: Patch) -> dict[str, object] | None:
    """The record's entry for ``patch``, if it was applied here."""
    return next(
        (
            e
            for e in read_record(site_packages)
            if e.get("package") == patch.package and e.get("patch") == patch.file.name
        ),
        None,
    )


def _problem(
    patch: Patch, site_packages: Path, installed: str | None, entry: Mapping[str, object] | None
) -> str | None:
    if installed is None:
        return f"{patch.package} is not installed in {site_packages}"
    if installed != str(patch.version):
        return f"{patch.package} {installed} is installed; {patch.file.name} is for {patch.version}"
    if entry is None:
        return f"{patch.file.name} is not applied (not in {RECORD})"
    if patch.sha256 is not None and entry.get("sha256") != patch.sha256:
        return (
            f"{patch.file.name} applied is not the locked one (sha256 {str(entry.get('sha256'))[:12]}..., the lock "
            f"says {patch.sha256[:12]}...)"
        )
    from stackgate.edges import fetch  # its HTTP client is not needed to read the record

    expected = final_hashes(read_record(site_packages))
    for path in sorted(_recorded_files(entry)):
        have = fetch.sha256_file(site_packages / path) if (site_packages / path).is_file() else None
        if have != expected.get(path):
            return (
                f"{path} changed since {patch.file.name} was applied"
                if have
                else f"{path} is gone since {patch.file.name} was applied"
            )
    return None


def final_hashes(entries: Sequence[Mapping[str, object]]) -> dict[str, str]:
    """Each file's expected hash: what the last patch that touched it left."""
    final: dict[str, str] = {}
    for entry in entries:
        final.update(_recorded_files(entry))
    return final


def _recorded_files(entry: Mapping[str, object]) -> dict[str, str]:
    """An entry's ``files`` (recorded path -> sha256); an entry edited into another shape has none."""
    files = entry.get("files")
    return {str(k): str(v) for k, v in files.items()} if isinstance(files, dict) else {}


def distribution(site_packages: Path, package: str) -> metadata.Distribution | None:
    """``package``'s installed distribution in ``site_packages``, read from its dist-info."""
    from importlib import metadata

    wanted = canonicalize_name(package)
    for dist in metadata.distributions(path=[str(site_packages)]):
        if canonicalize_name(dist.metadata["Name"] or "") == wanted:
            return dist
    return None


def installed_version(site_packages: Path, package: str) -> str | None:
    """The version of ``package`` installed in ``site_packages``, read from its dist-info."""
    dist = distribution(site_packages, package)
    return dist.version if dist is not None else None
