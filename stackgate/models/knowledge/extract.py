"""Extractors: read more out of an event than one pattern's groups can hold.

A signature names one in its ``extract`` field; the scanner hands it the event's text (the
window of lines the match belongs to) and the stack's context, and the values it returns join
the match's groups, so that causes and fixes can quote them. Provision reads resolver output
through the same values (``package``, ``requirers``, ``culprit``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Mapping

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

__all__ = ["EXTRACTORS", "Extractor", "Requirement", "first_error", "requirers", "torch_requirers"]

_NAME = r"[A-Za-z0-9][A-Za-z0-9._\-]*(?:\[[^\]\s]*\])?"
#: pip: "    sglang[srt] 0.4.9.post3 depends on torch==2.7.1; extra == "srt""
_PIP_DEPENDS = re.compile(rf"^\s*(?P<req>{_NAME}) (?P<ver>\S+) depends on (?P<pkg>{_NAME})(?P<spec>[^;\s]*)", re.MULTILINE)
#: pip: "    The user requested torch==2.1.1"
_PIP_USER = re.compile(rf"^\s*The user requested (?P<pkg>{_NAME})(?P<spec>[^;\s]*)", re.MULTILINE)
#: uv (after unwrapping): "Because sglang==0.5.9 depends on torch==2.9.1 and ...", "Because all
#: versions of eager-upgrader depend on torch>=2.10 and ..."
_UV_DEPENDS = re.compile(rf"(?P<req>{_NAME})(?:(?:==|>=|<=|~=|>|<)(?P<ver>[^\s,{{}}]+))?(?:\{{[^}}]*\}})? depends? on (?P<pkg>{_NAME})(?:\{{[^}}]*\}})?(?P<spec>[^\s,]*)")
_UV_USER = re.compile(rf"(?:you require|your project depends on) (?P<pkg>{_NAME})(?P<spec>[^\s,]*)")
_UV_DECORATION = re.compile(r"^[\s│╰─▶×]+", re.MULTILINE)
#: "ImportError: libnvrtc.so.12: ...", "fatal error: curand_kernel.h: ...", "error : Feature ..."
_ERROR_LINE = re.compile(r"(?:\b\w*Error|\bfatal error|\berror)\s*:\s*\S")


@dataclass(frozen=True)
class Requirement:
    """One requirer of a package, as a resolver report states it."""

    requirer: str  #: "sglang[srt]", or "you" for the user's own requirement
    version: str  #: the requirer's version ("" when the report does not say)
    package: str
    specifier: str  #: "==2.7.1", "" for an unbounded requirement

    def __str__(self) -> str:
        who = f"{self.requirer} {self.version}".strip()
        return f"{who} ({self.package}{self.specifier})"


@dataclass(frozen=True)
class Extractor:
    provides: tuple[str, ...]
    function: Callable[[str, Mapping[str, str]], dict[str, str]]

    def __call__(self, text: str, context: Mapping[str, str]) -> dict[str, str]:
        return self.function(text, context)


def requirers(text: str) -> list[Requirement]:
    """Every "X depends on Y<spec>" a pip or uv resolver report states, in order.

    >>> [str(r) for r in requirers("    sglang 0.5.9 depends on torch==2.9.1\\n    flashinfer-python 0.6.4 depends on torch")]
    ['sglang 0.5.9 (torch==2.9.1)', 'flashinfer-python 0.6.4 (torch)']
    """
    found = [Requirement(m["req"], m["ver"], m["pkg"], _spec(m["spec"])) for m in _PIP_DEPENDS.finditer(text)]
    found += [Requirement("you", "", m["pkg"], _spec(m["spec"])) for m in _PIP_USER.finditer(text)]
    if not found:
        flat = " ".join(_UV_DECORATION.sub("", text).split())  # uv wraps its sentences anywhere
        found += [Requirement(m["req"], m["ver"] or "", m["pkg"], _spec(m["spec"])) for m in _UV_DEPENDS.finditer(flat)]
        found += [Requirement("you", "", m["pkg"], _spec(m["spec"])) for m in _UV_USER.finditer(flat)]
    return list(dict.fromkeys(found))


def torch_requirers(text: str, context: Mapping[str, str]) -> dict[str, str]:
    """The contested package, who requires what of it, and whose requirement excludes the lock's pin.

    The contested package is the one with the most requirers (among equals a pinned one, then
    torch). The culprit is a requirer whose specifier excludes the lock's pin of it; without a
    pin, the requirers that bound the package at all.
    """
    found = requirers(text)
    if not found:
        return {}
    pins = _pins(context.get("lock_pins", ""))
    names = [canonicalize_name(r.package.split("[")[0]) for r in found]
    # The contested package: the most required one; among equals a pinned one, then torch.
    package = max(dict.fromkeys(names), key=lambda n: (names.count(n), n in pins, n == "torch"))
    mine = [r for r, n in zip(found, names, strict=True) if n == package]
    return {"package": package, "requirers": "; ".join(map(str, mine)), "culprit": _culprit(mine, pins.get(package))}


def _culprit(mine: list[Requirement], pinned: str | None) -> str:
    others = [r for r in mine if r.requirer != "you"]
    if pinned:
        version = _version(pinned)
        excluding = [r for r in others if version is not None and not _allows(r.specifier, version)]
        return "; ".join(map(str, excluding)) or f"no requirer in the report excludes {pinned}"
    bounded = [r for r in others if r.specifier]
    return "; ".join(map(str, bounded)) or "no requirer in the report bounds it"


def first_error(text: str, context: Mapping[str, str]) -> dict[str, str]:
    """The first line after the event's first line that names an error (a compiler's, an import's)."""
    for line in text.splitlines()[1:]:
        if _ERROR_LINE.search(line):
            return {"first_error": line.strip(" -\t")}
    return {"first_error": "(no error line in the output that followed)"}


def _spec(text: str) -> str:
    return text.strip().rstrip(".;")


def _pins(text: str) -> dict[str, str]:
    """``"torch==2.9.1+cu130 triton==3.5.1"`` -> ``{"torch": "2.9.1+cu130", "triton": "3.5.1"}``."""
    pins = {}
    for requirement in text.split():
        name, sep, version = requirement.partition("==")
        if sep:
            pins[canonicalize_name(name)] = version
    return pins


def _version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _allows(specifier: str, version: Version) -> bool:
    if not specifier:
        return True
    try:
        return SpecifierSet(specifier).contains(version, prereleases=True)
    except InvalidSpecifier:
        return True  # a specifier we cannot read is not evidence against it


EXTRACTORS: Mapping[str, Extractor] = {
    "torch_requirers": Extractor(("package", "requirers", "culprit"), torch_requirers),
    "first_error": Extractor(("first_error",), first_error),
}
