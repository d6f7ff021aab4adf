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
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import email.parser
import hashlib
import json
import os
import platform
import re
import shutil
import stat
import sys
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Protocol, Sequence

from stackgate.edges import faults, fetch, runner
from stackgate.facts import ToolkitFacts, ToolVersion, tool_version
from stackgate.facts.compare import toolkit_problem
from stackgate.models import settings
from stackgate.models.spec import PYPI_CUDA12_REASON, Toolkit

__all__ = [
    "CUDA_LINK",
    "DEFAULT_COMPONENTS",
    "RECORD",
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


def _components(toolkit: Toolkit) -> tuple[str, ...]:
    return toolkit.components or DEFAULT_COMPONENTS


# --- pypi ---------------------------------------------------------------------------------------


def _requirement(toolkit: Toolkit) -> str:
    return f"cuda-toolkit[{','.join(_components(toolkit))}]=={toolkit.version}"


def _pypi_command(toolkit: Toolkit, site: Path, cache: Path | None) -> list[str]:
    uv = _uv()
    common = ["--target", str(site), "--index-url", settings.TOOLKIT_INDEX_URL.value(), "--only-binary", ":all:"]
    if uv is not None:
        # Copies, not hard links into the cache: the toolkit must outlive a cache clean-up.
        cached = ["--cache-dir", str(cache)] if cache else []
        return [
            uv,
            "pip",
            "install",
            "--python",
            sys.executable,
            "--link-mode",
            "copy",
            *common,
            *cached,
            _requirement(toolkit),
        ]
    cached = ["--cache-dir", str(cache)] if cache else []
    return [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-input",
        "--progress-bar",
        "off",
        *common,
        *cached,
        _requirement(toolkit),
    ]


def _uv() -> str | None:
    """uv from this interpreter's environment (the test extra installs it), else from PATH."""
    if settings.TOOLKIT_INSTALLER.value() == "pip":
        return None
    with contextlib.suppress(ImportError, FileNotFoundError):
        import uv

        return str(uv.find_uv_bin())
    return shutil.which("uv")


def _installer_env() -> dict[str, str]:
    """This environment without pip/uv configuration: the machine's pip caps must not apply."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(PIP_CONFIG_FILE=os.devnull, UV_NO_CONFIG="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def _install_pypi(toolkit: Toolkit, staging: Path, log: Path, cache: Path | None, progress: Progress) -> None:
    site, tree = staging / "site", staging / "tree"
    progress(f"downloading and unpacking {_requirement(toolkit)}")
    _run(_pypi_command(toolkit, site, cache), log, f"installing {_requirement(toolkit)}")
    faults.trip("toolkit:installed")
    _check_extras(site, toolkit)
    progress(f"laying out the toolkit tree for {toolkit.prefix}")
    lay_out_wheels(site, tree, version=str(toolkit.version))
    _write_record(
        tree,
        {"source": "pypi", "requirement": _requirement(toolkit), "components": sorted(_components(toolkit))},
        toolkit,
    )
    faults.trip("toolkit:laid-out")
    _commit(toolkit, tree, log, progress)


def _check_extras(site: Path, toolkit: Toolkit) -> None:
    """pip and uv only warn about an unknown extra; a misspelt component must fail instead."""
    metadata = next(site.glob("cuda_toolkit-*.dist-info/METADATA"), None)
    if metadata is None:
        raise ToolkitError(f"the installer left no cuda_toolkit dist-info in {site}")
    message = email.parser.Parser().parsestr(metadata.read_text(encoding="utf-8"))
    known = set(message.get_all("Provides-Extra") or ())
    unknown = sorted(set(_components(toolkit)) - known)
    if unknown:
        raise ToolkitError(
            f"cuda-toolkit {toolkit.version} has no extra(s) {', '.join(unknown)}; it offers: "
            f"{', '.join(sorted(known))}"
        )


def lay_out_wheels(site: Path, tree: Path, *, version: str | None = None) -> None:
    """Turn NVIDIA's CUDA wheels installed with ``--target site`` into a toolkit tree at ``tree``.

    CUDA 13 wheels put everything under nvidia/cu13/{bin,include,lib,nvvm}; CUDA 12 wheels
    put one folder per component (nvidia/cuda_nvcc, nvidia/cuda_runtime, ...): both merge into
    one tree. Files are moved, not copied. Then what a runfile toolkit also has: lib64 -> lib,
    targets/<arch>-linux/{include,lib}, the unversioned .so links, dist-info/ and version.json.
    """
    tree.mkdir(parents=True, exist_ok=True)
    roots = (
        sorted(p for p in (site / "nvidia").iterdir() if p.is_dir() and p.name != "__pycache__")
        if (site / "nvidia").is_dir()
        else []
    )
    if not roots:
        raise ToolkitError(f"no CUDA wheel contents under {site / 'nvidia'}")
    for root in roots:
        _merge(root, tree)
    _link_if_absent(tree / "lib64", "lib", tree / "lib")
    targets = tree / "targets" / f"{_target_arch()}-linux"
    targets.mkdir(parents=True, exist_ok=True)
    for name in ("include", "lib"):
        _link_if_absent(targets / name, f"../../{name}", tree / name)
    _dev_links(tree / "lib")
    _keep_dist_info(site, tree / "dist-info")
    if version is not None:
        _write_version_json(tree, version)


# The wheels are Python packages (__init__.py), and some carry NVIDIA's build-scan reports
# (.metadata/provenance.txt, guardwords): neither belongs in a toolkit tree.
_NOT_TOOLKIT = frozenset({"__init__.py", "__pycache__", ".metadata"})


def _merge(source: Path, target: Path) -> None:
    """Move ``source``'s contents into ``target``; identical duplicates are fine, different ones are not."""
    target.mkdir(parents=True, exist_ok=True)
    for entry in sorted(source.iterdir()):
        if entry.name in _NOT_TOOLKIT:
            continue
        destination = target / entry.name
        if entry.is_dir() and not entry.is_symlink() and (destination.is_dir() or not destination.exists()):
            _merge(entry, destination)  # file by file, so that what is not toolkit stays behind
        elif not destination.exists() and not destination.is_symlink():
            os.rename(entry, destination)
        elif not (
            entry.is_file() and destination.is_file() and fetch.sha256_file(entry) == fetch.sha256_file(destination)
        ):
            raise ToolkitError(f"two CUDA wheels ship different files at {destination.relative_to(target.parent)}")


def _link_if_absent(link: Path, target: str, needs: Path) -> None:
    if needs.exists() and not link.exists() and not link.is_symlink():
        link.symlink_to(target)


def _target_arch() -> str:
    # nvcc.profile looks for headers and libraries under targets/<arch>-linux.
    return {"aarch64": "sbsa", "arm64": "sbsa"}.get(platform.machine(), platform.machine())


_VERSIONED_SO = re.compile(r"^(lib.+\.so)\.(\d+(?:\.\d+)*)$")


def _dev_links(lib: Path) -> None:
    """libcudart.so -> libcudart.so.13 and the like: the wheels ship only the versioned names."""
    if not lib.is_dir():
        return
    sonames: dict[str, str] = {}
    for entry in sorted(lib.iterdir()):
        match = _VERSIONED_SO.match(entry.name)
        if match and (match[1] not in sonames or len(entry.name) < len(sonames[match[1]])):
            sonames[match[1]] = entry.name
    for plain, versioned in sonames.items():
        _link_if_absent(lib / plain, versioned, lib / versioned)


def _keep_dist_info(site: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for info in sorted(site.glob("*.dist-info")):
        os.rename(info, target / info.name)


def _write_version_json(tree: Path, version: str) -> None:
    """The version.json a runfile toolkit carries, so that 13.0.1 and 13.0.2 (same nvcc) differ."""
    components = {"cuda": {"name": "CUDA SDK", "version": version}}
    for info in sorted((tree / "dist-info").glob("*.dist-info")):
        name, _, dist_version = info.name[: -len(".dist-info")].partition("-")
        components[name] = {"name": name.replace("_", "-"), "version": dist_version}
    (tree / "version.json").write_text(json.dumps(components, indent=2) + "\n")


# --- runfile ------------------------------------------------------------------------------------


def _runfile_command(runfile: Path, staging: Path) -> list[str]:
    return ["sh", str(runfile), *RUNFILE_FLAGS, f"--toolkitpath={staging / 'tree'}", f"--tmpdir={staging / 'tmp'}"]


def _runfile_display(toolkit: Toolkit, cache: Path | None) -> Path:
    url = toolkit.url or ""
    local = _local_path(url)
    return local if local is not None else _runfile_cache_path(toolkit, cache)


def _install_runfile(toolkit: Toolkit, runfile: Path, staging: Path, log: Path, progress: Progress) -> None:
    (staging / "tmp").mkdir(parents=True)
    progress(f"running {runfile.name} (toolkit only, silent)")
    _run(
        _runfile_command(runfile, staging),
        log,
        f"installing CUDA {toolkit.version} from {runfile.name}",
        hint="the runfile's own log: /var/log/cuda-installer.log",
    )
    shutil.rmtree(staging / "tmp", ignore_errors=True)
    _write_record(staging / "tree", {"source": "runfile", "url": toolkit.url, "sha256": toolkit.sha256}, toolkit)
    faults.trip("toolkit:laid-out")
    _commit(toolkit, staging / "tree", log, progress)


def _obtain_runfile(toolkit: Toolkit, cache: Path | None, progress: Progress) -> Path:
    """The runfile on disk with its sha256 checked, before anything of it runs."""
    url, want = toolkit.url or "", toolkit.sha256 or ""
    if not want:
        raise ToolkitError(f"{toolkit.label}: a runfile toolkit needs the runfile's sha256 in the lock")
    local = _local_path(url)
    if local is not None:
        if not local.is_file():
            raise ToolkitError(f"{toolkit.label}: runfile {local} does not exist")
        progress(f"checking the sha256 of {local.name}")
        _refuse_unless(lambda: fetch.check_file(local, want, url))
        return local
    target = _runfile_cache_path(toolkit, cache)
    progress(f"downloading {url} (unless the cache has it)")

    def shown(done: int, total: int | None) -> None:
        progress(f"downloading {target.name}: {fetch.amount(done, total)}")

    _refuse_unless(lambda: fetch.fetch_checked(url, target, want, on_progress=shown, on_retry=progress))
    return target


def _local_path(url: str) -> Path | None:
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme in ("http", "https"):
        return None
    return Path(urllib.parse.unquote(parsed.path)) if parsed.scheme == "file" else Path(url)


def _runfile_cache_path(toolkit: Toolkit, cache: Path | None) -> Path:
    name = Path(urllib.parse.urlparse(toolkit.url or "").path).name or "cuda.run"
    return (cache or _runfile_cache()) / f"{(toolkit.sha256 or 'unknown')[:16]}-{name}"


def _runfile_cache() -> Path:
    """Where downloaded runfiles are kept when the caller names no cache."""
    return settings.RUNFILE_CACHE.value() or Path.home() / ".cache" / "stackgate" / "runfiles"


def _refuse_unless(step: Callable[[], object]) -> None:
    """Run a fetch step; a wrong hash or a failed download stops the install before anything runs."""
    try:
        step()
    except fetch.HashMismatch as exc:
        raise ToolkitError(f"{exc}: refusing to run it") from exc
    except fetch.FetchError as exc:
        raise ToolkitError(str(exc)) from exc


# --- apt ----------------------------------------------------------------------------------------


class Apt:
    """The apt commands toolkit installs need; tests pass an object with the same two methods."""

    def query(self, argv: Sequence[str]) -> runner.Completed:
        return runner.run(argv, timeout_s=120)

    def install(self, argv: Sequence[str], log: Path) -> runner.Completed:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        return runner.run_logged(argv, log, timeout_s=settings.TOOLKIT_INSTALL_TIMEOUT_S.value(), env=env)


class AptCommands(Protocol):
    """What :func:`install_toolkit` needs of apt: read-only queries, and the install itself."""

    def query(self, argv: Sequence[str]) -> runner.Completed: ...
    def install(self, argv: Sequence[str], log: Path) -> runner.Completed: ...


NVIDIA_REPO = "developer.download.nvidia.com/compute/cuda/repos"
_APT_SETUP = (
    "wget https://developer.download.nvidia.com/compute/cuda/repos/<distro>/x86_64/cuda-keyring_1.1-1_all.deb",
    "sudo dpkg -i cuda-keyring_1.1-1_all.deb",
    "sudo apt-get update",
)


def _apt_package(toolkit: Toolkit) -> str:
    return f"cuda-toolkit-{toolkit.version.major}-{toolkit.version.minor}"


def _apt_install_command(toolkit: Toolkit) -> list[str]:
    package = _apt_package(toolkit)
    # A three-part lock version selects that release's package versions (13.0.1-1, ...).
    pinned = f"{package}={toolkit.version}-*" if len(toolkit.version.release) >= 3 else package
    return ["apt-get", "install", "-y", "--no-install-recommends", pinned]


def _install_apt(toolkit: Toolkit, log: Path, apt: AptCommands, progress: Progress) -> None:
    expected = Path(f"/usr/local/cuda-{toolkit.release}")
    if toolkit.prefix != expected:
        raise ToolkitError(
            f'{toolkit.label}: NVIDIA\'s apt packages install only to {expected}; set prefix = "{expected}" or use '
            'source = "runfile"'
        )
    progress(f"asking apt about {_apt_package(toolkit)}")
    _apt_check_available(toolkit, apt)
    progress(f"apt-get install {_apt_package(toolkit)}")
    done = apt.install(_apt_install_command(toolkit), log)
    if not done.ok:
        raise ToolkitError(f"apt-get could not install {_apt_package(toolkit)} ({done.ended})", log, done.tail())
    _verify_nvcc(toolkit, toolkit.prefix, log)


def _apt_check_available(toolkit: Toolkit, apt: AptCommands) -> None:
    package = _apt_package(toolkit)
    versions = _apt_versions(apt.query(["apt-cache", "policy", package]).stdout)
    if not versions:
        sources = apt.query(["apt-cache", "policy"]).stdout
        if NVIDIA_REPO not in sources:
            raise ToolkitError(
                f"NVIDIA's CUDA apt repository is not configured on this machine, so apt knows no {package}. "
                "Add it (https://developer.nvidia.com/cuda-downloads):\n" + "\n".join(f"  {c}" for c in _APT_SETUP)
            )
        raise ToolkitError(
            f"NVIDIA's CUDA apt repository is configured but offers no {package}: run `sudo apt-get update`, or "
            "check the repository's distro"
        )
    if len(toolkit.version.release) >= 3 and not any(v.startswith(f"{toolkit.version}-") for v in versions):
        raise ToolkitError(f"apt offers {package} {', '.join(versions)}, not CUDA {toolkit.version}")


def _apt_versions(policy: str) -> list[str]:
    """The versions in `apt-cache policy PKG`'s version table.

    >>> _apt_versions(
    ...     "p:\\n  Installed: (none)\\n  Candidate: 13.0.1-1\\n  Version table:\\n     13.0.1-1 600\\n"
    ...     "        600 https://x Packages\\n"
    ... )
    ['13.0.1-1']
    """
    lines = policy.splitlines()
    if not any(line.strip() == "Version table:" for line in lines):
        return []
    table = lines[next(i for i, line in enumerate(lines) if line.strip() == "Version table:") + 1 :]
    return [m[1] for line in table if (m := re.match(r"^\s+(?:\*\*\* )?(\S+) -?\d+$", line))]


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


# --- fingerprints of kept toolkits --------------------------------------------------------------

_HASHED_DIRS = ("bin", "nvvm/bin")


@dataclass(frozen=True)
class Fingerprint:
    """What a tree looks like: one entry per path, relative to the prefix."""

    prefix: Path
    entries: Mapping[str, tuple[object, ...]]

    @property
    def digest(self) -> str:
        text = "\n".join(f"{path}\t{entry!r}" for path, entry in sorted(self.entries.items()))
        return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def take_fingerprint(prefix: Path) -> Fingerprint:
    """Paths, types, modes, owners, sizes, mtimes and link targets; content hashes of bin/*."""
    entries: dict[str, tuple[object, ...]] = {}
    if prefix.is_symlink():
        entries["."] = ("link", os.readlink(prefix))
    if not prefix.exists():
        entries.setdefault(".", ("absent",))
        return Fingerprint(prefix, entries)
    root = prefix.resolve()
    for path, info in _walk(root):
        relative = path.relative_to(root).as_posix()
        entries[relative] = _entry(path, info, relative)
    return Fingerprint(prefix, entries)


def _walk(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    stack = [root]
    while stack:
        directory = stack.pop()
        with os.scandir(directory) as scan:
            for item in scan:
                info = item.stat(follow_symlinks=False)
                yield Path(item.path), info
                if stat.S_ISDIR(info.st_mode):
                    stack.append(Path(item.path))


def _entry(path: Path, info: os.stat_result, relative: str) -> tuple[object, ...]:
    owner = (oct(stat.S_IMODE(info.st_mode)), info.st_uid, info.st_gid)
    if stat.S_ISLNK(info.st_mode):
        return ("link", os.readlink(path))
    if stat.S_ISDIR(info.st_mode):
        return ("dir", *owner)  # no mtime: an added or removed entry shows up by itself
    content = (
        fetch.sha256_file(path) if stat.S_ISREG(info.st_mode) and relative.rpartition("/")[0] in _HASHED_DIRS else ""
    )
    return ("file", *owner, info.st_size, info.st_mtime_ns, content)


_FIELDS = {
    "file": ("type", "mode", "owner", "group", "size", "mtime", "content"),
    "dir": ("type", "mode", "owner", "group"),
    "link": ("type", "target"),
    "absent": ("type",),
}


def fingerprint(prefix: Path) -> str:
    """A stable sha256 of :func:`take_fingerprint`: equal digests, untouched tree."""
    return take_fingerprint(prefix).digest


def fingerprint_diff(before: Fingerprint, after: Fingerprint, limit: int = 20) -> list[str]:
    """What changed between two fingerprints of one tree, named path by path.

    >>> a = Fingerprint(Path("/t"), {"bin/x": ("file", "0o755", 0, 0, 3, 1, "aa")})
    >>> fingerprint_diff(a, Fingerprint(Path("/t"), {"bin/x": ("file", "0o755", 0, 0, 4, 2, "bb")}))
    ['changed: bin/x (size, mtime, content)']
    """
    changes = [f"removed: {p}" for p in sorted(before.entries.keys() - after.entries.keys())]
    changes += [f"added: {p}" for p in sorted(after.entries.keys() - before.entries.keys())]
    for path in sorted(before.entries.keys() & after.entries.keys()):
        old, new = before.entries[path], after.entries[path]
        if old != new:
            changes.append(f"changed: {path} ({_changed_fields(old, new)})")
    return changes[:limit] + ([f"... and {len(changes) - limit} more"] if len(changes) > limit else [])


def _changed_fields(old: tuple[object, ...], new: tuple[object, ...]) -> str:
    if old[0] != new[0]:
        return f"was a {old[0]}, now a {new[0]}"
    names = _FIELDS.get(str(old[0]), ())
    return ", ".join(name for name, a, b in zip(names, old, new, strict=False) if a != b)


@contextlib.contextmanager
def kept_untouched(toolkits: Iterable[Toolkit]) -> Iterator[dict[Path, Fingerprint]]:
    """Fingerprint every kept toolkit; on leaving, raise naming what changed in any of them."""
    kept = [t for t in toolkits if t.keep]
    before = {t.prefix: take_fingerprint(t.prefix) for t in kept}
    try:
        yield before
    finally:
        _check_kept(kept, before)


def _check_kept(kept: Sequence[Toolkit], before: Mapping[Path, Fingerprint]) -> None:
    for toolkit in kept:
        changes = fingerprint_diff(before[toolkit.prefix], take_fingerprint(toolkit.prefix))
        if changes:
            raise ToolkitError(
                f"{toolkit.label} is kept (keep = true) but changed during provisioning:\n"
                + "\n".join(f"  {c}" for c in changes)
            )
