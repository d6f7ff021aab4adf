"""The one place that calls the CUDA toolkit and patch modules (stackgate.stack.toolkit and
stackgate.stack.patches), so that plan and provision depend on four functions, not on two
modules' layouts. Each module is imported when a lock first needs it: a lock whose toolkits are
all ``keep = true`` and that has no ``[[patch]]`` never imports either.
"""

from __future__ import annotations

import importlib
import shlex
from pathlib import Path
from types import ModuleType
from typing import Callable, ContextManager, Sequence

from stackgate.checks.facts import ToolkitFacts
from stackgate.models.spec import Patch, Toolkit

__all__ = [
    "AdapterError",
    "apply_patch",
    "cuda_link_state",
    "install_command",
    "install_toolkit",
    "kept_untouched",
    "patch_errors",
    "patch_file_problem",
    "patch_state",
    "set_cuda_link",
    "toolkit_errors",
    "toolkit_state",
]

TOOLKIT_MODULE = "stackgate.stack.toolkit"
PATCHES_MODULE = "stackgate.stack.patches"
# The names stackgate.stack.patches gives its two functions: (is it applied?, apply it).
PATCH_FUNCTIONS = ("patch_state", "apply_patch")


class AdapterError(Exception):
    """A lock that needs a toolkit or patch module this checkout does not have."""


def _module(name: str, what: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        raise AdapterError(f"this lock needs {what}, and this checkout of stackgate has no {name}") from exc


def _toolkit() -> ModuleType:
    return _module(TOOLKIT_MODULE, "CUDA toolkit installation")


def _patches() -> ModuleType:
    return _module(PATCHES_MODULE, "patch support")


def toolkit_errors() -> tuple[type[BaseException], ...]:
    return (_toolkit().ToolkitError,)


def patch_errors() -> tuple[type[BaseException], ...]:
    return (_patches().PatchError,)


def toolkit_state(toolkit: Toolkit, facts: ToolkitFacts) -> str | None:
    """None when the toolkit at its prefix matches the lock, else why it must be installed."""
    return _toolkit().toolkit_state(toolkit, facts)


def install_command(toolkit: Toolkit, cache: Path | None) -> str:
    """The exact command install_toolkit runs, as shell text."""
    command = _toolkit().install_command(toolkit, cache=cache)
    return command if isinstance(command, str) else shlex.join(str(part) for part in command)


def install_toolkit(toolkit: Toolkit, *, log: Path, cache: Path | None, on_progress: Callable[[str], None] | None) -> None:
    _toolkit().install_toolkit(toolkit, log=log, cache=cache, on_progress=on_progress)


def kept_untouched(toolkits: Sequence[Toolkit]) -> ContextManager[object]:
    """Fingerprints the kept toolkits; leaving it raises ToolkitError if any of them changed."""
    return _toolkit().kept_untouched(toolkits)


def cuda_link_state(policy: str, default: Toolkit | None) -> str | None:
    """None when /usr/local/cuda follows the lock's stack.cuda_link policy, else why it must change."""
    return _toolkit().cuda_link_state(policy, default)


def set_cuda_link(target: Path) -> None:
    _toolkit().set_cuda_link(target)


def patch_state(patch: Patch, site_packages: Path) -> str | None:
    """None when the patch is applied in ``site_packages``, else why it must be applied."""
    return getattr(_patches(), PATCH_FUNCTIONS[0])(patch, site_packages)


def patch_file_problem(patch: Patch) -> str | None:
    """None when the patch file reads, has the locked sha256 and is a diff, else why not."""
    module = _patches()
    try:
        module.check_patch_file(patch)
    except module.PatchError as exc:
        return str(exc)
    return None


def apply_patch(patch: Patch, site_packages: Path) -> None:
    getattr(_patches(), PATCH_FUNCTIONS[1])(patch, site_packages)
