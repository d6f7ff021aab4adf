"""The environment's commands, URL wheels and environment file."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from pkgindex import DEAD_URL, IndexServer, lock_stack, write_stack_lock
from support import isolated_environ

from stackgate.edges import fetch
from stackgate.facts.compare import environment_spec, spec_changes
from stackgate.models import envfile, pylock
from stackgate.models.spec import Spec, load_spec
from stackgate.stack import pyenv

HOME = Path("/srv/root/generations/0001-x")


def _lock(tmp_path: Path, server: IndexServer, **kwargs: object) -> Spec:
    return load_spec(write_stack_lock(tmp_path / "lock.toml", server, tmp_path / "root", python="3.11", **kwargs))  # type: ignore[arg-type]


def _resolution(tmp_path: Path, server: IndexServer, **kwargs: object) -> tuple[Spec, pylock.Resolution]:
    """A test spec and its pylock, made by `invoke lock`'s code against the test index."""
    spec_path = write_stack_lock(tmp_path / "lock.toml", server, tmp_path / "root", python="3.11", **kwargs)  # type: ignore[arg-type]
    spec = load_spec(spec_path)
    return spec, pylock.load(lock_stack(spec_path, isolated_environ(UV_CACHE_DIR=str(tmp_path / "uv-cache"))))


def test_uv_creates_the_environment_and_only_the_pip_installer_gets_pip_at_once(
    tmp_path: Path, stack_index: IndexServer
) -> None:
    wheel = Path("/py/lib/python3.11/ensurepip/_bundled/pip-24.0-py3-none-any.whl")
    create = f"/bin/uv venv --no-config --no-python-downloads --allow-existing --python /usr/bin/python3.11 {HOME}"
    assert [
        c.display
        for c in pyenv.venv_commands(_lock(tmp_path, stack_index), Path("/usr/bin/python3.11"), HOME, "/bin/uv", wheel)
    ] == [create]
    pip_lock = _lock(tmp_path, stack_index, installer="pip")
    assert [c.display for c in pyenv.venv_commands(pip_lock, Path("/usr/bin/python3.11"), HOME, "/bin/uv", wheel)] == [
        create,
        f"/bin/uv pip install --no-config --offline --no-deps --python {HOME}/bin/python {wheel}",
    ]
    # Without the bundled wheel (Debian keeps it in python3-venv), ensurepip; without uv, venv.
    assert (
        pyenv.seed_command(HOME, "/bin/uv", None).display
        == f"PIP_CONFIG_FILE=/dev/null {HOME}/bin/python -m ensurepip --default-pip"
    )
    assert [c.display for c in pyenv.venv_commands(pip_lock, Path("/usr/bin/python3.11"), HOME, None)] == [
        f"PIP_CONFIG_FILE=/dev/null /usr/bin/python3.11 -m venv {HOME}"
    ]


def test_uv_syncs_the_generations_pylock_and_pip_installs_its_hashed_requirements(
    tmp_path: Path, stack_index: IndexServer
) -> None:
    uv = pyenv.install_commands(_lock(tmp_path, stack_index), HOME, "/bin/uv")
    assert [c.display for c in uv] == [
        (
            f"UV_PREVIEW_FEATURES=pylock /bin/uv pip sync --no-config --python {HOME}/bin/python "
            f"{HOME}/pylock.install.toml"
        ),
        # pip goes in after the sync, which would remove it
        f"PIP_CONFIG_FILE=/dev/null {HOME}/bin/python -m ensurepip --default-pip",
    ]
    assert (
        "--offline"
        in pyenv.install_commands(_lock(tmp_path, stack_index), HOME, "/bin/uv", wheelhouse=Path("/wh"))[0].argv
    )
    spec = _lock(tmp_path, stack_index, installer="pip")
    (pip,) = pyenv.install_commands(spec, HOME, "/bin/uv")
    assert pip.argv[3:] == (
        "install",
        "--disable-pip-version-check",
        "--no-input",
        "--no-deps",
        "--require-hashes",
        "--only-binary",
        ":all:",
        "--index-url",
        stack_index.simple("pypi"),
        "--extra-index-url",
        stack_index.simple("cu130"),
        "--requirement",
        f"{HOME}/requirements.txt",
    )
    (offline,) = pyenv.install_commands(spec, HOME, "/bin/uv", wheelhouse=Path("/wh"))
    assert offline.argv[offline.argv.index("--only-binary") + 2 :] == (
        "--no-index",
        "--find-links",
        "/wh",
        "--requirement",
        f"{HOME}/requirements.txt",
    )


def test_every_requirement_line_is_exact_and_hashed(tmp_path: Path, stack_index: IndexServer) -> None:
    spec, resolution = _resolution(tmp_path, stack_index)
    kernel = resolution.package("sgl-kernel")
    assert kernel is not None and kernel.archive is not None
    lines = pyenv.requirements(resolution, {})
    assert len(lines) == len(resolution.packages) == 9
    torch = resolution.package("torch")
    assert torch is not None
    assert f"torch==2.9.1+cu130 --hash=sha256:{torch.wheels[0].sha256}" in lines
    assert f"sgl-kernel @ {kernel.archive.url} --hash=sha256:{kernel.archive.sha256}" in lines
    local = pyenv.local_files(resolution, tmp_path / "cache", None)
    assert local == {
        kernel.archive.sha256: tmp_path
        / "cache"
        / kernel.archive.sha256
        / "sgl_kernel-0.3.21+cu130-cp310-abi3-manylinux2014_x86_64.whl"
    }
    checked = f"sgl-kernel @ {local[kernel.archive.sha256].as_uri()} --hash=sha256:{kernel.archive.sha256}"
    assert checked in pyenv.requirements(resolution, local)
    assert len(pyenv.local_files(resolution, tmp_path / "cache", tmp_path / "wh")) == 9  # a wheelhouse: every file


def test_a_url_wheel_is_downloaded_once_and_checked(tmp_path: Path, stack_index: IndexServer) -> None:
    spec, resolution = _resolution(tmp_path, stack_index)
    kernel = resolution.package("sgl-kernel")
    assert kernel is not None and kernel.archive is not None
    path, downloaded = pyenv.fetch_wheel(kernel.name, kernel.archive, tmp_path / "cache")
    assert downloaded and path.read_bytes() == (stack_index.files / path.name).read_bytes()
    asked = len(stack_index.requests)
    again, downloaded = pyenv.fetch_wheel(kernel.name, kernel.archive, tmp_path / "cache")
    assert (again, downloaded) == (path, False)
    assert len(stack_index.requests) == asked  # the cache answered


def test_a_wrong_sha256_is_refused_and_nothing_is_kept(tmp_path: Path, stack_index: IndexServer) -> None:
    spec, resolution = _resolution(tmp_path, stack_index)
    kernel = resolution.package("sgl-kernel")
    assert kernel is not None and kernel.archive is not None
    wrong = dataclasses.replace(kernel.archive, sha256="0" * 64)
    with pytest.raises(pyenv.PyenvError) as caught:
        pyenv.fetch_wheel(kernel.name, wrong, tmp_path / "cache")
    assert str(caught.value).startswith(f"sgl-kernel: {kernel.archive.url} has sha256 ")
    assert f"the lock says {'0' * 64}; refusing to install it" in str(caught.value)
    assert list((tmp_path / "cache").rglob("*.whl")) == [] and list((tmp_path / "cache").rglob("*.part")) == []


def test_an_unreachable_url_says_so(tmp_path: Path, stack_index: IndexServer) -> None:
    dead = pylock.LockedFile(
        "sgl_kernel-0.3.21+cu130-cp310-abi3-manylinux2014_x86_64.whl",
        "1" * 64,
        DEAD_URL + "/sgl_kernel-0.3.21+cu130-cp310-abi3-manylinux2014_x86_64.whl",
    )
    waits: list[float] = []
    with pytest.raises(
        pyenv.PyenvError, match=r"cannot download http://127\.0\.0\.1:9/.*Connection refused.*gave up after 2 tries"
    ):
        pyenv.fetch_wheel("sgl-kernel", dead, tmp_path / "cache", retry=fetch.Retry(attempts=2, sleep=waits.append))
    assert waits == [1.0]
    assert pyenv.unreachable([DEAD_URL, stack_index.url + "/"]).keys() == {DEAD_URL}


def test_installers_run_without_the_users_configuration() -> None:
    environ = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "PIP_INDEX_URL": "http://elsewhere",
        "PIP_CONSTRAINT": "/old/constraints.txt",
        "UV_INDEX_URL": "http://elsewhere",
        "UV_CONSTRAINT": "/old/constraints.txt",
        "PIP_FIND_LINKS": "/opt/wheels",
        "VIRTUAL_ENV": "/old",
        "PYTHONPATH": "/src",
        "UV_CACHE_DIR": "/cache/uv",
        "PIP_CERT": "/etc/ca.pem",
    }
    assert pyenv.installer_environ(environ) == {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "UV_CACHE_DIR": "/cache/uv",
        "PIP_CERT": "/etc/ca.pem",
    }


def test_the_environment_file_puts_the_toolkit_first_and_exports_the_guard(
    tmp_path: Path, stack_index: IndexServer
) -> None:
    spec = _lock(tmp_path, stack_index, env={"NCCL_P2P_LEVEL": "SYS"})
    values = envfile.parse(pyenv.environment_text(spec, HOME, tmp_path / "root"), {"PATH": "/usr/bin"})
    assert values == {
        "CUDA_HOME": "/usr/local/cuda-13.0",
        "PATH": f"/usr/local/cuda-13.0/bin:{HOME}/bin:/usr/bin",
        "TRITON_PTXAS_PATH": "/usr/local/cuda-13.0/bin/ptxas",
        "PIP_CONSTRAINT": f"file://{HOME}/constraints.txt",
        "UV_CONSTRAINT": f"file://{HOME}/constraints.txt",
        "VIRTUAL_ENV": str(HOME),
        "NCCL_P2P_LEVEL": "SYS",
    }


def test_the_spec_ignores_reasons_but_not_pins(tmp_path: Path, stack_index: IndexServer) -> None:
    spec = _lock(tmp_path, stack_index)
    text = (tmp_path / "lock.toml").read_text()
    (tmp_path / "other.toml").write_text(
        text.replace("it must equal flashinfer-python", "kept equal").replace(
            'sglang = "==0.5.9"', 'sglang = "==0.5.8"'
        )
    )
    other = load_spec(tmp_path / "other.toml")
    assert spec_changes(environment_spec(spec), environment_spec(other)) == [
        "packages.sglang.version: ==0.5.9 -> ==0.5.8"
    ]
