"""The resolution of a stack spec: a PEP 751 lock file, ``pylock.<name>.toml``, beside the spec.

The spec (``lockfiles/<name>.toml``) says what the stack must be: its top-level pins, indexes,
overrides and guard. ``stackgate lock`` resolves it with uv into the pylock: every distribution with
its version, markers, and each file's URL and sha256. This module reads a pylock through
:mod:`packaging.pylock` (PEP 751's own validation, not a parser of ours), adds what stackgate asks
of one before any of its values reach a requirements file, a command line or a terminal (every
package installable from hashed wheels, URLs that may be fetched, no control characters), and
says, offline, whether the pylock still matches its spec: ``[tool.stackgate.inputs]`` records the
spec's resolution inputs when the pylock is made.

Like the spec, a pylock is input: every problem is collected with its key path and raised at
once as :class:`PylockError` (a :class:`~stackgate.models.spec.SpecError`: exit 2, nothing done).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from stackgate.models import inputfile
from stackgate.models.spec import Spec, SpecError, read_toml, spec_command, url_problem

if TYPE_CHECKING:  # packaging's pylock reader is imported when a pylock is read (a spec without one never does)
    from packaging.pylock import Package as PylockPackage
    from packaging.pylock import Pylock, PylockValidationError

__all__ = [
    "Locked",
    "LockedFile",
    "PylockError",
    "Resolution",
    "check_beside",
    "differences",
    "file_roots",
    "install_text",
    "inputs",
    "lock_command",
    "load",
    "load_beside",
    "loads",
    "outside_roots",
    "path_for",
    "stamp",
    "target_problems",
    "wheel_name_problem",
]

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
#: A wheel's file name (name-version[-build]-python-abi-platform.whl), each field in the escaped
#: alphabet of wheel names: a plain base name, no path separator, nothing a join could resolve away.
_WHEEL_NAME = re.compile(r"[A-Za-z0-9_.]+-[A-Za-z0-9_.!+]+(?:-\d[A-Za-z0-9_.]*)?(?:-[A-Za-z0-9_.]+){3}\.whl")


class PylockError(SpecError):
    """A pylock that cannot be used, with every problem found and its key path."""

    def __init__(self, path: Path | str, problems: list[str]) -> None:
        super().__init__(path, problems)
        noun = "problem" if len(self.problems) == 1 else "problems"
        lines = "\n".join(f"  {problem}" for problem in self.problems)
        self.args = (f"{self.path}: {len(self.problems)} {noun} in the pylock:\n{lines}",)


@dataclass(frozen=True)
class LockedFile:
    """One file of a locked distribution: what an installer may take, and its sha256."""

    filename: str
    sha256: str
    url: str

    def within(self, folder: Path) -> Path:
        """Where this file lies in ``folder``; :class:`PylockError` unless that is inside it (a
        name that is no plain wheel name, or a link there that leads out, is never written through)."""
        target = folder / self.filename
        problem = wheel_name_problem(self.filename)
        if problem is None and target.resolve().parent != folder.resolve():
            problem = f"{self.filename!r} resolves to {target.resolve()}, outside {folder}"
        if problem is not None:
            raise PylockError(folder, [f"{self.url}: {problem}"])
        return target


@dataclass(frozen=True)
class Locked:
    """One locked distribution."""

    name: str  #: canonical name (PEP 503)
    version: str
    marker: str | None
    wheels: tuple[LockedFile, ...]
    archive: LockedFile | None = None  #: a wheel named by URL (sgl-kernel's cu130 build), not by an index
    requires_python: str | None = None

    @property
    def files(self) -> tuple[LockedFile, ...]:
        return (*self.wheels, *((self.archive,) if self.archive else ()))


@dataclass(frozen=True)
class Resolution:
    """A validated pylock: its packages by name and the spec inputs it was made from."""

    path: Path
    sha256: str  #: of the file's bytes: what the fingerprint and the generations record
    requires_python: str | None
    packages: Mapping[str, Locked]
    inputs: Mapping[str, str]
    environments: tuple[str, ...] = ()  #: the environments the pylock says it is for (none: any)

    def package(self, name: str) -> Locked | None:
        return self.packages.get(canonicalize_name(name))

    @property
    def files(self) -> tuple[LockedFile, ...]:
        return tuple(file for package in self.packages.values() for file in package.files)


def path_for(spec: Path) -> Path:
    """The pylock beside a spec: PEP 751 names it ``pylock.<name>.toml``, ``<name>`` without dots.

    >>> path_for(Path("lockfiles/blackwell-sm120-cu128.toml"))
    PosixPath('lockfiles/pylock.blackwell-sm120-cu128.toml')
    """
    return spec.parent / f"pylock.{spec.stem.replace('.', '-')}.toml"


def wheel_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a locked file's name, or None: it must be a plain wheel file name.

    >>> wheel_name_problem("torch-2.9.1+cu130-1-cp312-cp312-manylinux_2_28_x86_64.whl") is None
    True
    >>> wheel_name_problem("torch-2.9.1-1/../../x/pwn-cp312-cp312-any.whl").split(" (")[0]
    "'torch-2.9.1-1/../../x/pwn-cp312-cp312-any.whl' is not a wheel file name"
    """
    if _WHEEL_NAME.fullmatch(name):
        return None
    return f"{name!r} is not a wheel file name (name-version[-build]-python-abi-platform.whl, a plain base name)"


def lock_command(spec: Path) -> str:
    """The command that makes (or makes again) a spec's pylock, as it can run (a profile inside the installed
    package is copied out first: :func:`~stackgate.models.spec.spec_command`).

    >>> lock_command(Path("/srv/my specs/a.toml"))
    "stackgate lock --lock '/srv/my specs/a.toml'"
    """
    return spec_command("lock", spec)


def load(path: Path) -> Resolution:
    """Read and validate a pylock; raise :class:`PylockError` listing every problem."""
    try:
        data = inputfile.read_capped(path, inputfile.MAX_PYLOCK_BYTES)
    except FileNotFoundError:
        raise PylockError(path, ["no such file"]) from None
    except OSError as exc:
        raise PylockError(path, [f"cannot read: {exc.strerror or exc}"]) from None
    return loads(data, path)


def loads(data: bytes, path: Path) -> Resolution:
    """Validate pylock bytes (``path`` names it in errors and must be a PEP 751 file name)."""
    from packaging.pylock import Pylock, PylockValidationError, is_valid_pylock_path

    document = read_toml(data, path, PylockError)
    try:
        pylock = Pylock.from_dict(document)
    except PylockValidationError as exc:
        raise PylockError(path, [_validation_problem(exc)]) from None
    problems = (
        []
        if is_valid_pylock_path(Path(path.name))
        else [f"(file name): {path.name!r} is not a PEP 751 name: pylock.toml or pylock.<name>.toml"]
    )
    packages = _packages(pylock, problems)
    recorded = _recorded_inputs(document, problems)
    if problems:
        raise PylockError(path, problems)
    requires_python = str(pylock.requires_python) if pylock.requires_python else None
    environments = tuple(str(marker) for marker in pylock.environments or ())
    return Resolution(path, hashlib.sha256(data).hexdigest(), requires_python, packages, recorded, environments)


def load_beside(spec: Spec, *, wheelhouse: Path | None = None) -> Resolution:
    """The spec's pylock, validated, with every ``file://`` URL under a root the spec allows
    (:func:`file_roots`) and the spec's target admitted (:func:`target_problems`); raise
    :class:`PylockError` naming each file and marker that is not: a bad lockfile, exit 2 in every
    command that reads it."""
    resolution = load(path_for(spec.path))
    problems = outside_roots(resolution, file_roots(spec, wheelhouse)) + target_problems(spec, resolution)
    if problems:
        raise PylockError(resolution.path, problems)
    return resolution


def check_beside(spec: Spec) -> None:
    """Refuse the spec's pylock when there is one and it cannot be used (:class:`PylockError`, a
    bad lockfile: exit 2) before a command looks at anything else; no pylock is no error here."""
    if os.path.lexists(path_for(spec.path)):
        load_beside(spec)


def file_roots(spec: Spec, wheelhouse: Path | None = None) -> tuple[Path, ...]:
    """Where a pylock's ``file://`` URLs may point: the spec's folder, the wheelhouse, and the
    folders the spec's own ``file://`` URLs name (an index's folder, a URL wheel's folder)."""
    python = spec.python
    roots = [spec.path.parent, *((wheelhouse,) if wheelhouse is not None else ())]
    indexes = (python.default_index, *(index.url for index in python.indexes))
    roots += [_file_path(url) for url in indexes if _is_file(url)]
    roots += [_file_path(p.url).parent for p in python.packages if p.url and _is_file(p.url)]
    return tuple(roots)


def outside_roots(resolution: Resolution, roots: tuple[Path, ...]) -> list[str]:
    """Each locked ``file://`` URL that resolves (after ``..`` and symlinks) outside ``roots``."""
    allowed = [root.resolve() for root in roots]
    problems = []
    for package in resolution.packages.values():
        for file in (f for f in package.files if _is_file(f.url)):
            path = _file_path(file.url).resolve()
            if not any(path.is_relative_to(root) for root in allowed):
                folders = ", ".join(str(root) for root in allowed)
                problems.append(
                    f"{package.name}: {file.url} resolves to {path}, outside the spec's folder and the roots it "
                    f"names ({folders}): a file:// URL may only name a file there"
                )
    return problems


def _is_file(url: str) -> bool:
    return urllib.parse.urlsplit(url).scheme == "file"


def _file_path(url: str) -> Path:
    """The local path a ``file://`` URL names, percent-decoded.

    >>> _file_path("file:///srv/wheel%20house/simple/")
    PosixPath('/srv/wheel house/simple')
    """
    return Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path))


def _validation_problem(exc: PylockValidationError) -> str:
    """packaging's finding with its key path (``packages[2].version: Invalid version: 'x'``)."""
    from packaging.pylock import PylockUnsupportedVersionError

    context, message = getattr(exc, "context", None), getattr(exc, "message", None)
    if isinstance(exc, PylockUnsupportedVersionError):
        context = context or "lock-version"
    return f"{context}: {message or exc}" if context else str(exc)


def _packages(pylock: Pylock, problems: list[str]) -> dict[str, Locked]:
    found: dict[str, Locked] = {}
    for i, package in enumerate(pylock.packages):
        where = f"packages[{i}]"
        name = canonicalize_name(package.name)
        if name in found:
            problems.append(f"{where}: {name} is listed twice (stackgate locks one platform: one entry per name)")
            continue
        locked = _locked(package, where, problems)
        if locked is not None:
            found[name] = locked
    return dict(sorted(found.items()))


def _locked(package: PylockPackage, where: str, problems: list[str]) -> Locked | None:
    if package.vcs or package.directory or not (package.wheels or package.archive):
        problems.append(
            f"{where}: {package.name} has no wheel: stackgate installs hashed wheels only (no sdist, VCS or directory)"
        )
        return None
    if package.version is None:
        problems.append(f"{where}.version: missing: stackgate locks exact versions")
        return None
    wheels = tuple(
        _file(wheel.url, wheel.path, wheel.hashes, wheel.filename, f"{where}.wheels[{j}]", problems)
        for j, wheel in enumerate(package.wheels or ())
    )
    archive = None
    if package.archive is not None:
        name = _url_name(package.archive.url) or ""
        archive = _file(
            package.archive.url, package.archive.path, package.archive.hashes, name, f"{where}.archive", problems
        )
    if any(file is None for file in wheels) or (package.archive is not None and archive is None):
        return None
    marker = str(package.marker) if package.marker else None
    requires = str(package.requires_python) if package.requires_python else None
    files = tuple(f for f in wheels if f)
    return Locked(canonicalize_name(package.name), str(package.version), marker, files, archive, requires)


def _file(
    url: str | None, path: Any, hashes: Mapping[str, str], filename: str, where: str, problems: list[str]
) -> LockedFile | None:
    """A file an installer may fetch: by URL (one this machine may fetch from), with a sha256."""
    if url is None:
        problems.append(
            f"{where}: names the path {path}, not a URL: a pylock from `stackgate lock` names every file by its URL"
        )
        return None
    problem = url_problem(url) or (f"{url!r} holds whitespace" if re.search(r"\s", url) else None)
    if problem:
        problems.append(f"{where}.url: {problem}")
        return None
    named = wheel_name_problem(filename)
    if named:
        problems.append(f"{where}: {named}: stackgate installs hashed wheels only, each under its own name")
        return None
    sha256 = hashes.get("sha256")
    if sha256 is None or not _SHA256.fullmatch(sha256):
        problems.append(
            f"{where}.hashes: needs a sha256 of 64 lowercase hex digits (found: {', '.join(sorted(hashes)) or 'none'})"
        )
        return None
    return LockedFile(filename, sha256, url)


def _url_name(url: str | None) -> str | None:
    """The file name a URL ends in, percent-decoded.

    >>> _url_name("https://h/whl/sgl_kernel-0.3.21%2Bcu130-cp310-abi3-manylinux2014_x86_64.whl")
    'sgl_kernel-0.3.21+cu130-cp310-abi3-manylinux2014_x86_64.whl'
    """
    return urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1]) if url else None


def _recorded_inputs(document: Mapping[str, Any], problems: list[str]) -> dict[str, str]:
    tool = document.get("tool")
    stackgate = tool.get("stackgate") if isinstance(tool, dict) else None
    recorded = stackgate.get("inputs") if isinstance(stackgate, dict) else None
    if not isinstance(recorded, dict):
        problems.append(
            "tool.stackgate.inputs: missing: this pylock was not made by `stackgate lock`, so nothing says which "
            "spec it resolves"
        )
        return {}
    bad = [key for key, value in recorded.items() if not isinstance(value, str)]
    problems.extend(f"tool.stackgate.inputs.{key}: must be a string" for key in bad)
    return {key: value for key, value in recorded.items() if isinstance(value, str)}


# --- the spec's inputs and what differs ---------------------------------------------------------


def inputs(spec: Spec) -> dict[str, str]:
    """What of the spec decides its resolution, by key path: Python version and platform, the
    indexes and which packages each serves, every pin (and URL), the guard, the overrides.
    Reasons, comments and a URL's sha256 do not (the sha256 is compared with the pylock's file)."""
    python = spec.python
    found = {
        "python.version": python.version,
        "python.platform": python.platform,
        "python.default_index": python.default_index,
    }
    for index in python.indexes:
        found[f"python.index[{index.url}]"] = ", ".join(sorted(index.packages))
    for package in python.packages:
        found[f"python.packages.{package.name}"] = str(package.specifier) + (f" @ {package.url}" if package.url else "")
    found["python.guard.frozen"] = ", ".join(sorted(python.frozen))
    for override in python.overrides:
        found[f"python.override.{override.package}"] = str(override.specifier)
    return found


def differences(spec: Spec, resolution: Resolution) -> list[str]:
    """How the spec and its pylock disagree (empty: the pylock is current), each by key path: an
    input changed since the pylock was made, or the pylock does not hold what the spec pins (a
    pylock edited by hand), or a URL file's sha256 is not the one the spec names."""
    wanted, made = inputs(spec), resolution.inputs
    changed = [
        _difference(key, made.get(key), wanted.get(key))
        for key in sorted(wanted.keys() | made.keys())
        if made.get(key) != wanted.get(key)
    ]
    return (changed or _unmet(spec, resolution)) + _hash_differences(spec, resolution)


def _difference(key: str, made: str | None, wanted: str | None) -> str:
    """One changed input.

    >>> _difference("python.packages.sglang", "==0.5.9", "==0.5.8")
    'python.packages.sglang: ==0.5.9 in the pylock, ==0.5.8 in the spec'
    """
    if made is None:
        return f"{key}: {wanted} in the spec, not in the pylock"
    if wanted is None:
        return f"{key}: {made} in the pylock, not in the spec"
    return f"{key}: {made} in the pylock, {wanted} in the spec"


def _unmet(spec: Spec, resolution: Resolution) -> list[str]:
    wants = [(f"python.packages.{p.name}", p.name, p.specifier) for p in spec.python.packages]
    wants += [(f"python.override.{o.package}", o.package, o.specifier) for o in spec.python.overrides]
    problems = []
    for key, name, specifier in wants:
        locked = resolution.package(name)
        if locked is None:
            problems.append(f"{key}: {specifier} in the spec, {name} not in the pylock")
        elif not specifier.contains(locked.version, prereleases=True):
            problems.append(f"{key}: {specifier} in the spec, {locked.version} in the pylock")
    for package in (p for p in spec.python.packages if p.url):
        locked = resolution.package(package.name)
        urls = [f.url for f in locked.files] if locked else []
        if locked and package.url not in urls:
            problems.append(
                f"python.packages.{package.name}.url: {package.url} in the spec, {', '.join(urls)} in the pylock"
            )
    return problems


def target_problems(spec: Spec, resolution: Resolution) -> list[str]:
    """Where the pylock leaves out the spec's target (``python.platform`` and ``python.version``):
    its ``environments`` or ``requires-python``, or a package the spec pins whose marker or
    requires-python excludes it (that pin would never be installed there). Another package's marker
    may exclude the target: PEP 751 installs only the packages whose markers admit the environment,
    so a package for another platform is simply not installed here."""
    python = spec.python
    target = f"the spec's {python.platform} with Python {python.version} (python.platform, python.version)"
    problems = []
    if resolution.requires_python and not _admits_python(resolution.requires_python, python.version):
        problems.append(f"requires-python: {resolution.requires_python} excludes {target}")
    admitted = (_admits_target(m, python.platform, python.version) for m in resolution.environments)
    if resolution.environments and not any(admitted):
        problems.append(f"environments: {' | '.join(resolution.environments)}: none admits {target}")
    pinned = {p.name for p in python.packages}
    for package in (p for p in resolution.packages.values() if canonicalize_name(p.name) in pinned):
        if package.requires_python and not _admits_python(package.requires_python, python.version):
            problems.append(f"packages.{package.name}.requires-python: {package.requires_python} excludes {target}")
        if package.marker and not _admits_target(package.marker, python.platform, python.version):
            problems.append(
                f"packages.{package.name}.marker: {package.marker} excludes {target}: it would not be installed"
            )
    return problems


#: The patch releases a spec's Python major.minor may be: a bound on the full version admits it
#: when one of them satisfies it.
_PATCHES = range(0, 41)


def _admits_python(specifier: str, version: str) -> bool:
    """Whether some X.Y.z of the spec's Python satisfies a requires-python.

    >>> _admits_python(">=3.12", "3.12"), _admits_python(">=3.12.4", "3.12"), _admits_python("<3.12", "3.12")
    (True, True, False)
    """
    allowed = SpecifierSet(specifier)
    return any(allowed.contains(f"{version}.{patch}", prereleases=True) for patch in _PATCHES)


def _admits_target(marker: str, platform: str, version: str) -> bool:
    """Whether a marker holds on the spec's target (Linux on the platform's machine, CPython at
    some X.Y.z; no extras or dependency groups: stackgate installs none).

    >>> _admits_target("sys_platform == 'linux' and platform_machine == 'x86_64'", "x86_64-manylinux_2_28", "3.12")
    True
    >>> _admits_target("sys_platform == 'win32'", "x86_64-manylinux_2_28", "3.12")
    False
    """
    from packaging.markers import Marker

    parsed = Marker(marker)
    machine = platform.split("-", 1)[0]
    base = {
        "implementation_name": "cpython",
        "os_name": "posix",
        "platform_machine": machine,
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_version": version,
        "sys_platform": "linux",
    }
    for patch in _PATCHES:
        full = f"{version}.{patch}"
        if parsed.evaluate({**base, "python_full_version": full, "implementation_version": full}, context="lock_file"):
            return True
    return False


def _hash_differences(spec: Spec, resolution: Resolution) -> list[str]:
    problems = []
    for package in (p for p in spec.python.packages if p.url and p.sha256):
        locked = resolution.package(package.name)
        file = next((f for f in locked.files if f.url == package.url), None) if locked else None
        if file is not None and file.sha256 != package.sha256:
            problems.append(
                f"python.packages.{package.name}.sha256: {package.sha256} in the spec, {file.sha256} in the pylock "
                f"for {package.url}"
            )
    return problems


# --- writing ------------------------------------------------------------------------------------


def stamp(resolved: str, spec: Spec) -> str:
    """uv's pylock text with stackgate's header and the spec's inputs (``[tool.stackgate.inputs]``)."""
    # The header is part of the pylock's bytes, whose sha256 provisioned environments record:
    # new words make the next resolution a new file even where uv resolves the same distributions.
    header = (
        f"# The resolution of {spec.path.name} (PEP 751), written by `stackgate lock`: do not edit.\n"
        "# Every distribution of the stack with its files and their sha256; `stackgate lock --check` says\n"
        "# whether it still matches the spec, `stackgate provision` installs exactly this.\n"
    )
    table = "".join(f"{_string(key)} = {_string(value)}\n" for key, value in sorted(inputs(spec).items()))
    return f"{header}{resolved.rstrip()}\n\n[tool.stackgate.inputs]\n{table}"


def install_text(resolution: Resolution, local: Mapping[str, Path]) -> str:
    """The pylock an installer is given: every locked package with its wheels, each named by its
    URL or, when the file already lies on this machine (``local``, by sha256: a wheelhouse, a
    checked download), by its path. sdists are left out: only hashed wheels are installed."""
    lines = ['lock-version = "1.0"', 'created-by = "stackgate"']
    if resolution.requires_python:
        lines.append(f"requires-python = {_string(resolution.requires_python)}")
    for package in resolution.packages.values():
        lines += ["", "[[packages]]", f"name = {_string(package.name)}", f"version = {_string(package.version)}"]
        if package.marker:
            lines.append(f"marker = {_string(package.marker)}")
        if package.wheels:
            lines.append(f"wheels = [{', '.join(_file_table(f, local) for f in package.wheels)}]")
        if package.archive:
            lines.append(f"archive = {_file_table(package.archive, local)}")
    return "\n".join(lines) + "\n"


def _file_table(file: LockedFile, local: Mapping[str, Path]) -> str:
    where = f"path = {_string(str(local[file.sha256]))}" if file.sha256 in local else f"url = {_string(file.url)}"
    return f"{{ {where}, hashes = {{ sha256 = {_string(file.sha256)} }} }}"


def _string(text: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's).

    >>> _string('a "b" \\\\ c')
    '"a \\\\"b\\\\" \\\\\\\\ c"'
    """
    return json.dumps(text, ensure_ascii=True)
