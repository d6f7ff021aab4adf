"""The environment file (``stackgate.env``): written by provision, read by verify and smoke.

It is a POSIX shell file of ``export NAME="value"`` lines so that people and service managers
can source it; stackgate reads it back without a shell, expanding only ``$NAME`` and
``${NAME}`` against the environment it is applied to. Whatever the values hold, sourcing the
file runs nothing: every ``$`` that does not start such a reference is escaped, like ``"``,
backquotes and backslashes, and a name or value that a shell could not read back is refused.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

from stackgate.models.spec import SHELL_REFERENCE

__all__ = ["EnvFileError", "apply", "parse", "read", "render"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LINE = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
#: What a value may not hold: a line break (for sh, or for parse's splitlines) would end the
#: line that parse reads; the other control characters are not text.
_UNWRITABLE = re.compile("[\x00-\x08\x0a-\x1f\x7f\x85\u2028\u2029]")


class EnvFileError(Exception):
    """An environment file that cannot be read back."""


def render(values: Mapping[str, str], header: str = "") -> str:
    """Shell text exporting ``values``; ``$PATH``-style references are left to the shell.

    >>> print(render({"CUDA_HOME": "/usr/local/cuda-13.0", "X": "$(id):$PATH"}), end="")
    export CUDA_HOME="/usr/local/cuda-13.0"
    export X="\\$(id):$PATH"
    """
    lines = [f"# {line}" for line in header.splitlines()]
    for name, value in values.items():
        if not _NAME.fullmatch(name) or _UNWRITABLE.search(value):
            raise EnvFileError(f"{name!r}={value!r}: not a variable a shell file can export as written")
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`")
        lines.append(f'export {name}="{_escape_dollars(escaped)}"')
    return "\n".join(lines) + "\n"


def _escape_dollars(text: str) -> str:
    """Every ``$`` that starts no plain ``$NAME``/``${NAME}`` reference written as ``\\$``, so
    that a shell keeps it literal (no command substitution, arithmetic or parameter operators).

    >>> print(_escape_dollars("$(id) $((1+1)) ${X:-y} $1 $PATH ${HOME}"))
    \\$(id) \\$((1+1)) \\${X:-y} \\$1 $PATH ${HOME}
    """
    return "".join("\\$" if c == "$" and not SHELL_REFERENCE.match(text, i) else c for i, c in enumerate(text))


def parse(text: str, base: Mapping[str, str]) -> dict[str, str]:
    """The variables a shell would export after sourcing ``text`` on top of ``base``.

    >>> parse('export PATH="/opt/bin:$PATH"', {"PATH": "/usr/bin"})
    {'PATH': '/opt/bin:/usr/bin'}
    """
    scope = dict(base)
    exported: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if not match:
            raise EnvFileError(f"line {number}: not an assignment: {raw!r}")
        value = _value(match[2].strip(), scope, number)
        scope[match[1]] = exported[match[1]] = value
    return exported


def read(path: Path, base: Mapping[str, str]) -> dict[str, str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EnvFileError(f"{path}: cannot read: {exc}") from None
    try:
        return parse(text, base)
    except EnvFileError as exc:
        raise EnvFileError(f"{path}: {exc}") from None


def apply(path: Path | None, base: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``base`` with the file's variables applied, and the variables that came from the file.

    A missing file changes nothing: a machine that was never provisioned has none.
    """
    if path is None or not path.is_file():
        return dict(base), {}
    exported = read(path, base)
    return {**base, **exported}, exported


def _value(raw: str, scope: Mapping[str, str], number: int) -> str:
    """One shell word as POSIX sh reads it: single quotes literal, double quotes with
    backslash escapes before $ ` " \\ and with $NAME expanded, bare words expanded.

    >>> _value('"a \\"b\\" $X"', {"X": "1"}, 1)
    'a "b" 1'
    """
    if raw.startswith("'"):
        if len(raw) < 2 or not raw.endswith("'") or "'" in raw[1:-1]:
            raise EnvFileError(f"line {number}: unterminated or mixed single quotes: {raw!r}")
        return raw[1:-1]
    quoted = raw.startswith('"')
    if quoted and (len(raw) < 2 or not raw.endswith('"') or raw.endswith('\\"') and not raw.endswith('\\\\"')):
        raise EnvFileError(f"line {number}: unterminated double quotes: {raw!r}")
    body = raw[1:-1] if quoted else raw
    out, i = [], 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body) and body[i + 1] in '$`"\\':
            out.append(body[i + 1])
            i += 2
            continue
        if ch == "$":
            match = SHELL_REFERENCE.match(body, i)
            if match:
                out.append(scope.get(match[0].strip("${}"), ""))
                i = match.end()
                continue
        out.append(ch)
        i += 1
    return "".join(out)
