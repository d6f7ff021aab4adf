"""Machine-readable reports of a run: the versioned JSON document and JUnit XML.

Renderers only read results. The console rendering lives in :mod:`stackgate.ui`. Every JSON
document and JUnit file is written with its secrets hidden (:mod:`stackgate.models.redact`), whoever
built it; :func:`redacted` does the same for results on their way to a console.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import socket
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from stackgate import __version__
from stackgate.models.result import Result, Status
from stackgate.models.exitcodes import ExitCode
from stackgate.models.redact import redact, secrets_in

__all__ = ["SCHEMA", "Verdict", "document", "judge", "junit_xml", "redacted", "write_json", "write_junit", "write_text"]

SCHEMA = "stackgate.report/1"


@dataclass(frozen=True)
class Verdict:
    """What a set of results adds up to."""

    exit_code: ExitCode
    counts: Mapping[str, int] = field(default_factory=dict)
    reason: str = ""

    @property
    def passed(self) -> bool:
        return self.exit_code == ExitCode.PASSED


def judge(results: Sequence[Result], *, strict: bool = False) -> Verdict:
    """Failures and errors fail; warnings fail only when strict; nothing checked is not a pass."""
    counts = Counter(r.status.name for r in results)
    tally = {s.name: counts.get(s.name, 0) for s in Status}
    bad = tally["FAIL"] + tally["ERROR"]
    if bad:
        return Verdict(ExitCode.FAILED, tally, f"{bad} check(s) failed")
    if strict and tally["WARN"]:
        return Verdict(ExitCode.FAILED, tally, f"{tally['WARN']} warning(s) with --strict")
    if not results or tally["SKIP"] == len(results):
        return Verdict(ExitCode.FAILED, tally, "nothing was checked: every check was skipped")
    return Verdict(ExitCode.PASSED, tally, "passed")


def document(
    command: str,
    results: Sequence[Result],
    verdict: Verdict,
    *,
    lock: Any = None,
    started: float,
    duration_s: float,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON report: versioned, self-contained, stable for aggregation across a fleet."""
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "command": command,
        "tool": {"name": "stackgate", "version": __version__},
        "host": {"hostname": socket.gethostname(), "platform": platform.platform(), "python": platform.python_version()},
        "lock": {"name": lock.name, "path": str(lock.path), "sha256": lock.sha256} if lock is not None else None,
        "started": _dt.datetime.fromtimestamp(started, _dt.timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(duration_s, 3),
        "results": [r.to_dict() for r in results],
        "counts": dict(verdict.counts),
        "verdict": "passed" if verdict.passed else "failed",
        "reason": verdict.reason,
        "exit_code": int(verdict.exit_code),
    }
    doc.update(extra or {})
    return doc


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
        name=name,
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
    case = ET.Element("testcase", classname=f"stackgate.{result.area}", name=result.check, time=f"{result.duration_s:.3f}")
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


def _clean(text: str) -> str:
    """XML 1.0 cannot carry most control characters; a log line may hold them."""
    return "".join(ch for ch in text if ch in "\t\n\r" or ord(ch) >= 0x20)


def write_json(path: Path | str, doc: Mapping[str, Any]) -> None:
    """The document as strict JSON, its secrets hidden (a report, a kept run).

    A NaN or an infinity fails here, loudly, not later in a reader's parser.
    """
    write_text(path, json.dumps(redact(doc), indent=2, sort_keys=False, allow_nan=False) + "\n")


def write_junit(path: Path | str, suites: Mapping[str, Sequence[Result]], *, strict: bool = False) -> None:
    """JUnit XML of the suites, their results' secrets hidden."""
    hidden = redact({name: [r.to_dict() for r in results] for name, results in suites.items()})
    write_text(path, junit_xml({name: [Result.from_dict(r) for r in results] for name, results in hidden.items()}, strict=strict))


def redacted(results: Sequence[Result], context: Any = None, known: Iterable[str] = ()) -> list[Result]:
    """The results with their secrets hidden, for a console: also each secret found in
    ``context`` (the run's whole document, say, whose command line holds the API key that a
    check's details repeat) and each of ``known``."""
    known = set(known) | (secrets_in(context) if context is not None else set())
    return [Result.from_dict(r) for r in redact([r.to_dict() for r in results], known=known)]


def write_text(path: Path | str, text: str) -> None:
    """Write a report atomically: a reader never sees half a file.

    The temporary file is hidden (a leading dot, no report suffix), so a collector that reads
    a folder (node_exporter's textfile collector reads *.prom) never picks it up; the report
    gets the permissions a plain write would give (mkstemp makes files private to their owner,
    which would hide a root-written report from the collector's own user).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's umask, read without changing it (Linux says it in /proc; setting and
    restoring it would race with other threads creating files)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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
