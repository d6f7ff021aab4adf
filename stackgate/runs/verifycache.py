"""``verify --cached``: the static checks' results, kept while the stamp of what they judged holds.

A check is live when it reads only NVML (the GPUs' count, driver, ECC, PCIe links,
processes) or is named in :data:`LIVE_CHECKS` (the kernel's Xid events): live checks run on
every verify. The others (the stack's interpreter, distributions, toolkits, patches, the
environment) are static: a cached verify reuses their results while the stamp
(:mod:`stackgate.facts.stamp`) taken now equals the one taken when they ran, the same checks are
asked for, the same stackgate wrote it and it is younger than :data:`MAX_AGE_S`.

The cache is one JSON file per lock: ``<python.root>/cache/verify-<lock>-<hash>.json`` when the
root holds a stack and is writable, else ``$XDG_CACHE_HOME/stackgate/verify/`` (default
``~/.cache``). It is written atomically. A cache that cannot be read, is not what this stackgate
writes, is a symbolic link, is owned by another user or writable by others, or lies in a folder
that others than this user (or root) may write, is ignored with a note, and the static checks run;
it is never trusted across a changed stamp.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from stackgate import __version__
from stackgate.checks.core import Check
from stackgate.edges import owned
from stackgate.edges.files import write_json
from stackgate.facts.stamp import Stamp, changed
from stackgate.models.result import Result, Status
from stackgate.models.spec import Spec

__all__ = ["LIVE_CHECKS", "MAX_AGE_S", "SCHEMA", "CacheError", "Entry", "is_live", "load", "miss", "path_for", "save"]

SCHEMA = "stackgate.verify-cache/1"
#: Checks measured on every verify whatever they read (by name: the kernel log's Xid events).
LIVE_CHECKS = frozenset({"gpu.kernel_events"})
#: The fact parts that are live state: a check that needs only these is live.
LIVE_PARTS = frozenset({"nvml"})
#: A cache older than this is not used (a full verify a day, whatever the stamp says).
MAX_AGE_S = 24 * 3600.0
MAX_BYTES = 8 * 2**20


class CacheError(Exception):
    """A cache file that is not to be trusted, and why."""


@dataclass(frozen=True)
class Entry:
    stamp: Stamp
    checks: tuple[str, ...]  #: the static checks it holds the results of, in order
    results: tuple[Result, ...]
    sites: tuple[str, ...]  #: the site-packages folders the stamp covers
    written: float  #: when the static checks ran (Unix time)
    version: str = __version__

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "stackgate": self.version,
            "written": self.written,
            "checks": list(self.checks),
            "sites": list(self.sites),
            "stamp": {k: dict(v) for k, v in self.stamp.items()},
            "results": [r.to_dict() for r in self.results],
        }


def is_live(check: Check) -> bool:
    return check.name in LIVE_CHECKS or (bool(check.needs) and set(check.needs) <= LIVE_PARTS)


def path_for(spec: Spec, environ: Mapping[str, str] | None = None) -> Path:
    """Where the cache of ``lock`` lives (see the module's docstring)."""
    environ = os.environ if environ is None else environ
    key = hashlib.sha256(str(spec.path.resolve()).encode()).hexdigest()[:12]
    name = f"verify-{spec.name}-{key}.json"
    root = spec.python.root
    if root is not None and (root / "current").is_symlink() and os.access(root, os.W_OK | os.X_OK):
        return root / "cache" / name
    base = (
        Path(environ["XDG_CACHE_HOME"])
        if environ.get("XDG_CACHE_HOME")
        else Path(environ.get("HOME") or Path.home()) / ".cache"
    )
    return base / "stackgate" / "verify" / name


def load(path: Path) -> Entry | None:
    """The cache at ``path`` (None when there is none); :class:`CacheError` when it is not to be trusted:
    its folder writable by others than this user (or root), or the file a symbolic link, not a regular
    file, another user's or writable by others (checked on the descriptor it is read from)."""
    try:
        folder = os.stat(path.parent)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CacheError(f"unreadable: {exc.strerror or exc}") from exc
    why = owned.problem(folder, (os.geteuid(), 0))
    if why is not None:
        raise CacheError(
            f"its folder {path.parent} {why}, so another user could replace it: only a cache in a folder of this "
            f"user (or root) that no one else may write is trusted; `chmod go-w {path.parent}`"
        )
    try:
        data = owned.read_owned(path, MAX_BYTES)
    except FileNotFoundError:
        return None
    except owned.UntrustedError as exc:
        raise CacheError(f"{exc.strerror}; only a file of this user that no one else may write is trusted") from exc
    except OSError as exc:
        raise CacheError(f"unreadable: {exc.strerror or exc}") from exc
    try:
        return _entry(json.loads(data))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CacheError(f"damaged: {type(exc).__name__}: {exc}") from exc


def _entry(raw: Any) -> Entry:
    if not isinstance(raw, dict) or raw.get("schema") != SCHEMA:
        raise ValueError(f"not a {SCHEMA} document")
    stamp = raw["stamp"]
    if not isinstance(stamp, dict) or not all(
        isinstance(v, dict) and all(isinstance(x, str) for x in (*v, *v.values())) for v in stamp.values()
    ):
        raise TypeError("stamp: not sections of strings")
    results = tuple(_result(r) for r in raw["results"])
    checks, sites = raw["checks"], raw["sites"]
    if not all(isinstance(x, str) for x in (*checks, *sites)) or [r.check for r in results] != list(checks):
        raise TypeError("checks and results do not match")
    written = raw["written"]
    if not isinstance(written, (int, float)) or isinstance(written, bool):
        raise TypeError("written: not a time")
    return Entry(
        {str(k): dict(v) for k, v in stamp.items()},
        tuple(checks),
        results,
        tuple(sites),
        float(written),
        str(raw["stackgate"]),
    )


def _result(raw: Any) -> Result:
    if not isinstance(raw, dict) or not isinstance(raw.get("summary"), str) or not isinstance(raw.get("check"), str):
        raise TypeError("a result without its check or summary")
    if not isinstance(raw.get("details", []), list) or not all(isinstance(d, str) for d in raw.get("details", [])):
        raise TypeError(f"{raw['check']}: details are not lines")
    if not isinstance(raw.get("data", {}), dict):
        raise TypeError(f"{raw['check']}: data is not an object")
    return Result.from_dict(raw)


def miss(entry: Entry | None, stamp: Stamp, checks: Sequence[str], now: float) -> str | None:
    """Why the cache cannot answer now (None: it can)."""
    if entry is None:
        return "no cache yet"
    if entry.version != __version__:
        return f"written by stackgate {entry.version}"
    if list(entry.checks) != list(checks):
        return "other checks were asked for"
    if not 0 <= now - entry.written <= MAX_AGE_S:
        return f"older than {MAX_AGE_S / 3600:g} h"
    differs = changed(entry.stamp, stamp)
    return f"changed since: {'; '.join(differs)}" if differs else None


def save(path: Path, entry: Entry) -> str | None:
    """Write the cache (atomically); why it was not written, if it was not."""
    if any(r.status == Status.ERROR for r in entry.results):
        return "not cached: a check crashed or timed out"
    try:
        write_json(path, entry.to_dict())
        os.chmod(path, path.stat().st_mode & 0o755)  # no one else may write what the next verify trusts
    except (OSError, ValueError) as exc:
        return f"not cached: cannot write {path}: {exc}"
    return None
