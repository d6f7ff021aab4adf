"""The failure knowledge base: signatures of known failures, kept as data.

Each ``*.toml`` file beside this module holds ``[[signature]]`` entries: an id, the component,
the stages where it shows (provision, verify, smoke), regex patterns, the cause, the fix with
commands, and the public source it was learned from. diagnose, smoke's log scan, provision's
reading of installer output and verify's import classifier all read this one table, so a
signature is written once.

Causes and fixes may quote a pattern's named groups (``{lib}``) and context values the caller
supplies (``{lock_backend}``); an unknown name is left as written.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import string
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["SEVERITIES", "STAGES", "Finding", "Match", "Scanner", "Signature", "SignatureError", "load", "match_all", "match_first"]

SEVERITIES = ("info", "warning", "error")
STAGES = ("provision", "verify", "smoke")
COMPONENTS = ("sglang", "sgl-kernel", "flashinfer", "torch", "triton", "nccl", "cuda toolkit", "driver", "resolver", "python")
_FOLDER = Path(__file__).resolve().parent


class SignatureError(Exception):
    """A signature file that does not follow the format."""


@dataclass(frozen=True)
class Signature:
    id: str
    component: str
    stages: tuple[str, ...]
    severity: str
    patterns: tuple[re.Pattern[str], ...]
    cause: str
    fix: str
    commands: tuple[str, ...] = ()
    source: str = ""
    examples: tuple[str, ...] = ()  #: real text from the source; the tests feed it back

    def search(self, text: str) -> re.Match[str] | None:
        for pattern in self.patterns:
            found = pattern.search(text)
            if found:
                return found
        return None


@dataclass(frozen=True)
class Match:
    """A signature found in some text, with the values its patterns captured."""

    signature: Signature
    text: str
    groups: Mapping[str, str] = field(default_factory=dict)
    context: Mapping[str, str] = field(default_factory=dict)

    @property
    def cause(self) -> str:
        return _format(self.signature.cause, {**self.context, **self.groups})

    @property
    def fix(self) -> str:
        return _format(self.signature.fix, {**self.context, **self.groups})

    @property
    def commands(self) -> tuple[str, ...]:
        values = {**self.context, **self.groups}
        return tuple(_format(c, values) for c in self.signature.commands)


@functools.lru_cache(maxsize=None)
def load(folder: Path = _FOLDER) -> tuple[Signature, ...]:
    """Every signature in the folder's TOML files, ids unique."""
    signatures: list[Signature] = []
    for path in sorted(folder.glob("*.toml")):
        signatures.extend(_read(path))
    ids = [s.id for s in signatures]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise SignatureError(f"duplicate signature ids: {', '.join(duplicates)}")
    return tuple(signatures)


def match_all(text: str, *, stage: str | None = None, context: Mapping[str, str] | None = None, signatures: Iterable[Signature] | None = None) -> list[Match]:
    """Every signature (of a stage, if given) found in ``text``, most severe first."""
    found = []
    for signature in load() if signatures is None else signatures:
        if stage is not None and stage not in signature.stages:
            continue
        hit = signature.search(text)
        if hit:
            groups = {k: v for k, v in hit.groupdict().items() if v is not None}
            found.append(Match(signature, hit[0], groups, dict(context or {})))
    found.sort(key=lambda m: -SEVERITIES.index(m.signature.severity))
    return found


def match_first(text: str, **kwargs: Any) -> Match | None:
    found = match_all(text, **kwargs)
    return found[0] if found else None


def _read(path: Path) -> list[Signature]:
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SignatureError(f"{path.name}: {exc}") from None
    return [_signature(path.name, i, raw) for i, raw in enumerate(document.get("signature", []))]


def _signature(file: str, index: int, raw: Mapping[str, Any]) -> Signature:
    where = f"{file}: signature[{index}] ({raw.get('id', '?')})"
    try:
        signature = Signature(
            id=raw["id"],
            component=raw["component"],
            stages=tuple(raw["stages"]),
            severity=raw["severity"],
            patterns=tuple(re.compile(p, re.MULTILINE) for p in raw["patterns"]),
            cause=raw["cause"].strip(),
            fix=raw["fix"].strip(),
            commands=tuple(raw.get("commands", ())),
            source=raw.get("source", ""),
            examples=tuple(raw.get("examples", ())),
        )
    except KeyError as exc:
        raise SignatureError(f"{where}: missing {exc}") from None
    except re.error as exc:
        raise SignatureError(f"{where}: bad pattern: {exc}") from None
    unknown = set(raw) - {"id", "component", "stages", "severity", "patterns", "cause", "fix", "commands", "source", "examples"}
    problems = [f"unknown keys {sorted(unknown)}"] if unknown else []
    if signature.severity not in SEVERITIES:
        problems.append(f"severity must be one of {SEVERITIES}")
    if not set(signature.stages) <= set(STAGES) or not signature.stages:
        problems.append(f"stages must be among {STAGES}")
    if signature.component not in COMPONENTS:
        problems.append(f"component must be one of {COMPONENTS}")
    if not signature.patterns:
        problems.append("needs at least one pattern")
    if problems:
        raise SignatureError(f"{where}: {'; '.join(problems)}")
    return signature


class _Keep(dict):  # type: ignore[type-arg]
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def _format(template: str, values: Mapping[str, str]) -> str:
    """Fill ``{name}`` fields that are known; leave the others as written.

    >>> _format("{lib} needs CUDA {major}; {other}", {"lib": "libcudart.so.12", "major": "12"})
    'libcudart.so.12 needs CUDA 12; {other}'
    """
    try:
        return string.Formatter().vformat(template, (), _Keep(values))
    except (ValueError, IndexError):
        return template


@dataclass(frozen=True)
class Finding:
    """A signature found in a stream of lines, where it was first seen and how often."""

    match: Match
    source: str
    line: int  #: 1-based number of the line where the event ended
    lines: tuple[str, ...]  #: the lines that matched (the whole event for multi-line ones)
    count: int = 1

    @property
    def signature(self) -> Signature:
        return self.match.signature


class Scanner:
    """Match signatures against a stream of lines, keeping a small window so that a traceback
    spread over several lines is matched as one event. Each signature is reported once, at its
    first occurrence, with a count of the lines where it appeared again.
    """

    WINDOW = 12

    def __init__(self, *, stage: str | None = None, context: Mapping[str, str] | None = None, signatures: Iterable[Signature] | None = None, source: str = "") -> None:
        chosen = load() if signatures is None else tuple(signatures)
        self.signatures = tuple(s for s in chosen if stage is None or stage in s.stages)
        self.context = dict(context or {})
        self.source = source
        self.number = 0
        self._window: list[str] = []
        self._found: dict[str, Finding] = {}

    def feed(self, line: str) -> list[Finding]:
        """Scan one more line; return the signatures seen for the first time."""
        self.number += 1
        line = line.rstrip("\n")
        self._window = [*self._window[-(self.WINDOW - 1):], line]
        text = "\n".join(self._window)
        last_line_starts = len(text) - len(line)
        new = []
        for signature in self.signatures:
            hit = signature.search(text) if _multiline(signature) else signature.search(line)
            # An event counts on the line where it ends, so a traceback held in the window for
            # a few more lines is not counted again.
            if hit is None or (_multiline(signature) and hit.end() < last_line_starts):
                continue
            finding = self._record(signature, hit)
            if finding is not None:
                new.append(finding)
        return new

    def feed_text(self, text: str) -> list[Finding]:
        found = []
        for line in text.splitlines():
            found.extend(self.feed(line))
        return found

    @property
    def findings(self) -> list[Finding]:
        """Everything found so far, most severe first, then in order of appearance."""
        return sorted(self._found.values(), key=lambda f: (-SEVERITIES.index(f.signature.severity), f.line))

    def _record(self, signature: Signature, hit: re.Match[str]) -> Finding | None:
        previous = self._found.get(signature.id)
        if previous is not None:
            self._found[signature.id] = dataclasses.replace(previous, count=previous.count + 1)
            return None
        groups = {k: v for k, v in hit.groupdict().items() if v is not None}
        lines = tuple(hit[0].splitlines()) or (self._window[-1],)
        finding = Finding(Match(signature, hit[0], groups, self.context), self.source, self.number, lines)
        self._found[signature.id] = finding
        return finding


def _multiline(signature: Signature) -> bool:
    return any(p.flags & re.DOTALL or "\\n" in p.pattern for p in signature.patterns)
