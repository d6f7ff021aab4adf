"""The engine's own /metrics: scraped before and after the measured requests, kept with the report.

The body is the Prometheus text exposition format (0.0.4) that prometheus_client writes for
SGLang (``sglang:*`` families, every series labelled with ``model_name``, ``engine_type``,
``tp_rank``, ``pp_rank``) and vLLM (``vllm:*``). It is read strictly and completely before any of
it is kept: a line that is not a comment, a blank or ``name{labels} value [timestamp]`` with a
metric name, label names, quoted label values and a Go-style float as the format defines them
fails the whole scrape with a :class:`MetricsError` that names the URL, the line number and what
is wrong; so does a body that is not UTF-8, larger than :data:`MAX_BYTES` or with more than
:data:`MAX_SERIES` series. A server's metrics are its own account of the run (speculative
acceptance, token counters), so a body that cannot be read is reported, never half-used.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Any

from stackgate.edges import httpclient
from stackgate.models.printable import printable

__all__ = ["MAX_BYTES", "MAX_SERIES", "MetricsError", "Scrape", "Series", "parse", "scrape"]

#: The largest body read: a real SGLang server's exposition is tens of KiB.
MAX_BYTES = 8 * 2**20
#: The most series kept from one scrape.
MAX_SERIES = 50_000

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\\n]|\\[\\"n])*)"\s*(,|(?=}))')
_FLOAT = re.compile(r"[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|Inf|inf)|NaN")
_TIMESTAMP = re.compile(r"-?\d+")
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


class MetricsError(ValueError):
    """A /metrics answer that is not the text exposition format."""


@dataclass(frozen=True)
class Series:
    """One sample line: a metric name, its labels and its value."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def to_dict(self) -> dict[str, Any]:
        value: Any = self.value if math.isfinite(self.value) else str(self.value)
        return {"name": self.name, "labels": dict(self.labels), "value": value}


@dataclass(frozen=True)
class Scrape:
    """One answer of the metrics endpoint, read whole."""

    url: str
    at: float  #: time.time() when the answer was in
    types: tuple[tuple[str, str], ...]  #: (family, TYPE) as declared
    series: tuple[Series, ...]

    def values(self, name: str) -> list[float]:
        """Every finite value of the series called ``name`` (one per label set)."""
        return [s.value for s in self.series if s.name == name and math.isfinite(s.value)]

    def total(self, name: str) -> float | None:
        """The sum over ``name``'s series (a counter over ranks), None where it has none."""
        values = self.values(name)
        return sum(values) if values else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "at": round(self.at, 3),
            "types": dict(self.types),
            "series": [s.to_dict() for s in self.series],
        }


def scrape(base_url: str, path: str, *, api_key: str | None = None, timeout_s: float = 10.0) -> Scrape:
    """GET ``path`` and read it; raises :class:`MetricsError` (or :class:`httpclient.HttpError`)."""
    url = f"{base_url}{path}"
    answer = httpclient.request("GET", url, timeout_s=timeout_s, headers=httpclient.bearer(api_key))
    if answer.status != 200:
        raise httpclient.HttpError("status", f"{url}: HTTP {answer.status}", answer.status, answer.body)
    if len(answer.body) > MAX_BYTES:
        raise MetricsError(f"{url}: the body is {len(answer.body)} bytes, more than the {MAX_BYTES} read")
    try:
        text = answer.body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MetricsError(f"{url}: the body is not UTF-8 (byte {exc.start})") from None
    types, series = parse(text, url)
    return Scrape(url, time.time(), types, series)


def parse(text: str, source: str = "/metrics") -> tuple[tuple[tuple[str, str], ...], tuple[Series, ...]]:
    """The declared types and the series of an exposition; raises :class:`MetricsError`.

    >>> types, series = parse('# TYPE sglang:spec_accept_length gauge\\nsglang:spec_accept_length{tp_rank="0"} 3.2\\n')
    >>> types, series[0].value, series[0].labels
    ((('sglang:spec_accept_length', 'gauge'),), 3.2, (('tp_rank', '0'),))
    >>> parse("sglang:x{a=1} 2\\n")
    Traceback (most recent call last):
    ...
    stackgate.serve.metrics.MetricsError: /metrics: line 1: a label is not name="value": 'sglang:x{a=1} 2'
    """
    types: dict[str, str] = {}
    series: list[Series] = []
    for number, line in enumerate(text.split("\n"), 1):
        stripped = line.strip()
        if not stripped:
            continue
        try:
            if stripped.startswith("#"):
                _comment(stripped, types)
            else:
                series.append(_sample(stripped))
        except MetricsError as exc:
            shown = printable(stripped if len(stripped) <= 80 else stripped[:77] + "...")
            raise MetricsError(f"{source}: line {number}: {exc}: {shown!r}") from None
        if len(series) > MAX_SERIES:
            raise MetricsError(f"{source}: more than {MAX_SERIES} series")
    return tuple(types.items()), tuple(series)


def _comment(line: str, types: dict[str, str]) -> None:
    words = line[1:].split(None, 3)
    if len(words) < 2 or words[0] not in ("HELP", "TYPE"):
        return  # an ordinary comment
    if not _NAME.fullmatch(words[1]):
        raise MetricsError(f"{words[0]} names no valid metric")
    if words[0] == "TYPE":
        kind = words[2] if len(words) > 2 else ""
        if kind not in ("counter", "gauge", "histogram", "summary", "untyped") or len(words) > 3:
            raise MetricsError("TYPE is not counter, gauge, histogram, summary or untyped")
        types[words[1]] = kind


def _sample(line: str) -> Series:
    name = _NAME.match(line)
    if name is None:
        raise MetricsError("a sample does not start with a metric name")
    rest = line[name.end() :]
    labels: list[tuple[str, str]] = []
    if rest.startswith("{"):
        at = 1
        while not rest[at:].lstrip().startswith("}"):
            label = _LABEL.match(rest, at)
            if label is None:
                raise MetricsError('a label is not name="value"')
            value = re.sub(r"\\[\\\"n]", lambda m: _UNESCAPE[m[0]], label[2])
            labels.append((label[1], value))
            at = label.end()
        rest = rest[at:].lstrip()[1:]
    words = rest.split()
    if not words or len(words) > 2 or (rest and not rest[0].isspace()):
        raise MetricsError("a sample is not name{labels} value [timestamp]")
    if not _FLOAT.fullmatch(words[0]):
        raise MetricsError(f"{words[0][:20]!r} is not a number")
    if len(words) == 2 and not _TIMESTAMP.fullmatch(words[1]):
        raise MetricsError(f"{words[1][:20]!r} is not a timestamp")
    return Series(name[0], tuple(labels), float(words[0]))
