"""Follow a server's log file: known failures, the start-up phase, evidence lines, the last lines.

The log is read incrementally while the server runs (during start-up and the whole benchmark),
each line going through the shared knowledge base (:class:`stackgate.scan.Scanner`
at the "smoke" stage). tqdm progress bars end their updates with a carriage return, so a ``\\r``
also ends a line here, and a run of such updates keeps only its newest one in the tail. Messages
are matched, never prefixes: SGLang writes ``[time TPn] message`` by default and other forms
with other log settings. What the findings mean for the run is judged in
:mod:`stackgate.checks.smoke.logscan`.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from stackgate.models.engines import ENGINES, Engine
from stackgate.models.finding import Finding
from stackgate.models.redact import redact_text
from stackgate.scan import Scanner

__all__ = ["EXCERPT_CHARS", "LAUNCHING", "PHASES", "READY_LINE", "FlagSighting", "LogWatcher", "excerpt", "phase_rules"]

#: How much of one log line a result quotes: SGLang's server_args line alone is ~9 KB.
EXCERPT_CHARS = 300


def excerpt(line: str, limit: int = EXCERPT_CHARS) -> str:
    """A log line as a result quotes it: its secrets hidden, then at most ``limit`` characters,
    cut after a separator so that no secret is cut in two (a half is no longer recognisable,
    and would be shown), saying how many were cut.

    >>> excerpt("server_args=ServerArgs(model_path='/m', api_key='sk-1', " + "x=1, " * 80 + ")", 60)
    "server_args=ServerArgs(model_path='/m', api_key='<redacted>',... (402 chars cut)"
    """
    line = redact_text(line)
    if len(line) <= limit:
        return line
    cut = max(line.rfind(sep, 0, limit + 1) for sep in " ,;()[]{}") + 1 or limit
    return f"{line[:cut]}... ({len(line) - cut} chars cut)"


#: A start-up phase as the watcher matches it: (message pattern, key, label).
PhaseRule = tuple[re.Pattern[str], str, str]


def phase_rules(engine: Engine) -> tuple[PhaseRule, ...]:
    """An engine's start-up phases, in order, compiled."""
    return tuple((re.compile(p.pattern), p.key, p.label) for p in engine.phases)


#: The start-up phases SGLang 0.5.9's log reveals, in order (the default engine's).
PHASES: tuple[PhaseRule, ...] = phase_rules(ENGINES["sglang"])
#: The phase before the log's first line.
LAUNCHING = "launching"
READY_LINE = ENGINES["sglang"].ready_line
_READ_SIZE = 1 << 20


@dataclass(frozen=True)
class FlagSighting:
    """Where a flag's proof line (its evidence pattern) first appeared in the log, if it did; a finding's
    :class:`~stackgate.models.finding.Evidence` (where a finding was seen) is another thing."""

    flag: str
    pattern: str
    line: int | None = None
    text: str = ""
    declined: str = ""  #: the log line by which the engine turned the path off, if one was seen
    declined_by: str = ""  #: the component that wrote it, and why (the engine's description)

    @property
    def seen(self) -> bool:
        return self.line is not None


class LogWatcher:
    """Reads what a server appended to its log since the last call. Safe to call from two threads."""

    def __init__(
        self,
        path: Path,
        *,
        context: Mapping[str, str] | None = None,
        evidence: Mapping[str, str] | None = None,
        tail: int = 40,
        engine: Engine | None = None,
    ) -> None:
        self.path = path
        self.scanner = Scanner(stage="smoke", context=context, source=str(path))
        self.phase = LAUNCHING  #: the last phase's label, as a person reads it
        self.phase_key = LAUNCHING  #: the last phase's key (PHASES)
        self.reached: set[str] = set()  #: the keys of every phase the log has shown
        self.quiet_since = time.monotonic()  #: when the log last grew (a progress bar's redraw counts)
        self.lines = 0
        self._offset = 0
        self._partial = ""
        self._tail_is_progress = False
        self._tail: deque[str] = deque(maxlen=tail)
        self._patterns = {flag: re.compile(pattern) for flag, pattern in (evidence or {}).items()}
        self._evidence = {flag: FlagSighting(flag, pattern) for flag, pattern in (evidence or {}).items()}
        self._guard = threading.Lock()
        chosen = engine or ENGINES["sglang"]
        self._phases = phase_rules(chosen) if engine is not None else PHASES
        fusion = chosen.fusion_flag if chosen.fusion_flag in self._evidence else ""
        self._declines = [(re.compile(d.pattern), f"{d.component}: {d.why}") for d in chosen.declines] if fusion else []
        self._fusion = fusion

    def poll(self) -> list[Finding]:
        """Read new output; return the findings seen for the first time."""
        with self._guard:
            text = self._read()
            if not text:
                return []
            new: list[Finding] = []
            for line, by_cr in self._split(text):
                new.extend(self._line(line, by_cr))
            return new

    @property
    def findings(self) -> list[Finding]:
        return self.scanner.findings

    @property
    def fatal(self) -> Finding | None:
        """The first failing finding: the server cannot come up (or stay up) after it."""
        errors = [f for f in self.scanner.findings if f.severity == "fail"]
        return min(errors, key=lambda f: f.evidence.line) if errors else None

    @property
    def cause(self) -> Finding | None:
        """The error that best explains a failure: a cause before a consequence (a line that only
        says a worker failed; its traceback, a few lines on, usually names the real error)."""
        errors = [f for f in self.scanner.findings if f.severity == "fail"]
        return errors[0] if errors else None  # findings are ranked: causes before consequences

    def finish(self, *, judge_end: bool = True) -> list[Finding]:
        """The log is complete (the server is gone): read the rest, judge how the log ends (unless
        ``judge_end`` is False: a server stopped while starting ends its log wherever it was)."""
        found = self.poll()
        with self._guard:
            return found + self.scanner.finish(judge_end=judge_end)

    @property
    def evidence(self) -> list[FlagSighting]:
        return list(self._evidence.values())

    def last_lines(self, count: int = 15) -> list[str]:
        return list(self._tail)[-count:]

    def _read(self) -> str:
        try:
            with open(self.path, "rb") as log:
                log.seek(self._offset)
                data = log.read(_READ_SIZE)
        except FileNotFoundError:
            return ""
        if data:
            self.quiet_since = time.monotonic()
        self._offset += len(data)
        return data.decode("utf-8", errors="replace")

    def _split(self, text: str) -> list[tuple[str, bool]]:
        """Complete lines of ``text`` (with the partial line kept from before), and whether each ended with \\r."""
        pieces = re.split(r"(\r\n|\n|\r)", self._partial + text)
        self._partial = pieces.pop()
        return [(pieces[i], pieces[i + 1] == "\r") for i in range(0, len(pieces), 2)]

    def _line(self, line: str, by_cr: bool) -> list[Finding]:
        if by_cr and not line.strip():
            return []  # the empty start of a progress bar's redraw
        self.lines += 1
        if self._tail_is_progress and self._tail:
            self._tail.pop()  # a progress bar's newer state replaces its older one
        self._tail.append(line)
        self._tail_is_progress = by_cr
        self._phase(line)
        for flag, pattern in self._patterns.items():
            if not self._evidence[flag].seen and pattern.search(line):
                self._evidence[flag] = FlagSighting(flag, pattern.pattern, self.lines, line.strip())
        self._declined(line)
        return self.scanner.feed(line)

    def _declined(self, line: str) -> None:
        """Record the first line by which the engine turned its fused path off."""
        item = self._evidence.get(self._fusion)
        if item is None or item.declined:
            return
        for pattern, who in self._declines:
            if pattern.search(line):
                self._evidence[self._fusion] = dataclasses.replace(item, declined=line.strip(), declined_by=who)
                return

    def _phase(self, line: str) -> None:
        for pattern, key, label in self._phases:
            found = pattern.search(line)
            if found:
                self.phase, self.phase_key = label.format(**found.groupdict()), key
                self.reached.add(key)
                return

    def silent_for(self) -> float:
        """Seconds since the log last grew (or since this watcher began, if it never did)."""
        return time.monotonic() - self.quiet_since
