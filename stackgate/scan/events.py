"""Never silent: failures in a log that no signature explains become ``unrecognized-failure`` findings.

The scanner hands this module every line that looks like a failure whatever its words: a Python
traceback, an ``ERROR`` / ``FATAL`` / ``CRITICAL`` line, an assertion that failed, a non-zero
exit. It also hands it the lines where signatures matched. When the log ends, each failure
event that no recognised finding sits in or next to becomes one ``unrecognized-failure``
finding: its excerpt (a traceback's last exception first), the kind of event and a best guess
of the component, read from the traceback's frames or the line's words. Events of the same
text are one finding with a count; a log with millions of error lines keeps the first
:data:`MAX_EVENTS` apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from stackgate.models.finding import Evidence, Finding, Fix

__all__ = ["GENERIC_KEYS", "ID", "MAX_EVENTS", "Event", "Events", "guess_component"]

ID = "unrecognized-failure"
MAX_EVENTS = 2000  #: failure events held apart at most (more are counted, not kept)
NEAR = 3  #: lines between a failure event and a recognised finding that still count as one event
TRACEBACK_LINES = 120  #: lines after a traceback's header searched for its exception
EXCERPT_LINES = 14

#: The literals the prefilter looks for on behalf of this module.
#: (the scan looks for each at its rarest byte, as for every key: see ``scanner._anchor``)
#: Each has a rare byte to be sought at: a lone lowercase "error" does not (every 'o' would be a
#: stop), so the lowercase forms are sought through the words that go with them (fatal, ptxas, CUDA).
GENERIC_KEYS = (
    b"Traceback (most recent call last)",
    b"ERROR",
    b"FATAL",
    b"CRITICAL",
    b"Assertion",
    b"xit code",
    b"xitcode",
    b"xit status",
    b"xited with",
    b"Error",
    b"Exception",
    b'File "',
    b"NCCL WARN",
    b"Failed to ",
    b"failed to ",
    b"failure",
    b"has failed",
    b"fatal",
    b"ptxas",
    b"CUDA error",
    b"CUDA Error",
    b"cudaError",
    b"CUBLAS_STATUS_",
    b"cuBLAS error",
    b"cannot open shared object",
    b"failed to open",
    b"Segmentation fault",
    b"core dumped",
    b"Check failed",
    b"terminate called",
    b"not found (required",
    b"] [E] ",
    b"Cannot ",
    b": error: ",
)

_TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
_LEVEL = re.compile(r"(?<![A-Za-z_])(?:ERROR|FATAL|CRITICAL)(?![A-Za-z_])")
_ASSERT = re.compile(r"Assertion\b[^\n]*\bfailed|Assertion (?:error|failed)\b|AssertionError")
_EXIT = re.compile(r"(?:exit(?:ed)?(?: with)? (?:code|status)|exitcode)\s*[:=]?\s*(?P<code>-?[1-9]\d*)")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure|Fault)\b(?::|$)")
#: An exception named anywhere a person pastes one: bare, after a log prefix, a pytest "E   ", "[rank0]: ".
_RAISED = re.compile(r"(?:^|[\s\]>):|(])(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)\b(?:\([\w.]*\))?(?::|$)")
_FRAME_LINE = re.compile(r'^\s*File "[^"\n]+", line \d+')  #: a traceback's frame, with or without its header
#: Lines a person calls an error whatever the tool: installers, compilers, NCCL, CUDA, the C++ runtime, crashes.
_FAILED = re.compile(
    r"\bNCCL WARN\b|\b[Ff]ailed to \w|\bfailure\b(?!s?=0)|\bFAILED\b|\bhas failed\b"
    r"|\bfatal(?: error)?\s*:|\b(?:ptxas|nvcc)\b[^\n]*\b(?:fatal|error)\b|\bCUDA[ _](?:[Ee]rror|ERROR)"
    r"|\bcudaError\w+|CUBLAS_STATUS_(?!SUCCESS)|cuBLAS error|cannot open shared object|failed to open"
    r"|Segmentation fault|core dumped|Check failed|terminate called after throwing"
    r"|not found \(required by|\berror=\"[^\"]|\] \[E\] |\b[Cc]annot (?:find|load|open|allocate|access"
    r"|connect)\b|\b[Ee]rror\s*:\s*(?!0\b|None\b|none\b|null\b|\[\])\S"
)
#: Lines that only report, whatever words they hold: NCCL's INFO (it logs optional plugins it did not find),
#: a failure the tool says it recovers from, lines logged at WARNING (or glog's I1128/W1128 levels), and git
#: saying a folder is no checkout (version probes print it on healthy starts).
_REPORT = re.compile(
    r"\bNCCL INFO\b|\b(?:continuing|skipping|ignoring|falling back|will retry)\b"
    r"|^[IW]\d{4} \d\d:\d\d:\d\d\.\d+ |\bWARNING\b|fatal: not a git repository"
)
_FRAME = re.compile(r"(?:site|dist)-packages/(?P<package>[A-Za-z_][\w]*)/")
_PACKAGES = {
    "sglang": "sglang",
    "sgl_kernel": "sgl-kernel",
    "flashinfer": "flashinfer",
    "torch": "torch",
    "triton": "triton",
    "deep_gemm": "deepgemm",
    "nccl": "nccl",
    "pip": "installer",
    "uv": "installer",
    "transformers": "sglang",
    "vllm": "vllm",
}
_WORDS = (
    (re.compile(r"nvidia-container|could not select device driver|OCI runtime|\bdocker\b"), "container runtime"),
    (re.compile(r"\bNVRM\b|\bXid\b|NVIDIA-SMI|\bNVML\b|nvidia-smi|fabric ?manager", re.I), "driver"),
    (re.compile(r"\bray\b|raylet|\bRay(?:Task|Actor)"), "ray"),
    (re.compile(r"TensorRT|\bTRT\b|tensorrt_llm"), "tensorrt-llm"),
    (re.compile(r"\bvllm\b|EngineCore"), "vllm"),
    (re.compile(r"\bptxas\b|\bnvcc\b|\bnvrtc\b"), "cuda toolkit"),
    (re.compile(r"\bNCCL\b|\bnccl"), "nccl"),
    (re.compile(r"\bflashinfer\b", re.I), "flashinfer"),
    (re.compile(r"sgl[_-]kernel"), "sgl-kernel"),
    (re.compile(r"\btriton\b", re.I), "triton"),
    (re.compile(r"deep_?gemm", re.I), "deepgemm"),
    (re.compile(r"\bsglang\b|\bTP\d+\]"), "sglang"),
    (re.compile(r"\bpip\b|\buv\b|Collecting |resolv"), "installer"),
    (re.compile(r"\bCUDA\b|\bcuda"), "cuda toolkit"),
    (re.compile(r"\btorch\b"), "torch"),
)


@dataclass
class Event:
    """One failure event: where it starts and ends, what kind it is, its lines."""

    kind: str  #: "traceback", "error line", "assertion", "non-zero exit"
    start: int
    end: int
    lines: list[str]
    open_for: int = 0  #: lines a traceback still waits for (its exception may come later)
    headline: str = ""


@dataclass
class Events:
    """The failure events of one input and the lines recognised findings explain."""

    source: str = ""
    events: list[Event] = field(default_factory=list)
    explained: list[tuple[int, int]] = field(default_factory=list)
    dropped: int = 0

    def see(self, line: str, number: int) -> None:
        """A line that holds a generic key: note the event it starts, if any."""
        last = self.events[-1] if self.events else None
        if last is not None and last.kind == "traceback" and (last.open_for or number <= last.end):
            return  # a line of a traceback: the traceback holds it
        kind = _kind(line)
        if kind is None:
            return
        if last is not None and kind == last.kind != "traceback" and number - last.end <= 2:
            last.end, last.lines = number, [*last.lines, line][: EXCERPT_LINES * 2]
            return
        if len(self.events) >= MAX_EVENTS:
            self.dropped += 1
            return
        self.events.append(Event(kind, number, number, [line], TRACEBACK_LINES if kind == "traceback" else 0))

    def follow(self, line: str, number: int) -> None:
        """A line that follows an open traceback: collect it until the traceback's exception."""
        event = self.events[-1]
        event.lines.append(line)
        event.end, event.open_for = number, event.open_for - 1
        prefix = _prefix(event.lines[0])
        text = line[len(prefix) :] if prefix and line.startswith(prefix) else line
        if _EXCEPTION.match(text.strip()) and not text.startswith((" ", "\t")):
            event.headline = text.strip()
            event.open_for = 0  # a chained traceback starts again with its own header

    @property
    def waiting(self) -> bool:
        return bool(self.events) and self.events[-1].open_for > 0

    def explain(self, first: int, last: int) -> None:
        """Lines ``first..last`` hold a recognised finding."""
        if len(self.explained) < 100_000:
            self.explained.append((first, last))

    def findings(self) -> list[Finding]:
        """One ``unrecognized-failure`` finding per distinct unexplained event, in order of appearance."""
        found: dict[str, Finding] = {}
        for event in self.events:
            if self._is_explained(event):
                continue
            finding = _finding(event, self.source)
            key = re.sub(r"\d+", "N", finding.values["headline"])[:200]
            previous = found.get(key)
            if previous is None:
                found[key] = finding
            else:
                count = previous.evidence.count + 1
                found[key] = Finding(
                    **{**previous.__dict__, "evidence": Evidence(**{**previous.evidence.__dict__, "count": count})}
                )
        return list(found.values())

    def _is_explained(self, event: Event) -> bool:
        return any(first <= event.end + NEAR and last >= event.start - NEAR for first, last in self.explained)


def _kind(line: str) -> str | None:
    if _TRACEBACK.search(line) or _FRAME_LINE.search(line):
        return "traceback"  # a frame without its header starts one too: people paste from the middle
    if _ASSERT.search(line):
        return "assertion"
    if _EXIT.search(line):
        return "non-zero exit"
    if _RAISED.search(line):
        return "exception"
    if _LEVEL.search(line):
        return "error line"
    if _FAILED.search(line) and not _REPORT.search(line):
        return "error line"
    return None


def _prefix(header: str) -> str:
    """What stands before ``Traceback`` on its header line (``[rank0]: ``), repeated on every line."""
    at = header.find("Traceback (most recent call last)")
    return header[:at] if at > 0 else ""


def guess_component(text: str) -> tuple[str, str]:
    """The component an excerpt most likely belongs to, and why.

    >>> guess_component(
    ...     '  File "/x/site-packages/sglang/srt/a.py", line 1\\n  File "/x/site-packages/flashinfer/b.py", line 2'
    ... )
    ('flashinfer', 'its last frame is in flashinfer')
    >>> guess_component("NCCL WARN something odd")
    ('nccl', 'its words name nccl')
    """
    frames = [m["package"] for m in _FRAME.finditer(text) if m["package"] in _PACKAGES]
    if frames:
        return _PACKAGES[frames[-1]], f"its last frame is in {frames[-1]}"
    for pattern, component in _WORDS:
        if pattern.search(text):
            return component, f"its words name {component}"
    return "unknown", "nothing in it names a component"


def _finding(event: Event, source: str) -> Finding:
    headline = event.headline or (event.lines[-1].strip() if event.kind == "traceback" else event.lines[0].strip())
    body = (
        event.lines[: EXCERPT_LINES - 1]
        if len(event.lines) <= EXCERPT_LINES
        else [*event.lines[:4], "...", *event.lines[-(EXCERPT_LINES - 6) :]]
    )
    lines = tuple(body)  # numbered from the event's first line; the last exception leads the title and `headline`
    component, why = guess_component("\n".join(event.lines))
    what = {
        "traceback": "traceback",
        "assertion": "failed assertion",
        "non-zero exit": "non-zero exit",
        "error line": "error line",
        "exception": "exception",
    }[event.kind]
    return Finding(
        id=ID,
        title=f"Unrecognized {what}: {headline[:160]}",
        severity="fail",
        component=component,
        cause=f"No entry of the knowledge base explains this {what}. Best guess of the component: {component} ({why}).",
        fix=Fix(
            "Read the excerpt (a traceback's last exception comes first); if it is a failure of this stack, attach a "
            "support bundle"
            " to an upstream report, and to stackgate's so that an entry can learn it.",
            ("stackgate diagnose --bundle stackgate-bundle.tar.gz",),
        ),
        learned_from="",
        evidence=Evidence(source, event.end if event.headline else event.start, lines, event.start),
        values={"kind": event.kind, "headline": headline[:500], "component_guess": component},
    )
