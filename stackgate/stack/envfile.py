"""The environment file (``stackgate.env``): written by provision, read by verify and smoke.

It is a POSIX shell file of ``export NAME="value"`` lines so that people and service managers
can source it; stackgate reads it back without a shell, expanding only ``$NAME`` and
``${NAME}`` against the environment it is applied to.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

__all__ = ["EnvFileError", "apply", "parse", "read", "render"]

_LINE = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


class EnvFileError(Exception):
    """An environment file that cannot be read back."""


def render(values: Mapping[str, str], header: str = "") -> str:
    """Shell text exporting ``values``; ``$PATH``-style references are left to the shell.

    >>> print(render({"CUDA_HOME": "/usr/local/cuda-13.0"}), end="")
    export CUDA_HOME="/usr/local/cuda-13.0"
    """
    lines = [f"# {line}" for line in header.splitlines()]
    for name, value in values.items():
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`")
        lines.append(f'export {name}="{escaped}"')
    return "\n".join(lines) + "\n"


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
            match = _VARIABLE.match(body, i)
            if match:
                out.append(scope.get(match[1] or match[2], ""))
                i = match.end()
                continue
        out.append(ch)
        i += 1
    return "".join(out)
