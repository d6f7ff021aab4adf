"""The package as it is published: `uv build` of the project's files (setuptools from PyPI, in an
isolated environment, as any builder) gives an sdist that is the whole project as git tracks it
(the tests with all their fixtures, the docs, the benchmarks, CI's scripts; every test module
collects from the unpacked sdist) and, built from that sdist, a wheel with the license file and
PEP 639 metadata (`License-Expression`, no deprecated license table: setuptools says nothing)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from support import CACHE, isolated_environ, pypi_unreachable

ROOT = Path(__file__).resolve().parents[1]
#: What setuptools adds to an sdist beside the project's files.
GENERATED = ("PKG-INFO", "setup.cfg", "stackgate.egg-info/")

pytestmark = pytest.mark.network


def project_files() -> list[str]:
    """The project's files as a clone holds them: tracked, or new and not ignored (not yet committed),
    with the files of a symlinked folder (lockfiles/, patches/) listed under the link's name."""
    if not (ROOT / ".git").exists():
        pytest.skip(f"{ROOT} is not a git checkout (an unpacked sdist): its file list is git's")
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--deduplicate"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    files = []
    for name in filter(None, listed.split("\0")):
        path = ROOT / name
        if path.is_symlink() and path.is_dir():
            files += [f"{name}/{inner.relative_to(path)}" for inner in sorted(path.rglob("*")) if inner.is_file()]
        elif path.is_file():
            files.append(name)
    return sorted(f for f in files if "__pycache__" not in f)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str, list[str]]:
    """(sdist, wheel, the build's output, the project's files), built from a copy of the project's files."""
    why = pypi_unreachable()  # setuptools, the build backend, comes from PyPI
    if why:
        pytest.skip(f"the registry is unreachable from here ({why})")
    files = project_files()
    tree = tmp_path_factory.mktemp("project") / "stackgate"
    for name in files:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tree / name)
    for link in ("lockfiles", "patches"):  # symlinks in a clone: as links here too
        shutil.rmtree(tree / link)
        (tree / link).symlink_to(f"stackgate/{link}")
    out = tree.parent / "dist"
    environ = isolated_environ(UV_CACHE_DIR=str(CACHE / "pypi-uv-cache"))
    done = subprocess.run(
        [sys.executable, "-m", "uv", "build", "--out-dir", str(out), str(tree)],  # the wheel from the sdist
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (sdist,) = out.glob("stackgate-*.tar.gz")
    (wheel,) = out.glob("stackgate-*.whl")
    return sdist, wheel, done.stdout + done.stderr, files


def test_the_sdist_is_the_whole_project_and_its_tests_collect_from_it(built, tmp_path):
    sdist, _, _, files = built
    with tarfile.open(sdist) as archive:
        names = [m.name.split("/", 1)[1] for m in archive.getmembers() if m.isfile()]
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python 3.10.12 and later
        archive.extractall(tmp_path, **safe)
    ours = sorted(n for n in names if not n.startswith(GENERATED))
    assert ours == files, {"missing": sorted(set(files) - set(ours)), "extra": sorted(set(ours) - set(files))}
    assert {"LICENSE", "tests/conftest.py", "tests/fakes/fake_nvml.py", ".ci/run"} <= set(names)
    assert any(n.startswith("tests/data/diagnose/cases/") for n in names)
    (unpacked,) = tmp_path.glob("stackgate-*")
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "0", "--collect-only"],
        cwd=unpacked,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-2000:]
    assert "tests collected" in collected.stdout and "error" not in collected.stdout.splitlines()[-1]


def test_the_wheel_carries_the_license_and_pep_639_metadata(built):
    _, wheel, output, _ = built
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(f"{info}/METADATA").decode()
        license_text = archive.read(f"{info}/licenses/LICENSE")
    assert license_text == (ROOT / "LICENSE").read_bytes()
    assert b"Apache License" in license_text and b"Version 2.0, January 2004" in license_text
    headers = metadata.split("\n\n", 1)[0].splitlines()
    assert "Metadata-Version: 2.4" in headers and "License-Expression: Apache-2.0" in headers
    assert "License-File: LICENSE" in headers
    assert not [h for h in headers if h.startswith("License:") or h.startswith("Classifier: License ::")]
    assert "Classifier: Operating System :: POSIX :: Linux" in headers
    assert all(n.startswith(("stackgate/", info)) for n in names)  # no tests, no docs in the wheel
    shipped = {"stackgate/systemd/stackgate-health.service", "stackgate/lockfiles/blackwell-sm120-cu130.toml"}
    shipped |= {f"stackgate/slurm/{n}" for n in ("stackgate-fleet.sbatch", "stackgate-slurm.conf", "stackgate.nhc")}
    assert shipped <= set(names)
    assert "deprecat" not in output.lower(), output  # setuptools warns of a license table or classifier


def test_the_readme_renders_as_pypi_shows_it(built):
    """PyPI renders the long description as CommonMark: it must be declared so."""
    _, wheel, _, _ = built
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(archive.read(n) for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    head, _, body = metadata.decode().partition("\n\n")
    assert "Description-Content-Type: text/markdown" in head.splitlines()
    assert body.strip() == (ROOT / "README.md").read_text().strip()
