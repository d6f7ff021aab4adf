"""A finding: a known failure seen in some text, what causes it and what to do about it.

One dataclass and one JSON form wherever a finding appears: the knowledge base's scanner makes
them (:mod:`stackgate.models.knowledge`), and diagnose's report, smoke's log scan (its results and
its sessions), verify's import check, provision's reading of installer output and the gate all
carry them as they are. :class:`Fix` is also what every :class:`~stackgate.models.result.Result`
carries.

The JSON form (:meth:`Finding.to_dict`, read back by :meth:`Finding.from_dict`)::

    {"id": "cuda-out-of-memory", "title": "...", "severity": "fail", "component": "torch",
     "consequence": false, "cause": "...", "fix": {"text": "...", "commands": ["..."]},
     "learned_from": "https://github.com/...", "references": ["..."],
     "evidence": {"file": "server.log", "line": 12, "start_line": 10, "count": 1, "lines": ["..."]},
     "values": {"lib": "libcudart.so.12"}}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["SEVERITIES", "Evidence", "Finding", "FindingError", "Fix", "severity"]

#: A finding's severities, least severe first: the words of a result's status (models/result.py) that a
#: finding can have, so a finding, a check, a kernel event and the health check say one thing one way:
#: ``info`` (a note: it fails nothing), ``warn`` (WARN) and ``fail`` (FAIL).
SEVERITIES = ("info", "warn", "fail")
#: The words documents written before the one vocabulary used (a kept run, an older diagnose report).
_OLD_WORDS = {"warning": "warn", "error": "fail"}


def severity(word: str) -> str:
    """A severity as a document gives it, in :data:`SEVERITIES`' words; :class:`FindingError` for another.

    >>> severity("fail"), severity("error"), severity("warning")
    ('fail', 'fail', 'warn')
    """
    said = _OLD_WORDS.get(word, word)
    if said not in SEVERITIES:
        raise FindingError(f"severity: {word!r} is not one of {', '.join(SEVERITIES)}")
    return said


class FindingError(Exception):
    """A JSON finding that does not have the one form; the message names the key."""


@dataclass(frozen=True)
class Fix:
    """What to do about a finding: a sentence and the commands to paste."""

    text: str
    commands: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "commands": list(self.commands)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Fix:
        """
        >>> Fix.from_dict({"text": "Reinstall.", "commands": ["stackgate provision"]})
        Fix(text='Reinstall.', commands=('stackgate provision',))
        """
        return cls(_text(raw, "text"), _texts(raw, "commands"))


@dataclass(frozen=True)
class Evidence:
    """Where a finding was seen: the input, the numbers of its lines, the lines themselves."""

    file: str  #: the input's name: a log's path, ``<stdin>``, ``import sgl_kernel``
    line: int  #: 1-based number of the line the finding is keyed on (where a traceback ends)
    lines: tuple[str, ...] = ()  #: the lines that matched (the whole event for multi-line ones)
    start_line: int = 0  #: 1-based number of ``lines[0]``; 0 when it is ``line``
    count: int = 1  #: how many events of this kind the input holds

    @property
    def where(self) -> str:
        """``file:line``, ``file:first-last`` for an event over several lines.

        >>> Evidence("server.log", 12, ("a", "b", "c"), 10).where, Evidence("", 3).where
        ('server.log:10-12', '<input>:3')
        """
        first = self.start_line or self.line
        span = f"{first}-{self.line}" if self.line > first else str(first)
        return f"{self.file or '<input>'}:{span}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "start_line": self.start_line,
            "count": self.count,
            "lines": list(self.lines),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Evidence:
        return cls(
            _text(raw, "file"),
            _number(raw, "line"),
            _texts(raw, "lines"),
            _number(raw, "start_line", 0),
            _number(raw, "count", 1),
        )


@dataclass(frozen=True)
class Finding:
    """A known failure seen somewhere: what it is, why it happens, how to fix it, where it was
    learned and where it was seen."""

    id: str
    title: str
    severity: str  #: one of :data:`SEVERITIES`
    component: str  #: sglang, torch, nccl, installer ... (the knowledge base's components)
    cause: str
    fix: Fix
    learned_from: str  #: the public report (or released wheel file) the knowledge comes from
    evidence: Evidence
    references: tuple[str, ...] = ()  #: further reports and fixes of the same failure
    values: Mapping[str, str] = field(default_factory=dict)  #: what the patterns captured
    consequence: bool = False  #: a symptom of another failure: listed after the causes

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "severity": self.severity,
            "component": self.component,
            "consequence": self.consequence,
            "cause": self.cause,
            "fix": self.fix.to_dict(),
            "learned_from": self.learned_from,
            "references": list(self.references),
            "evidence": self.evidence.to_dict(),
            "values": dict(self.values),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Finding:
        """The finding a :meth:`to_dict` wrote; :class:`FindingError` names a missing or bad key."""
        said = severity(_text(raw, "severity"))
        values = raw.get("values", {})
        if not isinstance(values, Mapping) or not all(isinstance(v, str) for v in values.values()):
            raise FindingError("values: not a mapping of names to text")
        return cls(
            id=_text(raw, "id"),
            title=_text(raw, "title"),
            severity=said,
            component=_text(raw, "component"),
            cause=_text(raw, "cause"),
            fix=Fix.from_dict(_mapping(raw, "fix")),
            learned_from=_text(raw, "learned_from"),
            evidence=Evidence.from_dict(_mapping(raw, "evidence")),
            references=_texts(raw, "references"),
            values={str(k): v for k, v in values.items()},
            consequence=raw.get("consequence") is True,
        )


def _mapping(raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = raw.get(key)
    if not isinstance(value, Mapping):
        raise FindingError(f"{key}: missing or not an object")
    return value


def _text(raw: Mapping[str, Any], key: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str):
        raise FindingError(f"{key}: missing or not text")
    return value


def _texts(raw: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = raw.get(key, [])
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise FindingError(f"{key}: not a list of text")
    return tuple(value)


def _number(raw: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise FindingError(f"{key}: missing or not a whole number")
    return value
