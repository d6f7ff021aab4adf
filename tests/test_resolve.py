"""`invoke lock` against a real index on 127.0.0.1: real uv resolutions, real files, real hashes."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
from pathlib import Path

import pytest
from pkgindex import IndexServer, Wheel, build_wheel, serve_stack, write_stack_lock

from stackgate.commands import lock as command
from stackgate.models import pylock
from stackgate.models.exitcodes import ExitCode
from stackgate.models.spec import load_spec
from stackgate.render.locklines import UNCHANGED
from stackgate.render.ui import UI

ROOT = Path(__file__).resolve().parents[1]
KERNEL = "sgl_kernel-0.3.21+cu130-cp310-abi3-manylinux2014_x86_64.whl"


def _lock(
    spec: Path, environ: dict[str, str], capsys: pytest.CaptureFixture[str], **kwargs: object
) -> tuple[ExitCode, str, str]:
    """`invoke lock` in this process, with what it printed (stdout, stderr)."""
    out = io.StringIO()
    capsys.readouterr()
    code = command.run(command.LockRequest(spec_path=spec, environ=environ, **kwargs), UI(stream=out, force_plain=True))  # type: ignore[arg-type]
    return code, out.getvalue(), capsys.readouterr().err


def _publish(server: IndexServer, base: Path, *wheels: Wheel) -> None:
    """New releases on the test PyPI, as a registry gets them between two locks."""
    for wheel in wheels:
        path = build_wheel(base / "pypi", wheel)
        (server.files / path.name).write_bytes(path.read_bytes())


def test_lock_resolves_the_spec_into_an_exact_hashed_pylock_the_same_every_time(
    tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_stack_lock(tmp_path / "lock.toml", stack_index, tmp_path / "root", sha256=None)
    code, out, err = _lock(spec, install_environ, capsys)
    assert code == ExitCode.PASSED, err
    target = tmp_path / "pylock.lock.toml"
    assert out == f"wrote {target} (9 distributions, 9 files, each with its sha256)\n"
    resolution = pylock.load(target)
    versions = {name: p.version for name, p in resolution.packages.items()}
    assert versions == {
        "filelock": "3.20.0",
        "flashinfer-cubin": "0.6.4",
        "flashinfer-python": "0.6.4",
        "nvidia-nccl-cu13": "2.27.7",
        "sgl-kernel": "0.3.21+cu130",
        "sglang": "0.5.9",
        "torch": "2.9.1+cu130",
        "torchaudio": "2.9.1+cu130",
        "triton": "3.5.1",
    }
    # The torch family comes from its own index, and only it: the cu130 index's filelock is not taken.
    url = {name: p.files[0].url for name, p in resolution.packages.items()}
    assert all(url[name].startswith(stack_index.simple("cu130")) for name in ("torch", "torchaudio", "triton"))
    assert all(
        url[name].startswith(stack_index.simple("pypi"))
        for name in ("filelock", "sglang", "flashinfer-python", "nvidia-nccl-cu13")
    )
    for file in resolution.files:
        assert file.sha256 == hashlib.sha256((stack_index.files / file.filename).read_bytes()).hexdigest()
    # The URL wheel's sha256 was nobody's to check: taken on first use, and said so.
    kernel = hashlib.sha256((stack_index.files / KERNEL).read_bytes()).hexdigest()
    assert (
        f"sgl-kernel: sha256 {kernel} of "
        f"{stack_index.file_url('sgl_kernel-0.3.21%2Bcu130-cp310-abi3-manylinux2014_x86_64.whl')} "
        "was "
        "recorded "
        "on first use"
    ) in err
    before = target.read_bytes()
    code, out, err = _lock(spec, install_environ, capsys)
    assert code == ExitCode.PASSED and out.startswith(f"unchanged: {target} ")
    assert target.read_bytes() == before and "first use" not in err  # the pylock vouches for it now
    assert _lock(spec, install_environ, capsys, check=True)[:2] == (
        ExitCode.PASSED,
        "pylock.lock.toml matches lock.toml: 9 distributions, 9 files, each with its sha256\n",
    )


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            'sglang = "==0.5.9"',
            'sglang = "==0.5.8"',
            "python.packages.sglang: ==0.5.9 in the pylock, ==0.5.8 in the spec",
        ),
        (
            'version = "==0.6.4"\nreason = "sglang 0.5.9 pins flashinfer_cubin',
            'version = ">=0.6.3"\nreason = "sglang 0.5.9 pins flashinfer_cubin',
            "python.override.flashinfer-cubin: ==0.6.4 in the pylock, >=0.6.3 in the spec",
        ),
        (
            'packages = ["torch", "torchaudio", "triton"]',
            'packages = ["torch", "torchaudio"]',
            "torch, torchaudio, triton in the pylock, torch, torchaudio in the spec",
        ),
        ('version = "3.11"', 'version = "3.12"', "python.version: 3.11 in the pylock, 3.12 in the spec"),
        (
            "[python.packages]\n",
            '[python.packages]\nrich = "==13.7.1"\n',
            "python.packages.rich: ==13.7.1 in the spec, not in the pylock",
        ),
    ],
)
def test_check_names_what_changed_in_the_spec_since_the_pylock_was_made(
    tmp_path: Path,
    stack_index: IndexServer,
    install_environ: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    old: str,
    new: str,
    expected: str,
) -> None:
    spec = write_stack_lock(
        tmp_path / "lock.toml", stack_index, tmp_path / "root", python="3.11", resolve_with=install_environ
    )
    assert old in spec.read_text()
    spec.write_text(spec.read_text().replace(old, new, 1))
    code, out, err = _lock(spec, install_environ, capsys, check=True)
    assert code == ExitCode.FAILED and out == ""
    assert f"stackgate lock --check: {tmp_path / 'pylock.lock.toml'} does not match lock.toml:" in err
    assert expected in err
    assert err.rstrip().endswith(f"fix: stackgate lock --lock {spec}")


def test_check_without_a_pylock_fails_and_a_damaged_one_is_a_bad_lockfile(
    tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_stack_lock(tmp_path / "lock.toml", stack_index, tmp_path / "root")
    code, out, err = _lock(spec, install_environ, capsys, check=True)
    assert code == ExitCode.FAILED
    assert f"lock.toml has no pylock: {tmp_path / 'pylock.lock.toml'} does not exist" in err
    (tmp_path / "pylock.lock.toml").write_text(
        'lock-version = "1.0"\ncreated-by = "x"\n[[packages]]\nname = "torch"\nversion = "2.9.1"\n'
        'wheels = [{ url = "http://example.com/torch-2.9.1-py3-none-any.whl", hashes = { sha256 = "00" } }]\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "invoke", "lock", "--lock", str(spec), "--check"],
        cwd=ROOT,
        env=install_environ,
        capture_output=True,
        text=True,
    )
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert "packages[0].wheels[0].url: plain http to example.com: use https" in done.stderr
    assert "tool.stackgate.inputs: missing: this pylock was not made by `stackgate lock`" in done.stderr


def test_a_url_wheel_that_is_not_the_specs_or_the_last_pylocks_is_refused_and_nothing_is_written(
    tmp_path: Path, install_environ: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    server = serve_stack(tmp_path / "index")
    try:
        spec = write_stack_lock(tmp_path / "lock.toml", server, tmp_path / "root", sha256="0" * 64)
        real = hashlib.sha256((server.files / KERNEL).read_bytes()).hexdigest()
        code, out, err = _lock(spec, install_environ, capsys)
        assert code == ExitCode.FAILED
        assert f"has sha256 {real}, the spec says {'0' * 64}; nothing was written" in err
        assert not (tmp_path / "pylock.lock.toml").exists()
        assert f"no pylock was written ({tmp_path / 'pylock.lock.toml'} does not exist)" in err
        assert "left as it was" not in err
        write_stack_lock(tmp_path / "lock.toml", server, tmp_path / "root", sha256=None)
        assert _lock(spec, install_environ, capsys)[0] == ExitCode.PASSED
        before = (tmp_path / "pylock.lock.toml").read_bytes()
        (server.files / KERNEL).write_bytes((server.files / KERNEL).read_bytes() + b"\0")  # the file at the URL changes
        changed = hashlib.sha256((server.files / KERNEL).read_bytes()).hexdigest()
        env = {**install_environ, "UV_NO_CACHE": "1"}  # uv would answer from its cache otherwise
        code, out, err = _lock(spec, env, capsys, refresh=True)  # the spec did not change: only --refresh asks
        assert code == ExitCode.FAILED
        assert f"has sha256 {changed} now, {real} when the last pylock was made; nothing was written" in err
        assert f"{tmp_path / 'pylock.lock.toml'} was left as it was" in err
        assert (tmp_path / "pylock.lock.toml").read_bytes() == before
    finally:
        server.close()


def test_upgrade_package_moves_only_that_package_and_what_it_drags(
    tmp_path: Path, install_environ: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    server = serve_stack(tmp_path / "index")
    try:
        spec = write_stack_lock(
            tmp_path / "lock.toml", server, tmp_path / "root", extra_packages={"torch-agnostic": ">=1.0"}
        )
        assert _lock(spec, install_environ, capsys)[0] == ExitCode.PASSED
        _publish(
            server,
            tmp_path / "index",
            Wheel("torch-agnostic", "1.1", ("torch", "filelock>=3.21")),
            Wheel("filelock", "3.21.0"),
        )
        env = {**install_environ, "UV_NO_CACHE": "1"}  # the index pages changed: no cached answer
        code, out, err = _lock(spec, env, capsys)
        assert code == ExitCode.PASSED and out.startswith("unchanged: ")  # the pylock's versions are preferences
        before = (tmp_path / "pylock.lock.toml").read_bytes()
        names = ["--upgrade-package", "torch-agnostc", "--upgrade-package", "sglang"]
        argv = [sys.executable, "-m", "stackgate", "lock", "--lock", str(spec), *names]
        misspelt = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert misspelt.returncode == ExitCode.USAGE, misspelt.stderr
        said = "--upgrade-package torch-agnostc: not in pylock.lock.toml or lock.toml's pins"
        said += " (closest: torch-agnostic, torchaudio)"
        assert said in misspelt.stderr and "sglang" not in misspelt.stderr  # a locked name is fine
        assert (tmp_path / "pylock.lock.toml").read_bytes() == before
        code, out, err = _lock(spec, env, capsys, upgrade=("torch-agnostic",))
        assert code == ExitCode.PASSED, err
        assert out.splitlines()[1:] == [
            "what moved",
            "package         before  now",
            "filelock        3.20.0  3.21.0",
            "torch-agnostic  1.0     1.1",
        ]
        assert _lock(spec, env, capsys, check=True)[0] == ExitCode.PASSED
    finally:
        server.close()


def test_an_upgrade_that_would_move_a_frozen_package_is_refused(
    tmp_path: Path, install_environ: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    server = serve_stack(tmp_path / "index")
    try:
        spec = write_stack_lock(
            tmp_path / "lock.toml",
            server,
            tmp_path / "root",
            extra_packages={"torch-agnostic": ">=1.0", "filelock": ">=3.19"},
        )
        spec.write_text(spec.read_text().replace('frozen = ["torch"', 'frozen = ["filelock", "torch"'))
        assert _lock(spec, install_environ, capsys)[0] == ExitCode.PASSED
        before = (tmp_path / "pylock.lock.toml").read_bytes()
        _publish(
            server,
            tmp_path / "index",
            Wheel("torch-agnostic", "1.1", ("torch", "filelock>=3.21")),
            Wheel("filelock", "3.21.0"),
        )
        code, out, err = _lock(spec, {**install_environ, "UV_NO_CACHE": "1"}, capsys, upgrade=("torch-agnostic",))
        assert code == ExitCode.FAILED
        assert (
            "--upgrade-package torch-agnostic would move the frozen filelock: 3.20.0 -> 3.21.0: nothing was written"
            in err
        )
        assert (tmp_path / "pylock.lock.toml").read_bytes() == before
    finally:
        server.close()


def test_a_spec_that_has_not_changed_is_answered_from_its_pylock_and_refresh_asks_the_indexes(
    tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str]
) -> None:
    spec_path = write_stack_lock(tmp_path / "lock.toml", stack_index, tmp_path / "root", resolve_with=install_environ)
    target = tmp_path / "pylock.lock.toml"
    before, asked = target.read_bytes(), len(stack_index.requests)

    def run_lock(*flags: str) -> subprocess.CompletedProcess[str]:
        env = {**install_environ, "NO_COLOR": "1", "UV_NO_CACHE": "1"}  # index pages are asked for, not cached
        argv = [sys.executable, "-m", "stackgate", "lock", "--lock", str(spec_path), *flags]
        return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)

    done = run_lock()
    assert done.returncode == ExitCode.PASSED, done.stderr
    assert done.stdout.splitlines() == [
        f"unchanged: {target} matches lock.toml (9 distributions, 9 files, each with its sha256)",
        f"  {UNCHANGED}",
    ]
    assert (len(stack_index.requests), target.read_bytes()) == (asked, before)  # no index was asked, nothing written
    refreshed = run_lock("--refresh")
    assert refreshed.returncode == ExitCode.PASSED, refreshed.stderr
    assert refreshed.stdout.startswith(f"unchanged: {target} (9 distributions")
    assert len(stack_index.requests) > asked and target.read_bytes() == before
    asked = len(stack_index.requests)
    spec_path.write_text(spec_path.read_text().replace('sglang = "==0.5.9"', 'sglang = ">=0.5.9"'))  # an input changed
    again = run_lock()
    assert again.returncode == ExitCode.PASSED and again.stdout.startswith(f"wrote {target} "), again.stderr
    assert len(stack_index.requests) > asked
    assert run_lock("--check", "--refresh").returncode == ExitCode.USAGE


def test_a_wheelhouse_is_downloaded_once_and_checked(
    tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_stack_lock(tmp_path / "lock.toml", stack_index, tmp_path / "root", resolve_with=install_environ)
    asked = len(stack_index.requests)
    code, out, err = _lock(spec, install_environ, capsys, wheelhouse=tmp_path / "wh")
    assert code == ExitCode.PASSED, err
    assert out.startswith("pylock.lock.toml matches lock.toml: its files go into ")  # current: not resolved again
    assert sorted(p.name for p in (tmp_path / "wh").iterdir()) == sorted(
        f.filename for f in pylock.load(tmp_path / "pylock.lock.toml").files
    )
    assert len(stack_index.requests) - asked == 9  # one GET per file, no index page
    code, out, err = _lock(spec, install_environ, capsys, wheelhouse=tmp_path / "wh")
    assert "(0 downloaded, 9 already there)" in out and len(stack_index.requests) - asked == 9
    (tmp_path / "wh" / "filelock-3.20.0-py3-none-any.whl").write_bytes(b"damaged")
    code, out, err = _lock(spec, install_environ, capsys, wheelhouse=tmp_path / "wh")
    assert "(1 downloaded, 8 already there)" in out  # a damaged file is fetched again, checked


def test_the_shipped_specs_with_a_pylock_pass_check(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _lock(None, {}, capsys, check=True, all_specs=True)  # type: ignore[arg-type]
    assert code == ExitCode.PASSED, err
    assert "pylock.blackwell-sm120-cu128.toml matches blackwell-sm120-cu128.toml: " in out
    assert "blackwell-sm120-cu130.toml: no pylock (pylock.blackwell-sm120-cu130.toml); not checked" in out
    assert (
        "pylock.blackwell-sm120-cu130-sglang0523.toml matches blackwell-sm120-cu130-sglang0523.toml: "
        "207 distributions, 228 files" in out
    )
    assert load_spec(ROOT / "lockfiles" / "blackwell-sm120-cu128.toml").python.platform == "x86_64-manylinux_2_28"
