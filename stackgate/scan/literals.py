"""The literal text every match of a regular expression contains, read off the pattern's source.

The scanner's prefilter looks for one literal per pattern (see :func:`required_literals`); a
line without it cannot match, so only the few lines that hold one are tried against the full
patterns. This is a small reader of the pattern language of :mod:`re` written for that one
purpose, so that the knowledge base does not lean on CPython's private parser (``re._parser``,
which may change in any release). It is conservative: whatever it cannot prove every match
contains (a character class, an optional part, an alternation, an escape it does not know)
ends a run of literal text; a run it returns is always part of every match.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LiteralError", "required_literals"]

_CLASS_ESCAPES = set("dDsSwW")  #: escapes that stand for a set of characters
_ZERO_WIDTH_ESCAPES = set("bBAZ")  #: escapes that match a position, not a character
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


class LiteralError(ValueError):
    """A pattern this reader cannot follow (unbalanced parentheses or brackets)."""


@dataclass(frozen=True)
class _Item:
    kind: str  #: "char" (a literal character), "zero" (a position), "group" (a sequence), "other"
    char: str = ""
    items: tuple[_Item, ...] | None = None  #: a group's sequence; None when it may vary (alternation)
    least: int = 1  #: the fewest times the item must appear (its quantifier's minimum)
    repeats: bool = False  #: it may appear more than once


def required_literals(source: str) -> list[str]:
    """The runs of literal characters that every match of ``source`` contains, in order.

    >>> required_literals(r"NCCL error in: (?P<where>\\S+), (?P<what>[a-z ]+)")
    ['NCCL error in: ', ', ']
    >>> required_literals(r"lib(?:cudart|nvrtc)\\.so\\.(?P<major>\\d+): cannot open")
    ['lib', '.so.', ': cannot open']
    >>> required_literals(r"ab?c+d{0,2}e")
    ['a', 'c', 'e']
    """
    items, end = _sequence(source, 0)
    if end != len(source):
        raise LiteralError(f"unbalanced ')' at {end} in {source!r}")
    runs: list[str] = []
    current: list[str] = []

    def cut() -> None:
        if current:
            runs.append("".join(current))
            current.clear()

    def walk(sequence: tuple[_Item, ...]) -> None:
        for item in sequence:
            if item.least == 0:
                cut()  # an optional part: nothing of it is certain, and it separates its neighbours
            elif item.kind == "zero":
                continue
            elif item.kind == "char" and item.char != "\n":
                current.append(item.char)
                if item.repeats:
                    cut()
            elif item.kind == "group" and item.items is not None:
                walk(item.items)
                if item.repeats:
                    cut()
            else:
                cut()

    walk(tuple(items))
    cut()
    return runs


def _sequence(source: str, start: int) -> tuple[list[_Item], int]:
    """The items from ``start`` to the end of the enclosing group; ``None`` items for alternation."""
    items: list[_Item] = []
    i = start
    while i < len(source):
        ch = source[i]
        if ch == ")":
            return items, i
        if ch == "|":
            # An alternation: no single sequence is certain. Skip to the group's end.
            close = _group_end(source, i)
            return [_Item("group", items=None)], close
        item, i = _atom(source, i)
        item, i = _quantified(source, i, item)
        items.append(item)
    return items, i


def _atom(source: str, i: int) -> tuple[_Item, int]:
    ch = source[i]
    if ch == "\\":
        return _escape(source, i)
    if ch == "[":
        return _Item("other"), _class_end(source, i)
    if ch == "(":
        return _group(source, i)
    if ch in "^$":
        return _Item("zero"), i + 1
    if ch == ".":
        return _Item("other"), i + 1
    return _Item("char", ch), i + 1


def _escape(source: str, i: int) -> tuple[_Item, int]:
    if i + 1 >= len(source):
        raise LiteralError(f"a trailing backslash in {source!r}")
    ch = source[i + 1]
    if ch in _ZERO_WIDTH_ESCAPES:
        return _Item("zero"), i + 2
    if ch in _CLASS_ESCAPES or ch.isdigit():
        return _Item("other"), i + 2 + (ch == "0") * 2  # \0oo: an octal character, taken as unknown
    if ch in _HEX_ESCAPES:
        return _Item("other"), i + 2 + _HEX_ESCAPES[ch]
    if ch == "N":
        return _Item("other"), source.index("}", i) + 1
    if ch.isalpha():
        return _Item("other"), i + 2  # \n, \t and the like: not worth proving, never in a key
    return _Item("char", ch), i + 2


def _group(source: str, i: int) -> tuple[_Item, int]:
    """A parenthesised group: its own sequence when it is a plain or named one."""
    head = source[i + 1 : i + 4]
    if head.startswith("?#"):
        return _Item("zero"), source.index(")", i) + 1
    if head.startswith(("?=", "?!", "?<=", "?<!")) or head.startswith("?P="):
        return _Item("zero" if not head.startswith("?P=") else "other"), _group_end(source, i + 1) + 1
    body = i + 1
    if head.startswith("?P<"):
        body = source.index(">", i) + 1
    elif head.startswith("?:"):
        body = i + 3
    elif head.startswith("?"):
        # Scoped flags (?s:...), (?i:...): only `s` (dot matches newline) and `m` keep literals literal.
        colon = source.find(":", i)
        flags = source[i + 2 : colon]
        if colon < 0 or not set(flags) <= set("sm-"):
            return _Item("other"), _group_end(source, i + 1) + 1
        body = colon + 1
    items, end = _sequence(source, body)
    if end >= len(source) or source[end] != ")":
        raise LiteralError(f"unbalanced '(' at {i} in {source!r}")
    return _Item("group", items=tuple(items)), end + 1


def _quantified(source: str, i: int, item: _Item) -> tuple[_Item, int]:
    if i >= len(source):
        return item, i
    ch = source[i]
    least, repeats, end = 1, False, i
    if ch in "?*+":
        least, repeats, end = (0 if ch in "?*" else 1), ch != "?", i + 1
    elif ch == "{":
        close = source.find("}", i)
        bounds = source[i + 1 : close].split(",") if close > 0 else []
        if (
            close > 0
            and 1 <= len(bounds) <= 2
            and all(b.strip().isdigit() or b == "" for b in bounds)
            and bounds[0] != ""
        ):
            least = int(bounds[0])
            repeats = len(bounds) == 2 or least > 1
            end = close + 1
        elif close > 0 and len(bounds) == 2 and bounds[0] == "":
            least, repeats, end = 0, True, close + 1
    if end == i:
        return item, i
    if end < len(source) and source[end] in "?+":
        end += 1  # lazy or possessive
    return _Item(item.kind, item.char, item.items, least, repeats), end


def _class_end(source: str, i: int) -> int:
    """The index just past the ``]`` closing the class that starts at ``i``."""
    j = i + 1
    if j < len(source) and source[j] == "^":
        j += 1
    if j < len(source) and source[j] == "]":
        j += 1
    while j < len(source):
        if source[j] == "\\":
            j += 2
            continue
        if source[j] == "]":
            return j + 1
        j += 1
    raise LiteralError(f"unbalanced '[' at {i} in {source!r}")


def _group_end(source: str, i: int) -> int:
    """The index of the ``)`` that closes the group containing ``i``."""
    depth, j = 0, i
    while j < len(source):
        ch = source[j]
        if ch == "\\":
            j += 2
            continue
        if ch == "[":
            j = _class_end(source, j)
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            if depth == 0:
                return j
            depth -= 1
        j += 1
    return j
