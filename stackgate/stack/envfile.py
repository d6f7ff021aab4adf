"""The environment file (``stackgate.env``): written by provision, read by verify and smoke.

It is a POSIX shell file of ``export NAME="value"`` lines so that people and service managers
can source it; stackgate reads it back without a shell, expanding only ``$NAME`` and
``${NAME}`` against the environment it is applied to.
"""

from __future__ import annotations

import re
import shlex
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
        try:
            words = shlex.split(match[2], posix=True)
        except ValueError as exc:
            raise EnvFileError(f"line {number}: {exc}") from None
        value = _expand(" ".join(words), scope)
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


def _expand(value: str, scope: Mapping[str, str]) -> str:
    return _VARIABLE.sub(lambda m: scope.get(m[1] or m[2], ""), value)
