"""The local package index's pytest fixtures: the stack's wheels served for the whole session, and an
installer environment of the session's own. The index itself (tests/pkgindex.py) imports no pytest, so
that a benchmark runs with what the README installs."""

from __future__ import annotations

import os
import sys
from typing import Iterator

import pytest
from pkgindex import IndexServer, serve_stack

__all__ = ["install_environ", "stack_index"]


@pytest.fixture(scope="session")
def stack_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IndexServer]:
    """The stack's wheels, served on 127.0.0.1 for the whole session."""
    server = serve_stack(tmp_path_factory.mktemp("index"))
    yield server
    server.close()


@pytest.fixture(scope="session")
def install_environ(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An environment for provisioning in tests: no pip/uv configuration of this machine, caches
    of the session's own, and the running interpreter as the stack's Python."""
    from support import isolated_environ

    caches = tmp_path_factory.mktemp("caches")
    return isolated_environ(
        UV_CACHE_DIR=str(caches / "uv"),
        PIP_CACHE_DIR=str(caches / "pip"),
        STACKGATE_BASE_PYTHON=os.path.realpath(getattr(sys, "_base_executable", sys.executable)),
    )
