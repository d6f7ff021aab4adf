"""`invoke provision` and `invoke rollback` end to end: real uv and pip, real wheels from a real
index on 127.0.0.1, real processes killed with SIGKILL; only the GPU-side toolkit and patch modules
are stood in for where a test says so."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
from pkgindex import SYMM_MEM_FILE, SYMM_MEM_TEXT, IndexServer, serve_stack, write_stack_lock

from stackgate.commands import provision
from stackgate.models.exitcodes import ExitCode
from stackgate.models.spec import load_spec
from stackgate.render.ui import UI
from stackgate.runs import history
from stackgate.stack import generations, pyenv, toolkit

ROOT = Path(__file__).resolve().parents[1]
IMPORT_ALL = (
    "import torch, torchaudio, triton, sglang, sgl_kernel, flashinfer; print(torch.__version__, torch.version.cuda)"
)


def _provision(
    spec: Path, environ: dict[str, str], capsys: pytest.CaptureFixture[str], **kwargs: object
) -> tuple[ExitCode, str, str]:
    """Provision in this process (what the task calls), capturing what it prints."""
    out = io.StringIO()
    capsys.readouterr()
    request = provision.ProvisionRequest(spec_path=spec, yes=True, environ=environ, **kwargs)  # type: ignore[arg-type]
    code = provision.run(request, UI(stream=out, force_plain=True))
    return code, out.getvalue(), capsys.readouterr().err


def _invoke(
    args: list[str], environ: dict[str, str], cwd: Path = ROOT, **extra: str
) -> subprocess.CompletedProcess[str]:
    """The task itself, in its own process (so that it can be killed)."""
    program = [sys.executable, "-m", "invoke", *(("--search-root", str(ROOT)) if cwd != ROOT else ())]
    return subprocess.run(
        [*program, *args], cwd=cwd, env={**environ, **extra}, capture_output=True, text=True, timeout=300
    )


def _current(root: Path) -> str:
    return os.readlink(root / "current")


def _works(root: Path, environ: dict[str, str]) -> str:
    done = subprocess.run(
        [str(root / "current" / "bin" / "python"), "-c", IMPORT_ALL], capture_output=True, text=True, env=environ
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _version(root: Path, name: str, environ: dict[str, str]) -> str:
    script = f"import importlib.metadata as m; print(m.version({name!r}))"
    return subprocess.run(
        [str(root / "current" / "bin" / "python"), "-c", script],
        capture_output=True,
        text=True,
        env=environ,
        check=True,
    ).stdout.strip()


@pytest.fixture(scope="module")
def built(
    tmp_path_factory: pytest.TempPathFactory, stack_index: IndexServer, install_environ: dict[str, str]
) -> Iterator[Path]:
    """A root provisioned once with uv, shared read-only; tests that change it take a copy."""
    base = tmp_path_factory.mktemp("built")
    spec = write_stack_lock(base / "lock.toml", stack_index, base / "root", resolve_with=install_environ)
    request = provision.ProvisionRequest(spec_path=spec, yes=True, environ=install_environ)
    assert provision.run(request, UI(stream=io.StringIO(), force_plain=True)) == ExitCode.PASSED
    yield base / "root"


def _copy(built: Path, tmp_path: Path) -> Path:
    root = tmp_path / "root"
    shutil.copytree(built, root, symlinks=True)
    return root


def test_first_run_builds_the_stack_and_a_second_run_does_nothing(
    built: Path, stack_index: IndexServer, install_environ: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert _works(built, install_environ) == "2.9.1+cu130 13.0"
    assert _version(built, "flashinfer-python", install_environ) == "0.6.4"  # the declared override
    assert _version(built, "sgl-kernel", install_environ) == "0.3.21+cu130"  # the URL wheel
    assert (
        _version(built, "nvidia-nccl-cu13", install_environ) == "2.27.7"
    )  # torch's dependency, from the default index
    before = (_current(built), sorted(p.name for p in (built / "generations").iterdir()))
    asked = len(stack_index.requests)
    code, out, err = _provision(built.parent / "lock.toml", install_environ, capsys)
    assert code == ExitCode.PASSED, err
    assert out.startswith("nothing to do: test-stack is provisioned as locked\n")
    assert len(stack_index.requests) == asked  # no download, not even an index page
    assert (_current(built), sorted(p.name for p in (built / "generations").iterdir())) == before


def test_the_pip_installer_builds_the_same_stack(
    tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_stack_lock(
        tmp_path / "lock.toml", stack_index, tmp_path / "root", installer="pip", resolve_with=install_environ
    )
    code, out, err = _provision(spec, install_environ, capsys)
    assert code == ExitCode.PASSED, err
    assert (
        " -m pip install --disable-pip-version-check --no-input --no-deps --require-hashes --only-binary :all: " in out
    )
    assert _works(tmp_path / "root", install_environ) == "2.9.1+cu130 13.0"
    assert _version(tmp_path / "root", "flashinfer-cubin", install_environ) == "0.6.4"
    assert _provision(spec, install_environ, capsys)[1].startswith("nothing to do")


def test_a_later_pip_install_in_the_provisioned_environment_cannot_move_torch(
    built: Path, stack_index: IndexServer, install_environ: dict[str, str]
) -> None:
    """With stackgate.env sourced, plain `pip` and `uv pip` are the environment's, and the guard
    (PIP_CONSTRAINT, UV_CONSTRAINT) holds torch through an eager upgrade and refuses torch 2.10."""
    pypi = stack_index.simple("pypi")
    uv = pyenv.find_uv()  # as stackgate finds it: PATH has it only where a venv is activated
    assert uv is not None
    shell = (
        f". {built}/current/stackgate.env && "
        f"pip install -q --upgrade --upgrade-strategy eager --index-url {pypi} flashinfer-python==0.6.4 && "
        f"python -c 'import torch; print(torch.__version__)' && "
        f"(pip install --index-url {pypi} torch==2.10.0 2>&1; echo pip-exit=$?) && "
        f"({shlex.quote(uv)} pip install --no-config --default-index {pypi} torch==2.10.0 2>&1; echo uv-exit=$?)"
    )
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, env=install_environ)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "2.9.1+cu130"
    assert "pip-exit=1" in lines and "uv-exit=1" in lines
    assert "The user requested (constraint) torch==2.9.1+cu130" in done.stdout
    assert _version(built, "torch", install_environ) == "2.9.1+cu130"


def test_a_package_that_demands_a_newer_torch_is_not_locked_and_so_not_installed(
    built: Path,
    tmp_path: Path,
    stack_index: IndexServer,
    install_environ: dict[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = _copy(built, tmp_path)
    spec = write_stack_lock(
        tmp_path / "lock.toml", stack_index, root, extra_packages={"torch-agnostic": "==1.0", "eager-upgrader": "==1.0"}
    )
    before = _current(root)
    locking = _invoke(["lock", "--lock", str(spec)], install_environ)
    assert locking.returncode == ExitCode.FAILED
    headline = next(line for line in locking.stderr.splitlines() if line.startswith("stackgate lock: "))
    assert "eager-upgrader requires torch>=2.10, but the lock holds torch at 2.9.1+cu130" in headline
    assert "torch-agnostic" not in headline and "flashinfer" not in headline
    assert "full log: " in locking.stderr and not (tmp_path / "pylock.lock.toml").exists()
    code, out, err = _provision(spec, install_environ, capsys)
    assert code == ExitCode.USAGE
    assert f"cannot apply: the spec has no pylock: {tmp_path / 'pylock.lock.toml'} does not exist" in out
    assert f"  $ stackgate lock --lock {spec}" in out
    assert _current(root) == before and _works(root, install_environ).startswith("2.9.1+cu130")


def test_a_url_wheel_whose_sha256_changed_is_refused_before_anything_is_created(
    built: Path,
    tmp_path: Path,
    stack_index: IndexServer,
    install_environ: dict[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = _copy(built, tmp_path)
    spec = write_stack_lock(
        tmp_path / "lock.toml",
        stack_index,
        root,
        sha256=None,
        extra_packages={"torch-agnostic": "==1.0"},
        resolve_with=install_environ,
    )
    real = hashlib.sha256(
        (stack_index.files / "sgl_kernel-0.3.21+cu130-cp310-abi3-manylinux2014_x86_64.whl").read_bytes()
    ).hexdigest()
    pylock = tmp_path / "pylock.lock.toml"
    pylock.write_text(pylock.read_text().replace(real, "0" * 64))  # the file at the URL is not what was locked any more
    before, ids = _current(root), _generation_ids(root)
    code, out, err = _provision(spec, install_environ, capsys)
    assert code == ExitCode.FAILED
    assert f"has sha256 {real}, the lock says {'0' * 64}; refusing to install it" in err
    assert (
        "is unchanged; a re-run refuses the same file: make the pylock again (stackgate lock) only if you trust the "
        "file"
    ) in err
    assert _current(root) == before and _generation_ids(root) == ids  # no generation was even created
    assert not list((root / "cache").rglob("0" * 64 + "/*.whl"))


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_an_index_file_that_is_not_the_locked_one_is_refused_by_the_installer(
    tmp_path: Path,
    stack_index: IndexServer,
    install_environ: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    installer: str,
) -> None:
    spec = write_stack_lock(
        tmp_path / "lock.toml", stack_index, tmp_path / "root", installer=installer, resolve_with=install_environ
    )
    real = hashlib.sha256((stack_index.files / "torch-2.9.1+cu130-py3-none-any.whl").read_bytes()).hexdigest()
    pylock = tmp_path / "pylock.lock.toml"
    pylock.write_text(pylock.read_text().replace(real, "1" * 64))
    code, out, err = _provision(spec, install_environ, capsys)
    assert code == ExitCode.FAILED
    log = Path(next(line for line in err.splitlines() if line.startswith("full log: "))[len("full log: ") :])
    said = log.read_text()
    assert (
        ("Hash mismatch for `torch==2.9.1+cu130`" in said)
        if installer == "uv"
        else ("THESE PACKAGES DO NOT MATCH THE HASHES" in said)
    ), said[-2000:]
    assert "1" * 64 in said and real in said
    assert not (tmp_path / "root" / "current").exists()


def test_a_dead_index_fails_before_anything_is_created_and_leaves_current(
    built: Path, tmp_path: Path, install_environ: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    root = _copy(built, tmp_path)
    gone = serve_stack(tmp_path / "index")
    spec = write_stack_lock(tmp_path / "lock.toml", gone, root, resolve_with=install_environ)
    gone.close()  # locked while it answered; now nothing listens there
    before, ids = _current(root), _generation_ids(root)
    code, out, err = _provision(spec, install_environ, capsys)
    assert code == ExitCode.FAILED
    assert f"stackgate provision failed: {gone.url}/ does not answer (" in err and ": nothing was created" in err
    assert (
        f"is unchanged; a re-run fails the same way while {gone.url}/ does not answer: check the URL in the lock "
        "and this machine's network"
    ) in err
    assert _current(root) == before and _generation_ids(root) == ids
    assert _works(root, install_environ).startswith("2.9.1+cu130")


def _generation_ids(root: Path) -> list[str]:
    return [g.id for g in generations.read(root).generations]


def _snapshot(root: Path) -> list[tuple[str, float]]:
    return sorted((str(p.relative_to(root)), p.lstat().st_mtime) for p in root.rglob("*"))


def test_a_malformed_lock_changes_nothing(built: Path, tmp_path: Path, install_environ: dict[str, str]) -> None:
    root = _copy(built, tmp_path)
    before = _snapshot(root)
    spec = tmp_path / "broken.toml"
    spec.write_text(
        (built.parent / "lock.toml")
        .read_text()
        .replace(f'root = "{built}"', f'root = "{root}"')
        .replace('torch = "==2.9.1+cu130"', 'torch = "=2.9.1"')
    )
    done = _invoke(["provision", "--lock", str(spec), "--yes"], install_environ)
    assert done.returncode == ExitCode.USAGE
    assert "python.packages.torch: invalid specifier '=2.9.1'" in done.stderr
    assert _snapshot(root) == before


def test_without_a_pylock_provision_refuses_with_the_command_that_makes_it(
    tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_stack_lock(tmp_path / "lock.toml", stack_index, tmp_path / "root", sha256=None)
    for dry_run in (True, False):
        code, out, err = _provision(spec, install_environ, capsys, dry_run=dry_run)
        assert code == ExitCode.USAGE
        assert (
            f"cannot apply: the spec has no pylock: {tmp_path / 'pylock.lock.toml'} does not exist (`stackgate lock "
            f"--lock {spec}` makes it)"
        ) in out
        assert (
            "  fix: Resolve the spec into its pylock where its indexes and URLs are reachable, then provision "
            f"again.\n  $ stackgate lock --lock {spec}\n"
        ) in out
    assert not (tmp_path / "root").exists()  # a refusal touches nothing: no root, no .provision.lock


def test_no_python_of_the_locked_version_says_so(
    tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_stack_lock(
        tmp_path / "lock.toml", stack_index, tmp_path / "root", python="3.99", resolve_with=install_environ
    )
    environ = {k: v for k, v in install_environ.items() if k != "STACKGATE_BASE_PYTHON"}
    code, out, err = _provision(spec, environ, capsys)
    assert code == ExitCode.REFUSED
    assert "cannot apply: no Python 3.99 on this machine (searched $STACKGATE_BASE_PYTHON, python3.99 on PATH" in out
    assert "uv cannot download Python here: install Python 3.99" in out
    assert not (tmp_path / "root").exists()


def test_a_full_disk_mid_install_leaves_current_and_the_next_run_finishes(
    built: Path,
    tmp_path: Path,
    stack_index: IndexServer,
    install_environ: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = _copy(built, tmp_path)
    spec = write_stack_lock(
        tmp_path / "lock.toml",
        stack_index,
        root,
        extra_packages={"torch-agnostic": "==1.0"},
        resolve_with=install_environ,
    )
    before = _current(root)
    monkeypatch.setenv("STACKGATE_FAULT", "during:python.stack=ENOSPC")
    code, out, err = _provision(spec, install_environ, capsys)
    assert code == ExitCode.FAILED and "No space left on device" in err
    assert (
        "is unchanged; free space on that disk, then `stackgate provision` again (it removes what was half built)"
        in err
    )
    assert _current(root) == before and _works(root, install_environ).startswith("2.9.1+cu130")
    monkeypatch.delenv("STACKGATE_FAULT")
    code, out, err = _provision(spec, install_environ, capsys)
    assert code == ExitCode.PASSED, err
    assert "remove unfinished generation(s)" in out
    assert _current(root) != before and _version(root, "torch-agnostic", install_environ) == "1.0"


#: Where the provisioner is killed, in the order one chain of runs meets them: each run finds
#: what the killed one before it left.
KILL_POINTS = (
    "during:python.venv",
    "during:python.discard",
    "before:python.stack",
    "during:python.stack",
    "before:python.check",
    "during:python.switch",
)


def _orphans(generation: Path) -> list[str]:
    """Processes still running with ``generation`` on their command line (waits a little for the
    kernel to deliver the parent-death signal)."""
    for _ in range(50):
        found = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(generation) in text:
                found.append(text)
        if not found:
            return []
        time.sleep(0.1)
    return found


def _killed(spec: Path, point: str, root: Path, environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Provision with SIGKILL at ``point``; the installer it ran must have died with it."""
    killed = _invoke(["provision", "--lock", str(spec), "--yes"], environ, STACKGATE_FAULT=point)
    assert killed.returncode == -9, (point, killed.stderr[-2000:])
    assert _orphans(generations.read(root).generations[-1].path) == [], point  # by its parent-death signal
    assert _works(root, environ).startswith("2.9.1+cu130"), point
    return killed


def test_kill_9_at_any_point_leaves_a_working_current_and_the_next_run_cleans_up(
    built: Path, tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str]
) -> None:
    """SIGKILL the provisioner at each point of a build, each run finding what the one before it
    left: every time `current` is untouched and works, and the next run removes what was left
    (the generation, or what a killed removal left) or finishes it; then a kill right after a
    switch leaves the new generation current, and rollback goes back."""
    root = _copy(built, tmp_path)
    original = _current(root)
    spec = write_stack_lock(
        tmp_path / "lock.toml",
        stack_index,
        root,
        extra_packages={"torch-agnostic": "==1.0"},
        resolve_with=install_environ,
    )
    left: list[str] = []  # what the previous killed run left
    for point in KILL_POINTS:
        killed = _killed(spec, point, root, install_environ)
        assert _current(root) == original, point
        hidden = sorted(p.name for p in (root / "generations").glob(".*.removing"))
        if point == "during:python.discard":
            assert hidden == [f".{left[0]}.removing"]  # the kill came between the rename and the deletion
        elif left and left[0].startswith("."):
            assert f"removed what an interrupted run left: {root / 'generations' / left[0]}" in killed.stderr, point
        elif left:
            assert f"remove unfinished generation(s) {left[0]}" in killed.stderr, (point, killed.stderr[-2000:])
        if point != "during:python.discard":
            assert hidden == [], point
        unfinished = [g.id for g in generations.read(root).generations if g.path.name != Path(original).name]
        assert len(unfinished) <= 1, (point, unfinished)
        left = hidden or unfinished
    rerun = _invoke(["provision", "--lock", str(spec), "--yes"], install_environ)
    assert rerun.returncode == 0, (rerun.stdout[-3000:], rerun.stderr[-3000:])
    assert "was built and checked from this lock by a run that stopped before switching" in rerun.stdout
    finished = _current(root)
    assert _version(root, "torch-agnostic", install_environ) == "1.0"
    assert _invoke(["provision", "--lock", str(spec), "--yes"], install_environ).stdout.startswith("nothing to do")
    assert [g for g in generations.read(root).generations if not g.ready] == []
    # Killed right after the switch: the new generation is current, and complete.
    plain = write_stack_lock(tmp_path / "plain.toml", stack_index, root, resolve_with=install_environ)
    _killed(plain, "after:python.switch", root, install_environ)
    assert _current(root) not in (original, finished)
    assert _invoke(["provision", "--lock", str(plain), "--yes"], install_environ).stdout.startswith("nothing to do")
    back = _invoke(["rollback", "--lock", str(plain)], install_environ)
    assert back.returncode == 0 and _current(root) == finished, back.stderr


def test_a_second_provision_fails_at_once_naming_the_running_one_or_waits_for_it(
    tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_stack_lock(tmp_path / "lock.toml", stack_index, tmp_path / "root", resolve_with=install_environ)
    first = subprocess.Popen(
        [sys.executable, "-m", "invoke", "provision", "--lock", str(spec), "--yes"],
        cwd=ROOT,
        env=install_environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        holder = tmp_path / "root" / generations.LOCK_FILE
        deadline = time.monotonic() + 120
        while f'"pid": {first.pid}' not in (holder.read_text() if holder.exists() else ""):
            assert first.poll() is None and time.monotonic() < deadline, "the first provision never took the lock"
            time.sleep(0.05)
        code, out, err = _provision(spec, install_environ, capsys)
        assert code == ExitCode.REFUSED
        assert f"another provision is running on {tmp_path / 'root'}: pid {first.pid}, started " in err
        assert f"command: invoke provision --lock {spec} --yes; wait for it, or pass --wait" in err
        code, out, err = _provision(spec, install_environ, capsys, wait=True)
        assert first.wait() == 0
        assert code == ExitCode.PASSED
        assert f"waiting for the provision holding {tmp_path / 'root'}: pid {first.pid}" in err
        assert out.startswith("nothing to do")  # the first one built it
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()


def test_rollback_switches_back_and_says_to_what(
    built: Path,
    tmp_path: Path,
    stack_index: IndexServer,
    install_environ: dict[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = _copy(built, tmp_path)
    first = _current(root)
    spec = write_stack_lock(
        tmp_path / "lock.toml",
        stack_index,
        root,
        extra_packages={"torch-agnostic": "==1.0"},
        resolve_with=install_environ,
    )
    built_here = _invoke(
        ["provision", "--lock", "lock.toml", "--yes"], install_environ, cwd=tmp_path
    )  # a relative --lock
    assert built_here.returncode == 0, built_here.stderr[-2000:]
    second = _current(root)
    new = generations.read(root).current
    assert new is not None and new.marker is not None
    assert new.marker["lock"]["path"] == str(spec)  # absolute: it is read from anywhere later
    assert new.describe().endswith(f"from {spec})")
    assert (root / second / "constraints.txt").read_text().startswith(f"# Written by stackgate from {spec} ")
    done = _invoke(["rollback", "--lock", str(spec)], install_environ)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        f"rolled back {root / 'current'}: {Path(second).name} -> generation {Path(first).name} (built "
    )
    built_first = next(g for g in generations.read(root).generations if g.path.name == Path(first).name)
    first_lock = built_first.marker["lock"]  # type: ignore[index]
    assert first_lock["path"] != str(spec)  # the fixture built it from its own lock file: named, not "another version"
    said = f"it was built from another lock file, {first_lock['path']} (sha256 {first_lock['sha256'][:12]})"
    assert said in done.stdout
    assert _current(root) == first and _works(root, install_environ).startswith("2.9.1+cu130")
    again = _invoke(["rollback", "--lock", str(spec)], install_environ)
    assert again.returncode == ExitCode.REFUSED and "no earlier ready generation" in again.stderr


def test_a_moved_torch_is_put_back_by_a_new_generation_and_rollback_refuses_the_drifted_one(
    built: Path,
    tmp_path: Path,
    stack_index: IndexServer,
    install_environ: dict[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = _copy(built, tmp_path)
    drifted = _current(root)
    spec = write_stack_lock(tmp_path / "lock.toml", stack_index, root, resolve_with=install_environ)
    # uv reads no configuration inside an environment, so `uv pip install --python` goes around
    # the guard (README): the drift provision must undo, and rollback must not go back to.
    uv = pyenv.find_uv()
    assert uv is not None
    subprocess.run(
        [
            uv,
            "pip",
            "install",
            "-q",
            "--no-config",
            "--python",
            str(root / "current/bin/python"),
            "--default-index",
            stack_index.simple("pypi"),
            "torch==2.10.0",
        ],
        env=install_environ,
        check=True,
    )
    assert _version(root, "torch", install_environ) == "2.10.0"
    code, out, err = _provision(spec, install_environ, capsys)
    assert code == ExitCode.PASSED, err
    assert "why: torch is 2.10.0, locked ==2.9.1+cu130" in out
    assert _version(root, "torch", install_environ) == "2.9.1+cu130"
    rebuilt = _current(root)
    out = io.StringIO()
    code = provision.rollback(
        provision.RollbackRequest(spec_path=spec, environ=install_environ), UI(stream=out, force_plain=True)
    )
    err = capsys.readouterr().err
    assert code == ExitCode.REFUSED and _current(root) == rebuilt
    assert (
        f"not switching to generation {Path(drifted).name}: it no longer holds what it was built from: torch is "
        "2.10.0, locked ==2.9.1+cu130"
    ) in err
    assert "`stackgate rollback --force` switches to this one anyway" in err
    forced = _invoke(["rollback", "--lock", str(spec), "--force"], install_environ)
    assert forced.returncode == 0, forced.stderr
    assert "switched anyway (--force), though it differs from what it was built from: torch is 2.10.0" in forced.stderr
    assert _current(root) == drifted and _version(root, "torch", install_environ) == "2.10.0"


def test_rollback_while_a_provision_runs_says_what_rollback_can_do(
    built: Path,
    tmp_path: Path,
    stack_index: IndexServer,
    install_environ: dict[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = _copy(built, tmp_path)
    spec = write_stack_lock(tmp_path / "lock.toml", stack_index, root, resolve_with=install_environ)
    hold = (
        "import sys, time; from pathlib import Path; from stackgate.stack import generations\n"
        "with generations.exclusive(Path(sys.argv[1]), wait=False, command='invoke provision'):\n    print('held', "
        "flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold, str(root)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        code = provision.rollback(
            provision.RollbackRequest(spec_path=spec, environ=install_environ),
            UI(stream=io.StringIO(), force_plain=True),
        )
        err = capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
    assert code == ExitCode.REFUSED
    assert f"another provision is running on {root}: pid {holder.pid}" in err
    assert err.rstrip().endswith("command: invoke provision; run `stackgate rollback` again once it has finished")
    assert "--wait" not in err


def test_rollback_of_a_root_that_does_not_exist_says_so_and_creates_nothing(
    tmp_path: Path, stack_index: IndexServer, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_stack_lock(tmp_path / "lock.toml", stack_index, tmp_path / "root")
    code = provision.rollback(provision.RollbackRequest(spec_path=spec), UI(stream=io.StringIO(), force_plain=True))
    assert code == ExitCode.REFUSED
    assert f"stackgate rollback: nothing to roll back: {tmp_path / 'root'} does not exist" in capsys.readouterr().err
    assert not (tmp_path / "root").exists()


def test_pip_in_the_environment_keeps_the_guard_without_activation(
    built: Path, tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str]
) -> None:
    """`<root>/current/bin/pip install`, not activated, with only the machine's pip configuration
    taken away (user and global files, PIP_* variables): the environment's own pip.conf holds
    torch. --dry-run resolves for real and changes nothing."""
    for folder in ("home", "xdg-dirs"):
        (tmp_path / folder).mkdir()
    environ = {k: v for k, v in install_environ.items() if k != "PIP_CONFIG_FILE" and k not in ("VIRTUAL_ENV",)}
    environ.update(
        HOME=str(tmp_path / "home"), XDG_CONFIG_HOME=str(tmp_path / "home"), XDG_CONFIG_DIRS=str(tmp_path / "xdg-dirs")
    )
    environ["PATH"] = "/usr/bin:/bin"  # not the environment's bin: nothing activated
    pip = [str(built / "current" / "bin" / "pip"), "install", "--dry-run", "--index-url", stack_index.simple("pypi")]

    def run(*wanted: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*pip, *wanted], capture_output=True, text=True, env=environ, cwd=tmp_path)

    moved = run("torch==2.10.0")
    assert moved.returncode == 1, moved.stdout
    assert "The user requested (constraint) torch==2.9.1+cu130" in moved.stdout + moved.stderr
    eager = run("--upgrade", "--upgrade-strategy", "eager", "eager-upgrader==1.0")
    assert eager.returncode == 1 and "eager-upgrader 1.0 depends on torch>=2.10" in eager.stdout + eager.stderr
    innocent = run("torch-agnostic==1.0")
    assert innocent.returncode == 0, innocent.stderr
    assert "Would install torch-agnostic-1.0" in innocent.stdout
    assert _version(built, "torch", install_environ) == "2.9.1+cu130"


def _fake_installs(monkeypatch: pytest.MonkeyPatch, calls: list[str]) -> None:
    """The toolkit module's installing and fingerprinting, faked where provision calls them:
    installing lays out a tree whose nvcc and ptxas are this machine's real CUDA 13.0 ones
    (a real install downloads the CUDA wheels: tests/test_toolkit.py does that)."""
    real = Path("/usr/local/cuda-13.0/bin")

    def install_toolkit(toolkit, *, log: Path, cache: Path | None = None, on_progress=None) -> None:  # type: ignore[no-untyped-def]
        calls.append(f"install {toolkit.prefix}")
        (toolkit.prefix / "bin").mkdir(parents=True)
        for tool in ("nvcc", "ptxas"):
            (toolkit.prefix / "bin" / tool).symlink_to(real / tool)

    @contextlib.contextmanager
    def kept_untouched(toolkits):  # type: ignore[no-untyped-def]
        kept = [t.prefix for t in toolkits if t.keep]
        calls.extend(f"fingerprint {prefix}" for prefix in kept)
        yield
        calls.extend(f"fingerprint {prefix}" for prefix in kept)

    monkeypatch.setattr(toolkit, "install_toolkit", install_toolkit)
    monkeypatch.setattr(toolkit, "kept_untouched", kept_untouched)


def test_only_toolkit_installs_a_missing_toolkit_and_keeps_the_kept_one(
    tmp_path: Path,
    stack_index: IndexServer,
    install_environ: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    toolkits = (
        f'[[toolkit]]\nversion = "13.0.1"\nnvcc = "13.0.88"\nprefix = "{tmp_path}/cuda-13.0"\nsource = '
        '"pypi"\ndefault = true\n\n'
        '[[toolkit]]\nversion = "13.0"\nprefix = "/usr/local/cuda-13.0"\nkeep = true\n'
    )
    spec = write_stack_lock(
        tmp_path / "lock.toml", stack_index, tmp_path / "root", toolkits=toolkits, resolve_with=install_environ
    )
    calls: list[str] = []
    _fake_installs(monkeypatch, calls)
    code, out, err = _provision(spec, install_environ, capsys, only="toolkit")
    assert code == ExitCode.PASSED, err
    assert calls == [
        "fingerprint /usr/local/cuda-13.0",
        f"install {tmp_path}/cuda-13.0",
        "fingerprint /usr/local/cuda-13.0",
    ]
    installing = load_spec(spec).toolkits[0]
    assert (
        f"       $ {shlex.join(toolkit.install_command(installing, cache=tmp_path / 'root' / 'cache' / 'toolkits'))}\n"
        in out
    )
    assert any(
        line.split()[:2] == ["PASS", "cuda.toolkits"]
        and line.endswith("CUDA 13.0.1 (nvcc V13.0.88), CUDA 13.0 (nvcc V13.0.88)")
        for line in out.splitlines()
    ), out
    assert "PASS  cuda.ptxas_arch" in out
    assert not (tmp_path / "root" / "generations").exists()  # --only toolkit left Python alone
    assert _provision(spec, install_environ, capsys, only="toolkit")[1].startswith("nothing to do")


def _with_patch(spec: Path, tmp_path: Path) -> Path:
    """Add a [[patch]]: a real unified diff (diff -u) of the test sglang's size table."""
    for side, text in (("a", SYMM_MEM_TEXT), ("b", SYMM_MEM_TEXT.replace("    10: 8,\n", "    10: 8,\n    12: 8,\n"))):
        (tmp_path / side / SYMM_MEM_FILE).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / side / SYMM_MEM_FILE).write_text(text)
    diff = subprocess.run(
        ["diff", "-u", f"a/{SYMM_MEM_FILE}", f"b/{SYMM_MEM_FILE}"], cwd=tmp_path, capture_output=True, text=True
    ).stdout
    (tmp_path / "sm120.patch").write_text(diff)
    sha = hashlib.sha256(diff.encode()).hexdigest()
    spec.write_text(
        spec.read_text()
        + (
            f'\n[[patch]]\npackage = "sglang"\nversion = "0.5.9"\nfile = "sm120.patch"\nsha256 = "{sha}"\nreason = '
            '"capability 12 in the size table"\n'
        )
    )
    return spec


def _patched(root: Path) -> bool:
    site = next((root / "current").glob("lib/python3*/site-packages"))
    return "    12: 8," in (site / SYMM_MEM_FILE).read_text()


def test_a_new_generation_gets_the_locks_patches_before_its_checks(
    built: Path,
    tmp_path: Path,
    stack_index: IndexServer,
    install_environ: dict[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = _copy(built, tmp_path)
    spec = _with_patch(
        write_stack_lock(
            tmp_path / "lock.toml",
            stack_index,
            root,
            extra_packages={"torch-agnostic": "==1.0"},
            resolve_with=install_environ,
        ),
        tmp_path,
    )
    code, out, err = _provision(spec, install_environ, capsys)
    assert code == ExitCode.PASSED, err
    assert out.index("[patches] apply sm120.patch to sglang 0.5.9\n") < out.index("[python] check generation ")
    assert _patched(root)
    assert _provision(spec, install_environ, capsys)[1].startswith("nothing to do")


def test_only_patches_applies_a_missing_patch_in_place_then_does_nothing(
    built: Path,
    tmp_path: Path,
    stack_index: IndexServer,
    install_environ: dict[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = _copy(built, tmp_path)
    spec = _with_patch(
        write_stack_lock(tmp_path / "lock.toml", stack_index, root, resolve_with=install_environ), tmp_path
    )
    before = _current(root)
    assert not _patched(root)
    code, out, err = _provision(spec, install_environ, capsys, only="patches")
    assert code == ExitCode.PASSED, err
    assert "[patches] apply sm120.patch to sglang 0.5.9 in " in out
    assert _patched(root) and _current(root) == before
    assert _provision(spec, install_environ, capsys, only="patches")[1].startswith("nothing to do")


def test_dry_run_prints_the_plan_and_touches_nothing(
    tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str]
) -> None:
    spec = write_stack_lock(tmp_path / "lock.toml", stack_index, tmp_path / "root", resolve_with=install_environ)
    done = _invoke(["provision", "--lock", str(spec), "--dry-run"], install_environ)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("plan for test-stack (root ")
    assert (
        "  5. [python] install the pylock's 9 distributions (9 files, each checked against its sha256) from "
        in done.stdout
    )
    assert not (tmp_path / "root").exists()


def test_ctrl_c_mid_install_exits_130_and_leaves_current(
    built: Path, tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str]
) -> None:
    root = _copy(built, tmp_path)
    spec = write_stack_lock(
        tmp_path / "lock.toml",
        stack_index,
        root,
        extra_packages={"torch-agnostic": "==1.0"},
        resolve_with=install_environ,
    )
    before = _current(root)
    done = _invoke(
        ["provision", "--lock", str(spec), "--yes"], install_environ, STACKGATE_FAULT="during:python.stack=SIGINT"
    )
    assert done.returncode == ExitCode.INTERRUPTED, done.stderr[-2000:]
    assert "stackgate: interrupted" in done.stderr
    assert _current(root) == before and _works(root, install_environ).startswith("2.9.1+cu130")
    assert [g.state for g in generations.read(root).generations if g.path.name != before.split("/")[-1]] == ["building"]
    rerun = _invoke(["provision", "--lock", str(spec), "--yes"], install_environ)
    assert rerun.returncode == 0 and "remove unfinished generation(s)" in rerun.stdout, rerun.stderr[-2000:]


def test_without_a_terminal_provision_asks_for_yes_and_changes_nothing(
    tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str]
) -> None:
    spec = write_stack_lock(tmp_path / "lock.toml", stack_index, tmp_path / "root", resolve_with=install_environ)
    done = _invoke(["provision", "--lock", str(spec)], install_environ)
    assert done.returncode == ExitCode.USAGE
    assert "there is no terminal to ask: pass --yes (or --dry-run to only see the plan)" in done.stderr
    assert not (tmp_path / "root").exists()  # refused before the root's lock was taken: nothing created
    home = {"HOME": str(tmp_path / "home")}
    assert history.runs_dir(load_spec(spec), home) == tmp_path / "home" / ".local" / "state" / "stackgate" / "runs"


def test_an_unwritable_root_is_a_clear_error(
    tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("")
    spec = write_stack_lock(
        tmp_path / "lock.toml", stack_index, tmp_path / "file" / "root", resolve_with=install_environ
    )
    code, out, err = _provision(spec, install_environ, capsys)
    assert code == ExitCode.REFUSED
    assert f"cannot create or lock {tmp_path / 'file' / 'root'}: " in err


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_a_wheelhouse_provisions_with_the_network_cut(
    tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str], installer: str
) -> None:
    """`invoke lock --wheelhouse` downloads every locked file once; `invoke provision --wheelhouse`
    then runs in a network namespace of its own (`unshare -n`: not even 127.0.0.1's index
    answers there) and installs the exact stack from the folder."""
    if subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare -n is not permitted here (it needs root or user namespaces)")
    spec = write_stack_lock(
        tmp_path / "lock.toml", stack_index, tmp_path / "root", installer=installer, resolve_with=install_environ
    )
    filled = _invoke(["lock", "--lock", str(spec), "--wheelhouse", str(tmp_path / "wheelhouse")], install_environ)
    assert filled.returncode == 0, filled.stderr
    assert (
        "wheelhouse " in filled.stdout
        and ": 9 files, each checked against its sha256 (9 downloaded, 0 already there)" in filled.stdout
    )
    cut = [
        "unshare",
        "-n",
        sys.executable,
        "-m",
        "invoke",
        "provision",
        "--lock",
        str(spec),
        "--yes",
        "--wheelhouse",
        str(tmp_path / "wheelhouse"),
    ]
    done = subprocess.run(cut, cwd=ROOT, env=install_environ, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert f"check that {tmp_path / 'wheelhouse'} holds all 9 locked files, each with its sha256" in done.stdout
    assert "with no index" in done.stdout and "download sgl-kernel" not in done.stdout
    assert "PASS  python.locked" in done.stdout
    assert _works(tmp_path / "root", install_environ) == "2.9.1+cu130 13.0"
    # A file of the wheelhouse that is not the locked one stops it before anything is created.
    (tmp_path / "wheelhouse" / "sglang-0.5.9-py3-none-any.whl").write_bytes(b"not the wheel")
    spec.write_text(spec.read_text() + "\n[smoke]\nport = 30001\n")  # any change: provision plans nothing otherwise
    shutil.rmtree(tmp_path / "root")
    refused = subprocess.run(cut, cwd=ROOT, env=install_environ, capture_output=True, text=True, timeout=300)
    assert refused.returncode == ExitCode.FAILED, refused.stderr[-2000:]
    assert (
        f"the wheelhouse {tmp_path / 'wheelhouse'} cannot be installed from: sglang-0.5.9-py3-none-any.whl has sha256 "
        in refused.stderr
    )
    assert not list((tmp_path / "root" / "generations").glob("0*"))


def test_the_guard_holds_in_a_root_whose_path_has_a_space(
    tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """pip and uv split PIP_CONSTRAINT and UV_CONSTRAINT on whitespace: stackgate.env names the
    constraints as a file: URL, which both read, so "/srv/my stack" is guarded too."""
    root = tmp_path / "my stack"
    spec = write_stack_lock(tmp_path / "lock.toml", stack_index, root, resolve_with=install_environ)
    code, out, err = _provision(spec, install_environ, capsys)
    assert code == ExitCode.PASSED, err
    pypi = stack_index.simple("pypi")
    uv = pyenv.find_uv()
    assert uv is not None
    shell = (
        f". {shlex.quote(str(root / 'current' / 'stackgate.env'))} && "
        f"(pip install --index-url {pypi} torch==2.10.0 2>&1; echo pip-exit=$?) && "
        f"({shlex.quote(uv)} pip install --no-config --default-index {pypi} torch==2.10.0 2>&1; echo uv-exit=$?)"
    )
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, env=install_environ)
    assert "pip-exit=1" in done.stdout and "uv-exit=1" in done.stdout, done.stdout
    assert "No such file" not in done.stdout and "File not found" not in done.stdout
    assert "The user requested (constraint) torch==2.9.1+cu130" in done.stdout
    assert _version(root, "torch", install_environ) == "2.9.1+cu130"


def test_rollback_refuses_a_generation_holding_what_its_pylock_does_not(
    built: Path, tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str]
) -> None:
    """Rollback reads the older generation against the pylock it was built from (its own copy):
    a package installed there by hand since is named, and only --force switches to it."""
    root = _copy(built, tmp_path)
    first = _current(root)
    spec = write_stack_lock(
        tmp_path / "lock.toml",
        stack_index,
        root,
        extra_packages={"torch-agnostic": "==1.0"},
        resolve_with=install_environ,
    )
    assert _invoke(["provision", "--lock", str(spec), "--yes"], install_environ).returncode == 0
    uv = pyenv.find_uv()
    assert uv is not None
    subprocess.run(
        [
            uv,
            "pip",
            "install",
            "-q",
            "--no-config",
            "--python",
            str(root / first / "bin/python"),
            "--default-index",
            stack_index.simple("pypi"),
            "--no-deps",
            "torch-agnostic==1.0",
        ],
        env=install_environ,
        check=True,
    )
    refused = _invoke(["rollback", "--lock", str(spec)], install_environ)
    assert refused.returncode == ExitCode.REFUSED
    assert (
        f"not switching to generation {Path(first).name}: it no longer holds what it was built from: torch-agnostic "
        "1.0 is installed but not in the pylock"
    ) in refused.stderr
    assert (
        _invoke(["rollback", "--lock", str(spec), "--force"], install_environ).returncode == 0
        and _current(root) == first
    )


def test_a_part_file_refused_in_the_download_cache_is_advised_away_not_retried() -> None:
    """A link planted where a URL wheel or runfile streams: the next run is refused the same way."""
    from stackgate.edges import fetch
    from stackgate.flows.provision import advice

    try:
        try:
            raise fetch.PartRefused("cannot download into /r/cache/.x.whl.part: is a symbolic link (to /etc/x)")
        except fetch.PartRefused as exc:
            raise pyenv.PyenvError(str(exc)) from exc
    except pyenv.PyenvError as exc:
        said = advice(exc)
    assert said.startswith("a re-run is refused the same way: remove what the line above names"), said


@pytest.mark.parametrize("command", [("provision", "--lock"), ("upgrade", "--to")])
def test_a_spec_naming_an_existing_interpreter_is_refused_by_every_build_in_the_same_words(tmp_path, command):
    """provision and upgrade build generations only under a python.root: a spec (with its current pylock)
    that names an existing interpreter is refused with exit 2 and the same words, and nothing is created."""
    from support import run_program
    from test_pylock_hostile import write_pair

    spec = write_pair(tmp_path)  # names /usr/bin/python3 as its interpreter
    name, option = command
    done = run_program(name, option, str(spec), env={"STACKGATE_STATE_DIR": str(tmp_path / "state")}, timeout=120)
    assert done.returncode == ExitCode.USAGE, done.stdout + done.stderr
    said = f"{option} {spec}: python.interpreter names an existing environment (/usr/bin/python3); {name} builds"
    assert said in done.stderr and "set python.root instead" in done.stderr, done.stderr
    assert not (tmp_path / "state").exists()
