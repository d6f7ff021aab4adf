"""Where a spec is found and read: the default lock, the shipped profiles, and the loaders.

Loading never raises anything but :class:`~stackgate.models.spec.reader.SpecError`, whatever the
bytes in the file: a bad lockfile must fail before anything on the machine is touched.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from pathlib import Path
from typing import Mapping

from stackgate.models import inputfile, settings
from stackgate.models.spec.model import Spec
from stackgate.models.spec.reader import SpecError, Table, read_toml
from stackgate.models.spec.rules import PACKAGE

__all__ = [
    "DEFAULT_SPEC",
    "LOCAL_SPEC",
    "SYSTEM_SPEC",
    "default_spec_path",
    "edit_hint",
    "find_local",
    "found_spec_path",
    "is_shipped",
    "load_spec",
    "loads_spec",
    "read_only_problem",
    "spec_command",
]

#: The profile used when nothing else names one (:func:`default_spec_path`).
DEFAULT_SPEC = PACKAGE / "lockfiles" / "blackwell-sm120-cu130.toml"
#: The spec of the current folder, as `stackgate init` writes it.
LOCAL_SPEC = "stackgate.toml"
#: The machine's spec, in $STACKGATE_SYSTEM_DIR (`stackgate init --system` writes it).
SYSTEM_SPEC = "stack.toml"


def default_spec_path(environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> Path:
    """The spec a command uses without ``--lock``: :func:`found_spec_path`, else the shipped default profile."""
    return found_spec_path(environ, cwd) or DEFAULT_SPEC


def found_spec_path(environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> Path | None:
    """The spec named or found without ``--lock``: ``$STACKGATE_LOCK``, a ``stackgate.toml`` in the working
    folder or the nearest folder above it (:func:`find_local`), ``/etc/stackgate/stack.toml``
    (``$STACKGATE_SYSTEM_DIR``); None when there is none (the shipped default profile stands in)."""
    named = settings.LOCK.value(environ)
    if named is not None:
        return named
    local = find_local(Path.cwd() if cwd is None else cwd)
    if local is not None:
        return local
    system = settings.SYSTEM_DIR.value(environ) / SYSTEM_SPEC
    return system if system.is_file() else None


def find_local(start: Path) -> Path | None:
    """The ``stackgate.toml`` of ``start`` or of the nearest folder above it, up to the filesystem root (as uv
    and ruff find their configuration). Above ``start`` only a file owned by this user or by root counts, as
    git trusts only a repository its user owns: a file another user left in a shared folder (/tmp) is passed by.

    >>> find_local(Path("/proc/self/fdinfo")) is None
    True
    """
    for folder in (start, *start.parents):
        candidate = folder / LOCAL_SPEC
        try:
            owner = candidate.stat().st_uid
        except OSError:
            continue
        if candidate.is_file() and (folder == start or owner in (os.getuid(), 0)):
            return candidate
    return None


def is_shipped(path: Path) -> bool:
    """Whether ``path`` is one of the profiles shipped inside the stackgate package."""
    try:
        return Path(path).resolve().parent == DEFAULT_SPEC.parent.resolve()
    except OSError:
        return False


def read_only_problem(path: Path, action: str) -> str | None:
    """Why ``action`` must not write beside ``path``: it is a profile inside the INSTALLED package
    (site-packages: an upgrade replaces it, another user shares it). In a source checkout (a
    pyproject.toml beside the package) the shipped profiles are the project's own files."""
    if not is_shipped(path) or (PACKAGE.parent / "pyproject.toml").is_file():
        return None
    return (
        f"{path} is a profile shipped inside the installed stackgate package: {action} would write there. "
        f"Copy it out first: `stackgate init --profile {Path(path).stem}` (./{LOCAL_SPEC}, which every command "
        f"then uses; --system for /etc/stackgate), then run it again on the copy (`--lock {LOCAL_SPEC}`)"
    )


def edit_hint(spec: Spec) -> str:
    """Where a user changes a value of ``lock``: the file, or for a profile inside the installed
    package, the copy `stackgate init --profile` makes (nothing is ever written into the package)."""
    if read_only_problem(spec.path, "an edit") is None:
        return f"in {spec.path}"
    return f"in a copy of the shipped profile (`stackgate init --profile {spec.path.stem}` writes ./{LOCAL_SPEC})"


def spec_command(action: str, path: Path) -> str:
    """The command line that runs ``stackgate ACTION`` on the spec at ``path``, as it can run: a profile inside
    the installed package is copied out first (:func:`read_only_problem`), and the copy named.

    >>> spec_command("lock", Path("/srv/my specs/a.toml"))
    "stackgate lock --lock '/srv/my specs/a.toml'"
    """
    if read_only_problem(path, action) is None:
        return f"stackgate {action} --lock {shlex.quote(str(path))}"
    return f"stackgate init --profile {Path(path).stem} && stackgate {action} --lock {LOCAL_SPEC}"


def load_spec(path: Path | str | None = None) -> Spec:
    """Read and validate a lockfile; raise :class:`SpecError` listing every problem."""
    path = default_spec_path() if path is None else Path(path)
    try:
        data = inputfile.read_capped(path, inputfile.MAX_SPEC_BYTES)
    except FileNotFoundError:
        raise SpecError(path, ["no such file"]) from None
    except IsADirectoryError:
        raise SpecError(path, ["is a directory, not a lockfile"]) from None
    except OSError as exc:
        raise SpecError(path, [f"cannot read: {exc.strerror or exc}"]) from None
    return loads_spec(data, path=path)


def loads_spec(data: bytes | str, path: Path | str = "<lockfile>") -> Spec:
    """Validate lockfile text; relative patch paths resolve against the file's folder."""
    path = Path(path)
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    document = read_toml(raw, path, SpecError)
    errors: list[str] = []
    spec = Spec._from_table(Table(document, "", errors), path, hashlib.sha256(raw).hexdigest())
    if errors or spec is None:
        raise SpecError(path, errors or ["invalid lockfile"])
    return spec
