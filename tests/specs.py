"""One builder for the minimal specs (lockfile text) the tests write: a stack name, one GPU's
hardware, the toolkits, the Python section; every other table comes as text after it.

A test that is ABOUT a lockfile's text (hostile files, key-path errors) keeps its own text."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

#: The running interpreter's ``major.minor``, for a spec whose interpreter is this one.
THIS_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
#: The default profile's toolkit: CUDA 13.0 kept where it is installed.
DEFAULT_TOOLKIT = '[[toolkit]]\nversion = "13.0"\nprefix = "/usr/local/cuda-13.0"\nkeep = true\ndefault = true\n'


def minimal_spec(
    *,
    name: str = "t",
    gpu_count: int = 1,
    compute_capability: str = "12.0",
    gpu_name: str = "RTX PRO 6000",
    min_driver: str = "580",
    toolkits: str = "",
    version: str = "3.12",
    interpreter: Path | str | None = None,
    root: Path | str | None = None,
    python: str = "",
    tail: str = "",
) -> str:
    """The text of a spec: ``toolkits`` (``[[toolkit]]`` tables) come before ``[python]``,
    ``python`` is more lines of the ``[python]`` table, ``tail`` the tables after it. The
    interpreter (``interpreter``) or the root (``root``) is written when given."""
    place = "".join(
        f'{key} = "{value}"\n' for key, value in (("interpreter", interpreter), ("root", root)) if value is not None
    )
    return (
        f'[stack]\nname = "{name}"\n'
        f'[hardware]\ngpu_count = {gpu_count}\ncompute_capability = "{compute_capability}"\n'
        f'gpu_name = "{gpu_name}"\nmin_driver = "{min_driver}"\n'
        f"{toolkits}"
        f'[python]\nversion = "{version}"\n{place}{python}'
        f"{tail}"
    )


def write_spec(path: Path, **fields: Any) -> Path:
    """:func:`minimal_spec` written to ``path``; the path."""
    path.write_text(minimal_spec(**fields))
    return path
