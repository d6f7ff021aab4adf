"""The guard against real resolvers: uv and pip installing real wheels from a real local index."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from pkgindex import IndexServer, write_stack_lock

from stackgate.facts import BasePython, interpreters
from stackgate.models.spec import Spec, load_spec
from stackgate.stack import guard, pyenv

ROOT = Path(__file__).resolve().parents[1]


def _versions(python: Path, environ: dict[str, str]) -> dict[str, str]:
    script = (
        "import importlib.metadata as m; print('\\n'.join(f'{d.metadata[\"Name\"]}=={d.version}' for d in "
        "m.distributions()))"
    )
    done = subprocess.run([str(python), "-c", script], capture_output=True, text=True, env=environ, check=True)
    return dict(line.split("==", 1) for line in done.stdout.split())


def _family_env(tmp_path: Path, name: str, spec: Spec, environ: dict[str, str]) -> tuple[Path, guard.GuardFiles]:
    """A fresh environment (created as provision creates one, pip in it) holding the torch
    family from the cu130 index: what a provisioned stack looks like to a later install."""
    home = tmp_path / name
    home.mkdir()
    base = interpreters.base_python(spec, environ)  # as provision finds it: $STACKGATE_BASE_PYTHON
    assert isinstance(base, BasePython), base
    uv = pyenv.find_uv()
    assert uv is not None
    log = tmp_path / f"{name}.log"
    for command in [*pyenv.venv_commands(spec, base.path, home, uv), pyenv.seed_command(home, uv, base.bundled_pip)]:
        pyenv.run(command, log=log, environ=environ)
    files = guard.write(spec, home)
    family = ("torch==2.9.1+cu130", "torchaudio==2.9.1+cu130", "triton==3.5.1")
    install = (
        uv,
        "pip",
        "install",
        "--no-config",
        "--python",
        str(pyenv.python_of(home)),
        "--no-deps",
        "--default-index",
        spec.python.indexes[0].url,
        *family,
    )
    pyenv.run(pyenv.Command(install), log=log, environ=environ)
    return home, files


def _later_install(
    installer: str, home: Path, index: str, guard_args: tuple[str, ...], wanted: tuple[str, ...]
) -> pyenv.Command:
    """An install into the stack after provisioning, as a person types it (eager, for pip)."""
    if installer == "uv":
        return pyenv.Command(
            (
                str(pyenv.find_uv()),
                "pip",
                "install",
                "--no-config",
                "--python",
                str(pyenv.python_of(home)),
                "--upgrade",
                "--default-index",
                index,
                *guard_args,
                *wanted,
            )
        )
    argv = (
        str(pyenv.python_of(home)),
        "-m",
        "pip",
        "install",
        "--upgrade",
        "--upgrade-strategy",
        "eager",
        "--index-url",
        index,
        *guard_args,
        *wanted,
    )
    return pyenv.Command(argv, {"PIP_CONFIG_FILE": "/dev/null"})


def test_constraints_pin_every_frozen_package_of_the_default_lock(tmp_path: Path) -> None:
    spec = load_spec()
    assert guard.constraints(spec) == [
        "torch==2.9.1+cu130",
        "torchaudio==2.9.1+cu130",
        "triton==3.5.1",
        "nvidia-nccl-cu13==2.27.7",
    ]
    files = guard.write(spec, tmp_path)
    lines = files.constraints.read_text().splitlines()
    assert lines[0].startswith(f"# Written by stackgate from {spec.path}")
    assert lines[1:] == guard.constraints(spec)
    assert guard.write_pip_conf(spec, tmp_path).read_text().splitlines()[1:] == [
        "[install]",
        f"constraint = {files.constraints.as_uri()}",
    ]
    overrides = files.overrides.read_text().splitlines()[1:]
    assert overrides == [
        "flashinfer-python==0.6.4  # sglang 0.5.9 pins flashinfer_python==0.6.3; the stack runs 0.6.4",
        "flashinfer-cubin==0.6.4  # sglang 0.5.9 pins flashinfer_cubin==0.6.3; it must equal flashinfer-python (0.6.4)",
    ]


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_the_same_install_moves_torch_without_the_guard_and_not_with_it(
    tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str], installer: str
) -> None:
    """The reference deployment's accident, replayed: an eager install of flashinfer 0.6.4 (it
    requires plain `torch`) next to torch 2.9.1+cu130. Without the constraints the real resolver
    takes torch 2.10.0 (a CUDA 12.8 build) from the default index; with them torch stays."""
    spec = load_spec(write_stack_lock(tmp_path / "lock.toml", stack_index, tmp_path / "root", installer=installer))
    outcomes = {}
    for guarded in (False, True):
        home, files = _family_env(tmp_path, f"env-{installer}-{guarded}", spec, install_environ)
        assert _versions(pyenv.python_of(home), install_environ)["torch"] == "2.9.1+cu130"
        guard_args = ("--constraint", str(files.constraints)) if guarded else ()
        wanted = ("flashinfer-python==0.6.4", "flashinfer-cubin==0.6.4")
        command = _later_install(installer, home, spec.python.default_index, guard_args, wanted)
        pyenv.run(command, log=tmp_path / f"eager-{guarded}.log", environ=install_environ)
        outcomes[guarded] = _versions(pyenv.python_of(home), install_environ)
    assert outcomes[False]["torch"] == "2.10.0"
    assert outcomes[False]["triton"] == "3.6.0"
    assert outcomes[True]["torch"] == "2.9.1+cu130"
    assert outcomes[True]["triton"] == "3.5.1"
    assert outcomes[True]["flashinfer-python"] == outcomes[False]["flashinfer-python"] == "0.6.4"


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_a_blocked_resolution_names_the_package_that_wanted_another_torch(
    tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str], installer: str
) -> None:
    """Real resolver output of a later install under the guard: flashinfer and torch-agnostic
    require plain `torch` (innocent), sglang pins torch==2.9.1 (uv folds the constraint into its
    text), eager-upgrader wants torch>=2.10. (`invoke lock` reads uv's the same way: test_resolve.)"""
    extra = {"eager-upgrader": "==1.0", "torch-agnostic": "==1.0"}
    spec = load_spec(
        write_stack_lock(
            tmp_path / "lock.toml", stack_index, tmp_path / "root", installer=installer, extra_packages=extra
        )
    )
    home, files = _family_env(tmp_path, "env", spec, install_environ)
    wanted = ("torch-agnostic==1.0", "flashinfer-python", "sglang==0.5.9", "eager-upgrader==1.0")
    command = _later_install(
        installer,
        home,
        spec.python.default_index,
        ("--constraint", str(files.constraints), "--override", str(files.overrides))
        if installer == "uv"
        else ("--constraint", str(files.constraints)),
        wanted,
    )
    with pytest.raises(guard.GuardError) as caught:
        pyenv.run(command, log=tmp_path / "stack.log", environ=install_environ, spec=spec)
    message = str(caught.value)
    assert "eager-upgrader" in message and "torch>=2.10" in message, message
    assert "the lock holds torch at 2.9.1+cu130" in message
    assert "torch-agnostic" not in message and "flashinfer" not in message and "sglang" not in message
    assert caught.value.log == tmp_path / "stack.log"
    assert _versions(pyenv.python_of(home), install_environ)["torch"] == "2.9.1+cu130"


def test_blocked_reads_both_resolvers_phrasings() -> None:
    spec = load_spec()
    pip_text = (
        "The conflict is caused by:\n    The user requested torch==2.9.1+cu130\n"
        "    flashinfer-python 0.6.4 depends on torch\n    xformers 0.0.33 depends on torch>=2.10,<2.11\n"
        "    The user requested (constraint) torch==2.9.1+cu130\n"
    )
    uv_text = (
        "Because all versions of xformers depend on torch>=2.10 and all versions of sglang depend on "
        "torch==2.9.1+cu130, we can conclude that all versions of xformers and all versions of sglang are incompatible."
    )
    (pip_hit,) = guard.blocked(pip_text, spec)
    assert (pip_hit.requirer, pip_hit.requirer_version, pip_hit.package, pip_hit.locked) == (
        "xformers",
        "0.0.33",
        "torch",
        "2.9.1+cu130",
    )
    assert str(pip_hit) == "xformers 0.0.33 requires torch>=2.10,<2.11, but the lock holds torch at 2.9.1+cu130"
    (uv_hit,) = guard.blocked(uv_text, spec)
    assert str(uv_hit) == "every version of xformers requires torch>=2.10, but the lock holds torch at 2.9.1+cu130"
    assert guard.blocked("ERROR: No matching distribution found for sglang==9.9", spec) == []


def test_uv_resolver_output_is_read_from_a_real_run(
    tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str]
) -> None:
    """The phrasing the test above relies on is uv's real one, not a copy of it."""
    uv = pyenv.find_uv()
    subprocess.run(
        [uv, "venv", "-q", "--no-config", "--python", install_environ["STACKGATE_BASE_PYTHON"], str(tmp_path / "v")],
        check=True,
        env=install_environ,
    )
    constraints = tmp_path / "c.txt"
    constraints.write_text("torch==2.9.1+cu130\n")
    done = subprocess.run(
        [
            uv,
            "pip",
            "install",
            "--no-config",
            "--python",
            str(tmp_path / "v/bin/python"),
            "--default-index",
            stack_index.simple("pypi"),
            "-c",
            str(constraints),
            "eager-upgrader",
            "torch-agnostic",
        ],
        capture_output=True,
        text=True,
        env=install_environ,
    )
    assert done.returncode != 0
    spec = load_spec()
    hits = guard.blocked(done.stderr, spec)
    assert [h.requirer for h in hits] == ["eager-upgrader"], done.stderr
    assert hits[0].requirement == "torch>=2.10"
