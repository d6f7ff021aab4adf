"""The plan: desired (the lock) against actual (facts, generations) -> steps; pure, so exact."""

from __future__ import annotations

import functools
import hashlib
import shlex
import time
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name
from pkgindex import IndexServer, write_stack_lock
from support import isolated_environ

from stackgate.facts import BasePython, Distribution, EnvFacts, Facts, Missing, ProbeFacts, inspect_toolkit
from stackgate.facts.compare import environment_spec
from stackgate.models import pylock
from stackgate.models.spec import Spec, load_spec
from stackgate.stack import generations, pyenv, toolkit
from stackgate.stack import plan as planmodule
from stackgate.stack.plan import plan

BASE = BasePython(Path("/opt/python3.11/bin/python3.11"), "3.11.7", "test")
UV = "/usr/bin/uv"
MARKERS = {"python_version": "3.11", "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}
LOCKED = {
    "torch": (
        "2.9.1+cu130",
        [
            "filelock",
            "nvidia-nccl-cu13==2.27.7; platform_system == 'Linux'",
            "triton==3.5.1; platform_system == 'Linux'",
        ],
    ),
    "torchaudio": ("2.9.1+cu130", ["torch==2.9.1+cu130"]),
    "triton": ("3.5.1", []),
    "filelock": ("3.20.0", []),
    "nvidia-nccl-cu13": ("2.27.7", []),
    "flashinfer-python": ("0.6.4", ["torch", "flashinfer-cubin"]),
    "flashinfer-cubin": ("0.6.4", []),
    "sgl-kernel": ("0.3.21+cu130", []),
    "sglang": (
        "0.5.9",
        [
            "torch==2.9.1",
            "torchaudio==2.9.1",
            "sgl-kernel==0.3.21",
            "flashinfer_python==0.6.3",
            "flashinfer_cubin==0.6.3",
        ],
    ),
}


def _lock(tmp_path: Path, server: IndexServer, **kwargs: object) -> Spec:
    """A test spec with its pylock beside it (made by `invoke lock`'s code; once per process)."""
    environ = isolated_environ(UV_CACHE_DIR=str(tmp_path / "uv-cache"))
    return load_spec(
        write_stack_lock(
            tmp_path / "lock.toml", server, tmp_path / "root", python="3.11", resolve_with=environ, **kwargs
        )
    )  # type: ignore[arg-type]


def _dists(**changes: str) -> ProbeFacts:
    found = {}
    for name, (version, requires) in LOCKED.items():
        version = changes.get(name, version)
        found[canonicalize_name(name)] = Distribution(name, version, tuple(requires), "/site-packages")
    return ProbeFacts("/root/current/bin/python", "3.11.7", MARKERS, found, None, 0.0)


def _facts(spec: Spec, *, dists: ProbeFacts | Missing | None = None, base: BasePython | Missing = BASE) -> Facts:
    facts = Facts(spec, environ={})
    facts.provide("dists", dists if dists is not None else _dists())
    facts.provide("base_python", base)
    facts.provide("toolkits", tuple(inspect_toolkit(t, spec.hardware.arch) for t in spec.toolkits))
    facts.provide("env", EnvFacts({}, {}, None, None, None, None, Path("/usr/local/cuda"), "test"))
    path = pylock.path_for(spec.path)
    facts.provide("pylock", pylock.load(path) if path.exists() else Missing(f"{path} does not exist"))
    return facts


def _provisioned(spec: Spec, environment: dict | None = None) -> generations.RootState:
    """A root whose current generation was built from ``spec`` (default: this lock's)."""
    root = spec.python.root
    assert root is not None
    home = generations.generations_dir(root) / "0001-built"
    generation = generations.mark(generations.create(home, {"spec": environment or environment_spec(spec)}), "ready")
    pyenv.write_environment(spec, home, root)
    generations.switch(root, generation)
    return generations.read(root)


def _actions(the_plan) -> list[str]:  # type: ignore[no-untyped-def]
    return [s.action for s in the_plan.steps]


def _why(the_plan) -> str:  # type: ignore[no-untyped-def]
    """Why a new generation is built: the creating step says."""
    return next(s.why for s in the_plan.steps if s.action == "python.venv")


@pytest.mark.parametrize(
    ("installer", "expected"),
    [
        (
            "uv",
            [
                "python.preflight",
                "python.fetch",
                "python.venv",
                "python.guard",
                "python.stack",
                "python.envfile",
                "python.check",
                "python.switch",
            ],
        ),
        (
            "pip",
            [
                "python.preflight",
                "python.fetch",
                "python.venv",
                "python.guard",
                "python.stack",
                "python.envfile",
                "python.check",
                "python.switch",
            ],
        ),
    ],
)
def test_an_empty_root_plans_a_whole_generation_in_order(
    tmp_path: Path, stack_index: IndexServer, installer: str, expected: list[str]
) -> None:
    spec = _lock(tmp_path, stack_index, installer=installer)
    the_plan = plan(
        spec, _facts(spec, dists=Missing("no stack environment")), generations.read(spec.python.root), uv=UV
    )
    assert _actions(the_plan) == expected
    assert the_plan.blockers == ()
    assert _why(the_plan) == f"no environment at {tmp_path / 'root' / 'current'} yet"
    assert not (tmp_path / "root").exists()  # planning touched nothing


def test_the_plan_reads_as_steps_with_why_and_exact_commands(
    tmp_path: Path, stack_index: IndexServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(time, "strftime", lambda fmt: "20250101T000000")
    spec = _lock(tmp_path, stack_index, installer="pip")
    the_plan = plan(
        spec, _facts(spec, dists=Missing("no stack environment")), generations.read(spec.python.root), uv=UV
    )
    text = "\n".join(the_plan.lines()).replace(str(tmp_path), "TMP").replace(stack_index.url, "http://INDEX")
    home = "TMP/root/generations/0001-20250101T000000"
    sha = spec.python.package("sgl-kernel").sha256
    pip = f"PIP_CONFIG_FILE=/dev/null {home}/bin/python -m pip install --disable-pip-version-check --no-input"
    assert text == "\n".join(
        [
            "plan for test-stack (root TMP/root): 8 steps",
            "  1. [python] check that http://INDEX/, http://INDEX/cu130/simple, http://INDEX/pypi/simple answer",
            "       why: nothing is created before the files' sources are known to answer",
            "  2. [python] download sgl-kernel from http://INDEX/files/sgl_kernel-0.3.21%2Bcu130-cp310-abi3-manylinux2014_x86_64.whl",
            f"       why: installed only after its sha256 matches the pylock ({sha})",
            "  3. [python] create generation 0001-20250101T000000 with Python 3.11.7 (found: test)",
            "       why: no environment at TMP/root/current yet",
            "       $ /usr/bin/uv venv --no-config --no-python-downloads --allow-existing --python "
            f"/opt/python3.11/bin/python3.11 {home}",
            f"       $ PIP_CONFIG_FILE=/dev/null {home}/bin/python -m ensurepip --default-pip",
            "  4. [python] write the guard and the pylock into 0001-20250101T000000: constraints "
            "torch==2.9.1+cu130, torchaudio==2.9.1+cu130, triton==3.5.1, nvidia-nccl-cu13==2.27.7",
            "       why: what people install later is held by these constraints; the installer reads the "
            "generation's copy of the pylock",
            "  5. [python] install the pylock's 9 distributions (9 files, each checked against its sha256) from "
            "http://INDEX/, http://INDEX/cu130/simple, http://INDEX/pypi/simple",
            "       why: exactly the pylock: nothing missing, nothing extra (resolved with override "
            "flashinfer-python==0.6.4: sglang 0.5.9 pins flashinfer_python==0.6.3; the stack runs 0.6.4; "
            "override flashinfer-cubin==0.6.4: sglang 0.5.9 pins flashinfer_cubin==0.6.3; it must equal "
            "flashinfer-python); then sgl_kernel/ holds exactly its owner's RECORD",
            f"       $ {pip} --no-deps --require-hashes --only-binary :all: --index-url http://INDEX/pypi/simple "
            f"--extra-index-url http://INDEX/cu130/simple --requirement {home}/requirements.txt",
            "  6. [python] write 0001-20250101T000000/stackgate.env, activate and pip.conf",
            "       why: stackgate.env exports CUDA_HOME, PATH, TRITON_PTXAS_PATH, PIP_CONSTRAINT, UV_CONSTRAINT, "
            "VIRTUAL_ENV and the lock's [env]; "
            "pip.conf holds its pip to the guard, activated or not",
            "  7. [python] check generation 0001-20250101T000000: exactly the pylock, pins, guard, consistency, "
            "torch build",
            "       why: a generation that fails its checks is never switched to",
            "  8. [python] switch TMP/root/current to 0001-20250101T000000; keep 3 generations",
            "       why: atomically (a new symlink renamed over the old one), only now that the generation passed",
            "already as locked:",
            "  CUDA 13.0 at /usr/local/cuda-13.0: kept, present (never written to)",
        ]
    )


def test_a_provisioned_root_plans_nothing(tmp_path: Path, stack_index: IndexServer) -> None:
    spec = _lock(tmp_path, stack_index)
    the_plan = plan(spec, _facts(spec), _provisioned(spec), uv=UV)
    assert the_plan.empty
    assert the_plan.in_place[1].startswith(
        f"Python stack: {tmp_path / 'root' / 'current'} -> 0001-built matches the lock (8 pins, guard: "
        "torch==2.9.1+cu130"
    )
    assert the_plan.in_place[2] == f"{tmp_path / 'root' / 'current' / 'stackgate.env'}: as the lock says"


def test_a_moved_torch_is_rebuilt_in_a_new_generation(tmp_path: Path, stack_index: IndexServer) -> None:
    spec = _lock(tmp_path, stack_index)
    the_plan = plan(spec, _facts(spec, dists=_dists(torch="2.10.0")), _provisioned(spec), uv=UV)
    assert _actions(the_plan)[:3] == ["python.preflight", "python.fetch", "python.venv"]
    assert _why(the_plan).startswith("torch is 2.10.0, locked ==2.9.1+cu130; ")
    assert "torchaudio 2.9.1+cu130 requires torch==2.9.1+cu130, but torch 2.10.0 is installed" in _why(the_plan)
    assert the_plan.generation is not None and the_plan.generation.name.startswith("0002-")


def test_a_changed_lock_is_rebuilt_and_says_what_changed(tmp_path: Path, stack_index: IndexServer) -> None:
    spec = _lock(tmp_path, stack_index)
    older = environment_spec(spec)
    older["packages"]["sglang"]["version"] = "==0.5.8"
    the_plan = plan(spec, _facts(spec), _provisioned(spec, older), uv=UV)
    assert _why(the_plan) == (
        "the lock's Python stack changed since generation 0001-built was built: packages.sglang.version: ==0.5.8 "
        "-> ==0.5.9"
    )


def test_a_declared_override_is_no_drift_but_another_conflict_is(tmp_path: Path, stack_index: IndexServer) -> None:
    spec = _lock(tmp_path, stack_index)
    state = _provisioned(spec)
    assert plan(spec, _facts(spec), state, uv=UV).empty  # sglang wants flashinfer 0.6.3: declared
    unmet = _dists()
    sglang = unmet.distributions["sglang"]
    unmet.distributions["sglang"] = Distribution("sglang", "0.5.9", (*sglang.requires, "orjson"), "/site-packages")  # type: ignore[index]
    the_plan = plan(spec, _facts(spec, dists=unmet), state, uv=UV)
    assert "sglang 0.5.9 requires orjson, but orjson is not installed" in _why(the_plan)


def test_a_changed_env_only_rewrites_the_environment_file(tmp_path: Path, stack_index: IndexServer) -> None:
    spec = _lock(tmp_path, stack_index)
    state = _provisioned(spec)
    changed = _lock(tmp_path, stack_index, env={"NCCL_P2P_LEVEL": "SYS"})
    the_plan = plan(changed, _facts(changed), state, uv=UV)
    assert _actions(the_plan) == ["python.envfile.current"]
    assert the_plan.steps[0].why == "the lock's [env] or default toolkit changed"


def test_a_generation_without_pip_conf_gets_one_in_place(tmp_path: Path, stack_index: IndexServer) -> None:
    spec = _lock(tmp_path, stack_index)
    state = _provisioned(spec)
    assert state.current is not None
    (state.current.path / "pip.conf").unlink()  # built before stackgate wrote one
    the_plan = plan(spec, _facts(spec), state, uv=UV)
    assert _actions(the_plan) == ["python.envfile.current"]
    assert the_plan.steps[0].what == "rewrite 0001-built/stackgate.env, activate and pip.conf"
    assert (
        the_plan.steps[0].why
        == "pip.conf is missing (built by an older stackgate): its pip is not guarded outside an activated shell"
    )


def test_without_a_pylock_the_plan_is_blocked_with_the_command_that_makes_it(
    tmp_path: Path, stack_index: IndexServer
) -> None:
    spec = load_spec(
        write_stack_lock(tmp_path / "lock.toml", stack_index, tmp_path / "root", python="3.11", sha256=None)
    )
    the_plan = plan(spec, _facts(spec, dists=Missing("none")), generations.read(spec.python.root), uv=UV)
    (blocker,) = the_plan.blockers
    assert blocker.usage and blocker.message == f"{tmp_path}/pylock.lock.toml does not exist"
    assert blocker.fix is not None and blocker.fix.commands == (f"stackgate lock --lock {tmp_path}/lock.toml",)
    assert "python.venv" in _actions(the_plan)  # --dry-run still shows what a build would do


def test_a_stale_pylock_blocks_naming_what_changed_in_the_spec(tmp_path: Path, stack_index: IndexServer) -> None:
    spec = _lock(tmp_path, stack_index)
    (tmp_path / "lock.toml").write_text(
        (tmp_path / "lock.toml").read_text().replace('sglang = "==0.5.9"', 'sglang = "==0.5.8"')
    )
    changed = load_spec(tmp_path / "lock.toml")
    (blocker,) = plan(
        changed, _facts(changed, dists=Missing("none")), generations.read(spec.python.root), uv=UV
    ).blockers
    assert blocker.usage
    assert blocker.message == (
        "pylock.lock.toml does not match the spec: python.packages.sglang: ==0.5.9 in the pylock, ==0.5.8 in the spec"
    )
    assert blocker.fix is not None and blocker.fix.commands == (f"stackgate lock --lock {tmp_path}/lock.toml",)


def test_no_interpreter_of_the_locked_version_blocks_with_why(tmp_path: Path, stack_index: IndexServer) -> None:
    spec = _lock(tmp_path, stack_index)
    missing = Missing("no Python 3.11 on this machine (...). uv cannot download Python here: install Python 3.11")
    the_plan = plan(
        spec, _facts(spec, dists=Missing("none"), base=missing), generations.read(spec.python.root), uv=None
    )
    messages = [b.message for b in the_plan.blockers]
    assert messages == ['uv is not installed (python.installer = "uv")', missing.reason]
    assert "$ " not in "".join(messages) and "python.venv" in _actions(the_plan)  # still shown by --dry-run


def test_a_kept_toolkit_that_is_missing_blocks_the_toolkit_area_only(tmp_path: Path, stack_index: IndexServer) -> None:
    kept = (
        '[[toolkit]]\nversion = "13.0"\nprefix = "/usr/local/cuda-13.0"\nkeep = true\ndefault = '
        'true\n\n[[toolkit]]\nversion = "12.8"\nprefix = "/nonexistent/cuda-12.8"\nkeep = true\n'
    )
    spec = _lock(tmp_path, stack_index, toolkits=kept)
    state = _provisioned(spec)
    (blocker,) = plan(spec, _facts(spec), state, uv=UV).blockers
    assert blocker.message == (
        "CUDA 12.8 at /nonexistent/cuda-12.8 is kept (keep = true) but missing: stackgate never installs a kept toolkit"
    )
    assert plan(spec, _facts(spec), state, only="python", uv=UV).empty


def test_a_toolkit_to_install_is_a_step_with_the_toolkit_modules_command(
    tmp_path: Path, stack_index: IndexServer
) -> None:
    installed = f'[[toolkit]]\nversion = "13.0.1"\nprefix = "{tmp_path}/cuda-13.0"\nsource = "pypi"\ndefault = true\n'
    spec = _lock(tmp_path, stack_index, toolkits=installed)
    the_plan = plan(spec, _facts(spec), _provisioned(spec), uv=UV)
    assert _actions(the_plan) == ["toolkit.install"]
    step = the_plan.steps[0]
    assert (step.what, step.why) == (f"install CUDA 13.0.1 at {tmp_path}/cuda-13.0 from pypi", "missing")
    (command,) = step.commands
    assert command == shlex.join(
        toolkit.install_command(spec.toolkits[0], cache=tmp_path / "root" / "cache" / "toolkits")
    )
    assert f"--cache-dir {tmp_path}/root/cache/toolkits " in command and command.endswith(
        " 'cuda-toolkit[nvcc,crt,nvvm,cudart,cccl]==13.0.1'"
    )


def test_a_toolkit_that_matches_the_lock_is_left_in_place(tmp_path: Path, stack_index: IndexServer) -> None:
    """This machine's /usr/local/cuda-13.0 answers as a locked, not kept, CUDA 13.0 (installed by
    hand, so stackgate has no record of it, and nothing to do)."""
    installed = '[[toolkit]]\nversion = "13.0"\nprefix = "/usr/local/cuda-13.0"\nsource = "pypi"\ndefault = true\n'
    spec = _lock(tmp_path, stack_index, toolkits=installed)
    the_plan = plan(spec, _facts(spec), _provisioned(spec), uv=UV)
    assert the_plan.empty and the_plan.in_place[0] == "CUDA 13.0 at /usr/local/cuda-13.0: installed as locked"


def test_cuda_link_policy_default_points_the_link_at_the_default_toolkit(
    tmp_path: Path, stack_index: IndexServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = write_stack_lock(tmp_path / "lock.toml", stack_index, tmp_path / "root", python="3.11").read_text()
    path = tmp_path / "lock.toml"
    path.write_text(text.replace('name = "test-stack"', 'name = "test-stack"\ncuda_link = "default"'))
    spec = load_spec(path)
    link = tmp_path / "cuda"
    link.symlink_to("/usr/local/cuda-12.8")  # the machine's /usr/local/cuda, as the plan sees it
    monkeypatch.setattr(planmodule, "cuda_link_state", functools.partial(toolkit.cuda_link_state, link=link))
    the_plan = plan(spec, _facts(spec), _provisioned(spec), uv=UV)
    assert _actions(the_plan) == ["toolkit.link"]
    assert the_plan.steps[0].why == (
        f'{link} points at /usr/local/cuda-12.8; the lock (cuda_link = "default") wants it to point at '
        "/usr/local/cuda-13.0"
    )
    assert the_plan.steps[0].commands == ("ln -sfn /usr/local/cuda-13.0 /usr/local/cuda",)


def test_a_generation_built_and_checked_but_never_switched_to_is_resumed(
    tmp_path: Path, stack_index: IndexServer
) -> None:
    spec = _lock(tmp_path, stack_index)
    older = environment_spec(spec)
    older["packages"]["sglang"]["version"] = "==0.5.8"
    state = _provisioned(spec, older)
    left = generations.mark(
        generations.create(
            generations.generations_dir(tmp_path / "root") / "0002-left", {"spec": environment_spec(spec)}
        ),
        "ready",
    )
    the_plan = plan(spec, _facts(spec), generations.read(tmp_path / "root"), uv=UV)
    assert the_plan.resume and the_plan.generation == left.path
    assert _actions(the_plan) == ["python.envfile", "python.check", "python.switch"]
    assert the_plan.steps[0].why.endswith(
        "generation 0002-left was built and checked from this lock by a run that stopped before switching"
    )
    assert state.current is not None and state.current.id == "0001-built"


DIFF = "--- a/sglang/m.py\n+++ b/sglang/m.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n"


def _patched_spec(tmp_path: Path, server: IndexServer, text: str, sha256: str, file: str = "fix.patch") -> Spec:
    """The test lock with one [[patch]] whose file holds ``text`` and whose lock entry says ``sha256``."""
    (tmp_path / "fix.patch").write_text(text)
    path = _lock(tmp_path, server).path
    path.write_text(
        path.read_text()
        + f'\n[[patch]]\npackage = "sglang"\nversion = "0.5.9"\nfile = "{file}"\nsha256 = "{sha256}"\nreason = "r"\n'
    )
    return load_spec(path)


@pytest.mark.parametrize(
    ("text", "sha256", "file", "expected"),
    [
        (DIFF, "0" * 64, "fix.patch", "patch[0].file: fix.patch: sha256 is {digest}, the lock says " + "0" * 64),
        ("not a diff\n", "", "fix.patch", "patch[0].file: fix.patch: no file in the patch"),
        (DIFF, "", "absent.patch", "patch[0].file: {tmp}/absent.patch: no such file"),
        (
            DIFF,
            "",
            "/nonexistent/x.patch",
            "patch[0].file: /nonexistent/x.patch resolves to /nonexistent/x.patch, outside the lockfile's checkout "
            "({tmp})",
        ),
    ],
)
def test_a_patch_file_that_cannot_apply_blocks_the_plan_as_a_lockfile_problem(
    tmp_path: Path, stack_index: IndexServer, text: str, sha256: str, file: str, expected: str
) -> None:
    digest = hashlib.sha256(text.encode()).hexdigest()
    spec = _patched_spec(tmp_path, stack_index, text, sha256 or digest, file)
    expected = expected.format(digest=digest, tmp=tmp_path)
    # a new generation (it would apply the patch) and the patches area of a live one
    for the_plan in (
        plan(spec, _facts(spec, dists=Missing("none")), generations.read(spec.python.root), uv=UV),
        plan(spec, _facts(spec), _provisioned(spec), only="patches", uv=UV),
    ):
        (blocker,) = the_plan.blockers
        assert blocker.usage and blocker.message.startswith(expected), blocker.message
        assert blocker.fix is not None and blocker.fix.commands == (f"sha256sum '{spec.patches[0].file}'",)
    assert "patches.apply" not in _actions(the_plan)


def test_a_good_patch_file_is_planned(tmp_path: Path, stack_index: IndexServer) -> None:
    spec = _patched_spec(tmp_path, stack_index, DIFF, hashlib.sha256(DIFF.encode()).hexdigest())
    the_plan = plan(spec, _facts(spec, dists=Missing("none")), generations.read(spec.python.root), uv=UV)
    assert the_plan.blockers == () and "patches.apply" in _actions(the_plan)


def test_the_lock_command_for_a_spec_keeps_its_path_one_quoted_word(tmp_path: Path, stack_index: IndexServer) -> None:
    folder = tmp_path / "x'$(touch p)' y"
    folder.mkdir()
    spec = load_spec(write_stack_lock(folder / "lock.toml", stack_index, tmp_path / "root", python="3.11"))
    (blocker,) = plan(spec, _facts(spec, dists=Missing("none")), generations.read(spec.python.root), uv=UV).blockers
    assert blocker.fix is not None and shlex.split(blocker.fix.commands[0]) == [
        "stackgate",
        "lock",
        "--lock",
        str(folder / "lock.toml"),
    ]


def test_a_distribution_the_pylock_does_not_hold_is_drift_too(tmp_path: Path, stack_index: IndexServer) -> None:
    """The environment must be exactly the pylock: an extra distribution (installed by hand, say)
    is rebuilt away, as provision's plan and the gate's environment stage both judge."""
    spec = _lock(tmp_path, stack_index)
    extra = _dists()
    extra.distributions["xgrammar"] = Distribution("xgrammar", "0.1.27", (), "/site-packages")  # type: ignore[index]
    extra.distributions["pip"] = Distribution("pip", "24.0", (), "/site-packages")  # type: ignore[index]  # seeded on purpose
    state = _provisioned(spec)
    assert plan(spec, _facts(spec), state, uv=UV).empty
    assert (
        _why(plan(spec, _facts(spec, dists=extra), state, uv=UV))
        == "xgrammar 0.1.27 is installed but not in the pylock"
    )
