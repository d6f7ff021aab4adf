"""The stack's Python environment: created with uv, filled with exactly the spec's pylock.

A new environment gets the pylock's distributions and nothing else, every file checked against
the pylock's sha256: uv syncs the generation's copy of the pylock; pip installs hashed
requirements written from it, ``--no-deps`` (the pylock is the resolution: nothing is resolved
again on the machine) and ``--only-binary :all:``. Which index each file comes from was decided
when the pylock was made (the torch family from its own index, explicitly), so no index
strategy at install time can take a package from the wrong one; with a wheelhouse, no index is
asked at all. The guard's constraints stay in every generation for what people install later
(PIP_CONSTRAINT, UV_CONSTRAINT and the environment's pip.conf).

Every command is built here as data (:class:`Command`), shown by the plan exactly as it runs.
Installers run without the user's pip/uv configuration: a stray PIP_INDEX_URL, PIP_CONSTRAINT
(say, from a sourced stackgate.env of another generation) or /etc/pip.conf would change what
gets installed.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import shlex
import shutil
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from stackgate.edges import fetch, files, runner
from stackgate.models import envfile, pylock, settings
from stackgate.models.spec import Override, Package, Python, Spec
from stackgate.stack import guard

__all__ = [
    "BUILT_PYLOCK",
    "INSTALL_PYLOCK",
    "Command",
    "PyenvError",
    "activate_text",
    "built_python",
    "environment",
    "environment_text",
    "fetch_wheel",
    "find_uv",
    "install_commands",
    "installer_environ",
    "local_files",
    "python_of",
    "requirements",
    "run",
    "seed_command",
    "sources",
    "unreachable",
    "venv_commands",
    "wheel_path",
    "wheelhouse_problems",
    "write_environment",
    "write_install_files",
]

REQUIREMENTS = "requirements.txt"
ENV_FILE = "stackgate.env"
ACTIVATE = "activate"
#: pip/uv settings that do not change WHAT gets installed, so a user's values are kept.
_KEPT_SETTINGS = frozenset(
    {
        "UV_CACHE_DIR",
        "PIP_CACHE_DIR",
        "PIP_NO_CACHE_DIR",
        "UV_NO_CACHE",
        "UV_LINK_MODE",
        "UV_HTTP_TIMEOUT",
        "PIP_DEFAULT_TIMEOUT",
        "PIP_CERT",
        "PIP_CLIENT_CERT",
        "UV_NATIVE_TLS",
        "UV_CONCURRENT_DOWNLOADS",
        "UV_CONCURRENT_INSTALLS",
    }
)


class PyenvError(Exception):
    """An environment step that failed; ``log`` holds its full output, ``unreachable`` the
    indexes it used that did not answer."""

    def __init__(
        self, message: str, log: Path | None = None, tail: tuple[str, ...] = (), unreachable: tuple[str, ...] = ()
    ) -> None:
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
#: uv calls installing from a pylock a preview feature; saying so keeps the warning out of the logs
#: (older uv versions ignore the variable).
_UV_ENV = {"UV_PREVIEW_FEATURES": "pylock"}
#: What a generation installs from: the pylock's packages, files named by URL or local path.
INSTALL_PYLOCK = "pylock.install.toml"
#: The pylock a generation was built from, as it was (rollback and verify read it there).
BUILT_PYLOCK = "pylock.toml"


def _pip(home: Path, *args: str) -> Command:
    argv = (str(python_of(home)), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", *args)
    return Command(argv, _PIP_ENV)


def venv_commands(spec: Spec, base: Path, home: Path, uv: str | None, bundled_pip: Path | None = None) -> list[Command]:
    """Create the environment from ``base`` (an interpreter of the locked version) with uv (well
    under a second, where ``python -m venv`` runs ensurepip for seconds); with the pip installer,
    put pip in at once, since it does the installing."""
    if uv is None:  # only the pip installer gets here (the plan blocks uv without uv)
        return [Command((str(base), "-m", "venv", str(home)), _PIP_ENV)]
    # --allow-existing: the generation's folder already holds its marker (state "building").
    create = Command(
        (uv, "venv", "--no-config", "--no-python-downloads", "--allow-existing", "--python", str(base), str(home))
    )
    return [create, seed_command(home, uv, bundled_pip)] if spec.python.installer == "pip" else [create]


def seed_command(home: Path, uv: str | None, bundled_pip: Path | None) -> Command:
    """Put pip into the environment: what people type later, held there by the guard's pip.conf.
    The pip wheel the base Python bundles, installed by uv offline; ensurepip where there is none."""
    if uv is not None and bundled_pip is not None:
        return Command(
            (
                uv,
                "pip",
                "install",
                "--no-config",
                "--offline",
                "--no-deps",
                "--python",
                str(python_of(home)),
                str(bundled_pip),
            )
        )
    return Command((str(python_of(home)), "-m", "ensurepip", "--default-pip"), _PIP_ENV)


def install_commands(
    spec: Spec, home: Path, uv: str | None, *, wheelhouse: Path | None = None, bundled_pip: Path | None = None
) -> list[Command]:
    """Install exactly the pylock into a new environment, every file checked against its sha256:
    uv syncs the generation's pylock (then pip goes in beside it); pip installs the generation's
    hashed requirements without resolving (``--no-deps``: the pylock is the resolution)."""
    if spec.python.installer == "uv":
        assert uv is not None
        offline = ("--offline",) if wheelhouse is not None else ()
        sync = Command(
            (uv, "pip", "sync", "--no-config", *offline, "--python", str(python_of(home)), str(home / INSTALL_PYLOCK)),
            _UV_ENV,
        )
        return [sync, seed_command(home, uv, bundled_pip)]
    if wheelhouse is not None:
        where: tuple[str, ...] = ("--no-index", "--find-links", str(wheelhouse))
    else:
        where = (
            "--index-url",
            spec.python.default_index,
            *(arg for index in spec.python.indexes for arg in ("--extra-index-url", index.url)),
        )
    return [
        _pip(
            home,
            "--no-deps",
            "--require-hashes",
            "--only-binary",
            ":all:",
            *where,
            "--requirement",
            str(home / REQUIREMENTS),
        )
    ]


def local_files(resolution: pylock.Resolution, cache: Path, wheelhouse: Path | None) -> dict[str, Path]:
    """The locked files an install takes from this machine, by sha256: every file from a
    wheelhouse; else the URL wheels (``archive``), which provision downloads and checks itself
    (resumable, into ``cache``) before installing."""
    if wheelhouse is not None:
        return {file.sha256: file.within(wheelhouse) for file in resolution.files}
    return {p.archive.sha256: wheel_path(p.archive, cache) for p in resolution.packages.values() if p.archive}


def requirements(resolution: pylock.Resolution, local: Mapping[str, Path]) -> list[str]:
    """pip's lines: each locked package at its version with every locked file's sha256 (pip takes
    the one that fits this interpreter and checks it); a URL wheel by its URL or local file."""
    lines = []
    for package in resolution.packages.values():
        marker = f" ; {package.marker}" if package.marker else ""
        hashes = "".join(f" --hash=sha256:{f.sha256}" for f in package.files)
        if package.archive is not None:
            origin = local[package.archive.sha256].as_uri() if package.archive.sha256 in local else package.archive.url
            lines.append(f"{package.name} @ {origin}{marker}{hashes}")
        else:
            lines.append(f"{package.name}=={package.version}{marker}{hashes}")
    return lines


def write_install_files(resolution: pylock.Resolution, home: Path, local: Mapping[str, Path]) -> None:
    """What a generation installs from, written into it: the pylock as it was, the installer's
    pylock (local files by path) and pip's hashed requirements."""
    files.write_text(home / BUILT_PYLOCK, resolution.path.read_text(encoding="utf-8"))
    files.write_text(home / INSTALL_PYLOCK, pylock.install_text(resolution, local))
    files.write_text(home / REQUIREMENTS, "".join(f"{line}\n" for line in requirements(resolution, local)))


def sources(spec: Spec, resolution: pylock.Resolution) -> list[str]:
    """Where an install from the index downloads from: uv fetches each locked file by its URL (its
    server's root is asked), pip asks the spec's indexes; both fetch URL wheels by their URL."""
    origins = {_origin(f.url) for f in resolution.files}
    if spec.python.installer == "pip":
        origins = {_origin(f.url) for p in resolution.packages.values() if p.archive for f in (p.archive,)}
        origins |= {spec.python.default_index, *(index.url for index in spec.python.indexes)}
    return sorted(origins)


def _origin(url: str) -> str:
    """The server root of a URL.

    >>> _origin("https://files.pythonhosted.org/packages/71/43/x.whl")
    'https://files.pythonhosted.org/'
    """
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/"


def unreachable(urls: Sequence[str]) -> dict[str, str]:
    """Each URL that nothing answers at, with the reason (asked in parallel)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(8, len(urls)))) as pool:
        answers = dict(zip(urls, pool.map(fetch.unreachable, urls), strict=True))
    return {url: why for url, why in answers.items() if why is not None}


def wheelhouse_problems(resolution: pylock.Resolution, wheelhouse: Path) -> list[str]:
    """Each locked file the wheelhouse lacks or holds with another sha256."""
    problems = []
    for file in resolution.files:
        path = file.within(wheelhouse)
        if not path.is_file():
            problems.append(f"{file.filename} is missing")
        elif (have := fetch.sha256_file(path)) != file.sha256:
            problems.append(f"{file.filename} has sha256 {have}, the pylock says {file.sha256}")
    return problems


# --- running them -----------------------------------------------------------------------------


def run(
    command: Command,
    *,
    log: Path,
    environ: Mapping[str, str],
    spec: Spec | None = None,
    on_line: Callable[[str], None] | None = None,
) -> runner.Completed:
    """Run one step's command; a failure names its log, and a resolution the guard blocked names
    the package that asked for another version of a frozen one."""
    env = {**installer_environ(environ), **command.env}
    limit_s = settings.PYTHON_INSTALL_TIMEOUT_S.value(environ)
    done = runner.stream(command.argv, log=log, timeout_s=limit_s, env=env, on_line=on_line)
    if done.ok:
        return done
    tail = tuple(done.tail(15))
    culprits = guard.blocked(done.stdout, spec) if spec is not None else []
    if culprits:
        raise guard.GuardError(_blocked_message(culprits), log, tail)
    ended = f"timed out after {limit_s:g} s" if done.timed_out else f"exit {done.returncode}"
    silent = {url: why for url in _indexes(command) if (why := fetch.unreachable(url)) is not None}
    said = "".join(f"; {url} does not answer ({why})" for url, why in silent.items())
    raise PyenvError(
        f"`{Path(command.argv[0]).name} {' '.join(command.argv[1:3])}` failed ({ended}){said}", log, tail, tuple(silent)
    )


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


def wheel_path(file: pylock.LockedFile, cache: Path) -> Path:
    """Where a URL wheel lives once checked: under its sha256, so another file is another path."""
    return file.within(cache / file.sha256)


def fetch_wheel(
    name: str,
    file: pylock.LockedFile,
    cache: Path,
    *,
    on_progress: Callable[[int, int | None], None] | None = None,
    on_retry: Callable[[str], None] | None = None,
    retry: fetch.Retry = fetch.RETRY,
) -> tuple[Path, bool]:
    """Download a URL wheel (tried again and resumed when the connection drops) and check its
    sha256 (the pylock's) before anything installs it.

    Returns the checked file and whether it was downloaded (False: the cache already had it).
    """
    target = wheel_path(file, cache)
    try:
        downloaded = fetch.fetch_checked(
            file.url,
            target,
            file.sha256,
            timeout_s=settings.DOWNLOAD_TIMEOUT_S.value(),
            on_progress=on_progress,
            on_retry=on_retry,
            retry=retry,
        )
    except fetch.HashMismatch as exc:
        raise PyenvError(
            f"{name}: {exc}; refusing to install it (a changed or tampered file, or a wrong sha256 in the pylock)"
        ) from exc
    except fetch.FetchError as exc:
        raise PyenvError(str(exc)) from exc
    return target, downloaded


# --- the environment file ---------------------------------------------------------------------


def environment(spec: Spec, home: Path) -> dict[str, str]:
    """What stackgate.env exports: the default toolkit first on PATH, its CUDA_HOME and ptxas,
    the guard (PIP_CONSTRAINT, UV_CONSTRAINT: later installs cannot move torch either), the
    environment itself (VIRTUAL_ENV, so `uv pip` finds it), then the lock's [env]."""
    default = spec.default_toolkit
    values: dict[str, str] = {}
    if default is not None:
        values["CUDA_HOME"] = str(default.prefix)
    path = [str(default.prefix / "bin")] if default is not None else []
    values["PATH"] = ":".join([*path, str(home / "bin"), "$PATH"])
    if default is not None:
        values["TRITON_PTXAS_PATH"] = str(default.prefix / "bin" / "ptxas")
    # As a file: URL, which both read: pip and uv split these variables on whitespace, and a
    # root such as "/srv/my stack" would otherwise become two files that do not exist.
    constraints = (home / guard.CONSTRAINTS).absolute().as_uri()
    values.update(PIP_CONSTRAINT=constraints, UV_CONSTRAINT=constraints, VIRTUAL_ENV=str(home))
    values.update(spec.env)
    return values


def environment_text(spec: Spec, home: Path, root: Path) -> str:
    header = (
        f"stackgate environment of {spec.name}, generation {home.name}.\nSource it: . {root / 'current' / ENV_FILE}"
    )
    return envfile.render(environment(spec, home), header)


def activate_text(spec: Spec, home: Path, root: Path) -> str:
    return (
        f"# Source this file to work in the stack: . {root / 'current' / ACTIVATE}\n"
        f"# It applies stackgate.env (CUDA, the guard's constraints, the lock's [env]) and marks the prompt.\n"
        f". {shlex.quote(str(home / ENV_FILE))}\n"
        f'PS1="({spec.name}) ${{PS1-}}"\n'
        "hash -r 2>/dev/null || true\n"
    )


def write_environment(spec: Spec, home: Path, root: Path) -> Path:
    """Write what people and their tools read in a generation: stackgate.env and activate (each
    replaced atomically), and pip.conf, the guard for its pip whether activated or not."""
    files.write_text(home / ENV_FILE, environment_text(spec, home, root))
    files.write_text(home / ACTIVATE, activate_text(spec, home, root))
    guard.write_pip_conf(spec, home)
    return home / ENV_FILE


# --- what a generation was built from ---------------------------------------------------------


def built_python(python: Python, built: Any, interpreter: Path) -> Python:
    """``python`` as a generation was built: the pins, frozen packages and overrides of ``built``
    (the :func:`~stackgate.facts.compare.environment_spec` in its marker), read at ``interpreter``.
    ValueError when ``built`` is not such a spec (a marker from elsewhere, or damaged)."""
    try:
        packages = tuple(
            Package(name, SpecifierSet(p["version"]), p.get("url"), p.get("sha256"))
            for name, p in built["packages"].items()
        )
        overrides = tuple(
            Override(name, SpecifierSet(spec), "declared when it was built")
            for name, spec in built["overrides"].items()
        )
        frozen = tuple(str(name) for name in built["frozen"])
        version = str(built["python"])
    except (KeyError, TypeError, AttributeError, InvalidSpecifier) as exc:
        raise ValueError(f"no readable spec: {type(exc).__name__}: {exc}") from exc
    return dataclasses.replace(
        python, version=version, interpreter=interpreter, packages=packages, frozen=frozen, overrides=overrides
    )
