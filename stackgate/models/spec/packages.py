"""The stack's Python environment a spec describes: [python] (its interpreter, indexes, pins, guard and
overrides) and the [[patch]] array.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from stackgate.models.spec.hardware import Toolkit
from stackgate.models.spec.reader import Table, kind_of
from stackgate.models.spec.rules import (
    check_sha256,
    check_url,
    resolve_path,
)

__all__ = [
    "DEFAULT_INDEX",
    "DEFAULT_PLATFORM",
    "INSTALLERS",
    "Index",
    "Override",
    "Package",
    "Patch",
    "Python",
]

#: Where packages not mapped to a [[python.index]] come from, unless python.default_index says.
DEFAULT_INDEX = "https://pypi.org/simple"
#: The platform `stackgate lock` resolves for (uv's --python-platform), unless python.platform says:
#: the x86_64 Linux servers the profiles describe, glibc 2.28 or newer (torch's own wheels' floor).
DEFAULT_PLATFORM = "x86_64-manylinux_2_28"
#: What python.platform may name: uv's Linux targets (a GPU server runs Linux).
_PLATFORM = re.compile(r"(x86_64|aarch64)-(unknown-linux-gnu|manylinux_2_\d{2})")
INSTALLERS = ("uv", "pip")


@dataclass(frozen=True)
class Index:
    url: str
    packages: tuple[str, ...]  #: canonical names served only from this index

    @classmethod
    def _from_table(cls, t: Table, pinned: set[str]) -> Index:
        url = t.get("url", str)
        check_url(t, "url", url)
        index = cls(url or "", tuple(canonicalize_name(n) for n in t.strings("packages")))
        # provision installs from a named index exactly the pins it maps there; an unpinned name
        # would be pulled in later, as someone's dependency, from the default index instead.
        for i, name in enumerate(index.packages):
            if name not in pinned:
                t.error(
                    f"packages[{i}]",
                    f"{name!r} has no pin in python.packages: "
                    "provision installs from this index only what the lock pins",
                )
        t.finish()
        return index


@dataclass(frozen=True)
class Package:
    name: str  #: canonical name (PEP 503)
    specifier: SpecifierSet
    url: str | None = None
    sha256: str | None = None

    @property
    def requirement(self) -> str:
        """The requirement line an installer takes for this pin."""
        if self.url:
            return f"{self.name} @ {self.url}"
        return f"{self.name}{self.specifier}"

    @property
    def pinned_version(self) -> str | None:
        """The exact version of an ``==`` pin, local label included."""
        specs = list(self.specifier)
        if len(specs) == 1 and specs[0].operator in ("==", "==="):
            return specs[0].version
        return None

    @classmethod
    def _all_from_table(cls, t: Table) -> tuple[Package, ...]:
        """[python.packages]: one pin a key, no name pinned twice."""
        packages = []
        for raw_name, value in t.data.items():
            t.seen.add(raw_name)
            if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", raw_name):
                t.error(raw_name, "is not a valid distribution name")
                continue
            package = cls._from_entry(t, raw_name, value)
            if package is not None:
                packages.append(package)
        names = [p.name for p in packages]
        for name in {n for n in names if names.count(n) > 1}:
            t.error(name, "is pinned twice (names compare after PEP 503 normalisation)")
        return tuple(packages)

    @classmethod
    def _from_entry(cls, t: Table, raw_name: str, value: Any) -> Package | None:
        """One pin: a specifier string, or a table with version, url and sha256."""
        name = canonicalize_name(raw_name)
        if isinstance(value, str):
            spec = _specifier(t, raw_name, value)
            return cls(name, spec) if spec is not None else None
        if not isinstance(value, dict):
            t.error(raw_name, f"must be a version specifier or a table, not {kind_of(value)}")
            return None
        table = Table(value, t.key(raw_name), t.errors)
        spec = table.parsed("version", SpecifierSet)
        url = table.get("url", str, None)
        check_url(table, "url", url)
        sha256 = check_sha256(table, "sha256")
        if sha256 is not None and url is None:
            table.error("sha256", "only a url package carries a sha256")
        table.finish()
        return cls(name, spec, url, sha256) if spec is not None else None


def _specifier(t: Table, name: str, text: str) -> SpecifierSet | None:
    try:
        spec = SpecifierSet(text)
    except InvalidSpecifier:
        t.error(name, f"invalid specifier {text!r} (expected e.g. '==2.9.1+cu130')")
        return None
    if not text.strip():
        t.error(name, "empty specifier: pin a version, e.g. '==2.9.1'")
        return None
    return spec


@dataclass(frozen=True)
class Override:
    package: str
    specifier: SpecifierSet
    reason: str

    @classmethod
    def _from_table(cls, t: Table, names: set[str]) -> Override:
        package = canonicalize_name(t.get("package", str) or "")
        if package and package not in names:
            t.error("package", f"{package!r} has no pin in python.packages")
        spec = t.parsed("version", SpecifierSet)
        reason = t.get("reason", str)
        if reason is not None and not reason.strip():
            t.error("reason", "must say why the override is needed")
        t.finish()
        return cls(package, spec or SpecifierSet(), reason or "")


@dataclass(frozen=True)
class Python:
    version: str  #: major.minor of the target interpreter
    root: Path | None  #: stackgate-managed generations live here; <root>/current is live
    interpreter: Path | None  #: an existing interpreter to inspect instead of a managed root
    installer: str
    indexes: tuple[Index, ...]
    packages: tuple[Package, ...]
    frozen: tuple[str, ...]
    overrides: tuple[Override, ...]
    imports: tuple[str, ...]
    torch_cuda: str | None  #: torch.version.cuda the stack needs, e.g. "13.0"
    #: where every package not mapped to a [[python.index]] comes from (PyPI, or a mirror of it)
    default_index: str = DEFAULT_INDEX
    #: the platform `stackgate lock` resolves for, e.g. x86_64-manylinux_2_28 (not this machine's)
    platform: str = DEFAULT_PLATFORM

    @property
    def target(self) -> Path:
        """The interpreter whose environment is the stack."""
        if self.interpreter is not None:
            return self.interpreter
        assert self.root is not None
        return self.root / "current" / "bin" / "python"

    @property
    def env_file(self) -> Path | None:
        """The environment file provision writes into the live generation; for a generation
        looked at before it is live (``interpreter`` set beside ``root``, as provision's checks
        and an upgrade's A/B do), that generation's own."""
        if self.root is None:
            return None
        if self.interpreter is not None:
            return self.interpreter.parent.parent / "stackgate.env"
        return self.root / "current" / "stackgate.env"

    def package(self, name: str) -> Package | None:
        wanted = canonicalize_name(name)
        return next((p for p in self.packages if p.name == wanted), None)

    def override(self, name: str) -> Override | None:
        wanted = canonicalize_name(name)
        return next((o for o in self.overrides if o.package == wanted), None)

    @classmethod
    def _from_table(cls, t: Table, toolkits: tuple[Toolkit, ...]) -> Python:
        version = t.get("version", str)
        if version is not None and not re.fullmatch(r"3\.\d{1,2}", version):
            t.error("version", f"must be a major.minor like '3.12', not {version!r}")
        root = t.get("root", str, None)
        interpreter = t.get("interpreter", str, None)
        if (root is None) == (interpreter is None):
            t.error(
                "root", "set exactly one of root (a stackgate-managed environment) or interpreter (an existing one)"
            )
        for name, value in (("root", root), ("interpreter", interpreter)):
            if value is not None and not os.path.isabs(value):
                t.error(name, f"must be an absolute path, not {value!r}")
        installer = t.get("installer", str, "uv")
        t.choice("installer", installer, INSTALLERS)
        table = t.sub("packages")
        packages = Package._all_from_table(table)
        # Cross-references count a pin that failed to parse as declared: one error, not two.
        names: set[str] = {canonicalize_name(str(key)) for key in table.data}
        frozen = _frozen(t.sub("guard"), names)
        overrides = tuple(Override._from_table(o, names) for o in t.array("override"))
        default = next((tk for tk in toolkits if tk.default), None)
        torch_cuda = t.get("torch_cuda", str, default.release if default else None)
        if torch_cuda is not None and not re.fullmatch(r"\d+\.\d+", torch_cuda):
            t.error("torch_cuda", f"must be a CUDA major.minor like '13.0', not {torch_cuda!r}")
        python = cls(
            version=version or "",
            root=Path(root) if root else None,
            interpreter=Path(interpreter) if interpreter else None,
            installer=installer or "uv",
            indexes=tuple(Index._from_table(i, names) for i in t.array("index")),
            packages=packages,
            frozen=frozen,
            overrides=overrides,
            imports=t.strings("imports"),
            torch_cuda=torch_cuda,
            default_index=_default_index(t),
            platform=_platform(t),
        )
        t.finish()
        return python


def _frozen(guard: Table, names: set[str]) -> tuple[str, ...]:
    """[python.guard] frozen: canonical names, each pinned in python.packages."""
    frozen = tuple(canonicalize_name(n) for n in guard.strings("frozen"))
    for i, name in enumerate(frozen):
        if name not in names:
            guard.error(f"frozen[{i}]", f"{name!r} has no pin in python.packages: the guard needs a version to hold")
    guard.finish()
    return frozen


def _default_index(t: Table) -> str:
    url = t.get("default_index", str, DEFAULT_INDEX)
    check_url(t, "default_index", url)
    return url or DEFAULT_INDEX


def _platform(t: Table) -> str:
    value = t.get("platform", str, DEFAULT_PLATFORM) or DEFAULT_PLATFORM
    if not _PLATFORM.fullmatch(value):
        t.error(
            "platform",
            f"must be a Linux target such as {DEFAULT_PLATFORM!r} or 'aarch64-manylinux_2_28', not {value!r}",
        )
    return value


@dataclass(frozen=True)
class Patch:
    package: str
    version: Version
    file: Path
    reason: str
    sha256: str | None = None

    @classmethod
    def _from_table(cls, t: Table, folder: Path) -> Patch:
        """One [[patch]]; a relative file resolves against ``folder``, the lockfile's."""
        file = t.get("file", str)
        patch = cls(
            package=canonicalize_name(t.get("package", str) or ""),
            version=t.parsed("version", Version) or Version("0"),
            file=resolve_path(folder / file) if file else Path(),
            reason=t.get("reason", str) or "",
            sha256=check_sha256(t, "sha256"),
        )
        t.finish()
        return patch
