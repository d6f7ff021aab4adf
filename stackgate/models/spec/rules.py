"""The rules a spec's values follow beyond their types: where a URL may point, what a ``$`` in an
environment value may start, where a patch file may lie, and the ``{toolkit.default}`` references.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Mapping, Protocol
from urllib.parse import urlsplit

from stackgate.models.spec.reader import Table

__all__ = [
    "PACKAGE",
    "SHELL_REFERENCE",
    "SHIPPED_PATCHES",
    "check_sha256",
    "check_url",
    "dollar_problem",
    "normal_path",
    "patch_location_problem",
    "resolve_path",
    "resolve_references",
    "url_problem",
]


class _Located(Protocol):
    """A spec, as the patch rule reads it: its file's path."""

    @property
    def path(self) -> Path: ...


class _PatchFile(Protocol):
    """A patch, as the patch rule reads it: its file."""

    @property
    def file(self) -> Path: ...


#: The installed package: the lockfiles and the patches they name ship inside it (package data), so
#: the default profile is found without a checkout (the checkout's lockfiles/ and patches/ link here).
PACKAGE = Path(__file__).resolve().parents[2]
#: The shipped patches (patches/ beside lockfiles/ in the package): any lockfile may name one of them.
SHIPPED_PATCHES = PACKAGE / "patches"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
#: A lock reference such as {toolkit.default}; ``${NAME}`` is the shell's, not ours.
_REFERENCE = re.compile(r"(?<!\$)\{([A-Za-z_][A-Za-z0-9_.]*)\}")
#: The only use of ``$`` an environment value may make: a plain variable reference, which
#: stackgate.env leaves to the shell (and envfile.parse expands the same way).
SHELL_REFERENCE = re.compile(r"\$(?:\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)")


def resolve_references(t: Table, name: str, value: str, references: Mapping[str, str]) -> str:
    """Replace ``{toolkit.default}`` style references.

    >>> resolve_references(None, "X", "{a}/bin", {"a": "/opt"})
    '/opt/bin'
    """

    def replace(match: re.Match[str]) -> str:
        key = match[1]
        if key in references:
            return references[key]
        t.error(name, f"unknown reference {{{key}}} (known: {', '.join(sorted(references))})")
        return match[0]

    return _REFERENCE.sub(replace, value)


def dollar_problem(value: str) -> str | None:
    """Why an environment value may not be written into a file that shells source, or None:
    a ``$`` may only start a plain ``$NAME`` or ``${NAME}`` reference.

    >>> dollar_problem("{toolkit.default}/bin:$PATH:${HOME}") is None
    True
    >>> print(dollar_problem("$(touch /tmp/x)"))  # doctest: +NORMALIZE_WHITESPACE
    '$(' at character 1: a '$' may only start a variable reference, $NAME or ${NAME}
    (no command substitution, arithmetic, ${NAME:-default} or $1); stackgate.env is sourced by shells
    """
    for i in (i for i, c in enumerate(value) if c == "$"):
        if not SHELL_REFERENCE.match(value, i):
            return (
                f"{value[i : i + 2]!r} at character {i + 1}: "
                "a '$' may only start a variable reference, $NAME or ${NAME} "
                "(no command substitution, arithmetic, ${NAME:-default} or $1); stackgate.env is sourced by shells"
            )
    return None


def normal_path(text: str) -> Path:
    """An absolute path as the filesystem reads it: ``//``, ``.``, ``..`` and a trailing ``/`` gone.

    >>> normal_path("//usr/local//cuda-13.0/../cuda-13.0/")
    PosixPath('/usr/local/cuda-13.0')
    """
    return Path("/" + os.path.normpath(text).lstrip("/")) if text.startswith("/") else Path(os.path.normpath(text))


def patch_location_problem(spec: _Located, patch: _PatchFile) -> str | None:
    """Why ``patch``'s file cannot be the lock's patch, or None: it must exist, after ``..`` and
    symlinks, inside the lockfile's checkout or stackgate's shipped patches. Only provision reads
    the file, so provision asks (before it plans to apply it); other commands need only its name.
    """
    try:
        path = patch.file.resolve()
        folder = spec.path.parent.resolve()
        bases = (_checkout(folder), SHIPPED_PATCHES.resolve())
        found = "a file" if path.is_file() else "not a file" if path.exists() else "no such file"
    except (OSError, RuntimeError) as exc:  # a name too long, a symlink loop (RuntimeError before 3.13)
        return f"{patch.file} cannot be resolved: {getattr(exc, 'strerror', None) or exc}"
    if not any(path.is_relative_to(base) for base in bases):
        return (
            f"{patch.file} resolves to {path}, outside the lockfile's checkout ({bases[0]}) "
            f"and stackgate's patches ({bases[1]}): keep the patch beside the lock"
        )
    return None if found == "a file" else f"{path}: {found}"


def resolve_path(path: Path) -> Path:
    """``path`` made absolute with symlinks and ``..`` resolved, as far as that can be done."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # checked, with the reason, by patch_location_problem
        return Path(os.path.abspath(path))


def _checkout(folder: Path) -> Path:
    """The git checkout that holds ``folder`` (the nearest folder above with a .git), else ``folder``."""
    return next((parent for parent in (folder, *folder.parents) if (parent / ".git").exists()), folder)


def check_url(t: Table, name: str, url: str | None, *, local_path: bool = False) -> None:
    problem = url_problem(url, local_path=local_path) if url is not None else None
    if problem:
        t.error(name, problem)


def url_problem(url: str, *, local_path: bool = False) -> str | None:
    """Why ``url`` may not be fetched from, or None: https to any host; http only to this machine
    (``localhost`` or a loopback IP literal: nothing on the way can change the bytes); file:// on
    this machine; with ``local_path``, an absolute path too (a runfile already on disk).

    >>> url_problem("http://127.0.0.1:8080/simple") is None, url_problem("https://[::1]/x") is None
    (True, True)
    >>> print(url_problem("http://download.pytorch.org/whl/cu130"))
    plain http to download.pytorch.org: use https (http only to localhost or a loopback IP such as 127.0.0.1 or [::1])
    """
    where = f"must be an https:// URL{', a file:// URL or an absolute path' if local_path else ' or a file:// URL'}"
    if local_path and url.startswith("/"):
        return None
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        parts.port  # noqa: B018 - an out-of-range port raises here, not later in a download
    except ValueError as exc:
        return f"{where}, not {url!r}: {exc}"
    if parts.scheme == "https" and host:
        return None
    if parts.scheme == "file" and parts.netloc in ("", "localhost"):
        return None
    if parts.scheme == "http" and host:
        return (
            None
            if _loopback(host)
            else f"plain http to {host}: use https (http only to localhost or a loopback IP such as 127.0.0.1 or [::1])"
        )
    return f"{where} (http:// only to localhost or a loopback IP), not {url!r}"


def _loopback(host: str) -> bool:
    """``localhost`` or a loopback IP literal, written out: 127.0.0.1.evil.com, localhost.evil
    and the inet_aton shorthands (0x7f.1, 2130706433) are names or guesses, not loopback.

    >>> [_loopback(h) for h in ("localhost", "127.0.0.1", "::1", "127.0.0.1.evil.com", "0x7f.1", "localhost.evil")]
    [True, True, True, False, False, False]
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_sha256(t: Table, name: str) -> str | None:
    """The optional sha256 ``name`` of ``t``: 64 lowercase hex digits, or None (and an error)."""
    value = t.get(name, str, None)
    if value is not None and not _SHA256.fullmatch(value):
        t.error(name, f"must be 64 lowercase hex digits, not {value!r}")
        return None
    return value
