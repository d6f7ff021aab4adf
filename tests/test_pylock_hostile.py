"""Hostile input files through the real command line: a wheel name that walks out of its folder, a
file:// URL outside the spec's roots, a spec, pylock or inventory that is a FIFO, a link to
/dev/zero or huge, a pylock that does not validate. Each is a bad input: exit 2, nothing written."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest
import test_lock
from pkgindex import Wheel, build_wheel
from support import run_program

from stackgate.models import pylock
from stackgate.models.spec import load_spec
from stackgate.stack import pyenv

ROOT = Path(__file__).resolve().parents[1]
TORCH = Wheel("torch", "2.11.0")


def stackgate(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    """The real program, in a clean environment (no inherited PIP_*/UV_* settings)."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "NO_COLOR": "1",
        "PIP_CONFIG_FILE": "/dev/null",
        "UV_NO_CONFIG": "1",
    }
    return run_program(*args, base=env, timeout=120)


def write_pair(
    folder: Path,
    *,
    url: str | None = None,
    name: str | None = None,
    extra: str = "",
    index: str | None = None,
    package: str = "",
) -> Path:
    """A spec pinning torch and its current pylock, torch's wheel named by a file:// URL (by
    default the real wheel beside the spec); ``name`` is the wheel table's file name, ``extra``
    top-level pylock keys, ``package`` keys of torch's entry, ``index`` the spec's python.default_index."""
    wheel = build_wheel(folder, TORCH)
    sha256 = hashlib.sha256(wheel.read_bytes()).hexdigest()
    spec = folder / "stack.toml"
    spec.write_text(
        test_lock.MINIMAL.replace("[python]\n", f'[python]\ndefault_index = "{index}"\n' if index else "[python]\n")
    )
    named = f'name = "{name}", ' if name else ""
    body = (
        'lock-version = "1.0"\ncreated-by = "uv"\nrequires-python = ">=3.12"\n' + extra + "\n[[packages]]\n"
        f'name = "torch"\nversion = "2.11.0"\n{package}'
        f'wheels = [{{ {named}url = "{url or wheel.as_uri()}", hashes = {{ sha256 = "{sha256}" }} }}]\n'
    )
    pylock.path_for(spec).write_text(pylock.stamp(body, load_spec(spec)))
    return spec


def test_a_current_pylock_of_local_files_fills_a_wheelhouse(tmp_path: Path) -> None:
    spec = write_pair(tmp_path / "spec")
    done = stackgate("lock", "--lock", str(spec), "--wheelhouse", str(tmp_path / "wh"), home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert [p.name for p in (tmp_path / "wh").iterdir()] == [TORCH.filename]


def test_a_wheel_name_that_walks_out_of_the_wheelhouse_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    name = "torch-2.11.0-1/../../outside/pwn-py3-none-any.whl"
    spec = write_pair(tmp_path / "spec", name=name)
    done = stackgate("lock", "--lock", str(spec), "--wheelhouse", str(tmp_path / "wh"), home=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"packages[0].wheels[0]: {name!r} is not a wheel file name" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "outside").exists() and not (tmp_path / "wh").exists()
    assert stackgate("lock", "--check", "--lock", str(spec), home=tmp_path).returncode == 2


def test_a_wheelhouse_link_that_leads_out_is_never_written_through(tmp_path: Path) -> None:
    spec = write_pair(tmp_path / "spec")
    (tmp_path / "wh").mkdir()
    (tmp_path / "wh" / TORCH.filename).symlink_to(tmp_path / "elsewhere.whl")
    done = stackgate("lock", "--lock", str(spec), "--wheelhouse", str(tmp_path / "wh"), home=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"resolves to {tmp_path / 'elsewhere.whl'}, outside {tmp_path / 'wh'}" in done.stderr
    assert not (tmp_path / "elsewhere.whl").exists()


@pytest.mark.parametrize("plant", ["a symbolic link", "a hard link"])
def test_a_part_file_planted_in_the_wheelhouse_is_never_written_through(tmp_path: Path, plant: str) -> None:
    """`.<wheel>.part`, where the download streams, planted as a link to a file elsewhere: refused, exit 2."""
    spec = write_pair(tmp_path / "spec")
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    part = tmp_path / "wh" / f".{TORCH.filename}.part"
    part.parent.mkdir()
    part.symlink_to(victim) if plant == "a symbolic link" else os.link(victim, part)
    done = stackgate("lock", "--lock", str(spec), "--wheelhouse", str(tmp_path / "wh"), home=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    why = "is a symbolic link (to " if plant == "a symbolic link" else "has 2 names (hard links)"
    assert f"cannot download into {part}: " in done.stderr and why in done.stderr and "Traceback" not in done.stderr
    assert victim.read_text() == "precious\n" and not (tmp_path / "wh" / TORCH.filename).exists()


@pytest.mark.parametrize("where", ["/etc/{name}", "{spec}/../{name}"])
def test_a_file_url_outside_the_specs_roots_is_refused_by_every_reader(tmp_path: Path, where: str) -> None:
    outside = tmp_path / TORCH.filename
    outside.write_bytes(build_wheel(tmp_path / "built", TORCH).read_bytes())
    path = where.format(name=TORCH.filename, spec=tmp_path / "spec")
    spec = write_pair(tmp_path / "spec", url=f"file://{path}")
    for command in (["lock", "--check"], ["lock", "--wheelhouse", str(tmp_path / "wh")]):
        done = stackgate(*command, "--lock", str(spec), home=tmp_path)
        assert done.returncode == 2, done.stdout + done.stderr
        assert (
            f"torch: file://{path} resolves to " in done.stderr
            and "outside the spec's folder and the roots it names" in done.stderr
        )
    assert not (tmp_path / "wh").exists()


def test_a_file_url_under_a_folder_the_spec_names_is_allowed(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    wheel = build_wheel(mirror, TORCH)
    assert (
        stackgate(
            "lock", "--check", "--lock", str(write_pair(tmp_path / "a", url=wheel.as_uri())), home=tmp_path
        ).returncode
        == 2
    )
    spec = write_pair(tmp_path / "b", url=wheel.as_uri(), index=mirror.as_uri())  # the spec names the mirror
    done = stackgate("lock", "--check", "--lock", str(spec), home=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_provisions_download_cache_never_builds_a_path_out_of_its_folder(tmp_path: Path) -> None:
    """A LockedFile made without the loader (whatever builds one): the cache path is checked too."""
    hostile = pylock.LockedFile(
        "sgl_kernel-0.3.21-1/../../../x/pwn-cp310-abi3-any.whl", "a" * 64, "https://h/sgl_kernel.whl"
    )
    with pytest.raises(pylock.PylockError) as caught:
        pyenv.wheel_path(hostile, tmp_path / "cache")
    assert "is not a wheel file name" in str(caught.value)
    good = pylock.LockedFile("sgl_kernel-0.3.21-cp310-abi3-any.whl", "a" * 64, "https://h/sgl_kernel.whl")
    assert pyenv.wheel_path(good, tmp_path / "cache") == tmp_path / "cache" / ("a" * 64) / good.filename


# --- files that are no files, or too large -------------------------------------------------------


def hostile(path: Path, kind: str) -> str:
    """Make ``path`` a FIFO, a link to /dev/zero or a 50 MB (sparse) file; what the refusal says."""
    if kind == "fifo":
        os.mkfifo(path)
        return "is a FIFO (named pipe), not a regular file: refused unread"
    if kind == "zero":
        path.symlink_to("/dev/zero")
        return "is a character device (/dev/zero), not a regular file: refused unread"
    with open(path, "wb") as out:
        out.truncate(50 << 20)
    return "is 52428800 bytes, more than the "


KINDS = ["fifo", "zero", "huge"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_spec_that_is_no_regular_file_or_huge_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    said = hostile(tmp_path / "stack.toml", kind)
    for command in (["verify"], ["lock", "--check"], ["provision", "--dry-run"]):
        done = stackgate(*command, "--lock", str(tmp_path / "stack.toml"), home=tmp_path)  # a hang fails on the timeout
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"cannot read: {said}" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_a_pylock_that_is_no_regular_file_or_huge_is_refused_by_every_reader(tmp_path: Path, kind: str) -> None:
    spec = write_pair(tmp_path)
    pylock.path_for(spec).unlink()
    said = hostile(pylock.path_for(spec), kind)
    commands = (
        ["verify"],
        ["lock", "--check"],
        ["gate", "--model", str(tmp_path)],
        ["fleet", "verify", "--hosts", "127.0.0.1"],
    )
    for command in commands:
        done = stackgate(*command, "--lock", str(spec), home=tmp_path)
        assert done.returncode == 2, (command, done.stdout + done.stderr)
        assert said in done.stdout + done.stderr and "Traceback" not in done.stderr, command


@pytest.mark.parametrize("kind", KINDS)
def test_an_inventory_that_is_no_regular_file_or_huge_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    said = hostile(tmp_path / "nodes.toml", kind)
    done = stackgate("fleet", "verify", "--inventory", str(tmp_path / "nodes.toml"), home=tmp_path)
    assert done.returncode == 2 and f"cannot read the inventory: {said}" in done.stderr, done.stderr


# --- a pylock that does not validate: exit 2 everywhere --------------------------------------------


READERS = [
    ["verify"],
    ["verify", "--cached"],
    ["lock", "--check"],
    ["provision", "--dry-run"],
    ["gate", "--model", "{model}"],
    ["smoke", "--model", "{model}"],
    ["fleet", "verify", "--hosts", "127.0.0.1"],
]


def reader(command: list[str], folder: Path) -> list[str]:
    """``command`` with ``{model}`` a model folder (a config.json: the launch would go ahead)."""
    model = folder / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    return [word.format(model=model) for word in command]


@pytest.mark.parametrize("command", READERS, ids=" ".join)
def test_a_pylock_that_does_not_validate_is_a_bad_lockfile_in_every_command(tmp_path: Path, command: list[str]) -> None:
    spec = write_pair(tmp_path)
    locked = pylock.path_for(spec)
    locked.write_text(locked.read_text().replace('version = "2.11.0"', 'version = "two"'))
    done = stackgate(*reader(command, tmp_path), "--lock", str(spec), home=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "packages[0].version: Invalid version: 'two'" in done.stderr and "SKIP" not in done.stdout


# --- a pylock that leaves out the spec's platform or Python ---------------------------------------


@pytest.mark.parametrize("command", READERS, ids=" ".join)
def test_a_pylock_whose_marker_excludes_the_specs_target_is_a_bad_lockfile_in_every_command(
    tmp_path: Path, command: list[str]
) -> None:
    spec = write_pair(tmp_path, package="marker = \"sys_platform == 'win32'\"\n")
    done = stackgate(*reader(command, tmp_path), "--lock", str(spec), home=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert 'packages.torch.marker: sys_platform == "win32" excludes the spec' in done.stderr


@pytest.mark.parametrize(
    ("extra", "package", "said"),
    [
        (
            "",
            "marker = \"sys_platform == 'win32'\"\n",
            'packages.torch.marker: sys_platform == "win32" excludes the spec',
        ),
        (
            "environments = [\"sys_platform == 'darwin'\"]\n",
            "",
            'environments: sys_platform == "darwin": none admits the spec',
        ),
        ("", 'requires-python = "<3.12"\n', "packages.torch.requires-python: <3.12 excludes the spec"),
    ],
    ids=["package-for-win32", "lock-for-darwin", "package-for-older-python"],
)
def test_a_pylock_that_leaves_out_the_specs_target_is_a_bad_lockfile(
    tmp_path: Path, extra: str, package: str, said: str
) -> None:
    spec = write_pair(tmp_path, extra=extra, package=package)
    done = stackgate("lock", "--check", "--lock", str(spec), home=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        said in done.stderr
        and "x86_64-manylinux_2_28 with Python 3.12 (python.platform, python.version)" in done.stderr
    )


def test_a_pylock_whose_requires_python_excludes_the_specs_python_is_a_bad_lockfile(tmp_path: Path) -> None:
    spec = write_pair(tmp_path)
    locked = pylock.path_for(spec)
    locked.write_text(locked.read_text().replace('requires-python = ">=3.12"', 'requires-python = ">=3.13"'))
    done = stackgate("lock", "--check", "--lock", str(spec), home=tmp_path)
    assert (
        done.returncode == 2
        and "requires-python: >=3.13 excludes the spec's x86_64-manylinux_2_28 with Python 3.12" in done.stderr
    )


def test_markers_and_bounds_that_admit_the_target_pass(tmp_path: Path) -> None:
    extra = "environments = [\"sys_platform == 'darwin'\", \"sys_platform == 'linux'\"]\n"
    package = (
        "marker = \"platform_machine == 'x86_64' and python_full_version >= '3.12.4'\"\nrequires-python = \">=3.10\"\n"
    )
    done = stackgate(
        "lock", "--check", "--lock", str(write_pair(tmp_path, extra=extra, package=package)), home=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
