"""`stackgate lock`'s action: resolve a stack spec with uv into its pylock, and fill a wheelhouse.

The resolution is one ``uv pip compile --format pylock.toml --generate-hashes`` of the spec's
pins, for the spec's Python version and platform (not this machine's), against the spec's
indexes, with its overrides and the guard's constraints. A package that a [[python.index]] serves
is pinned to that index explicitly (an ``explicit`` uv index and a source naming it, in the
pyproject the resolution reads), so no index strategy can take torch from PyPI or filelock from
the torch index. The existing pylock is handed to uv as the output file, so its versions are
preferences: a new resolution moves only what the spec or ``--upgrade-package`` asks to move.

A URL wheel (sgl-kernel's cu130 build) is downloaded once by uv and hashed: when the spec names
no sha256 that hash is trusted on first use and reported for review; a hash that differs from
the spec's, or from the one the last pylock recorded for the same URL, is refused. The pylock is
validated (:mod:`stackgate.models.pylock`) and only then replaces the old one, atomically.

uv runs with the spec as the whole truth: ``--no-config`` and without the user's UV_*/PIP_*
settings, cache, TLS and timeouts aside (:func:`stackgate.stack.pyenv.installer_environ`), as
every installer stackgate runs.
"""

from __future__ import annotations

import concurrent.futures
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from stackgate.edges import fetch, files
from stackgate.models import pylock, settings
from stackgate.models.spec import Spec
from stackgate.stack import guard, pyenv

__all__ = [
    "FirstUse",
    "Moved",
    "Outcome",
    "ResolveError",
    "compile_command",
    "current",
    "download",
    "previous",
    "resolve",
]

#: Files downloaded into a wheelhouse at once.
DOWNLOADS_AT_ONCE = 4


class ResolveError(Exception):
    """A resolution that failed or was refused; nothing was written. ``log`` holds uv's output."""

    def __init__(self, message: str, log: Path | None = None, tail: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.log = log
        self.tail = tail


@dataclass(frozen=True)
class Moved:
    """A distribution whose locked version changed (None: absent on that side)."""

    name: str
    old: str | None
    new: str | None

    def __str__(self) -> str:
        return f"{self.name}: {self.old or '(none)'} -> {self.new or '(none)'}"


@dataclass(frozen=True)
class FirstUse:
    """A URL wheel whose sha256 no one vouched for: recorded as downloaded (trust on first use)."""

    name: str
    url: str
    sha256: str


@dataclass(frozen=True)
class Outcome:
    path: Path
    resolution: pylock.Resolution
    moved: tuple[Moved, ...]
    first_use: tuple[FirstUse, ...]
    changed: bool  #: the file's bytes differ from the pylock that was there
    replaced: bool  #: there was a pylock before (``moved`` is measured against it)


def current(spec: Spec, wheelhouse: Path | None = None) -> tuple[pylock.Resolution | None, list[str]]:
    """The spec's pylock and how it differs from the spec, offline (``stackgate lock --check``):
    (None, [why]) when there is none. A pylock that does not validate, or names a local file
    outside the roots the spec allows, raises PylockError."""
    path = pylock.path_for(spec.path)
    if not path.exists():
        return None, [f"{path} does not exist"]
    resolution = pylock.load_beside(spec, wheelhouse=wheelhouse)
    return resolution, pylock.differences(spec, resolution)


def resolve(
    spec: Spec,
    *,
    uv: str,
    environ: Mapping[str, str],
    upgrade: Sequence[str] = (),
    on_line: Callable[[str], None] | None = None,
) -> Outcome:
    """Resolve the spec into its pylock and write it; :class:`ResolveError` leaves the old one."""
    target = pylock.path_for(spec.path)
    old = previous(target)
    work = Path(tempfile.mkdtemp(prefix=f"stackgate-lock-{spec.name}-"))
    log = work / "uv.log"
    output = work / "pylock.toml"
    try:
        if old is not None:
            shutil.copyfile(old.path, output)  # its versions are uv's preferences
        command = compile_command(spec, uv, work, output, upgrade)
        pyenv.run(command, log=log, environ=environ, spec=spec, on_line=on_line)
        text = pylock.stamp(output.read_text(encoding="utf-8"), spec)
        resolution = pylock.loads(text.encode(), target)
        outside = pylock.outside_roots(resolution, pylock.file_roots(spec))
        if outside:
            raise pylock.PylockError(target, outside)
    except (pyenv.PyenvError, guard.GuardError) as exc:
        raise ResolveError(f"the resolution failed: {exc}", exc.log, exc.tail) from exc
    except pylock.PylockError as exc:
        raise ResolveError(f"uv wrote a pylock stackgate cannot use: {exc}", log) from exc
    outcome = _judge(spec, old, resolution, upgrade, log)
    files.write_text(target, text)  # a temporary file of its own, renamed: never through a planted link
    shutil.rmtree(work, ignore_errors=True)
    return outcome


def previous(target: Path) -> pylock.Resolution | None:
    """The pylock being replaced, when it is one stackgate can read (else it is resolved afresh)."""
    try:
        return pylock.load(target) if target.exists() else None
    except pylock.PylockError:
        return None


def compile_command(spec: Spec, uv: str, work: Path, output: Path, upgrade: Sequence[str] = ()) -> pyenv.Command:
    """The one uv run that resolves the spec; its inputs are written into ``work``."""
    python = spec.python
    (work / "pyproject.toml").write_text(_pyproject(spec), encoding="utf-8")
    argv = [
        uv,
        "pip",
        "compile",
        "--no-config",
        "--no-python-downloads",
        "--no-build",
        "--no-header",
        str(work / "pyproject.toml"),
    ]
    argv += ["--format", "pylock.toml", "--generate-hashes", "--output-file", str(output)]
    argv += [
        "--python-version",
        python.version,
        "--python-platform",
        python.platform,
        "--default-index",
        python.default_index,
    ]
    if python.frozen:
        (work / guard.CONSTRAINTS).write_text(
            "".join(f"{line}\n" for line in guard.constraints(spec)), encoding="utf-8"
        )
        argv += ["--constraint", str(work / guard.CONSTRAINTS)]
    if python.overrides:
        (work / guard.OVERRIDES).write_text("".join(f"{line}\n" for line in guard.overrides(spec)), encoding="utf-8")
        argv += ["--override", str(work / guard.OVERRIDES)]
    for name in upgrade:
        argv += ["--upgrade-package", name]
    return pyenv.Command(tuple(argv))


def _pyproject(spec: Spec) -> str:
    """The resolution's input: the pins as a project's dependencies, each [[python.index]] as an
    explicit uv index that only the packages it serves come from, URL wheels as URL sources.
    Every value comes from a validated spec and is written as a TOML string."""
    python = spec.python
    lines = [
        "[project]",
        'name = "stackgate-stack"',
        'version = "0"',
        f"requires-python = {_toml(f'>={python.version}')}",
    ]
    lines.append("dependencies = [" + ", ".join(_toml(f"{p.name}{p.specifier}") for p in python.packages) + "]")
    lines += ["", "[tool.uv.sources]"]
    for i, index in enumerate(python.indexes):
        lines += [f"{name} = {{ index = {_toml(f'stackgate-index-{i}')} }}" for name in index.packages]
    lines += [f"{p.name} = {{ url = {_toml(p.url)} }}" for p in python.packages if p.url]
    for i, index in enumerate(python.indexes):
        lines += [
            "",
            "[[tool.uv.index]]",
            f"name = {_toml(f'stackgate-index-{i}')}",
            f"url = {_toml(index.url)}",
            "explicit = true",
        ]
    return "\n".join(lines) + "\n"


def _toml(text: str) -> str:
    return json.dumps(text, ensure_ascii=True)


def _judge(
    spec: Spec, old: pylock.Resolution | None, new: pylock.Resolution, upgrade: Sequence[str], log: Path
) -> Outcome:
    """Refuse what must not be written (a changed URL file, a moved frozen package), and say
    what moved and which hashes were taken on first use."""
    first_use = []
    for package in spec.python.packages:
        if not package.url:
            continue
        locked = new.package(package.name)
        file = next((f for f in locked.files if f.url == package.url), None) if locked else None
        if file is None:
            raise ResolveError(f"{package.name}: the resolution did not take {package.url}", log)
        before = _sha256_of(old, package.url)
        if package.sha256 and file.sha256 != package.sha256:
            raise ResolveError(
                f"{package.name}: {package.url} has sha256 {file.sha256}, the spec says {package.sha256}; nothing "
                "was written (a changed or tampered file, or a wrong sha256 in the spec)",
                log,
            )
        if before and before != file.sha256:
            raise ResolveError(
                f"{package.name}: {package.url} has sha256 {file.sha256} now, {before} when the last pylock was made; "
                f"nothing was written (the file at that URL changed: pin the sha256 you trust in the spec)",
                log,
            )
        if not package.sha256 and not before:
            first_use.append(FirstUse(package.name, package.url, file.sha256))
    moved = _moved(old, new)
    frozen = [m for m in moved if m.name in spec.python.frozen and m.old is not None]
    if upgrade and frozen:
        asked = ", ".join(upgrade)
        raise ResolveError(
            f"--upgrade-package {asked} would move the frozen {'; '.join(str(m) for m in frozen)}: nothing was "
            "written (the guard holds it; change its pin in the spec on purpose)",
            log,
        )
    changed = old is None or old.sha256 != new.sha256
    return Outcome(new.path, new, tuple(moved), tuple(first_use), changed, old is not None)


def _sha256_of(resolution: pylock.Resolution | None, url: str) -> str | None:
    return next((f.sha256 for f in resolution.files if f.url == url), None) if resolution else None


def _moved(old: pylock.Resolution | None, new: pylock.Resolution) -> list[Moved]:
    before = {name: p.version for name, p in old.packages.items()} if old else {}
    after = {name: p.version for name, p in new.packages.items()}
    return [
        Moved(name, before.get(name), after.get(name))
        for name in sorted(before.keys() | after.keys())
        if before.get(name) != after.get(name)
    ]


# --- the wheelhouse -----------------------------------------------------------------------------


def download(
    resolution: pylock.Resolution,
    wheelhouse: Path,
    *,
    on_file: Callable[[str, bool], None] | None = None,
    retry: fetch.Retry = fetch.RETRY,
) -> list[Path]:
    """Every locked file in ``wheelhouse``, each checked against its sha256 (a file already
    there and right is kept); ``on_file(name, downloaded)`` hears about each."""
    files = resolution.files
    targets = {file: file.within(wheelhouse) for file in files}  # every name checked before anything is written
    wheelhouse.mkdir(parents=True, exist_ok=True)

    def one(file: pylock.LockedFile) -> Path:
        target = targets[file]
        try:
            downloaded = fetch.fetch_checked(
                file.url, target, file.sha256, timeout_s=settings.DOWNLOAD_TIMEOUT_S.value(), retry=retry
            )
        except fetch.FetchError as exc:
            raise ResolveError(f"the wheelhouse is incomplete: {exc}") from exc
        if on_file is not None:
            on_file(file.filename, downloaded)
        return target

    with concurrent.futures.ThreadPoolExecutor(max_workers=DOWNLOADS_AT_ONCE) as pool:
        return list(pool.map(one, files))
