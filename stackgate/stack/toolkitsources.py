"""Where a toolkit comes from: NVIDIA's CUDA wheels from PyPI (laid out as a standard tree), a runfile
(downloaded, checked, run silent into staging), or apt from NVIDIA's repository. Each builds into
:mod:`stackgate.stack.toolkittree`'s staging and commits there; :mod:`stackgate.stack.toolkit` picks one.
"""

from __future__ import annotations

import contextlib
import email.parser
import json
import os
import platform
import re
import shutil
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable, Protocol, Sequence

from stackgate.edges import faults, fetch, runner
from stackgate.models import settings
from stackgate.models.spec import Toolkit
from stackgate.stack.toolkittree import (
    RUNFILE_FLAGS,
    Progress,
    ToolkitError,
    _commit,
    _components,
    _run,
    _verify_nvcc,
    _write_record,
)

__all__ = [
    "NVIDIA_REPO",
    "Apt",
    "AptCommands",
    "lay_out_wheels",
]

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
