"""The machine a spec describes: [hardware] (its GPUs), the [[toolkit]] array (its CUDA toolkits) and [nccl]."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from stackgate.models.spec.reader import Table
from stackgate.models.spec.rules import (
    check_sha256,
    check_url,
    normal_path,
)

__all__ = [
    "CUDA_LINK_POLICIES",
    "PYPI_CUDA12_REASON",
    "TOOLKIT_SOURCES",
    "Capability",
    "Hardware",
    "Nccl",
    "Toolkit",
]

TOOLKIT_SOURCES = ("pypi", "runfile", "apt")
CUDA_LINK_POLICIES = ("leave", "default")
PYPI_CUDA12_REASON = (
    'PyPI\'s CUDA 12 nvcc wheels carry ptxas, headers and nvvm but not the nvcc driver; use source = "runfile" or "apt"'
)


@dataclass(frozen=True, order=True)
class Capability:
    """A CUDA compute capability such as 12.0.

    >>> Capability.parse("12.0").arch
    'sm_120a'
    >>> str(Capability(9, 0))
    '9.0'
    """

    major: int
    minor: int

    @classmethod
    def parse(cls, text: str) -> Capability:
        match = re.fullmatch(r"(\d{1,2})\.(\d)", text.strip())
        if not match:
            raise ValueError(f"invalid compute capability {text!r} (expected e.g. '12.0')")
        return cls(int(match[1]), int(match[2]))

    @property
    def arch(self) -> str:
        # Hopper and newer have arch-specific ("a") targets that the stack's kernels build for.
        suffix = "a" if self.major >= 9 else ""
        return f"sm_{self.major}{self.minor}{suffix}"

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


@dataclass(frozen=True)
class Hardware:
    gpu_count: int
    compute_capability: Capability
    gpu_name: str
    min_driver: Version
    arch: str  #: the ptxas target the default toolkit must build, e.g. sm_120a

    @classmethod
    def _from_table(cls, t: Table) -> Hardware:
        count = t.positive("gpu_count", int)
        capability = t.parsed("compute_capability", Capability.parse)
        name = t.get("gpu_name", str)
        driver = t.parsed("min_driver", Version)
        arch = t.get("arch", str, capability.arch if capability else "")
        if arch is not None and not re.fullmatch(r"sm_\d+[af]?", arch):
            t.error("arch", f"invalid ptxas target {arch!r} (expected e.g. 'sm_120a')")
        t.finish()
        return cls(count or 0, capability or Capability(0, 0), name or "", driver or Version("0"), arch or "")


@dataclass(frozen=True)
class Toolkit:
    version: Version  #: the CUDA release, e.g. 13.0.1
    prefix: Path
    source: str | None = None  #: pypi | runfile | apt; None for a toolkit that is only kept
    default: bool = False  #: CUDA_HOME and TRITON_PTXAS_PATH point here
    keep: bool = False  #: must exist and stay untouched
    nvcc: Version | None = None  #: the nvcc build that release ships, e.g. 13.0.88
    components: tuple[str, ...] = ()  #: pypi extras of cuda-toolkit
    url: str | None = None  #: runfile location (URL or local path)
    sha256: str | None = None

    @property
    def release(self) -> str:
        """The major.minor that ``nvcc --version`` prints as "release X.Y"."""
        return f"{self.version.major}.{self.version.minor}"

    @property
    def label(self) -> str:
        return f"CUDA {self.version} at {self.prefix}"

    @classmethod
    def _from_table(cls, t: Table) -> Toolkit:
        version = t.parsed("version", Version)
        prefix = t.get("prefix", str)
        if prefix is not None and not os.path.isabs(prefix):
            t.error("prefix", f"must be an absolute path, not {prefix!r}")
        keep = t.get("keep", bool, False)
        source = t.get("source", str, None)
        if source is None and not keep:
            t.error("source", f"missing: say how to install it ({', '.join(TOOLKIT_SOURCES)}) or set keep = true")
        elif source is not None:
            t.choice("source", source, TOOLKIT_SOURCES)
        if keep and source is not None:
            t.error("source", "a keep = true toolkit is never installed by stackgate; drop source")
        if source == "pypi" and version is not None and version.major < 13:
            t.error("source", f"pypi cannot provide CUDA {version}: {PYPI_CUDA12_REASON}")
        url = t.get("url", str, None)
        check_url(t, "url", url, local_path=True)
        sha256 = check_sha256(t, "sha256")
        if source == "runfile" and (url is None or sha256 is None):
            t.error("url" if url is None else "sha256", "a runfile toolkit needs both url and sha256")
        toolkit = cls(
            version=version or Version("0"),
            prefix=normal_path(prefix or "/"),
            source=source,
            default=t.get("default", bool, False) or False,
            keep=keep or False,
            nvcc=t.parsed("nvcc", Version, None),
            components=t.strings("components"),
            url=url,
            sha256=sha256,
        )
        t.finish()
        return toolkit

    @classmethod
    def _all_from_table(cls, top: Table) -> tuple[Toolkit, ...]:
        """The [[toolkit]] array: exactly one default, no two on one prefix."""
        toolkits = tuple(cls._from_table(t) for t in top.array("toolkit"))
        defaults = [i for i, t in enumerate(toolkits) if t.default]
        if toolkits and not defaults:
            top.error("toolkit", "exactly one toolkit must have default = true, found none")
        for i in defaults[1:]:
            top.error(
                f"toolkit[{i}].default",
                f"toolkit[{defaults[0]}] is the default already: exactly one toolkit may have default = true",
            )
        first: dict[Path, int] = {}
        for i, toolkit in enumerate(toolkits):
            if toolkit.prefix in first:
                top.error(
                    f"toolkit[{i}].prefix",
                    f"{toolkit.prefix} is toolkit[{first[toolkit.prefix]}]'s prefix too: "
                    "two toolkits cannot share a prefix",
                )
            first.setdefault(toolkit.prefix, i)
        return toolkits


@dataclass(frozen=True)
class Nccl:
    min_version: Version | None = None
    min_busbw_gbs: float | None = None

    @classmethod
    def _from_table(cls, t: Table) -> Nccl:
        nccl = cls(t.parsed("min_version", Version, None), t.positive("min_busbw_gbs", float, None))
        t.finish()
        return nccl
