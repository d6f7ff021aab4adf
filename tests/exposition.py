"""A strict reader of the Prometheus text exposition format (0.0.4), for the tests.

It refuses what node_exporter's textfile collector (and Prometheus' own parser) would refuse,
and a little more that the format's documentation asks for: bad metric or label names, bad
escapes, values that are not Go floats, a TYPE after the family's first sample or given twice,
HELP given twice, a family whose samples are not together, a series given twice, a last line
without its newline.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
FLOAT = re.compile(r"[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|Inf|inf)|NaN")
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")


@dataclass
class Family:
    name: str
    help: str | None = None
    type: str | None = None
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    def value(self, **labels: str) -> float:
        """The one sample whose labels include these."""
        found = [v for have, v in self.samples if all(have.get(k) == want for k, want in labels.items())]
        assert len(found) == 1, f"{self.name}{labels}: {len(found)} samples"
        return found[0]


class ExpositionError(AssertionError):
    pass


def parse(text: str) -> dict[str, Family]:
    if not text.endswith("\n"):
        raise ExpositionError("the last line has no newline")
    families: dict[str, Family] = {}
    closed: set[str] = set()
    current: str | None = None
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for number, line in enumerate(text[:-1].split("\n"), 1):
        where = f"line {number}: {line!r}"
        if not line.strip():
            continue
        if line.startswith("#"):
            _comment(line, families, closed, where)
            continue
        name, labels, value = _sample(line, where)
        family = families.setdefault(name, Family(name))
        if name in closed and current != name:
            raise ExpositionError(f"{where}: the samples of {name} are not together")
        key = (name, tuple(sorted(labels.items())))
        if key in seen:
            raise ExpositionError(f"{where}: series given twice")
        seen.add(key)
        family.samples.append((labels, value))
        if current is not None and current != name:
            closed.add(current)
        current = name
        closed.add(name)
    return families


def _comment(line: str, families: dict[str, Family], closed: set[str], where: str) -> None:
    parts = line.split(" ", 3)
    if len(parts) < 3 or parts[1] not in ("HELP", "TYPE"):
        return  # a plain comment
    kind, name = parts[1], parts[2]
    if not METRIC.fullmatch(name):
        raise ExpositionError(f"{where}: bad metric name {name!r}")
    family = families.setdefault(name, Family(name))
    rest = parts[3] if len(parts) > 3 else ""
    if kind == "HELP":
        if family.help is not None:
            raise ExpositionError(f"{where}: HELP given twice for {name}")
        family.help = _unescape(rest, "\\n", where)
        return
    if family.type is not None:
        raise ExpositionError(f"{where}: TYPE given twice for {name}")
    if family.samples or name in closed:
        raise ExpositionError(f"{where}: TYPE after the first sample of {name}")
    if rest not in TYPES:
        raise ExpositionError(f"{where}: unknown type {rest!r}")
    family.type = rest


def _sample(line: str, where: str) -> tuple[str, dict[str, str], float]:
    match = METRIC.match(line)
    if not match:
        raise ExpositionError(f"{where}: bad metric name")
    name, rest = match[0], line[match.end() :]
    labels: dict[str, str] = {}
    if rest.startswith("{"):
        labels, rest = _labels(rest[1:], where)
    if not rest.startswith(" "):
        raise ExpositionError(f"{where}: no space before the value")
    fields = rest.strip(" ").split(" ")
    if len(fields) not in (1, 2) or not FLOAT.fullmatch(fields[0]):
        raise ExpositionError(f"{where}: bad value {rest.strip()!r}")
    if len(fields) == 2 and not re.fullmatch(r"-?\d+", fields[1]):
        raise ExpositionError(f"{where}: bad timestamp")
    text = fields[0]
    value = math.nan if text == "NaN" else float(text.replace("Inf", "inf"))
    return name, labels, value


def _labels(text: str, where: str) -> tuple[dict[str, str], str]:
    labels: dict[str, str] = {}
    while True:
        if text.startswith("}"):
            return labels, text[1:]
        match = LABEL.match(text)
        if not match or text[match.end() : match.end() + 2] != '="':
            raise ExpositionError(f"{where}: bad label at {text[:20]!r}")
        name = match[0]
        if name in labels:
            raise ExpositionError(f"{where}: label {name} given twice")
        value, text = _quoted(text[match.end() + 2 :], where)
        labels[name] = value
        if text.startswith(","):
            text = text[1:]
        elif not text.startswith("}"):
            raise ExpositionError(f"{where}: expected , or }} after label {name}")


def _quoted(text: str, where: str) -> tuple[str, str]:
    out = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == '"':
            return "".join(out), text[i + 1 :]
        if ch == "\n":
            raise ExpositionError(f"{where}: raw newline in a label value")
        if ch == "\\":
            nxt = text[i + 1 : i + 2]
            if nxt not in ("\\", '"', "n"):
                raise ExpositionError(f"{where}: bad escape \\{nxt}")
            out.append("\n" if nxt == "n" else nxt)
            i += 2
            continue
        out.append(ch)
        i += 1
    raise ExpositionError(f"{where}: unterminated label value")


def _unescape(text: str, allowed: str, where: str) -> str:
    out = []
    i = 0
    while i < len(text):
        if text[i] == "\\":
            nxt = text[i + 1 : i + 2]
            if nxt not in allowed:
                raise ExpositionError(f"{where}: bad escape \\{nxt} in HELP")
            out.append("\n" if nxt == "n" else nxt)
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)
