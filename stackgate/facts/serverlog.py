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

import re
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from stackgate.models.finding import Finding
from stackgate.models.redact import redact_text
from stackgate.scan import Scanner

__all__ = ["EXCERPT_CHARS", "LAUNCHING", "PHASES", "READY_LINE", "Evidence", "LogWatcher", "excerpt"]

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


#: The start-up phases SGLang 0.5.9's log reveals, in order (message pattern, key, label).
PHASES: tuple[tuple[re.Pattern[str], str, str], ...] = tuple(
    (re.compile(pattern), key, label)
    for pattern, key, label in (
        (r"server_args=ServerArgs\(", "starting", "starting"),
        (r"Init torch distributed begin", "distributed", "initialising torch.distributed"),
        (r"Load weight begin", "weights", "loading weights"),
        (r"Loading \w+ checkpoint shards:\s*(?P<pct>\d+)%", "weights", "loading weights ({pct}%)"),
        (r"Load weight end", "loaded", "weights loaded"),
        (r"KV Cache is allocated|Memory pool end", "kv_cache", "allocating the KV cache"),
        (r"Capture (?:cuda|cpu|npu) graph begin|Capturing batches", "graphs", "capturing CUDA graphs"),
        (r"Capture (?:cuda|cpu|npu) graph end", "graphs_done", "CUDA graphs captured"),
        (r"Uvicorn running on", "listening", "HTTP up, warming up"),
        (r"The server is fired up and ready to roll!", "ready", "ready"),
    )
)
#: The phase before the log's first line.
LAUNCHING = "launching"
READY_LINE = "The server is fired up and ready to roll!"
_READ_SIZE = 1 << 20


@dataclass(frozen=True)
class Evidence:
    """Where a flag's evidence pattern first appeared in the log, if it did."""

    flag: str
    pattern: str
    line: int | None = None
    text: str = ""

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
        self._evidence = {flag: Evidence(flag, pattern) for flag, pattern in (evidence or {}).items()}
        self._guard = threading.Lock()

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
        """The first error-severity finding: the server cannot come up (or stay up) after it."""
        errors = [f for f in self.scanner.findings if f.severity == "error"]
        return min(errors, key=lambda f: f.evidence.line) if errors else None

    @property
    def cause(self) -> Finding | None:
        """The error that best explains a failure: a cause before a consequence (a line that only
        says a worker failed; its traceback, a few lines on, usually names the real error)."""
        errors = [f for f in self.scanner.findings if f.severity == "error"]
        return errors[0] if errors else None  # findings are ranked: causes before consequences

    def finish(self, *, judge_end: bool = True) -> list[Finding]:
        """The log is complete (the server is gone): read the rest, judge how the log ends (unless
        ``judge_end`` is False: a server stopped while starting ends its log wherever it was)."""
        found = self.poll()
        with self._guard:
            return found + self.scanner.finish(judge_end=judge_end)

    @property
    def evidence(self) -> list[Evidence]:
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
                self._evidence[flag] = Evidence(flag, pattern.pattern, self.lines, line.strip())
        return self.scanner.feed(line)

    def _phase(self, line: str) -> None:
        for pattern, key, label in PHASES:
            found = pattern.search(line)
            if found:
                self.phase, self.phase_key = label.format(**found.groupdict()), key
                self.reached.add(key)
                return

    def silent_for(self) -> float:
        """Seconds since the log last grew (or since this watcher began, if it never did)."""
        return time.monotonic() - self.quiet_since
