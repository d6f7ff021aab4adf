"""The TOML table reader: a spec's bytes as a document, and typed getters that collect errors.

Every error is collected with its key path and reported at once (:class:`SpecError`), so that a
user fixes a bad lockfile in one pass.
"""

from __future__ import annotations

import difflib
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from packaging.specifiers import InvalidSpecifier
from packaging.version import InvalidVersion

from stackgate.models.exitcodes import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = ["SpecError", "Table", "control_problems", "kind_of", "read_toml"]

#: Refused in every key and string of a lockfile: C0 controls (NUL, newline, ESC ...), DEL, C1
#: controls, and the Unicode line and paragraph separators (Python's splitlines breaks there).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
#: Free text that may hold a tab (and the benchmark prompt, sent as JSON, may hold newlines).
#: Nothing else may: every other string can reach a shell file, a command line or a log line.
_FREE_TEXT = {
    "stack.description": "\t",
    "python.override[].reason": "\t",
    "patch[].reason": "\t",
    "benchmark.prompt": "\t\n",
}
#: The default of a key that must be there.
_REQUIRED = object()


class SpecError(UsageError):
    """A lockfile that cannot be used, with every problem found and its key path."""

    def __init__(self, path: Path | str, problems: list[str]) -> None:
        self.path = Path(path)
        self.problems = list(problems)
        lines = "\n".join(f"  {problem}" for problem in self.problems)
        noun = "problem" if len(self.problems) == 1 else "problems"
        super().__init__(f"{self.path}: {len(self.problems)} {noun} in the lockfile:\n{lines}")


def read_toml(raw: bytes, path: Path, error: type[SpecError]) -> dict[str, Any]:
    """TOML bytes as a document, or ``error`` with the problem: not UTF-8, not TOML, or holding a
    control character anywhere (:func:`control_problems`). The spec and its pylock read this way."""
    try:
        document = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise error(path, [f"not UTF-8 text (byte {exc.start})"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise error(path, [f"not valid TOML: {exc}"]) from None
    except RecursionError:
        raise error(path, ["not valid TOML: nested too deeply"]) from None
    # Control characters are refused before any value is read: nothing downstream (a path, an
    # env file, a command line, a terminal) ever sees one, so no check below needs to care.
    hostile = control_problems(document)
    if hostile:
        raise error(path, hostile)
    return document


def control_problems(document: Mapping[str, Any]) -> list[str]:
    """Every key and string holding a control character, by key path (tab and newline only
    where :data:`_FREE_TEXT` allows them).

    >>> control_problems({"patch": [{"file": "a\\x00b"}], "stack": {"description": "a\\tb"}})
    ['patch[0].file: contains a control character (U+0000)']
    """
    problems = []
    for where, key, value in _walk(document):
        if key is not None and _CONTROL.search(key):
            problems.append(f"{where}: the key contains a control character ({_codepoint(key)})")
        if isinstance(value, str):
            allowed = _FREE_TEXT.get(re.sub(r"\[\d+\]", "[]", where), "")
            if any(c not in allowed for c in _CONTROL.findall(value)):
                problems.append(f"{where}: contains a control character ({_codepoint(value, allowed)})")
    return problems


def _walk(document: Mapping[str, Any]) -> Iterator[tuple[str, str | None, Any]]:
    """(key path, key or None for an array item, value) of every value, depth first, without
    recursion (a deeply nested document must not end in RecursionError)."""
    stack: list[tuple[str, str | None, Any]] = [("", None, document)]
    while stack:
        where, key, value = stack.pop()
        if where:
            yield where, key, value
        if isinstance(value, dict):
            stack.extend((_join(where, k), k, v) for k, v in reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", None, v) for i, v in reversed(list(enumerate(value))))


def _join(path: str, name: str) -> str:
    name = _printable(name)
    return f"{path}.{name}" if path else name


def _printable(text: str) -> str:
    r"""``text`` with control characters written as escapes, safe to print in an error.

    >>> _printable("A\x1b[2JB")
    'A\\x1b[2JB'
    """
    return _CONTROL.sub(lambda m: repr(m[0])[1:-1], text)


def _codepoint(text: str, allowed: str = "") -> str:
    return next(f"U+{ord(c):04X}" for c in _CONTROL.findall(text) if c not in allowed)


class Table:
    """One TOML table being read: typed getters that record errors with their key path."""

    def __init__(self, data: Any, path: str, errors: list[str]) -> None:
        self.path = path
        self.errors = errors
        self.ok = isinstance(data, dict)
        if not self.ok:
            self.error("", f"must be a table, not {kind_of(data)}")
        self.data: dict[str, Any] = data if self.ok else {}
        self.seen: set[str] = set()

    def key(self, name: str) -> str:
        return _join(self.path, name)

    def error(self, name: str, message: str) -> None:
        where = self.key(name) if name else (self.path or "(top level)")
        self.errors.append(f"{where}: {message}")

    def get(self, name: str, kind: type | tuple[type, ...], default: Any = _REQUIRED) -> Any:
        self.seen.add(name)
        if name not in self.data:
            if default is _REQUIRED:
                self.error(name, "missing (required)")
                return None
            return default
        value = self.data[name]
        # bool is an int in Python; a lockfile's `gpu_count = true` is still a mistake.
        if isinstance(value, bool) and bool not in _as_tuple(kind):
            self.error(name, f"must be {_names(kind)}, not a boolean")
            return None
        if not isinstance(value, kind):
            self.error(name, f"must be {_names(kind)}, not {kind_of(value)}")
            return None
        return value

    def parsed(self, name: str, parse: Callable[[str], Any], default: Any = _REQUIRED) -> Any:
        text = self.get(name, str, default)
        if text is None or text is default:
            return text
        try:
            return parse(text)
        except (ValueError, InvalidVersion, InvalidSpecifier) as exc:
            self.error(name, str(exc))
            return None

    def strings(self, name: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
        items = self.get(name, list, list(default))
        if items is None:
            return ()
        bad = [i for i, item in enumerate(items) if not isinstance(item, str)]
        for i in bad:
            self.error(f"{name}[{i}]", f"must be a string, not {kind_of(items[i])}")
        return tuple(item for item in items if isinstance(item, str))

    def positive(self, name: str, kind: type, default: Any = _REQUIRED) -> Any:
        value = self.get(name, (int, float) if kind is float else kind, default)
        if value is not None and value is not default and value <= 0:
            self.error(name, f"must be greater than 0, not {value}")
            return None
        return float(value) if kind is float and value is not None else value

    def sub(self, name: str, required: bool = False) -> Table:
        value = self.get(name, dict, _REQUIRED if required else {})
        return Table(value if value is not None else {}, self.key(name), self.errors)

    def array(self, name: str) -> list[Table]:
        items = self.get(name, list, [])
        return [Table(item, f"{self.key(name)}[{i}]", self.errors) for i, item in enumerate(items or [])]

    def choice(self, name: str, value: Any, allowed: tuple[str, ...]) -> None:
        """Record that ``value`` must be one of ``allowed`` unless it is.

        >>> t = Table({"installer": "conda"}, "python", [])
        >>> t.choice("installer", "conda", ("uv", "pip")); t.errors
        ["python.installer: must be one of uv, pip, not 'conda'"]
        """
        if value not in allowed:
            self.error(name, f"must be one of {', '.join(allowed)}, not {value!r}")

    def finish(self, known: tuple[str, ...] = ()) -> None:
        """Reject keys nobody read, with a "did you mean" from the known ones."""
        for name in self.data:
            if name in self.seen:
                continue
            choices = difflib.get_close_matches(name, tuple(self.seen) + known, n=1)
            hint = f" (did you mean {choices[0]!r}?)" if choices else ""
            self.error(name, f"unknown key{hint}")


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _names(kind: type | tuple[type, ...]) -> str:
    words = {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "true or false",
        list: "an array",
        dict: "a table",
    }
    return " or ".join(words.get(k, k.__name__) for k in _as_tuple(kind))


def kind_of(value: Any) -> str:
    return _names(type(value)) if type(value) in (str, int, float, bool, list, dict) else type(value).__name__
