"""The run document (``stackgate.report/1``) read as hostile input: the one validator of every
document that comes from elsewhere (a node's report, a run kept in or copied into the history),
applied when it is kept and when it is read, before any renderer formats a figure of it or a
writer turns it into JSON again.

Three rules, each problem named by its key path:

- every number anywhere is finite: JSON's ``1e999`` reads as infinity (and Python's ``NaN`` and
  ``Infinity`` literals as themselves), which no report can compare, draw or write back;
- nothing is nested deeper than :data:`MAX_DEPTH` (stackgate's own documents stay under 12 levels);
- each field a reader of runs formats has its type (:data:`FIELDS`): a number where a figure
  belongs, text where text belongs, an object or a list where one is walked. A field may be
  absent unless the caller names it ``required``.

>>> problems({"verdict": "passed", "duration_s": "12", "gate": {"benchmark": {"floor_tok_s": float("inf")}}})
['gate.benchmark.floor_tok_s: inf, not a finite number', "duration_s: text ('12'), not a number"]
"""

from __future__ import annotations

import math
from typing import Any, Iterator, Mapping, Sequence

__all__ = ["FIELDS", "MAX_DEPTH", "problems"]

#: Deeper than this is no stackgate document (a JSON bomb of nested lists).
MAX_DEPTH = 64
#: A document's problems are listed up to this many.
MAX_PROBLEMS = 10

NUMBER, INTEGER, TEXT, OBJECT, LIST, NULL, BOOL = "number", "integer", "text", "object", "list", "null", "bool"

_BENCHMARK_FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("", (OBJECT, NULL)),
    ("runs", (LIST,)),
    ("runs[]", (OBJECT,)),
    ("runs[].tokens", (INTEGER, NULL)),
    ("runs[].seconds", (NUMBER, NULL)),
    ("runs[].tok_s", (NUMBER, NULL)),
    ("runs[].ttft_s", (NUMBER, NULL)),
    ("runs[].decode_tok_s", (NUMBER, NULL)),
    *(
        field
        for figure in ("tok_s", "decode_tok_s", "ttft_s")
        for field in (
            (figure, (OBJECT, NULL)),
            (f"{figure}.n", (INTEGER,)),
            *(
                (f"{figure}.{name}", (NUMBER, NULL))  # null: not finite when measured (one value has no CI)
                for name in ("mean", "median", "stdev", "cv", "min", "max", "ci_low", "ci_high")
            ),
            (f"{figure}.values", (LIST,)),
            (f"{figure}.values[]", (NUMBER,)),
        )
    ),
    ("baseline_tok_s", (NUMBER, NULL)),
    ("floor_tok_s", (NUMBER, NULL)),
    ("max_regression", (NUMBER, NULL)),
    ("summary", (TEXT, NULL)),
    ("status", (TEXT, NULL)),
)
_RESULT_FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("[]", (OBJECT,)),
    ("[].check", (TEXT,)),
    ("[].status", (TEXT,)),
    ("[].summary", (TEXT,)),
    ("[].stage", (TEXT,)),
    ("[].details", (LIST,)),
    ("[].details[]", (TEXT,)),
    ("[].fix", (OBJECT, NULL)),
    ("[].fix.text", (TEXT,)),
    ("[].fix.commands", (LIST,)),
    ("[].fix.commands[]", (TEXT,)),
    ("[].data", (OBJECT,)),
    ("[].duration_s", (NUMBER,)),
)
_SESSION_FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("", (OBJECT,)),
    ("sessions", (LIST,)),
    ("sessions[]", (OBJECT,)),
    ("sessions[].findings", (LIST,)),
    ("sessions[].server_info", (OBJECT, NULL)),
    *((f"sessions[].benchmark{path and '.'}{path}", kinds) for path, kinds in _BENCHMARK_FIELDS),
)

#: Key path -> the kinds its value may be. ``a[]`` is each item of the list ``a``, ``a.*`` each
#: value of the object ``a``.
FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("schema", (TEXT,)),
    ("command", (TEXT,)),
    ("run_id", (TEXT,)),
    ("started", (TEXT,)),
    ("verdict", (TEXT,)),
    ("reason", (TEXT,)),
    ("exit_code", (INTEGER,)),
    ("duration_s", (NUMBER,)),
    ("counts", (OBJECT,)),
    ("counts.*", (INTEGER,)),
    ("host", (OBJECT,)),
    ("host.hostname", (TEXT,)),
    ("host.machine", (TEXT, NULL)),
    ("lock", (OBJECT, NULL)),
    ("lock.name", (TEXT,)),
    ("lock.path", (TEXT,)),
    ("lock.sha256", (TEXT,)),
    ("fleet", (OBJECT,)),
    ("fleet.node", (TEXT,)),
    ("results", (LIST,)),
    *((f"results{path}", kinds) for path, kinds in _RESULT_FIELDS),
    ("gate", (OBJECT,)),
    ("gate.interrupted", (BOOL,)),
    ("gate.stages", (LIST,)),
    ("gate.stages[]", (OBJECT,)),
    ("gate.stages[].name", (TEXT,)),
    ("gate.stages[].status", (TEXT,)),
    ("gate.stages[].reason", (TEXT, NULL)),
    ("gate.stages[].duration_s", (NUMBER,)),
    ("gate.stages[].results", (LIST,)),
    *((f"gate.stages[].results{path}", kinds) for path, kinds in _RESULT_FIELDS),
    ("gate.fingerprint", (OBJECT, NULL)),
    ("gate.fingerprint.digest", (TEXT,)),
    ("gate.fingerprint.short", (TEXT,)),
    ("gate.fingerprint.components", (OBJECT,)),
    ("gate.fingerprint.components.*", (OBJECT,)),
    *((f"gate.benchmark{path and '.'}{path}", kinds) for path, kinds in _BENCHMARK_FIELDS),
    ("gate.smoke", (OBJECT,)),
    *((f"gate.smoke.*{path and '.'}{path}", kinds) for path, kinds in _SESSION_FIELDS),
    *((f"smoke{path and '.'}{path}", kinds) for path, kinds in _SESSION_FIELDS),
    ("smoke.interrupted", (BOOL,)),
)


def problems(doc: Any, required: Sequence[str] = ()) -> list[str]:
    """What is wrong with ``doc`` as a run document (empty: nothing), at most :data:`MAX_PROBLEMS`
    of them, the last one saying how many more there were; the ``required`` fields must be there."""
    if not isinstance(doc, Mapping):
        return [f"a JSON {_kind_name(doc)}, not an object"]
    deep, found = _depth_and_numbers(doc)
    if deep is not None:
        return [deep]
    found += [f"{name}: missing" for name in required if name not in doc]
    for path, kinds in FIELDS:
        found += [
            f"{where}: {_said(value)}, not {' or '.join(_WORDS[k] for k in kinds)}"
            for where, value in _values(doc, path)
            if not any(_is(value, kind) for kind in kinds)
        ]
    if len(found) > MAX_PROBLEMS:
        found = [*found[: MAX_PROBLEMS - 1], f"... and {len(found) - MAX_PROBLEMS + 1} more"]
    return found


_WORDS = {
    NUMBER: "a number",
    INTEGER: "a whole number",
    TEXT: "text",
    OBJECT: "an object",
    LIST: "a list",
    NULL: "null",
    BOOL: "true or false",
}


def _is(value: Any, kind: str) -> bool:
    if kind in (NUMBER, INTEGER):
        whole = isinstance(value, int) and not isinstance(value, bool)
        return whole or (kind == NUMBER and isinstance(value, float))
    if kind == TEXT:
        return isinstance(value, str)
    if kind == OBJECT:
        return isinstance(value, Mapping)
    if kind == LIST:
        return isinstance(value, list)
    if kind == BOOL:
        return isinstance(value, bool)
    return value is None


def _said(value: Any) -> str:
    """What a value is, briefly: ``text ('<script>al...')``, ``a list``, ``true``.

    >>> _said("<script>alert(document.cookie)</script>"), _said([1]), _said(True), _said(None)
    ("text ('<script>alert(docume...')", 'a list', 'true', 'null')
    """
    if isinstance(value, str):
        return f"text ({(value[:20] + '...') if len(value) > 20 else value!r})"
    if isinstance(value, bool) or value is None:
        return "null" if value is None else str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    return _kind_name(value)


def _kind_name(value: Any) -> str:
    return "an object" if isinstance(value, Mapping) else "a list" if isinstance(value, list) else type(value).__name__


def _depth_and_numbers(doc: Mapping[str, Any]) -> tuple[str | None, list[str]]:
    """The first place nested too deeply (None: none), and every number that is not finite;
    without recursion."""
    found: list[str] = []
    stack: list[tuple[str, Any, int]] = [("", doc, 0)]
    while stack:
        where, value, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"{where}: nested deeper than {MAX_DEPTH} levels", found
        if isinstance(value, float) and not math.isfinite(value):
            found.append(f"{where}: {value!r}, not a finite number")
        elif isinstance(value, Mapping):
            stack.extend((f"{where}.{k}" if where else str(k), v, depth + 1) for k, v in reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", v, depth + 1) for i, v in reversed(list(enumerate(value))))
    return None, found


def _values(doc: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(key path, value) of each value ``path`` names in ``doc`` that is there (see :data:`FIELDS`)."""
    items: list[tuple[str, Any]] = [("", doc)]
    for part in path.replace("[]", ".[]").split("."):
        found: list[tuple[str, Any]] = []
        for where, value in items:
            if part == "[]" and isinstance(value, list):
                found += [(f"{where}[{i}]", item) for i, item in enumerate(value)]
            elif part == "*" and isinstance(value, Mapping):
                found += [(f"{where}.{k}" if where else str(k), item) for k, item in value.items()]
            elif part not in ("[]", "*") and isinstance(value, Mapping) and part in value:
                found.append((f"{where}.{part}" if where else part, value[part]))
        items = found
    return iter(items)
