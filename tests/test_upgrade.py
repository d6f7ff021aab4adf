"""`stackgate upgrade` end to end: real provisioning with uv against the local index (spec A:
sglang's own flashinfer 0.6.3 pin; spec B: the 0.6.4 override), each generation served by the
SGLang stand-in at the rate and token stream its backend is given, real processes killed with
SIGKILL at each step. Only NVML (no GPU here) and SGLang are stood in for."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterator

import pytest
from fakes import fake_nvml
from fakes.fake_nvml import gpu, machine
from pkgindex import IndexServer, install_environ, lock_stack, stack_index, write_stack_lock  # noqa: F401 (fixtures)
from smoke_support import FAKES, Rig, assert_nothing_left, free_port, kill_leftovers

from stackgate.commands import provision, upgrade
from stackgate.models.exitcodes import ExitCode
from stackgate.render.ui import UI
from stackgate.stack import generations

ROOT = Path(__file__).resolve().parents[1]
#: The verify checks a machine without GPUs can pass (the fake NVML describes one RTX PRO 6000).
VERIFY = ("gpu.*", "python.interpreter", "python.pins", "python.frozen", "python.consistency")
BENCH = {"output_tokens": 120, "runs": 2, "warmup": 1}
#: The stand-in decodes 200 tok/s with flashinfer and 150 with triton (the reference deployment's
#: story: the default backend silently changed and cost tokens).
TRITON_SLOW = [{"when": {"attention_backend": "triton"}, "set": {"rate": 150.0}}]


def _spec(path: Path, server: IndexServer, root: Path, environ: dict[str, str], rig: Rig, *, flashinfer: str, backend: str, hardware: dict[str, str] | None = None) -> Path:
    """A spec of the test stack with its pylock: flashinfer 0.6.3 as sglang pins it, or 0.6.4 by
    the declared override; smoke launches the stand-in with ``backend``."""
    write_stack_lock(path, server, root)
    text = path.read_text()
    if flashinfer == "0.6.3":
        text = text.replace('flashinfer-python = "==0.6.4"', 'flashinfer-python = "==0.6.3"').replace('flashinfer-cubin = "==0.6.4"', 'flashinfer-cubin = "==0.6.3"')
        text = text.split("[[python.override]]")[0] + "[env]" + text.split("[env]", 1)[1]
    for key, value in (hardware or {}).items():
        text = text.replace(f"{key} = ", f"{key} = {value}\n# was: {key} = ", 1)
    bench = "\n".join(f"{k} = {v}" for k, v in BENCH.items())
    text += textwrap.dedent(f"""
        [smoke]
        model = "{rig.model}"
        tp = 1
        port = {rig.port}
        attention_backend = "{backend}"
        ready_timeout_s = 60
        stop_grace_s = 3

        [smoke.env]
        PYTHONPATH = "{FAKES}"
        STACKGATE_FAKE_SGLANG = "{rig.behaviour_path}"

        [benchmark]
        {bench}
        """)
    path.write_text(text)
    lock_stack(path, environ)
    return path


@pytest.fixture(scope="module")
def live_root(tmp_path_factory: pytest.TempPathFactory, stack_index: IndexServer, install_environ: dict[str, str]) -> Iterator[Path]:
    """A root with spec A provisioned once; each test upgrades a copy of it."""
    base = tmp_path_factory.mktemp("live")
    rig = Rig(base, free_port())
    lock = _spec(base / "a.toml", stack_index, base / "root", install_environ, rig, flashinfer="0.6.3", backend="triton")
    assert provision.run(provision.ProvisionRequest(lock_path=lock, yes=True, environ=install_environ), UI(stream=io.StringIO(), force_plain=True)) == ExitCode.PASSED
    yield base / "root"


class Node:
    """A copy of the live root, the stand-in's rig, spec A (live) and spec B (new) for it."""

    def __init__(self, live_root: Path, tmp: Path, server: IndexServer, environ: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = tmp / "root"
        shutil.copytree(live_root, self.root, symlinks=True)
        self.tmp, self.server = tmp, server
        self.rig = Rig(tmp, free_port())
        spec = machine([gpu(uuid="GPU-0000", memory=[96 * 2**30, 2**20])])
        self.rig.nvml_path.write_text(json.dumps({**spec, "holders": str(self.rig.holders_path)}))
        self.rig.behave(profiles=TRITON_SLOW)
        self.environ = {**environ, "STACKGATE_NVML_MODULE": "fakes.fake_nvml", "STACKGATE_FAKE_NVML": str(self.rig.nvml_path), "STACKGATE_LOG_DIR": str(tmp / "logs")}
        for key in ("STACKGATE_NVML_MODULE", "STACKGATE_FAKE_NVML", "STACKGATE_LOG_DIR"):
            monkeypatch.setenv(key, self.environ[key])
        self.a = _spec(tmp / "a.toml", server, self.root, environ, self.rig, flashinfer="0.6.3", backend="triton")
        self.live = os.readlink(self.root / "current")

    def spec_b(self, *, backend: str = "flashinfer", hardware: dict[str, str] | None = None) -> Path:
        return _spec(self.tmp / "b.toml", self.server, self.root, self.environ, self.rig, flashinfer="0.6.4", backend=backend, hardware=hardware)

    def upgrade(self, to: Path, **request: Any) -> tuple[upgrade.UpgradeRun, dict[str, Any], str]:
        out = io.StringIO()
        chosen = upgrade.UpgradeRequest(to=to, lock_path=self.a, verify_checks=VERIFY, environ=self.environ, run_dir=self.tmp / "servers", json_path=self.tmp / "up.json", **request)
        done = upgrade.upgrade_node(chosen, UI(stream=out, force_plain=True), nvml_lib=fake_nvml)
        doc = done.document()
        upgrade.write_reports(doc, chosen)
        upgrade_console(doc, out)
        return done, json.loads((self.tmp / "up.json").read_text()), out.getvalue()

    def current(self) -> str:
        return os.readlink(self.root / "current")

    def serves(self) -> str:
        """What `current`'s interpreter imports (it still works)."""
        script = "import flashinfer, sglang, torch; print(flashinfer.__version__, torch.__version__)"
        done = subprocess.run([str(self.root / "current" / "bin" / "python"), "-c", script], capture_output=True, text=True, env=self.environ)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()


def upgrade_console(doc: dict[str, Any], out: io.StringIO) -> None:
    from stackgate.render import upgrade as render

    render.console(doc, UI(stream=out, force_plain=True))


@pytest.fixture
def node(live_root: Path, tmp_path: Path, stack_index: IndexServer, install_environ: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    made = Node(live_root, tmp_path, stack_index, install_environ, monkeypatch)
    yield made
    kill_leftovers(made.rig)


def test_a_faster_new_stack_with_the_same_tokens_is_switched_to(node: Node) -> None:
    done, doc, out = node.upgrade(node.spec_b())
    assert done.exit_code == ExitCode.PASSED and done.won, out
    part = doc["upgrade"]
    assert part["ab"]["order"] == ["live", "new", "new", "live"]
    assert [leg["side"] for leg in part["ab"]["legs"]] == ["live", "new", "new", "live"]
    assert {leg["attention_backend"] for leg in part["ab"]["legs"] if leg["side"] == "live"} == {"triton"}
    assert {leg["attention_backend"] for leg in part["ab"]["legs"] if leg["side"] == "new"} == {"flashinfer"}
    assert part["decision"]["switch"] is True and part["decision"]["reason"].startswith("switched: it passes, gives the same greedy tokens and is faster")
    changes = {c["name"]: (c["old"], c["new"]) for c in part["plan"]["changes"]}
    assert changes["flashinfer-python"] == ("0.6.3", "0.6.4") and changes["attention_backend"] == ("triton", "flashinfer")
    assert part["current"]["switched"] and node.current() == f"generations/{part['new']['generation']}"
    assert node.serves().startswith("0.6.4 ")
    assert "flashinfer-python: 0.6.3 -> 0.6.4" in out and "SWITCHED: switched" in out
    assert_nothing_left(node.rig)
