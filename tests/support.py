"""Helpers shared by the test modules (plain functions, not fixtures): the checkout's root, the
suite's cache, isolated installer environments, throw-away venvs and interpreter specs, and the one
way a test runs the program (:func:`run_program`)."""

from __future__ import annotations

import base64
import fcntl
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import venv
from pathlib import Path
from typing import Any, Callable

from specs import DEFAULT_TOOLKIT, THIS_PYTHON, minimal_spec

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
CACHE = Path(os.environ.get("STACKGATE_TEST_CACHE", Path.home() / ".cache" / "stackgate-tests"))
#: The CPU torch wheel that lies on this kind of machine's disk (pip finds it through its config).
CPU_TORCH = os.environ.get("STACKGATE_TEST_TORCH", "torch==2.13.0")
#: Written last into a cached build: its presence means the build is complete.
READY = ".stackgate-ready"
#: ``python -c SHOW_MODULES FILE stackgate ARGS``: `python -m stackgate ARGS` that writes, at its exit, the
#: names of the modules it imported to FILE (one a line).
SHOW_MODULES = """
import atexit, runpy, sys
out = sys.argv[1]
sys.argv[:] = sys.argv[2:]
atexit.register(lambda: open(out, "w").write("\\n".join(sorted(sys.modules))))
runpy.run_module("stackgate", run_name="__main__", alter_sys=True)
"""


#: PyPI's simple API, and where its files and their metadata are served from.
PYPI_HOSTS = ("pypi.org", "files.pythonhosted.org")


def pypi_unreachable() -> str | None:
    """Why PyPI cannot be reached from here at all, or None: the one reason a `network` test skips."""
    for host in PYPI_HOSTS:
        try:
            socket.create_connection((host, 443), timeout=10).close()
        except OSError as exc:
            return f"{host}:443 cannot be reached: {exc}"
    return None


def run_program(
    *args: str,
    program: str = "stackgate",
    cwd: Path | str = ROOT,
    env: dict[str, str] | None = None,
    base: dict[str, str] | None = None,
    stdin: str | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """``python -m stackgate ARGS`` (``program="invoke"``: the same tasks through the checkout's tasks.py) in
    a real subprocess, with this checkout's package and the tests' support modules importable and colour
    off. Its environment is ``base`` (by default this process's, less ``$STACKGATE_LOCK``), then ``env``
    over it. ``stdin`` is its input; its output is captured as text; it never raises on an exit code."""
    if base is None:
        base = {k: v for k, v in os.environ.items() if k != "STACKGATE_LOCK"}
    environ = {**base, "PYTHONPATH": f"{ROOT}{os.pathsep}{TESTS}", "NO_COLOR": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", program, *args],
        cwd=cwd,
        env=environ,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def isolated_environ(**extra: str) -> dict[str, str]:
    """This process's environment without any pip/uv configuration, for a test's own index."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(PIP_CONFIG_FILE=os.devnull, UV_NO_CONFIG="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.update(extra)
    return env


def cached_build(home: Path, build: Callable[[Path], None]) -> Path:
    """``home``, built once by ``build(folder)`` and shared by every run of the suite.

    Two runs at once must not break each other, nor a run killed mid-build the next one: the
    build runs under an exclusive lock, in a fresh folder beside ``home`` that no reader sees,
    and a symbolic link renamed onto ``home`` (atomic) publishes it once it is complete. The
    folder itself is never moved, because a venv cannot be (its scripts name their own path).
    Nothing a reader may be using is deleted: only unfinished folders, under the lock.
    """
    if _built(home):
        return home
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / f".{home.name}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if _built(home):
            return home  # another run built it while this one waited for the lock
        _sweep(home)
        folder = Path(tempfile.mkdtemp(prefix=f".{home.name}.", suffix=".d", dir=home.parent))
        folder.chmod(0o755)  # as a folder made by hand: mkdtemp makes it private
        build(folder)
        (folder / READY).write_text(f"built by pid {os.getpid()}\n")
        link = folder.with_suffix(".link")
        link.symlink_to(folder.name)
        os.replace(link, home)
    return home


def _sweep(home: Path) -> None:
    """Delete what killed builders left (only the lock's holder builds, so none is in use); a
    complete build is kept, as a reader may be using it."""
    legacy = [home] if home.is_dir() and not home.is_symlink() else []  # built in place by older tests
    for folder in [*home.parent.glob(f".{home.name}.*.d"), *legacy]:
        if not (folder / READY).is_file():
            folder.rename(folder.with_name(f".{home.name}.{folder.name}.removing"))  # gone at once
    for leftover in home.parent.glob(f".{home.name}.*.removing"):
        shutil.rmtree(leftover)


def _built(home: Path) -> bool:
    return (home / READY).is_file()


def released_wheel(name: str, version: str) -> Path:
    """The released wheel of ``name==version`` from PyPI (a pure-Python one: ``*.whl``),
    downloaded once into the test cache and shared by every run (``cached_build``)."""

    def download(folder: Path) -> None:
        argv = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary",
            ":all:",
            f"{name}=={version}",
            "-d",
            str(folder),
        ]
        subprocess.run(argv, env=isolated_environ(), check=True, capture_output=True)

    (found,) = cached_build(CACHE / f"{name}-{version}-wheel", download).glob("*.whl")
    return found


def make_venv(home: Path) -> tuple[Path, Path]:
    """A fresh empty venv: its interpreter and its site-packages."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(home)
    python = home / "bin" / "python"
    site = next((home / "lib").glob("python3*/site-packages"))
    return python, site


def install_dist(
    site: Path, name: str, version: str, requires: tuple[str, ...] = (), files: dict[str, bytes] | None = None
) -> Path:
    """Install a distribution the way an installer leaves it: files, METADATA and RECORD.

    Real metadata, read by importlib.metadata in the target interpreter like any wheel's.
    """
    dist_info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir(parents=True)
    metadata = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        *(f"Requires-Dist: {r}" for r in requires),
    ]
    (dist_info / "METADATA").write_text("\n".join(metadata) + "\n")
    record = []
    for relative, content in (files or {}).items():
        target = site / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
        record.append(f"{relative},sha256={digest},{len(content)}")
    record += [f"{dist_info.name}/METADATA,,", f"{dist_info.name}/RECORD,,"]
    (dist_info / "RECORD").write_text("\n".join(record) + "\n")
    return dist_info


def interpreter_lock(
    python: Path, packages: str = "", extra: str = "", *, imports: str = '["torch"]', version: str | None = None
):
    """A lock for one SM120 GPU whose stack is an existing interpreter of this machine."""
    from stackgate.models.spec import loads_spec

    return loads_spec(interpreter_spec(python, packages, extra, imports=imports, version=version))


def interpreter_spec(
    python: Path, packages: str = "", extra: str = "", *, imports: str = '["torch"]', version: str | None = None
) -> str:
    """The text of :func:`interpreter_lock`'s spec, for a test that needs it in a file."""
    return minimal_spec(
        toolkits=DEFAULT_TOOLKIT,
        version=version or THIS_PYTHON,
        interpreter=python,
        python=f"imports = {imports}\n[python.packages]\n{packages}\n{extra}\n",
    )


def processes_with(marker: str, part: str = "cmdline") -> list[int]:
    """The processes whose ``/proc/<pid>/<part>`` (command line, or ``environ``) holds ``marker``."""
    found = []
    for path in Path("/proc").glob(f"[0-9]*/{part}"):
        try:
            if marker.encode() in path.read_bytes():
                found.append(int(path.parent.name))
        except OSError:
            continue
    return found


def parsed(*argv: str) -> list[Any]:
    """The task contexts (invoke's ParserContext) the `stackgate` program parses ``argv`` into; nothing runs."""
    from stackgate import __version__
    from stackgate import program as cliprogram

    program = cliprogram.StackgateProgram(
        name="stackgate", binary="stackgate", version=__version__, namespace=cliprogram.namespace
    )
    program.create_config()
    program.parse_core(["stackgate", *argv])
    program.parse_collection()
    program.parse_tasks()
    return list(program.tasks)
