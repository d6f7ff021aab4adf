"""Where a spec is found and read: the default lock, the shipped profiles, and the loaders.

Loading never raises anything but :class:`~stackgate.models.spec.reader.SpecError`, whatever the
bytes in the file: a bad lockfile must fail before anything on the machine is touched.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Mapping

from stackgate.models import inputfile, settings
from stackgate.models.spec.model import Spec
from stackgate.models.spec.reader import SpecError, Table, read_toml
from stackgate.models.spec.rules import PACKAGE

__all__ = [
    "DEFAULT_LOCK",
    "LOCAL_LOCK",
    "SYSTEM_LOCK",
    "default_lock_path",
    "edit_hint",
    "is_shipped",
    "load_spec",
    "loads_spec",
    "read_only_problem",
]

#: The profile used when nothing else names one (:func:`default_lock_path`).
DEFAULT_LOCK = PACKAGE / "lockfiles" / "blackwell-sm120-cu130.toml"
#: The spec of the current folder, as `stackgate init` writes it.
LOCAL_LOCK = "stackgate.toml"
#: The machine's spec, in $STACKGATE_SYSTEM_DIR (`stackgate init --system` writes it).
SYSTEM_LOCK = "stack.toml"


def default_lock_path(environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> Path:
    """The lock a command uses without ``--lock``: ``$STACKGATE_LOCK``, ``./stackgate.toml``,
    ``/etc/stackgate/stack.toml`` (``$STACKGATE_SYSTEM_DIR``), then the shipped default profile."""
    named = settings.LOCK.value(environ)
    if named is not None:
        return named
    here = (Path.cwd() if cwd is None else cwd) / LOCAL_LOCK
    system = settings.SYSTEM_DIR.value(environ) / SYSTEM_LOCK
    return next((p for p in (here, system) if p.is_file()), DEFAULT_LOCK)


def is_shipped(path: Path) -> bool:
    """Whether ``path`` is one of the profiles shipped inside the stackgate package."""
    try:
        return Path(path).resolve().parent == DEFAULT_LOCK.parent.resolve()
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
        f"Copy it out first: `stackgate init --profile {Path(path).stem}` (./{LOCAL_LOCK}, which every command "
        "then uses; --system for /etc/stackgate), then run it again"
    )


def edit_hint(lock: Spec) -> str:
    """Where a user changes a value of ``lock``: the file, or for a profile inside the installed
    package, the copy `stackgate init --profile` makes (nothing is ever written into the package)."""
    if read_only_problem(lock.path, "an edit") is None:
        return f"in {lock.path}"
    return f"in a copy of the shipped profile (`stackgate init --profile {lock.path.stem}` writes ./{LOCAL_LOCK})"


def load_spec(path: Path | str | None = None) -> Spec:
    """Read and validate a lockfile; raise :class:`SpecError` listing every problem."""
    path = default_lock_path() if path is None else Path(path)
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
    lock = Spec._from_table(Table(document, "", errors), path, hashlib.sha256(raw).hexdigest())
    if errors or lock is None:
        raise SpecError(path, errors or ["invalid lockfile"])
    return lock
