"""The environment's commands, URL wheels and environment file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pkgindex import DEAD_URL, IndexServer, stack_index, write_stack_lock  # noqa: F401 (fixtures)

from stackgate.edges import fetch
from stackgate.facts.compare import environment_spec, spec_changes
from stackgate.models import envfile
from stackgate.models import spec as lockmodel
from stackgate.stack import guard, pyenv

HOME = Path("/srv/root/generations/0001-x")


def _lock(tmp_path: Path, server: IndexServer, **kwargs: object) -> lockmodel.Lock:
    return lockmodel.load(write_stack_lock(tmp_path / "lock.toml", server, tmp_path / "root", python="3.11", **kwargs))  # type: ignore[arg-type]


def _files() -> guard.GuardFiles:
    return guard.GuardFiles(HOME / "constraints.txt", HOME / "overrides.txt")


def test_uv_creates_the_environment_then_puts_the_bundled_pip_in_it(tmp_path: Path, stack_index: IndexServer) -> None:
    commands = pyenv.venv_commands(_lock(tmp_path, stack_index), Path("/usr/bin/python3.11"), HOME, "/bin/uv")
    assert [c.display for c in commands] == [
        f"/bin/uv venv --no-config --no-python-downloads --allow-existing --python /usr/bin/python3.11 {HOME}",
        f"PIP_CONFIG_FILE=/dev/null {HOME}/bin/python -m ensurepip --default-pip",
    ]


def test_each_install_step_sees_one_index_and_the_constraints(tmp_path: Path, stack_index: IndexServer) -> None:
    lock = _lock(tmp_path, stack_index)
    (family,) = pyenv.family_commands(lock, HOME, _files(), "/bin/uv")
    assert family.argv[family.argv.index("--default-index") + 1] == stack_index.simple("cu130")
    assert family.argv[-3:] == ("torch==2.9.1+cu130", "torchaudio==2.9.1+cu130", "triton==3.5.1")
    assert "--no-deps" in family.argv and "--index-url" not in family.argv and "--index" not in family.argv
    stack = pyenv.stack_command(lock, HOME, _files(), "/bin/uv")
    assert stack.argv[stack.argv.index("--default-index") + 1] == lock.python.default_index
    assert stack.argv[stack.argv.index("--override") + 1] == str(HOME / "overrides.txt")
    for command in (family, stack):
        assert command.argv[command.argv.index("--constraint") + 1] == str(HOME / "constraints.txt")
        assert "--no-config" in command.argv


def test_pip_installs_the_overridden_packages_in_their_own_no_deps_step(tmp_path: Path, stack_index: IndexServer) -> None:
    lock = _lock(tmp_path, stack_index, installer="pip")
    names = [line.split("==")[0].split(" @ ")[0] for line in pyenv.requirements(lock, tmp_path)]
    assert "flashinfer-python" not in names and "flashinfer-cubin" not in names and "sglang" in names
    override = pyenv.override_command(lock, HOME, _files(), tmp_path)
    assert override is not None
    assert override.argv[-2:] == ("flashinfer-python==0.6.4", "flashinfer-cubin==0.6.4")
    assert "--no-deps" in override.argv and override.env == {"PIP_CONFIG_FILE": os.devnull}
    assert pyenv.override_command(_lock(tmp_path, stack_index), HOME, _files(), tmp_path) is None  # uv: --override


def test_the_url_wheel_is_required_as_its_checked_local_file(tmp_path: Path, stack_index: IndexServer) -> None:
    lock = _lock(tmp_path, stack_index)
    kernel = lock.python.package("sgl-kernel")
    assert kernel is not None
    line = pyenv.requirements(lock, tmp_path / "cache")[-1]
    assert line == f"sgl-kernel @ file://{tmp_path}/cache/{kernel.sha256}/sgl_kernel-0.3.21+cu130-cp310-abi3-manylinux2014_x86_64.whl"


def test_a_url_wheel_is_downloaded_once_and_checked(tmp_path: Path, stack_index: IndexServer) -> None:
    kernel = _lock(tmp_path, stack_index).python.package("sgl-kernel")
    assert kernel is not None
    path, downloaded = pyenv.fetch_wheel(kernel, tmp_path / "cache")
    assert downloaded and path.read_bytes() == (stack_index.files / path.name).read_bytes()
    asked = len(stack_index.requests)
    again, downloaded = pyenv.fetch_wheel(kernel, tmp_path / "cache")
    assert (again, downloaded) == (path, False)
    assert len(stack_index.requests) == asked  # the cache answered


def test_a_wrong_sha256_is_refused_and_nothing_is_kept(tmp_path: Path, stack_index: IndexServer) -> None:
    kernel = _lock(tmp_path, stack_index, sha256="0" * 64).python.package("sgl-kernel")
    assert kernel is not None
    with pytest.raises(pyenv.PyenvError) as caught:
        pyenv.fetch_wheel(kernel, tmp_path / "cache")
    assert str(caught.value).startswith(f"sgl-kernel: {kernel.url} has sha256 ")
    assert f"the lock says {'0' * 64}; refusing to install it" in str(caught.value)
    assert list((tmp_path / "cache").rglob("*.whl")) == [] and list((tmp_path / "cache").rglob("*.part")) == []


def test_an_unreachable_url_says_so(tmp_path: Path, stack_index: IndexServer) -> None:
    kernel = _lock(tmp_path, stack_index).python.package("sgl-kernel")
    assert kernel is not None
    dead = lockmodel.Package(kernel.name, kernel.specifier, DEAD_URL + "/sgl_kernel-0.3.21+cu130-cp310-abi3-manylinux2014_x86_64.whl", kernel.sha256)
    waits: list[float] = []
    with pytest.raises(pyenv.PyenvError, match=r"cannot download http://127\.0\.0\.1:9/.*Connection refused.*gave up after 2 tries"):
        pyenv.fetch_wheel(dead, tmp_path / "cache", retry=fetch.Retry(attempts=2, sleep=waits.append))
    assert waits == [1.0]


def test_installers_run_without_the_users_configuration() -> None:
    environ = {
        "PATH": "/usr/bin", "HOME": "/root", "PIP_INDEX_URL": "http://elsewhere", "PIP_CONSTRAINT": "/old/constraints.txt",
        "UV_INDEX_URL": "http://elsewhere", "UV_CONSTRAINT": "/old/constraints.txt", "PIP_FIND_LINKS": "/opt/wheels",
        "VIRTUAL_ENV": "/old", "PYTHONPATH": "/src", "UV_CACHE_DIR": "/cache/uv", "PIP_CERT": "/etc/ca.pem",
    }  # fmt: skip
    assert pyenv.installer_environ(environ) == {"PATH": "/usr/bin", "HOME": "/root", "UV_CACHE_DIR": "/cache/uv", "PIP_CERT": "/etc/ca.pem"}


def test_the_environment_file_puts_the_toolkit_first_and_exports_the_guard(tmp_path: Path, stack_index: IndexServer) -> None:
    lock = _lock(tmp_path, stack_index, env={"NCCL_P2P_LEVEL": "SYS"})
    values = envfile.parse(pyenv.environment_text(lock, HOME, tmp_path / "root"), {"PATH": "/usr/bin"})
    assert values == {
        "CUDA_HOME": "/usr/local/cuda-13.0",
        "PATH": f"/usr/local/cuda-13.0/bin:{HOME}/bin:/usr/bin",
        "TRITON_PTXAS_PATH": "/usr/local/cuda-13.0/bin/ptxas",
        "PIP_CONSTRAINT": f"{HOME}/constraints.txt",
        "UV_CONSTRAINT": f"{HOME}/constraints.txt",
        "VIRTUAL_ENV": str(HOME),
        "NCCL_P2P_LEVEL": "SYS",
    }


def test_the_spec_ignores_reasons_but_not_pins(tmp_path: Path, stack_index: IndexServer) -> None:
    lock = _lock(tmp_path, stack_index)
    text = (tmp_path / "lock.toml").read_text()
    (tmp_path / "other.toml").write_text(text.replace("it must equal flashinfer-python", "kept equal").replace('sglang = "==0.5.9"', 'sglang = "==0.5.8"'))
    other = lockmodel.load(tmp_path / "other.toml")
    assert spec_changes(environment_spec(lock), environment_spec(other)) == ["packages.sglang.version: ==0.5.9 -> ==0.5.8"]
