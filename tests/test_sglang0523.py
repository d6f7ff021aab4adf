"""The SGLang 0.5.23 stack (the blackwell-sm120-cu130-sglang0523 profile): locked and provisioned
for real with uv against the local index, whose stand-ins carry the real wheels' requirements and
tags (tests/pkgindex.py); beside a 0.5.9 generation, rolled back to it; the kernel package's rename,
a stale flashinfer-cubin and the host's floors refused before anything is installed. The floors are
also judged against the shipped pylock itself (the real wheels' tags and versions)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
from pathlib import Path

import pytest
from fakes.fake_nvml import gpu, machine
from pkgindex import IndexServer, write_sglang0523_spec, write_stack_lock

from stackgate.checks.core import REGISTRY
from stackgate.commands import provision
from stackgate.edges import libc
from stackgate.flows import provision as provision_flow
from stackgate.models import pylock
from stackgate.models.exitcodes import ExitCode
from stackgate.render.ui import UI
from stackgate.stack import floors

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "stackgate" / "lockfiles" / "pylock.blackwell-sm120-cu130-sglang0523.toml"


def _provision(spec: Path, environ: dict[str, str]) -> tuple[ExitCode, str]:
    """Provision in this process; what it printed (a failure's lines go to the UI's error stream)."""
    out = io.StringIO()
    ui = UI(stream=out, force_plain=True)
    ui.err = ui.console  # one stream, in order
    code = provision.run(provision.ProvisionRequest(spec_path=spec, yes=True, environ=environ), ui)
    return code, out.getvalue()


def _owner(generation: Path, folder: str) -> list[str]:
    """The distributions whose RECORD lists files of ``folder`` in a generation."""
    site = next(generation.glob("lib/python3*/site-packages"))
    return sorted(
        info.name for info in site.glob("*.dist-info") if f"\n{folder}/" in "\n" + (info / "RECORD").read_text()
    )


def test_the_0523_stack_lands_beside_the_059_generation_and_rollback_returns_to_it(
    tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str]
) -> None:
    root = tmp_path / "root"
    old = write_stack_lock(tmp_path / "old.toml", stack_index, root, resolve_with=install_environ)
    new = write_sglang0523_spec(tmp_path / "new.toml", stack_index, root, resolve_with=install_environ)
    code, out = _provision(old, install_environ)
    assert code == ExitCode.PASSED, out
    first = (root / "current").resolve()
    code, out = _provision(new, install_environ)
    assert code == ExitCode.PASSED, out
    second = (root / "current").resolve()
    assert first != second and first.parent == second.parent == root / "generations"
    assert "then sgl_kernel/ holds exactly its owner's RECORD" in out
    # No NVML here: the driver floor is named, not judged.
    assert "nvidia-cuda-runtime 13.0.96 (CUDA 13.0) needs NVIDIA driver >= 580.65.06" in out
    # Each generation's sgl_kernel/ belongs to its own kernel distribution, the old one untouched.
    assert _owner(second, "sgl_kernel") == ["sglang_kernel-0.4.10.dist-info"]
    assert _owner(first, "sgl_kernel") == ["sgl_kernel-0.3.21+cu130.dist-info"]
    out_stream = io.StringIO()
    back = provision.rollback(
        provision.RollbackRequest(spec_path=new, environ=install_environ), UI(stream=out_stream, force_plain=True)
    )
    assert back == ExitCode.PASSED, out_stream.getvalue()
    assert (root / "current").resolve() == first


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (
            {"sgl-kernel": "==0.3.21"},
            "holds sgl-kernel 0.3.21 and sglang-kernel 0.4.10: both install sgl_kernel/",
        ),
        (
            {"flashinfer-cubin": "==0.6.13"},
            "holds flashinfer-cubin 0.6.13 beside flashinfer-python 0.7.2: flashinfer refuses a cubin of another "
            "version at import",
        ),
    ],
    ids=["two-kernels", "stale-cubin"],
)
def test_a_pylock_that_must_not_be_installed_is_refused_before_anything_is_created(
    tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str], extra: dict[str, str], said: str
) -> None:
    root = tmp_path / "root"
    spec = write_sglang0523_spec(
        tmp_path / "s.toml", stack_index, root, extra_packages=extra, resolve_with=install_environ
    )
    code, out = _provision(spec, install_environ)
    assert code == ExitCode.USAGE, out
    assert said in out and "stackgate lock --lock" in out
    assert not (root / "generations").exists()


def test_a_wheel_for_a_newer_glibc_stops_provision_before_anything_is_created(
    tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str]
) -> None:
    here = libc.glibc_version()
    if here is None or here >= (2, 40):
        pytest.skip(f"this machine's C library ({here}) is not older than the newest glibc uv targets (2.40)")
    root = tmp_path / "root"
    spec = write_sglang0523_spec(
        tmp_path / "s.toml",
        stack_index,
        root,
        extra_packages={"future-glibc": "==1.0"},
        platform_tag="x86_64-manylinux_2_40",
        resolve_with=install_environ,
    )
    code, out = _provision(spec, install_environ)
    assert code == ExitCode.REFUSED, out
    assert (
        "future-glibc 1.0: future_glibc-1.0-py3-none-manylinux_2_40_x86_64.whl needs glibc >= 2.40 (its manylinux "
        f"tag); this machine has glibc {here[0]}.{here[1]}" in out
    )
    assert "fix: Provision test-stack-0523 on a host with glibc 2.40 or newer" in out
    assert not (root / "generations").exists()


def test_a_driver_older_than_the_locked_cuda_runtime_stops_provision(
    tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml = tmp_path / "nvml.json"
    nvml.write_text(json.dumps(machine([gpu()], driver="575.57.08", cuda=12090)))
    environ = {**install_environ, "STACKGATE_NVML_MODULE": "fakes.fake_nvml", "STACKGATE_FAKE_NVML": str(nvml)}
    for key in ("STACKGATE_NVML_MODULE", "STACKGATE_FAKE_NVML"):
        monkeypatch.setenv(key, environ[key])
    root = tmp_path / "root"
    spec = write_sglang0523_spec(tmp_path / "s.toml", stack_index, root, resolve_with=install_environ)
    code, out = _provision(spec, environ)
    assert code == ExitCode.REFUSED, out
    assert (
        "nvidia-cuda-runtime 13.0.96 (CUDA 13.0) needs NVIDIA driver >= 580.65.06; this machine's driver is 575.57.08"
        in out
    )
    assert not (root / "generations").exists()


def test_a_file_in_sgl_kernel_that_its_owner_did_not_install_fails_the_generation(
    tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str]
) -> None:
    root = tmp_path / "root"
    spec = write_sglang0523_spec(
        tmp_path / "s.toml", stack_index, root, extra_packages={"kernel-plugin": "==1.0"}, resolve_with=install_environ
    )
    code, out = _provision(spec, install_environ)
    assert code == ExitCode.FAILED, out
    assert (
        "was installed wrong, so current was not switched: sgl_kernel/ (sglang-kernel): sgl_kernel/plugin.py is not "
        "in sglang_kernel-0.4.10.dist-info/RECORD (another distribution's file)" in out
    )
    assert not (root / "current").exists()
    (generation,) = (root / "generations").iterdir()
    assert json.loads((generation / "stackgate-generation.json").read_text())["state"] == "failed"


def test_a_build_check_is_timed_after_its_facts_not_while_the_stack_imports(
    tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real 0.5.23 generation's probe took 43 s on the loaded 2-core machine, past the checks' 30 s:
    # here each interpreter start takes 3 s and each build check has 1 s.
    for name in provision_flow.BUILD_CHECKS:
        if name in REGISTRY:
            monkeypatch.setitem(REGISTRY, name, dataclasses.replace(REGISTRY[name], timeout=1.0))
    root = tmp_path / "root"
    spec = write_sglang0523_spec(
        tmp_path / "s.toml", stack_index, root, extra_packages={"slow-start": "==1.0"}, resolve_with=install_environ
    )
    code, out = _provision(spec, install_environ)
    assert "timed out after 1 s" not in out.split("gathering facts")[0], out
    assert (root / "current").exists(), out  # the generation passed its build checks and was switched to


def test_the_shipped_pylock_floors_are_its_real_wheels_floors() -> None:
    resolution = pylock.load(SHIPPED)
    assert floors.driver_floor(resolution) == ("nvidia-cuda-runtime 13.0.96 (CUDA 13.0)", "580.65.06")
    assert floors.refusals(resolution, floors.Host("3.12.1", (2, 36), "580.82.07"), "p") == []
    (python,) = floors.refusals(resolution, floors.Host("3.11.7", (2, 36), None), "p")
    assert python.message == (
        "apache-tvm-ffi 0.1.11: its locked wheels are for cp312 (apache_tvm_ffi-0.1.11-cp312-abi3-manylinux2014_x86_64"
        ".manylinux_2_17_x86_64.whl); the base interpreter is Python 3.11.7 (and 46 more packages)"
    )
    assert python.fix.commands == ("pyenv install 3.12",)
    old_glibc = [f.message for f in floors.refusals(resolution, floors.Host("3.12.1", (2, 31), None), "p")]
    assert old_glibc == [
        "sglang 0.5.23: sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl needs glibc >= 2.34 (its manylinux tag); "
        "this machine has glibc 2.31"
    ]
    (driver,) = floors.refusals(resolution, floors.Host("3.12.1", (2, 36), "575.57.08"), "p")
    assert driver.message.endswith("needs NVIDIA driver >= 580.65.06; this machine's driver is 575.57.08")
    assert os.path.basename(SHIPPED) == pylock.path_for(SHIPPED.parent / "blackwell-sm120-cu130-sglang0523.toml").name
