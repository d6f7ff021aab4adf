"""CUDA toolkits side by side: install one from PyPI wheels, a runfile or apt; never touch kept ones.

The public API, as provision's plan and steps call it:

``toolkit_state(toolkit, facts) -> str | None``
    None when the toolkit at the prefix matches the lock, else why it must be installed. A
    ``keep = true`` toolkit is never something to install: when it is wrong this raises
    :class:`ToolkitError` instead of returning a reason.
``install_command(toolkit, *, cache=None) -> list[str]``
    The exact command that :func:`install_toolkit` runs for the toolkit, for ``--dry-run``.
``install_toolkit(toolkit, *, log, cache=None, on_progress=None, link=CUDA_LINK, apt=None) -> None``
    Install it. All installer output goes to ``log``; a failure raises :class:`ToolkitError`
    naming the log and its last lines. A pypi or runfile toolkit is built in a sibling staging
    directory and renamed into place only once ``bin/nvcc --version`` reports the locked
    release, so the prefix never exists half-built, even after kill -9. Whatever a runfile or
    apt does to ``link`` (/usr/local/cuda) is undone.
``cuda_link_state(policy, default, link=CUDA_LINK) -> str | None``
    The lock's stack.cuda_link policy against the link: None when nothing is to be done, else
    why ``set_cuda_link(default.prefix, link)`` must run ("leave" never asks for anything).
``take_fingerprint(prefix) -> Fingerprint``, ``fingerprint(prefix) -> str``,
``fingerprint_diff(before, after) -> list[str]``
    A fast, stable summary of a tree (paths, types, modes, owners, sizes, mtimes, link
    targets, and content hashes of ``bin/*``), and the named differences between two.
``kept_untouched(toolkits)``
    A context manager: fingerprints every kept toolkit before, and raises :class:`ToolkitError`
    naming what changed if any of them differs after.
``set_cuda_link(target, link=CUDA_LINK) -> None``
    Point the /usr/local/cuda link at a toolkit atomically (a new link, then rename).
``lay_out_wheels(site, tree, *, version=None) -> None``
    Turn NVIDIA's CUDA wheels installed with ``--target site`` into a standard toolkit tree.

This module decides and installs; the ways a toolkit comes (PyPI wheels, a runfile, apt) are
:mod:`stackgate.stack.toolkitsources`, the tree on disk (staging, the nvcc check, the commit, the record)
:mod:`stackgate.stack.toolkittree`, and the kept toolkits' fingerprints :mod:`stackgate.stack.toolkitkept`;
the names above are importable from here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from stackgate.facts import ToolkitFacts
from stackgate.facts.compare import toolkit_problem
from stackgate.models.spec import PYPI_CUDA12_REASON, Toolkit
from stackgate.stack.toolkitkept import Fingerprint, fingerprint, fingerprint_diff, kept_untouched, take_fingerprint
from stackgate.stack.toolkitsources import (
    NVIDIA_REPO,
    Apt,
    AptCommands,
    _apt_install_command,
    _install_apt,
    _install_pypi,
    _install_runfile,
    _obtain_runfile,
    _pypi_command,
    _runfile_command,
    _runfile_display,
    lay_out_wheels,
)
from stackgate.stack.toolkittree import (
    CUDA_LINK,
    DEFAULT_COMPONENTS,
    RECORD,
    RUNFILE_FLAGS,
    Progress,
    ToolkitError,
    _components,
    _fresh_staging,
    _log_tail,
    _owned,
    _read_record,
    _remove_tree,
    _staging,
)

__all__ = [
    "CUDA_LINK",
    "DEFAULT_COMPONENTS",
    "NVIDIA_REPO",
    "RECORD",
    "RUNFILE_FLAGS",
    "Apt",
    "AptCommands",
    "Fingerprint",
    "ToolkitError",
    "cuda_link_state",
    "fingerprint",
    "fingerprint_diff",
    "install_command",
    "install_toolkit",
    "kept_untouched",
    "lay_out_wheels",
    "set_cuda_link",
    "take_fingerprint",
    "toolkit_state",
]

# --- what to do ---------------------------------------------------------------------------------


def toolkit_state(toolkit: Toolkit, facts: ToolkitFacts) -> str | None:
    """None when the installed toolkit matches the lock, else the reason it must be installed."""
    problem = toolkit_problem(facts)
    if toolkit.keep:
        if problem:
            raise ToolkitError(
                f"{toolkit.label} is kept (keep = true) and it is wrong: {problem}. stackgate never "
                "installs or repairs a kept toolkit: restore it with its own installer (runfile or apt)."
            )
        return None
    if problem:
        return problem + _foreign_note(toolkit)
    return _record_problem(toolkit)


def _record_problem(toolkit: Toolkit) -> str | None:
    record = _read_record(toolkit.prefix)
    if record is None:
        return None  # matching and not ours (installed by hand): nothing to do
    if record.get("version") != str(toolkit.version):
        return f"stackgate installed CUDA {record.get('version')} here, the lock wants {toolkit.version}"
    if toolkit.source == "pypi":
        listed = record.get("components")
        recorded = {c for c in listed if isinstance(c, str)} if isinstance(listed, list) else set()
        missing = sorted(set(_components(toolkit)) - recorded)
        if missing:
            return f"installed without the component(s) {', '.join(missing)} that the lock lists"
    return None


def _foreign_note(toolkit: Toolkit) -> str:
    prefix = toolkit.prefix
    if toolkit.source != "apt" and prefix.exists() and not _owned(prefix):
        return f" ({prefix} was not installed by stackgate: provision will not replace it; move it away first)"
    return ""


def install_command(toolkit: Toolkit, *, cache: Path | None = None) -> list[str]:
    """The exact command :func:`install_toolkit` runs for ``toolkit`` (shown by --dry-run)."""
    if toolkit.keep or toolkit.source is None:
        raise ToolkitError(f"{toolkit.label} is kept: stackgate never installs it")
    if toolkit.source == "pypi":
        return _pypi_command(toolkit, _staging(toolkit.prefix) / "site", cache)
    if toolkit.source == "runfile":
        return _runfile_command(_runfile_display(toolkit, cache), _staging(toolkit.prefix))
    return _apt_install_command(toolkit)


# --- installing ---------------------------------------------------------------------------------


def install_toolkit(
    toolkit: Toolkit,
    *,
    log: Path,
    cache: Path | None = None,
    on_progress: Progress | None = None,
    link: Path = CUDA_LINK,
    apt: AptCommands | None = None,
) -> None:
    """Install ``toolkit`` at its prefix, or raise :class:`ToolkitError`.

    A pypi or runfile toolkit is built in ``.<name>.stackgate-staging`` beside the prefix and
    renamed into place once its nvcc reports the locked release: a failure or a kill leaves no
    prefix (only staging, which the next run removes). apt installs in place, as dpkg does; an
    interrupted apt-get is finished by ``dpkg --configure -a`` and the next plan says what is
    still wrong. Whatever a runfile or apt does to ``link`` is undone; the lock's
    stack.cuda_link policy is applied separately (:func:`cuda_link_state`,
    :func:`set_cuda_link`), so that it also holds when no toolkit needed installing.

    ``log`` receives all installer output. ``cache`` keeps downloads between runs (the uv or
    pip cache, runfiles). ``on_progress`` is called with a short line as each phase starts.
    ``apt`` stands in for the apt commands in tests.
    """
    progress = on_progress or (lambda message: None)
    _refuse_unusable(toolkit)
    try:
        _install(toolkit, log, cache, progress, link, apt)
    except OSError as exc:
        raise ToolkitError(f"cannot install {toolkit.label}: {exc}", log, _log_tail(log)) from exc


def _install(
    toolkit: Toolkit, log: Path, cache: Path | None, progress: Progress, link: Path, apt: AptCommands | None
) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    if toolkit.source == "pypi":
        _staged(toolkit, lambda staging: _install_pypi(toolkit, staging, log, cache, progress))
        return
    before = _link_state(link)  # pip and uv never touch the link; runfiles and apt may
    try:
        if toolkit.source == "runfile":
            runfile = _obtain_runfile(toolkit, cache, progress)
            _staged(toolkit, lambda staging: _install_runfile(toolkit, runfile, staging, log, progress))
        else:
            _install_apt(toolkit, log, apt or Apt(), progress)
    finally:
        _restore_link(before, link)


def _staged(toolkit: Toolkit, build: Callable[[Path], None]) -> None:
    """Run ``build`` in a fresh staging directory that never outlives a failure."""
    staging = _fresh_staging(toolkit.prefix)
    try:
        build(staging)
    finally:
        _remove_tree(staging)


def _refuse_unusable(toolkit: Toolkit) -> None:
    if toolkit.keep or toolkit.source is None:
        raise ToolkitError(f"{toolkit.label} is kept (keep = true): stackgate never installs or writes to it")
    if toolkit.source == "pypi" and toolkit.version.major < 13:
        raise ToolkitError(f"pypi cannot provide CUDA {toolkit.version}: {PYPI_CUDA12_REASON}")
    if toolkit.source == "pypi" and not {"nvcc", "all"} & set(_components(toolkit)):
        raise ToolkitError(
            f"{toolkit.label}: components {list(toolkit.components)} lack 'nvcc', so the toolkit would have no compiler"
        )
    if toolkit.source != "apt" and toolkit.prefix.exists() and not _owned(toolkit.prefix):
        raise ToolkitError(
            f"{toolkit.prefix} exists and was not installed by stackgate (no {RECORD}): "
            "it will not be replaced. Move it away, or mark that toolkit keep = true."
        )


# --- the /usr/local/cuda link -------------------------------------------------------------------


@dataclass(frozen=True)
class _LinkState:
    kind: str  #: absent | link | other
    target: str = ""


def _link_state(link: Path) -> _LinkState:
    if link.is_symlink():
        return _LinkState("link", os.readlink(link))
    return _LinkState("other") if link.exists() else _LinkState("absent")


def _restore_link(before: _LinkState, link: Path) -> None:
    """Undo what an installer did to the link (a runfile or apt may re-point /usr/local/cuda)."""
    now = _link_state(link)
    if now == before:
        return
    if before.kind == "absent" and now.kind == "link":
        link.unlink()
    elif before.kind == "link" and now.kind in ("link", "absent"):
        set_cuda_link(Path(before.target), link)
    else:
        raise ToolkitError(
            f"the installer replaced {link} (was {before.kind}, now {now.kind}); stackgate cannot restore it: check "
            "it by hand"
        )


def cuda_link_state(policy: str, default: Toolkit | None, link: Path = CUDA_LINK) -> str | None:
    """None when ``link`` already follows the lock's stack.cuda_link policy, else why it must change."""
    if policy == "leave" or default is None:
        return None
    now = _link_state(link)
    if now.kind == "link" and Path(now.target) == default.prefix:
        return None
    found = {"absent": "does not exist", "other": "is a real directory (stackgate will not replace it)"}.get(
        now.kind, f"points at {now.target}"
    )
    return f'{link} {found}; the lock (cuda_link = "default") wants it to point at {default.prefix}'


def set_cuda_link(target: Path, link: Path = CUDA_LINK) -> None:
    """Point ``link`` at ``target`` atomically: a new link under a temporary name, then rename."""
    if link.is_symlink() and os.readlink(link) == str(target):
        return
    if link.exists() and not link.is_symlink():
        raise ToolkitError(f"{link} is a real directory, not a link: stackgate will not replace it")
    temporary = link.with_name(f".{link.name}.stackgate-{os.getpid()}")
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(target)
    os.replace(temporary, link)
