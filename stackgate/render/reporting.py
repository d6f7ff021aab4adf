"""Machine-readable reports of a run: JUnit XML, and results with their secrets hidden.

Renderers only read results. The versioned JSON document and its verdict are
:mod:`stackgate.models.verdict`; the console rendering lives in :mod:`stackgate.render.ui`. Every
JSON document and JUnit file is written with its secrets hidden (:mod:`stackgate.models.redact`,
:mod:`stackgate.edges.files`), whoever built it; :func:`redacted` does the same for results on
their way to a console.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from stackgate.edges.files import write_text
from stackgate.models.redact import redact, secrets_in
from stackgate.models.result import Result, Status

__all__ = ["counts_line", "junit_text", "junit_xml", "phases_line", "redacted", "write_junit"]


def junit_xml(suites: Mapping[str, Sequence[Result]], *, strict: bool = False) -> str:
    """JUnit XML: one testsuite per name, one testcase per check."""
    root = ET.Element("testsuites", name="stackgate")
    for name, results in suites.items():
        root.append(_suite(name, results, strict))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _suite(name: str, results: Sequence[Result], strict: bool) -> ET.Element:
    counts = Counter(r.status for r in results)
    failures = counts[Status.FAIL] + (counts[Status.WARN] if strict else 0)
    suite = ET.Element(
        "testsuite",
        name=_clean(name),
        tests=str(len(results)),
        failures=str(failures),
        errors=str(counts[Status.ERROR]),
        skipped=str(counts[Status.SKIP]),
        time=f"{sum(r.duration_s for r in results):.3f}",
    )
    for result in results:
        suite.append(_case(result, strict))
    return suite


def _case(result: Result, strict: bool) -> ET.Element:
    case = ET.Element(
        "testcase",
        classname=_clean(f"stackgate.{result.area}"),
        name=_clean(result.check),
        time=f"{result.duration_s:.3f}",
    )
    body = "\n".join([*result.details, *_fix_lines(result)])
    if result.status == Status.FAIL or (strict and result.status == Status.WARN):
        ET.SubElement(case, "failure", message=_clean(result.summary), type=result.status.name).text = _clean(body)
    elif result.status == Status.ERROR:
        ET.SubElement(case, "error", message=_clean(result.summary)).text = _clean(body)
    elif result.status == Status.SKIP:
        ET.SubElement(case, "skipped", message=_clean(result.summary))
    else:
        ET.SubElement(case, "system-out").text = _clean(f"{result.status.name}: {result.summary}\n{body}".strip())
    return case


def _fix_lines(result: Result) -> list[str]:
    if result.fix is None:
        return []
    return [f"fix: {result.fix.text}", *(f"$ {c}" for c in result.fix.commands)]


#: What XML 1.0 cannot carry (its Char production): most C0 controls, lone surrogates, U+FFFE and
#: U+FFFF. A server's log line may hold any of them; one makes the whole file unparseable.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _clean(text: str) -> str:
    r"""``text`` without what XML 1.0 cannot carry.

    >>> _clean("ok\x1b[2J \ufffe\uffff\udcff end\t")
    'ok[2J  end\t'
    """
    return _NOT_XML.sub("", text)


def write_junit(path: Path | str, suites: Mapping[str, Sequence[Result]], *, strict: bool = False) -> None:
    """JUnit XML of the suites, their results' secrets hidden."""
    write_text(path, junit_text(suites, strict=strict))


def junit_text(suites: Mapping[str, Sequence[Result]], *, strict: bool = False) -> str:
    """JUnit XML of the suites, their results' secrets hidden."""
    hidden = redact({name: [r.to_dict() for r in results] for name, results in suites.items()})
    return junit_xml({name: [Result.from_dict(r) for r in results] for name, results in hidden.items()}, strict=strict)


def redacted(results: Sequence[Result], context: Any = None, known: Iterable[str] = ()) -> list[Result]:
    """The results with their secrets hidden, for a console: also each secret found in
    ``context`` (the run's whole document, say, whose command line holds the API key that a
    check's details repeat) and each of ``known``."""
    known = set(known) | (secrets_in(context) if context is not None else set())
    return [Result.from_dict(r) for r in redact([r.to_dict() for r in results], known=known)]


def counts_line(counts: Mapping[str, int], duration_s: float) -> str:
    """``3 passed, 1 warning, 2 failed in 1.20 s``: the words pytest users read at a glance."""
    words = [("PASS", "passed"), ("WARN", "warning"), ("FAIL", "failed"), ("ERROR", "error"), ("SKIP", "skipped")]
    parts = []
    for key, word in words:
        n = counts.get(key, 0)
        if n or key in ("PASS", "FAIL"):
            plural = "s" if word in ("warning", "error") and n != 1 else ""
            parts.append(f"{n} {word}{plural}")
    return ", ".join(parts) + f" in {duration_s:.2f} s"


def phases_line(phases: Mapping[str, float], total_s: float) -> str:
    """``wall time 12.3 s: static 1.1 s, deep.gpu_work 4.0 s, deep.collective 7.2 s``."""
    parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases.items())
    return f"wall time {total_s:.1f} s: {parts}"
