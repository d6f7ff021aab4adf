"""A cheap stamp of what the static checks judge, taken without running anything.

``verify --cached`` reuses the static checks' results while this stamp is unchanged. It is made
of file-system metadata and small hashes, never a subprocess: the spec's, its pylock's and the
live environment file's sha256; the driver and the GPUs as NVML reports them (taken anyway for
the live checks); the stack's interpreter (where its path resolves, its file's identity), the
root's live generation; each locked toolkit's tree (the prefix, bin/, nvcc, ptxas, version.json:
where they resolve and their identity) and where /usr/local/cuda points; each site-packages
folder the last full verify found distributions in, and the interpreter's own (its identity and
every ``*.dist-info``, ``*.egg-info`` and ``*.pth`` entry's, with each metadata folder's
METADATA and RECORD, or PKG-INFO), the patch record there and every file it lists; and the
environment variables the stack reads (CUDA_*, NCCL_*, LD_*, PATH, TRITON_*, ...; never a
per-invocation one such as systemd's INVOCATION_ID).

Identity is (inode, size, modification time in ns): installing, removing or upgrading a
distribution renames dist-info folders, which changes their folder's time; a METADATA or RECORD
edited in place changes its own time; a toolkit installed again has new files. What this stamp
cannot see (a library rewritten in place inside a distribution, with the same size and time) is
what the full verify, or a cache's maximum age, is for.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from stackgate import __version__
from stackgate.edges.nvml import NvmlSnapshot
from stackgate.facts.collect import CUDA_LINK
from stackgate.facts.patchstate import RECORD, read_record
from stackgate.facts.values import Missing
from stackgate.models import pylock, settings
from stackgate.models.spec import Spec

__all__ = ["ENV_PREFIXES", "Stamp", "changed", "identity", "take"]

Stamp = dict[str, dict[str, str]]

#: Environment variables the stack's checks read (and the engine would): by prefix or name.
ENV_PREFIXES = (
    "CUDA",
    "NCCL_",
    "NVIDIA_",
    "LD_",
    "PATH",
    "TRITON_",
    "SGLANG_",
    "FLASHINFER_",
    "TORCH",
    "HF_",
    "TRANSFORMERS_",
    "OMP_",
    "MKL_",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "HOME",
    "XDG_CACHE_HOME",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONNOUSERSITE",
    "PYTHONUSERBASE",
    "PYTHONSAFEPATH",  # not PYTHONUNBUFFERED and the like: they change no result
)
_DIST_SUFFIXES = (".dist-info", ".egg-info", ".pth", ".egg-link")
#: The files of a metadata folder whose content the checks read (name, version, requirements, files).
_METADATA_FILES = {".dist-info": ("METADATA", "RECORD"), ".egg-info": ("PKG-INFO", "SOURCES.txt")}


def take(
    spec: Spec, nvml: Callable[[], NvmlSnapshot | Missing], site_dirs: Iterable[str], environ: Mapping[str, str]
) -> Stamp:
    """The stamp of this machine as the static checks of ``lock`` would judge it now. ``nvml`` is
    asked last, so that the files are stamped while NVML is still being read."""
    sites = sorted({*site_dirs, *_own_sites(spec)})
    files = {
        "interpreter": _interpreter(spec),
        "toolkits": {str(t.prefix): _tree(t.prefix) for t in spec.toolkits} | {str(CUDA_LINK): _where(CUDA_LINK)},
        "distributions": {site: _site(Path(site)) for site in sites},
        "patches": {site: _patch_files(Path(site)) for site in sites},
        "environment": {
            name: _digest(environ[name])
            for name in sorted(environ)
            if name.startswith(ENV_PREFIXES) or name in _named(spec)
        },
    }
    return {"stackgate": {"version": __version__}, "lock": _lock(spec), "gpu": _gpu(nvml()), **files}


def changed(old: Mapping[str, Mapping[str, str]], new: Mapping[str, Mapping[str, str]]) -> list[str]:
    """The sections (and at most three entries each) whose values differ, for the note on a miss.

    >>> changed({"lock": {"spec": "a"}, "gpu": {"driver": "1"}}, {"lock": {"spec": "b"}, "gpu": {"driver": "1"}})
    ['lock (spec)']
    """
    found = []
    for section in sorted(set(old) | set(new)):
        before, after = old.get(section) or {}, new.get(section) or {}
        names = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        if names:
            more = f", +{len(names) - 3}" if len(names) > 3 else ""
            found.append(f"{section} ({', '.join(names[:3])}{more})")
    return found


def identity(path: Path | str) -> str:
    """``inode:size:mtime_ns`` of a path (not following a final link), or ``absent``."""
    try:
        stat = os.lstat(path)
    except OSError:
        return "absent"
    return f"{stat.st_ino}:{stat.st_size}:{stat.st_mtime_ns}"


def _digest(text: str | bytes) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text).hexdigest()


def _file_sha(path: Path | None) -> str:
    try:
        return _digest(path.read_bytes()) if path is not None else "none"
    except OSError:
        return "absent"


def _lock(spec: Spec) -> dict[str, str]:
    return {
        "spec": _file_sha(spec.path),
        "pylock": _file_sha(pylock.path_for(spec.path)),
        "env_file": _file_sha(spec.python.env_file),
    }


def _named(spec: Spec) -> set[str]:
    """The lock's own variables and stackgate's settings."""
    return {*spec.env, *spec.smoke.env, *settings.SETTINGS}


def _gpu(nvml: NvmlSnapshot | Missing) -> dict[str, str]:
    if isinstance(nvml, Missing):
        return {"unavailable": nvml.reason}
    found = {"driver": nvml.driver_version, "cuda_driver": str(nvml.cuda_driver_version), "count": str(len(nvml.gpus))}
    found.update({f"gpu{g.index}": f"{g.name} {g.capability} {g.uuid}" for g in nvml.gpus})
    return found


def _where(path: Path) -> str:
    try:
        return f"{os.path.realpath(path)} {identity(Path(os.path.realpath(path)))}"
    except OSError:
        return "absent"


def _interpreter(spec: Spec) -> dict[str, str]:
    found = {"target": _where(spec.python.target)}
    root = spec.python.root
    if root is not None:
        found["current"] = _where(root / "current")
        found["generations"] = identity(root / "generations")
    return found


def _own_sites(spec: Spec) -> list[str]:
    """The interpreter's own site-packages (an environment with no distribution yet has one too)."""
    prefix = spec.python.target.parent.parent  # not resolved: a venv's python links to its base's
    found = [prefix / lib / f"python{spec.python.version}" / "site-packages" for lib in ("lib", "lib64")]
    return [str(p) for p in found if p.is_dir() and not p.is_symlink()]


def _tree(prefix: Path) -> str:
    parts: Sequence[Path] = (
        prefix,
        prefix / "bin",
        prefix / "bin" / "nvcc",
        prefix / "bin" / "ptxas",
        prefix / "version.json",
    )
    return _digest("|".join(_where(p) for p in parts))


def _site(site: Path) -> str:
    """The folder's identity and every distribution entry's in it (with its metadata files'), as
    one digest."""
    try:
        with os.scandir(site) as entries:
            names = sorted(e.name for e in entries if e.name.endswith(_DIST_SUFFIXES))
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"
    return _digest("|".join([identity(site), *(_entry(str(site), n) for n in names)]))


def _entry(site: str, name: str) -> str:
    """A distribution entry's identity, and for a metadata folder its METADATA's and RECORD's (or
    PKG-INFO's): a file rewritten in place changes neither the folder's entries nor its time.
    Plain strings, not Paths: a site of hundreds of distributions is stamped on every cached verify."""
    path = os.path.join(site, name)
    inside = _METADATA_FILES.get(os.path.splitext(name)[1], ())
    return " ".join([name, identity(path), *(identity(os.path.join(path, part)) for part in inside)])


def _patch_files(site: Path) -> str:
    entries = read_record(site)
    files = [dict(entry.get("files") or {}) for entry in entries]  # type: ignore[call-overload]
    listed = sorted({str(path) for named in files for path in named})
    return _digest("|".join([identity(site / RECORD), *(f"{p} {identity(site / p)}" for p in listed)]))
