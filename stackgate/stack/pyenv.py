"""The stack's Python environment: created with uv (pip when the lock asks), filled in the order
the stack needs, with the guard in force.

Order (FACTS.md): the torch family first, from its own index, with ``--no-deps``, so that exactly
the packages the lock maps to that index come from it; then the whole lock from the default index
(torch's own dependencies included), with the guard's constraints, the URL wheels checked against
their sha256, and the declared overrides (uv: ``--override``; pip: a separate ``--no-deps`` step).
Every install step sees exactly ONE index, so no index strategy (pip's "highest version of all
indexes", uv's ``first-index`` or ``unsafe-best-match``) can take a package from the wrong one;
the constraints, not the index order, hold torch.

Every command is built here as data (:class:`Command`), shown by the plan exactly as it runs.
Installers run without the user's pip/uv configuration: a stray PIP_INDEX_URL, PIP_CONSTRAINT
(say, from a sourced stackgate.env of another generation) or /etc/pip.conf would change what
gets installed.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from stackgate.edges import fetch, runner
from stackgate.models import envfile, settings
from stackgate.models.spec import Lock, Override, Package, Python
from stackgate.stack import guard

__all__ = [
    "Command",
    "PyenvError",
    "activate_text",
    "built_python",
    "environment",
    "environment_text",
    "family_commands",
    "fetch_wheel",
    "find_uv",
    "installer_environ",
    "override_command",
    "python_of",
    "requirements",
    "run",
    "stack_command",
    "venv_commands",
    "wheel_path",
    "write_environment",
    "write_requirements",
]

REQUIREMENTS = "requirements.txt"
ENV_FILE = "stackgate.env"
ACTIVATE = "activate"
#: pip/uv settings that do not change WHAT gets installed, so a user's values are kept.
_KEPT_SETTINGS = frozenset(
    {
        "UV_CACHE_DIR", "PIP_CACHE_DIR", "PIP_NO_CACHE_DIR", "UV_NO_CACHE", "UV_LINK_MODE",
        "UV_HTTP_TIMEOUT", "PIP_DEFAULT_TIMEOUT", "PIP_CERT", "PIP_CLIENT_CERT", "UV_NATIVE_TLS",
        "UV_CONCURRENT_DOWNLOADS", "UV_CONCURRENT_INSTALLS",
    }
)  # fmt: skip


class PyenvError(Exception):
    """An environment step that failed; ``log`` holds its full output, ``unreachable`` the
    indexes it used that did not answer."""

    def __init__(self, message: str, log: Path | None = None, tail: tuple[str, ...] = (), unreachable: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.log = log
        self.tail = tail
        self.unreachable = unreachable


@dataclass(frozen=True)
class Command:
    """One program run: what the plan shows is exactly what runs."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)  #: set on top of the installer environment

    @property
    def display(self) -> str:
        """Shell text a person can paste.

        >>> Command(("pip", "install", "a b"), {"PIP_CONFIG_FILE": "/dev/null"}).display
        "PIP_CONFIG_FILE=/dev/null pip install 'a b'"
        """
        prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in self.env.items())
        return prefix + shlex.join(self.argv)


def python_of(home: Path) -> Path:
    return home / "bin" / "python"


def find_uv() -> str | None:
    """The uv binary: the one installed with stackgate's own interpreter, else the one on PATH."""
    try:
        import uv  # the PyPI package ships the binary and knows where it is

        return str(uv.find_uv_bin())
    except (ImportError, FileNotFoundError):
        return shutil.which("uv")


def installer_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without anything that changes what pip or uv install (cache and TLS kept)."""
    env = {k: v for k, v in environ.items() if not k.startswith(("PIP_", "UV_")) or k in _KEPT_SETTINGS}
    for name in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "CONDA_PREFIX"):
        env.pop(name, None)
    return env


# --- the commands -----------------------------------------------------------------------------

_PIP_ENV = {"PIP_CONFIG_FILE": os.devnull}


def _pip(home: Path, *args: str) -> Command:
    argv = (str(python_of(home)), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", *args)
    return Command(argv, _PIP_ENV)


def _uv(uv: str, home: Path, *args: str) -> Command:
    return Command((uv, "pip", "install", "--no-config", "--python", str(python_of(home)), *args))


def venv_commands(lock: Lock, base: Path, home: Path, uv: str | None) -> list[Command]:
    """Create the environment from ``base`` (an interpreter of the locked version), with pip in it:
    pip is what people type later, and the guard (PIP_CONSTRAINT) must hold it too."""
    if lock.python.installer == "pip":
        return [Command((str(base), "-m", "venv", str(home)), _PIP_ENV)]
    assert uv is not None
    # --allow-existing: the generation's folder already holds its marker (state "building").
    create = Command((uv, "venv", "--no-config", "--no-python-downloads", "--allow-existing", "--python", str(base), str(home)))
    # ensurepip installs the pip bundled with that Python: offline, and the same every time.
    return [create, Command((str(python_of(home)), "-m", "ensurepip", "--default-pip"), _PIP_ENV)]


def family_commands(lock: Lock, home: Path, files: guard.GuardFiles, uv: str | None) -> list[Command]:
    """One install per [[python.index]]: only the pins the lock maps there, without dependencies
    (those come from the default index in the next step)."""
    commands = []
    for index in lock.python.indexes:
        pins = [_pin(lock, name) for name in index.packages]
        if not pins:
            continue
        common = ("--no-deps", "--constraint", str(files.constraints), *pins)
        if lock.python.installer == "pip":
            commands.append(_pip(home, "--index-url", index.url, *common))
        else:
            assert uv is not None
            commands.append(_uv(uv, home, "--default-index", index.url, *common))
    return commands


def stack_command(lock: Lock, home: Path, files: guard.GuardFiles, uv: str | None) -> Command:
    """The whole lock, from the default index, with the guard (and uv's overrides)."""
    requirement = str(home / REQUIREMENTS)
    if lock.python.installer == "pip":
        return _pip(home, "--index-url", lock.python.default_index, "--constraint", str(files.constraints), "--requirement", requirement)
    assert uv is not None
    return _uv(
        uv, home, "--default-index", lock.python.default_index, "--constraint", str(files.constraints),
        "--override", str(files.overrides), "--requirement", requirement,
    )  # fmt: skip


def override_command(lock: Lock, home: Path, files: guard.GuardFiles, cache: Path) -> Command | None:
    """pip only: the overridden packages, over what the resolution chose, without dependencies
    (pip cannot override a requirer's pin in one resolution; FACTS.md)."""
    if lock.python.installer != "pip" or not lock.python.overrides:
        return None
    wanted = []
    for override in lock.python.overrides:
        package = lock.python.package(override.package)
        wanted.append(_requirement(package, cache) if package and package.url else f"{override.package}{override.specifier}")
    return _pip(home, "--no-deps", "--index-url", lock.python.default_index, "--constraint", str(files.constraints), *wanted)


def _pin(lock: Lock, name: str) -> str:
    package = lock.python.package(name)
    assert package is not None  # the lock loader refuses an index name without a pin
    return f"{package.name}{package.specifier}"


def requirements(lock: Lock, cache: Path) -> list[str]:
    """The install step's requirement lines: every pin; URL packages as their checked local wheel.

    With pip the overridden packages wait for their own step: in the same resolution their
    requirers' pins would make it impossible.
    """
    skip = {o.package for o in lock.python.overrides} if lock.python.installer == "pip" else set()
    return [_requirement(p, cache) for p in lock.python.packages if p.name not in skip]


def _requirement(package: Package, cache: Path) -> str:
    if package.url:
        return f"{package.name} @ file://{wheel_path(package, cache)}"
    return f"{package.name}{package.specifier}"


def write_requirements(lock: Lock, home: Path, cache: Path) -> Path:
    path = home / REQUIREMENTS
    _write_atomic(path, "".join(f"{line}\n" for line in requirements(lock, cache)))
    return path


# --- running them -----------------------------------------------------------------------------


def run(command: Command, *, log: Path, environ: Mapping[str, str], lock: Lock | None = None, on_line: Callable[[str], None] | None = None) -> runner.Completed:
    """Run one step's command; a failure names its log, and a resolution the guard blocked names
    the package that asked for another version of a frozen one."""
    env = {**installer_environ(environ), **command.env}
    limit_s = settings.PYTHON_INSTALL_TIMEOUT_S.value(environ)
    done = runner.stream(command.argv, log=log, timeout_s=limit_s, env=env, on_line=on_line)
    if done.ok:
        return done
    tail = tuple(done.tail(15))
    culprits = guard.blocked(done.stdout, lock) if lock is not None else []
    if culprits:
        raise guard.GuardError(_blocked_message(culprits), log, tail)
    ended = f"timed out after {limit_s:g} s" if done.timed_out else f"exit {done.returncode}"
    silent = {url: why for url in _indexes(command) if (why := fetch.unreachable(url)) is not None}
    said = "".join(f"; {url} does not answer ({why})" for url, why in silent.items())
    raise PyenvError(f"`{Path(command.argv[0]).name} {' '.join(command.argv[1:3])}` failed ({ended}){said}", log, tail, tuple(silent))


#: The installer options that name an index (pip's and uv's spellings).
_INDEX_OPTIONS = frozenset({"--index-url", "--extra-index-url", "--default-index", "--index"})


def _indexes(command: Command) -> list[str]:
    """The index URLs a command uses.

    >>> _indexes(Command(("uv", "pip", "install", "--default-index", "https://a/simple", "torch")))
    ['https://a/simple']
    """
    argv = command.argv
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg in _INDEX_OPTIONS]


def _blocked_message(culprits: list[guard.Blocked]) -> str:
    first = culprits[0]
    others = "".join(f"; also {c}" for c in culprits[1:])
    return (
        f"the guard blocked a resolution: {first}{others}. Pin {first.requirer} to a version that accepts "
        f"{first.package} {first.locked}, drop it, or change the lock's {first.package} on purpose"
    )


# --- URL wheels -------------------------------------------------------------------------------


def wheel_path(package: Package, cache: Path) -> Path:
    """Where a URL wheel lives once checked: under its sha256, so a changed pin is a new file."""
    assert package.url is not None and package.sha256 is not None
    name = urllib.parse.unquote(urllib.parse.urlsplit(package.url).path.rsplit("/", 1)[-1])
    return cache / package.sha256 / name


def fetch_wheel(
    package: Package,
    cache: Path,
    *,
    on_progress: Callable[[int, int | None], None] | None = None,
    on_retry: Callable[[str], None] | None = None,
    retry: fetch.Retry = fetch.RETRY,
) -> tuple[Path, bool]:
    """Download a URL wheel (tried again and resumed when the connection drops) and check its
    sha256 before anything installs it.

    Returns the checked file and whether it was downloaded (False: the cache already had it).
    """
    target = wheel_path(package, cache)
    try:
        downloaded = fetch.fetch_checked(
            str(package.url), target, str(package.sha256), timeout_s=settings.DOWNLOAD_TIMEOUT_S.value(), on_progress=on_progress, on_retry=on_retry, retry=retry
        )
    except fetch.HashMismatch as exc:
        raise PyenvError(f"{package.name}: {exc}; refusing to install it (a changed or tampered file, or a wrong sha256 in the lock)") from exc
    except fetch.FetchError as exc:
        raise PyenvError(str(exc)) from exc
    return target, downloaded


# --- the environment file ---------------------------------------------------------------------


def environment(lock: Lock, home: Path) -> dict[str, str]:
    """What stackgate.env exports: the default toolkit first on PATH, its CUDA_HOME and ptxas,
    the guard (PIP_CONSTRAINT, UV_CONSTRAINT: later installs cannot move torch either), the
    environment itself (VIRTUAL_ENV, so `uv pip` finds it), then the lock's [env]."""
    default = lock.default_toolkit
    values: dict[str, str] = {}
    if default is not None:
        values["CUDA_HOME"] = str(default.prefix)
    path = [str(default.prefix / "bin")] if default is not None else []
    values["PATH"] = ":".join([*path, str(home / "bin"), "$PATH"])
    if default is not None:
        values["TRITON_PTXAS_PATH"] = str(default.prefix / "bin" / "ptxas")
    constraints = str(home / guard.CONSTRAINTS)
    values.update(PIP_CONSTRAINT=constraints, UV_CONSTRAINT=constraints, VIRTUAL_ENV=str(home))
    values.update(lock.env)
    return values


def environment_text(lock: Lock, home: Path, root: Path) -> str:
    header = f"stackgate environment of {lock.name}, generation {home.name}.\nSource it: . {root / 'current' / ENV_FILE}"
    return envfile.render(environment(lock, home), header)


def activate_text(lock: Lock, home: Path, root: Path) -> str:
    return (
        f"# Source this file to work in the stack: . {root / 'current' / ACTIVATE}\n"
        f"# It applies stackgate.env (CUDA, the guard's constraints, the lock's [env]) and marks the prompt.\n"
        f". {shlex.quote(str(home / ENV_FILE))}\n"
        f'PS1="({lock.name}) ${{PS1-}}"\n'
        "hash -r 2>/dev/null || true\n"
    )


def write_environment(lock: Lock, home: Path, root: Path) -> Path:
    """Write what people and their tools read in a generation: stackgate.env and activate (each
    replaced atomically), and pip.conf, the guard for its pip whether activated or not."""
    _write_atomic(home / ENV_FILE, environment_text(lock, home, root))
    _write_atomic(home / ACTIVATE, activate_text(lock, home, root))
    guard.write_pip_conf(lock, home)
    return home / ENV_FILE


def _write_atomic(path: Path, text: str) -> None:
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    part.write_text(text, encoding="utf-8")
    os.replace(part, path)


# --- what a generation was built from ---------------------------------------------------------


def built_python(python: Python, built: Any, interpreter: Path) -> Python:
    """``python`` as a generation was built: the pins, frozen packages and overrides of ``built``
    (the :func:`~stackgate.facts.compare.environment_spec` in its marker), read at ``interpreter``. ValueError when ``built`` is not
    such a spec (a marker from elsewhere, or damaged)."""
    try:
        packages = tuple(Package(name, SpecifierSet(p["version"]), p.get("url"), p.get("sha256")) for name, p in built["packages"].items())
        overrides = tuple(Override(name, SpecifierSet(spec), "declared when it was built") for name, spec in built["overrides"].items())
        frozen = tuple(str(name) for name in built["frozen"])
        version = str(built["python"])
    except (KeyError, TypeError, AttributeError, InvalidSpecifier) as exc:
        raise ValueError(f"no readable spec: {type(exc).__name__}: {exc}") from exc
    return dataclasses.replace(python, version=version, interpreter=interpreter, packages=packages, frozen=frozen, overrides=overrides)
