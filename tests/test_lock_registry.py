"""`invoke lock` of the shipped cu128 profile against the real registry (PyPI), as a user runs it.

The only reason to skip is a registry this machine cannot reach at all (checked first, by
connecting to it); a resolution that fails is a failure. uv's cache lives in the shared test
cache, so a second run resolves warm (uv locks its own cache: two runs at once share it safely).
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
from support import CACHE, isolated_environ, pypi_unreachable

from stackgate.commands import lock as command
from stackgate.models import pylock
from stackgate.models.exitcodes import ExitCode
from stackgate.render.ui import UI

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "lockfiles" / "blackwell-sm120-cu128.toml"
pytestmark = pytest.mark.network


def _lock(spec: Path, environ: dict[str, str], **kwargs: object) -> tuple[ExitCode, str]:
    out = io.StringIO()
    code = command.run(command.LockRequest(spec_path=spec, environ=environ, **kwargs), UI(stream=out, force_plain=True))  # type: ignore[arg-type]
    return code, out.getvalue()


def test_the_cu128_profile_resolves_against_pypi_into_a_complete_hashed_pylock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    why = pypi_unreachable()
    if why:
        pytest.skip(f"the registry is unreachable from here ({why})")
    spec = tmp_path / SPEC.name
    shutil.copyfile(SPEC, spec)
    environ = isolated_environ(UV_CACHE_DIR=str(CACHE / "pypi-uv-cache"))
    code, out = _lock(spec, environ)
    assert code == ExitCode.PASSED, capsys.readouterr().err[-3000:]
    target = tmp_path / "pylock.blackwell-sm120-cu128.toml"
    resolution = pylock.load(target)  # validated by packaging.pylock: every file has its sha256
    assert len(resolution.packages) >= 100
    assert all(len(f.sha256) == 64 for f in resolution.files)
    versions = {name: p.version for name, p in resolution.packages.items()}
    assert (versions["sglang"], versions["torch"], versions["sgl-kernel"]) == ("0.5.9", "2.9.1", "0.3.21")
    assert (versions["flashinfer-python"], versions["flashinfer-cubin"]) == ("0.6.3", "0.6.3")
    assert (versions["triton"], versions["nvidia-nccl-cu12"], versions["torchaudio"], versions["torchvision"]) == (
        "3.5.1",
        "2.27.5",
        "2.9.1",
        "0.24.1",
    )
    # Resolved for the spec's target (CPython 3.12 on x86_64 manylinux), not for this machine.
    (torch_wheel,) = resolution.packages["torch"].wheels
    assert torch_wheel.filename.startswith("torch-2.9.1-cp312-cp312-manylinux") and torch_wheel.filename.endswith(
        "_x86_64.whl"
    )
    first = target.read_bytes()
    size = f"{len(resolution.packages)} distributions, {len(resolution.files)} files, each with its sha256"
    assert _lock(spec, environ)[1].startswith(f"unchanged: {target} matches {SPEC.name} ({size})\n")  # from the pylock
    assert _lock(spec, environ, refresh=True) == (ExitCode.PASSED, f"unchanged: {target} ({size})\n")  # asked again
    assert target.read_bytes() == first
    assert _lock(spec, environ, check=True)[0] == ExitCode.PASSED
    spec.write_text(spec.read_text().replace('sglang = "==0.5.9"', 'sglang = "==0.5.8"'))
    assert _lock(spec, environ, check=True)[0] == ExitCode.FAILED
    assert "python.packages.sglang: ==0.5.9 in the pylock, ==0.5.8 in the spec" in capsys.readouterr().err
