"""Finding signatures in text: whole texts (:func:`match_all`) and streams of any size (:class:`Scanner`).

The scanner reads large blocks of bytes and finds the few lines that hold a signature's
prefilter key without looking at the others in Python: each block is translated so that every
key's anchor byte (its rarest, see :func:`_anchor`) reads as NUL, and one expression that starts
with NUL (the rest of each key after its anchor, as a trie) is searched there: ``re`` looks for
a pattern's literal first byte in a tight loop, where an expression starting with a set of
characters (the keys as they are) costs it several times more per byte. A line it stops on is
checked against the keys themselves; only the lines that hold one are decoded and tried
against the full patterns. A multi-line event (a traceback) is
matched over the window of lines that ends on its key's line; a resolver report that follows
its first line is collected forward. Signatures that describe the end of a log (a hang) are
judged once the stream is finished.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import string
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterable, Mapping

from stackgate.models.finding import Evidence, Finding, Fix
from stackgate.models.knowledge import Signature, context_defaults, rank
from stackgate.scan.events import GENERIC_KEYS, Events
from stackgate.scan.extract import COMPONENT, DROP, EXTRACTORS
from stackgate.scan.kernel import KERNEL_KEYS, KernelLines
from stackgate.scan.keys import COMMONNESS, load, ready, required_literals

__all__ = ["EVIDENCE_LINE", "Scanner", "make_finding", "match_all", "match_first", "rank"]

#: An extractor that returns DROP_KEY (with any value) says the match is not the failure after
#: all (an installer line of a package at the version the lock wants): it is dropped. One that
#: returns COMPONENT_KEY names the component the event belongs to (a kernel assert's file names
#: DeepGEMM or flashinfer), overriding the signature's own.
DROP_KEY, COMPONENT_KEY = DROP, COMPONENT

_CHUNK = 8 << 20  #: bytes read at a time from a file
_TAIL = 64 << 10  #: bytes of the log's end kept to judge ``at_end`` signatures
_LONG_LINE = 1 << 20  #: a "line" longer than this (a progress bar) is cut, not held forever
EVIDENCE_LINE = 2000  #: characters of a matched line a finding keeps


def make_finding(
    signature: Signature, groups: Mapping[str, str], context: Mapping[str, str], evidence: Evidence
) -> Finding:
    """The finding a signature makes where it matched: its texts with ``{names}`` filled in from
    the context (or its defaults) and the captured ``groups``."""
    values = {**context_defaults(), **dict.fromkeys(signature.group_names, ""), **context, **groups}
    return Finding(
        id=signature.id,
        title=_format(signature.title, values),
        severity=signature.severity,
        component=groups.get(COMPONENT_KEY) or signature.component,
        cause=_format(signature.cause, values),
        fix=Fix(_format(signature.fix, values), tuple(_format(c, values) for c in signature.commands)),
        learned_from=signature.source,
        evidence=evidence,
        references=signature.references,
        values=dict(groups),
        consequence=signature.consequence,
    )


def match_all(
    text: str,
    *,
    stage: str | None = None,
    context: Mapping[str, str] | None = None,
    signatures: Iterable[Signature] | None = None,
    source: str = "",
) -> list[Finding]:
    """Every signature (of a stage, if given) found anywhere in ``text``, most severe first; the
    evidence names ``source`` and the lines where each matched."""
    context = dict(context or {})
    pool = load() if signatures is None else tuple(signatures)
    findings = []
    for signature in pool:
        if stage is not None and stage not in signature.stages:
            continue
        hit = _search_text(signature, text)
        if hit is None:
            continue
        match, event, offset = hit
        start = offset + event.count("\n", 0, match.start()) + 1
        end = offset + event.count("\n", 0, max(match.end() - 1, match.start())) + 1
        evidence = Evidence(
            source, start if signature.after else end, _whole_lines(event, match.start(), match.end()), start
        )
        groups = _groups(signature, match, event[match.start() :] if signature.after else event, context)
        if DROP_KEY not in groups:
            findings.append(make_finding(signature, groups, context, evidence))
    return _unsuperseded(findings, {s.id: s.supersedes for s in pool if s.supersedes})


def _unsuperseded(findings: Iterable[Finding], supersedes: Mapping[str, tuple[str, ...]]) -> list[Finding]:
    """The findings, ranked, less each generic one a more specific one supersedes within
    :attr:`Scanner.WINDOW` lines: one event told twice (torch's "NCCL error ... internal error"
    above NCCL's own reason) is told once, by its specific entry, in a whole text as in a stream."""
    kept = list(findings)
    near = {
        old.id
        for found in kept
        for old in kept
        if old.id in supersedes.get(found.id, ()) and abs(old.evidence.line - found.evidence.line) <= Scanner.WINDOW
    }
    return sorted((f for f in kept if f.id not in near), key=rank)


def match_first(text: str, **kwargs: Any) -> Finding | None:
    """The most severe signature found in ``text`` (see :func:`match_all`), or None."""
    found = match_all(text, **kwargs)
    return found[0] if found else None


def _search_text(signature: Signature, text: str) -> tuple[re.Match[str], str, int] | None:
    """Where a signature matches: (the match, the text it was found in, that text's first line - 1)."""
    if not signature.at_end:
        hit = signature.search(text)
        return (hit, text, 0) if hit is not None else None
    end = _ends_with(signature, text.splitlines())
    return (end[0], end[0].string, end[1]) if end else None


class Scanner:
    """Match signatures against a stream of lines or blocks of bytes.

    Each signature is reported once, at its first occurrence, with a count of the events where
    it appeared again. :meth:`feed` and :meth:`feed_text` take text as it comes (a live log);
    :meth:`feed_bytes` and :meth:`scan_stream` take blocks of any size (a file of hundreds of
    MB is never held whole). Call :meth:`finish` at the end of the stream: it judges the
    signatures that describe how a log ends, and completes events still waiting for lines.
    """

    WINDOW = 12  #: the default lookback, in lines, of a multi-line signature

    def __init__(
        self,
        *,
        stage: str | None = None,
        context: Mapping[str, str] | None = None,
        signatures: Iterable[Signature] | None = None,
        source: str = "",
        never_silent: bool = False,
        kernel: bool = False,
    ) -> None:
        chosen = load() if signatures is None else tuple(s if s.keys else ready(s) for s in signatures)
        self.signatures = tuple(s for s in chosen if stage is None or stage in s.stages)
        self.context = dict(context or {})
        self.source = source
        self.number = 0  #: complete lines read so far
        self.bytes = 0  #: bytes read so far
        #: With ``never_silent``, failures no signature explains (see :mod:`._events`).
        self.events: Events | None = Events(source) if never_silent else None
        self.unrecognized: list[Finding] = []  #: filled by :meth:`finish`
        #: With ``kernel``, the kernel's GPU lines (Xid, NVRM, AER) of this input (see :mod:`.kernel`).
        self.kernel: KernelLines | None = KernelLines() if kernel else None
        self._plan = _plan(self.signatures, never_silent, kernel)
        self._carry = b""  # the last lines of what was scanned, for multi-line lookback
        self._partial = b""  # a line whose end has not arrived yet
        self._tail = b""  # the end of the log, for at_end signatures
        self._pending: list[_Pending] = []
        self._found: dict[str, Finding] = {}
        self._last: dict[str, int] = {}  # the line of each signature's last event
        self._finished = False

    def feed(self, line: str) -> list[Finding]:
        """Scan one more line; return the signatures seen for the first time."""
        return self.feed_bytes(line.rstrip("\n").encode("utf-8", "surrogateescape") + b"\n")

    def feed_text(self, text: str) -> list[Finding]:
        """Scan complete lines of text (a last line without a newline counts as complete)."""
        data = text.encode("utf-8", "surrogateescape")
        return self.feed_bytes(data if data.endswith(b"\n") else data + b"\n")

    def feed_bytes(self, data: bytes) -> list[Finding]:
        """Scan a block of a byte stream; a line cut at the block's end waits for the next one."""
        self.bytes += len(data)
        found, begin = [], 0
        if self._partial:  # complete the line the previous block cut, on its own (no copy of the block)
            newline = data.find(b"\n")
            if newline < 0:
                self._partial += data
                return self._flush_long_line()
            line = self._partial + data[: newline + 1]
            self._partial, begin = b"", newline + 1
            found = self._scan(line, 0, len(line))
        cut = data.rfind(b"\n") + 1
        if cut > begin:
            found.extend(self._scan(data, begin, cut))
        self._partial = data[max(cut, begin) :]
        return found + self._flush_long_line()

    def _flush_long_line(self) -> list[Finding]:
        if len(self._partial) <= _LONG_LINE:
            return []
        line, self._partial = self._partial + b"\n", b""
        return self._scan(line, 0, len(line))

    def scan_stream(self, stream: BinaryIO, chunk: int = _CHUNK) -> list[Finding]:
        """Scan a binary stream to its end, block by block, then :meth:`finish`."""
        found = []
        while True:
            block = stream.read(chunk)
            if not block:
                break
            found.extend(self.feed_bytes(block))
        return found + self.finish()

    def finish(self, *, judge_end: bool = True) -> list[Finding]:
        """The stream has ended: scan a last unterminated line, complete waiting events, judge the end
        (unless ``judge_end`` is False: a log cut short on purpose says nothing by how it ends)."""
        if self._finished:
            return []
        line, self._partial = self._partial + b"\n", b""
        found = self._scan(line, 0, len(line)) if len(line) > 1 else []
        for pending in self._pending:
            found.extend(self._complete(pending))
        self._pending.clear()
        found.extend(self._judge_end() if judge_end else [])
        self._finished = True
        if self.events is not None:
            self.unrecognized = self.events.findings()
        return found

    @property
    def findings(self) -> list[Finding]:
        """Everything found so far: most severe first, causes before consequences, then in order of appearance.
        A generic finding that a more specific one supersedes within :attr:`WINDOW` lines is one event
        told twice (torch's "NCCL error ... unhandled cuda error" above NCCL's own WARN line): it is left out."""
        return _unsuperseded(self._found.values(), {s.id: s.supersedes for s in self.signatures if s.supersedes})

    # -- the scan ------------------------------------------------------------------------------

    def _scan(self, data: bytes, start: int, end: int) -> list[Finding]:
        """Scan the complete lines ``data[start:end]`` (``end`` is just past a newline), in place."""
        found = self._feed_pending(data, start, end) if self._pending else []
        if self.events is not None and self.events.waiting:
            self._follow(data, start, end, self.number + 1)
        plan = self._plan
        position, counted_at, counted = start, start, self.number
        translated = data.translate(plan.table) if plan.search is not None else b""
        while plan.search is not None and plan.keys is not None:
            hit = plan.search.search(translated, position, end)
            if hit is None:
                break
            first = max(data.rfind(b"\n", start, hit.start()) + 1, start)
            last = data.index(b"\n", hit.start(), end)  # keys hold no newline; the region ends with one
            position = last + 1
            if plan.keys.search(data, first, last) is None:
                continue  # the anchor's byte stood for another: no key here
            counted += data.count(b"\n", counted_at, first)
            counted_at = first
            found.extend(self._examine(data, start, end, first, last, counted + 1))
        self.number = counted + data.count(b"\n", counted_at, end)
        self._carry = self._lines_before(data, start, end, self._plan.lookback)
        self._tail = (self._tail + data[max(start, end - _TAIL) : end])[-_TAIL:]
        return found

    def _lines_before(self, data: bytes, start: int, offset: int, count: int) -> bytes:
        """Up to ``count`` complete lines before ``offset``, reaching back into the previous region."""
        if count <= 0:
            return b""
        back, found = _back_lines(data, offset, count, floor=start)
        if found >= count:
            return data[back:offset]
        older, _ = _back_lines(self._carry, len(self._carry), count - found)
        return self._carry[older:] + data[back:offset]

    def _examine(self, data: bytes, start: int, end: int, first: int, last: int, number: int) -> list[Finding]:
        raw = data[first:last]
        line = raw.decode("utf-8", "replace")
        hits: list[tuple[Signature, re.Match[str], str, int]] = []
        for key, entries in self._plan.by_key:
            if key not in raw:
                continue
            for signature, index in entries:
                if any(h[0] is signature for h in hits):
                    continue
                hit = self._try(signature, signature.patterns[index], data, start, end, first, last, line, number)
                if hit is not None:
                    hits.append(hit)
        superseded = {old for h in hits for old in h[0].supersedes}
        found = [f for s, m, text, at in hits if s.id not in superseded for f in self._record(s, m, text, number, at)]
        if self.events is not None and any(key in raw for key in GENERIC_KEYS):
            self.events.see(line, number)
            if self.events.waiting:
                self._follow(data, last + 1, end, number + 1)
        if self.kernel is not None and any(key in raw for key in KERNEL_KEYS) and self.kernel.see(line, number):
            if self.events is not None:
                self.events.explain(number, number)  # a GPU event of the kernel is a known failure
        return found

    def _follow(self, data: bytes, offset: int, end: int, number: int) -> None:
        """Hand the lines from ``offset`` to an open traceback until it has its exception."""
        assert self.events is not None
        while self.events.waiting and offset < end:
            newline = data.find(b"\n", offset, end)
            if newline < 0:
                break
            self.events.follow(data[offset:newline].decode("utf-8", "replace"), number)
            offset, number = newline + 1, number + 1

    def _try(
        self,
        signature: Signature,
        pattern: re.Pattern[str],
        data: bytes,
        start: int,
        end: int,
        first: int,
        last: int,
        line: str,
        number: int,
    ) -> tuple[Signature, re.Match[str], str, int] | None:
        if signature.after:
            rest = _next_lines(data, last + 1, signature.after, end)
            following = rest.decode("utf-8", "replace").splitlines()
            if rest.count(b"\n") < signature.after:  # the event goes on past this region: wait for it
                self._pending.append(
                    _Pending(signature, pattern, number, line, following, signature.after - len(following))
                )
                return None
            return _match_forward(signature, pattern, line, following, number)
        if signature.window > 1:
            before = self._lines_before(data, start, first, signature.window - 1).decode("utf-8", "replace")
            return _match_back(signature, pattern, before, line, number)
        hit = pattern.search(line)
        return (signature, hit, line, number) if hit else None

    def _feed_pending(self, data: bytes, start: int, end: int) -> list[Finding]:
        found, waiting = [], []
        for pending in self._pending:
            more = _next_lines(data, start, pending.missing, end).decode("utf-8", "replace").splitlines()
            pending = dataclasses.replace(
                pending, following=[*pending.following, *more], missing=pending.missing - len(more)
            )
            if pending.missing > 0:
                waiting.append(pending)
            else:
                found.extend(self._complete(pending))
        self._pending = waiting
        return found

    def _complete(self, pending: _Pending) -> list[Finding]:
        hit = _match_forward(pending.signature, pending.pattern, pending.line, pending.following, pending.number)
        return self._record(*hit[:3], pending.number, pending.number) if hit else []

    def _judge_end(self) -> list[Finding]:
        lines = self._tail.decode("utf-8", "replace").split("\n")
        if len(self._tail) >= _TAIL:
            lines = lines[1:]  # the first one is cut
        lines = lines[:-1] if lines and lines[-1] == "" else lines
        ends = [
            (signature, end) for signature in self._plan.at_end if (end := _ends_with(signature, lines)) is not None
        ]
        superseded = {old for signature, _ in ends for old in signature.supersedes}
        if any(f.severity == "fail" for f in self._found.values()):
            superseded |= {signature.id for signature, _ in ends if signature.without_errors}
        found = []
        for signature, (hit, index) in ends:
            if signature.id not in superseded:
                number = self.number - (len(lines) - 1 - index)
                found.extend(self._record(signature, hit, hit.string, number, number))
        return found

    def _record(self, signature: Signature, hit: re.Match[str], text: str, number: int, first: int) -> list[Finding]:
        groups = _groups(signature, hit, text, self.context)
        if DROP_KEY in groups:
            return []
        if self.events is not None and signature.severity == "fail" and not signature.consequence:
            self.events.explain(first, number)  # a consequence (a scheduler died) or a warning explains no failure
        last = self._last.get(signature.id)
        self._last[signature.id] = number
        if last is not None and signature.window > 1 and number - last < signature.window:
            return []  # another line of the same event (a traceback quoting it twice)
        previous = self._found.get(signature.id)
        if previous is not None:
            again = dataclasses.replace(previous.evidence, count=previous.evidence.count + 1)
            self._found[signature.id] = dataclasses.replace(previous, evidence=again)
            return []
        start = first + text.count("\n", 0, hit.start())
        evidence = Evidence(self.source, number, _whole_lines(text, hit.start(), hit.end()), start)
        self._found[signature.id] = finding = make_finding(signature, groups, self.context, evidence)
        return [finding]


@dataclass(frozen=True)
class _Pending:
    """An event whose first line was seen; the lines that follow it are still arriving."""

    signature: Signature
    pattern: re.Pattern[str]
    number: int
    line: str
    following: list[str]
    missing: int


@dataclass(frozen=True)
class _Plan:
    keys: re.Pattern[bytes] | None  #: one expression for every key, None when there is none
    table: bytes  #: bytes.translate table: each key's anchor byte -> NUL (NUL itself -> 1)
    search: re.Pattern[bytes] | None  #: NUL, then the rest of any key after its anchor, translated
    by_key: tuple[tuple[bytes, tuple[tuple[Signature, int], ...]], ...]
    lookback: int  #: lines kept from one block for the next (the longest window)
    at_end: tuple[Signature, ...]


@functools.lru_cache(maxsize=64)
def _plan(signatures: tuple[Signature, ...], generic: bool = False, kernel: bool = False) -> _Plan:
    entries: dict[bytes, list[tuple[Signature, int]]] = {}
    for signature in signatures:
        if signature.at_end:
            continue
        for index, key in enumerate(signature.keys):
            entries.setdefault(key.encode("utf-8"), []).append((signature, index))
    # Specific signatures first, so that one that supersedes a generic one sees it on the same line.
    ordered = tuple((key, tuple(sorted(group, key=lambda e: -len(e[0].supersedes)))) for key, group in entries.items())
    extra = {*(GENERIC_KEYS if generic else ()), *(KERNEL_KEYS if kernel else ())}
    words = sorted({*entries, *extra})
    keys = re.compile(_trie(words)) if words else None
    sought = {_sought(s, i) for s in signatures if not s.at_end for i in range(len(s.keys))}
    table, search = _anchored(sorted({*sought, *extra}))
    lookback = max((s.window - 1 for s in signatures), default=0)
    return _Plan(keys, table, search, ordered, lookback, tuple(s for s in signatures if s.at_end))


def _sought(signature: Signature, index: int) -> bytes:
    """What the translated search looks for on behalf of one pattern: its key or, for a pattern
    matched within one line, whichever literal every match holds has the rarest anchor (a line
    without that literal cannot match, so it need not be looked at; a line found is still
    examined only when it holds a key, as every line that holds one and can match does)."""
    key = signature.keys[index].encode("utf-8")
    if signature.window > 1 or signature.after:
        return key  # an event's key line is the line that holds its key
    literals = [run.encode("utf-8") for run in required_literals(signature.patterns[index]) if len(run) >= 4]
    return max([key, *literals], key=lambda word: (_commonness(word[_anchor(word)]), len(word)))


def _anchored(words: list[bytes]) -> tuple[bytes, re.Pattern[bytes] | None]:
    """The translation table and the expression that find, in translated text, every place one of ``words`` may be.

    Each word's anchor byte reads as NUL in the translated text (a NUL of the text reads as 1, so
    that it starts nothing); so does every other word's anchor byte, which is why a place found
    is only a candidate. A word that is in the text is always found: its translation is in the
    translated text, at the same place.

    >>> table, search = _anchored([b"NCCL WARN", b"undefined symbol: "])
    >>> text = b"NCCL INFO x; NCCL WARN y; undefined symbol: z"
    >>> [text[m.start() : m.end()] for m in search.finditer(text.translate(table))]
    [b'WARN', b'ymbol: ']
    """
    if not words:
        return bytes(range(256)), None
    anchors = {word[_anchor(word)] for word in words}
    table = bytes(0 if byte in anchors else (1 if byte == 0 else byte) for byte in range(256))
    rests = sorted({word.translate(table)[_anchor(word) + 1 :] for word in words})
    return table, re.compile(b"\x00" + _trie(rests))


def _anchor(word: bytes, rest: int = 2) -> int:
    """Where the translated search for ``word`` starts: at its rarest byte that has ``rest``
    bytes after it (a byte near the end would leave the search too little to tell its word apart).

    >>> _anchor(b"NCCL WARN"), _anchor(b"ERROR")
    (5, 1)
    """
    last = max(len(word) - 1 - rest, 0)
    return max(range(last + 1), key=lambda i: (_commonness(word[i]), -i))


def _trie(words: list[bytes]) -> bytes:
    """One expression matching any of ``words``, shaped as a trie so that it branches per character.

    >>> re.fullmatch(_trie([b"NCCL error", b"NCCL WARN", b"Error"]), b"NCCL WARN") is not None
    True
    """
    root: dict = {}
    for word in words:
        node = root
        for byte in word:
            node = node.setdefault(byte, {})
        node[None] = True

    def build(node: dict) -> bytes:
        # The commonest characters first: a position that passes the first-character check
        # then finds its branch at once.
        children = sorted((k for k in node if k is not None), key=_commonness)
        branches = [re.escape(bytes([b])) + build(node[b]) for b in children]
        if not branches:
            return b""
        body = branches[0] if len(branches) == 1 else b"(?:" + b"|".join(branches) + b")"
        if None in node:  # a word ends here: what follows is optional
            return b"(?:" + body + b")?"
        return body

    return build(root)


def _commonness(byte: int) -> int:
    index = COMMONNESS.find(chr(byte))
    return len(COMMONNESS) if index < 0 else index


def _ends_with(signature: Signature, lines: list[str]) -> tuple[re.Match[str], int] | None:
    """The last line matching an ``at_end`` signature, when only allowed lines follow it."""
    for index in range(len(lines) - 1, -1, -1):
        hit = signature.search(lines[index])
        if hit is not None:
            after = [line for line in lines[index + 1 :] if line.strip()]
            only = signature.followed_only_by
            allowed = all(any(p.search(line) for p in only) for line in after) if only else True
            forbidden = any(p.search(line) for p in signature.not_followed_by for line in after)
            context = any(p.search(line) for p in signature.preceded_by for line in lines[:index])
            if signature.preceded_by and not context:
                return None  # no context before it (a pasted excerpt of these lines alone): nothing to judge
            return (hit, index) if allowed and not forbidden else None
    return None


def _match_back(
    signature: Signature, pattern: re.Pattern[str], before: str, line: str, number: int
) -> tuple[Signature, re.Match[str], str, int] | None:
    """A match over the window of lines before ``line`` and ``line``, ending on ``line``."""
    text = before + line
    last_starts = len(before)
    for hit in pattern.finditer(text):
        if hit.end() > last_starts or (hit.end() == last_starts == len(text)):
            return signature, hit, text, number - before.count("\n")
    return None


def _match_forward(
    signature: Signature, pattern: re.Pattern[str], line: str, following: list[str], number: int
) -> tuple[Signature, re.Match[str], str, int] | None:
    """A match over ``line`` and the lines after it, starting on ``line``."""
    text = "\n".join([line, *following])
    hit = pattern.search(text)
    return (signature, hit, text, number) if hit is not None and hit.start() <= len(line) else None


def _groups(signature: Signature, hit: re.Match[str], event: str, context: Mapping[str, str]) -> dict[str, str]:
    groups = {k: v for k, v in hit.groupdict().items() if v is not None}
    if signature.extract:
        groups.update(EXTRACTORS[signature.extract](event, context))
    return groups


def _whole_lines(text: str, start: int, end: int) -> tuple[str, ...]:
    """The complete lines of ``text`` that the span ``start:end`` touches, each cut to
    :data:`EVIDENCE_LINE` characters (a progress bar's megabyte "line" is no evidence).

    >>> _whole_lines("a\\nbad one\\nc", 4, 7)
    ('bad one',)
    """
    first = text.rfind("\n", 0, start) + 1
    last = text.find("\n", max(end - 1, start))
    lines = text[first : len(text) if last < 0 else last].split("\n")
    return tuple(
        line if len(line) <= EVIDENCE_LINE else f"{line[:EVIDENCE_LINE]}... ({len(line) - EVIDENCE_LINE} chars cut)"
        for line in lines
    )


def _back_lines(data: bytes, offset: int, count: int, floor: int = 0) -> tuple[int, int]:
    """The offset of the line ``count`` lines before ``offset`` (a line start), not before ``floor``, and how
    many lines that is."""
    found = 0
    while found < count and offset > floor:
        offset = max(data.rfind(b"\n", floor, offset - 1) + 1, floor)
        found += 1
    return offset, found


def _next_lines(data: bytes, start: int, count: int, end: int | None = None) -> bytes:
    """Up to ``count`` complete lines from ``start`` (newlines included), not past ``end``."""
    end = len(data) if end is None else end
    stop = start
    for _ in range(count):
        newline = data.find(b"\n", stop, end)
        if newline < 0:
            break
        stop = newline + 1
    return data[start:stop]


class _Keep(dict[str, str]):
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
