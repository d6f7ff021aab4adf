"""A toolkit's tree on disk, below every way of installing one: the error, the staging folder it is built
in, the check that its nvcc reports the locked release, the atomic commit into the prefix, the record
stackgate writes into it, and the installer's log.
"""

from __future__ import annotations

import ctypes
import datetime
import json
import os
import shutil
from pathlib import Path
from typing import Callable, Mapping, Sequence

from stackgate.edges import runner
from stackgate.facts import ToolVersion, tool_version
from stackgate.models import settings
from stackgate.models.spec import Toolkit

__all__ = [
    "CUDA_LINK",
    "DEFAULT_COMPONENTS",
    "RECORD",
    "RUNFILE_FLAGS",
    "Progress",
    "ToolkitError",
]

CUDA_LINK = Path("/usr/local/cuda")
#: cuda-toolkit extras installed when a pypi toolkit names no components: what nvcc needs.
DEFAULT_COMPONENTS = ("nvcc", "crt", "nvvm", "cudart", "cccl")
#: What stackgate writes into a toolkit it installed: provenance, and the licence to replace it.
RECORD = "stackgate-toolkit.json"
# The runfile's documented silent, toolkit-only options: no driver, no man pages under
# /usr/share/man, and no refusal because another toolkit (the kept 12.8) is detected.
RUNFILE_FLAGS = ("--silent", "--toolkit", "--no-man-page", "--override")


class ToolkitError(Exception):
    """A toolkit that cannot be installed, or a kept toolkit that changed; names the log if any."""

    def __init__(self, message: str, log: Path | None = None, tail: Sequence[str] = ()) -> None:
        self.log = log
        self.tail = tuple(tail)
        text = message
        if log is not None:
            text += f"\nfull output: {log}"
        if self.tail:
            text += "\nlast lines:\n" + "\n".join(f"  {line}" for line in self.tail)
        super().__init__(text)


Progress = Callable[[str], None]


def _components(toolkit: Toolkit) -> tuple[str, ...]:
    return toolkit.components or DEFAULT_COMPONENTS


# --- staging, checking, committing --------------------------------------------------------------


def _staging(prefix: Path) -> Path:
    # A sibling, so that the final rename stays on one filesystem and is atomic.
    return prefix.with_name(f".{prefix.name}.stackgate-staging")


def _fresh_staging(prefix: Path) -> Path:
    """An empty staging directory; what an interrupted run left there is removed first."""
    staging = _staging(prefix)
    _remove_tree(staging)
    staging.mkdir(parents=True)
    return staging


def _commit(toolkit: Toolkit, tree: Path, log: Path, progress: Progress) -> None:
    """Check the staged tree's nvcc, then make it the prefix in one rename.

    Replacing an older stackgate install swaps the two trees in one step; the old one is left
    in staging, which the caller removes.
    """
    progress("checking the staged toolkit's nvcc --version")
    _verify_nvcc(toolkit, tree, log)
    progress(f"moving the toolkit into {toolkit.prefix}")
    if toolkit.prefix.exists() or toolkit.prefix.is_symlink():
        _exchange(tree, toolkit.prefix)
    else:
        os.rename(tree, toolkit.prefix)
    _log(log, f"installed CUDA {toolkit.version} at {toolkit.prefix}")


def _verify_nvcc(toolkit: Toolkit, root: Path, log: Path) -> None:
    found = tool_version(root / "bin" / "nvcc")
    if not isinstance(found, ToolVersion):
        raise ToolkitError(f"the installed toolkit has no working nvcc: {found.reason}", log, _log_tail(log))
    wrong = found.release != toolkit.release or (toolkit.nvcc is not None and found.build != toolkit.nvcc)
    if wrong:
        want = f"release {toolkit.release}" + (f", V{toolkit.nvcc}" if toolkit.nvcc else "")
        raise ToolkitError(
            f"nvcc reports release {found.release}, V{found.build}; the lock wants {want}", log, _log_tail(log)
        )
    _log(log, f"nvcc reports release {found.release}, V{found.build}")


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> None:
    """Swap two paths atomically (renameat2 RENAME_EXCHANGE): the prefix is never absent."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None and renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return
    # No atomic exchange here (old kernel or filesystem): two renames, a moment without a prefix.
    parked = a.with_name(a.name + ".parked")
    os.rename(b, parked)
    os.rename(a, b)
    os.rename(parked, a)


def _write_record(tree: Path, fields: Mapping[str, object], toolkit: Toolkit) -> None:
    record = {
        "version": str(toolkit.version),
        **fields,
        "installed_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    (tree / RECORD).write_text(json.dumps(record, indent=2) + "\n")


def _read_record(prefix: Path) -> dict[str, object] | None:
    try:
        data = json.loads((prefix / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _owned(prefix: Path) -> bool:
    """A prefix stackgate may replace: one it installed, or an empty directory."""
    if (prefix / RECORD).is_file():
        return True
    return prefix.is_dir() and not prefix.is_symlink() and not any(prefix.iterdir())


def _remove_tree(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def _run(argv: Sequence[str], log: Path, what: str, hint: str = "") -> None:
    done = runner.run_logged(argv, log, timeout_s=settings.TOOLKIT_INSTALL_TIMEOUT_S.value(), env=_installer_env())
    if not done.ok:
        extra = f"; {hint}" if hint else ""
        raise ToolkitError(f"{what} failed ({done.ended}){extra}", log, done.tail())


def _log(log: Path, message: str) -> None:
    with open(log, "a", encoding="utf-8") as sink:
        sink.write(f"[stackgate] {message}\n")


def _log_tail(log: Path, lines: int = 12) -> list[str]:
    try:
        return log.read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return []


def _installer_env() -> dict[str, str]:
    """This environment without pip/uv configuration: the machine's pip caps must not apply."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(PIP_CONFIG_FILE=os.devnull, UV_NO_CONFIG="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env
