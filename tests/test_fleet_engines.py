"""The fleet engines' registry (flows/fleetengines.py): the controller knows no engine by name.

A third engine, brought by this test through the registry (no line of the controller changed),
runs a real `fleet verify` end to end: its nodes are local folders, its transport runs each
command with ``sh -c`` through edges/runner (real processes), each node's stackgate is this
checkout's program with the node's fake NVML (tests/test_fleet.py's node wrapper, no sshd).
"""

from __future__ import annotations

import ast
import io
import json
import os
import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

import pytest
from fleet_support import fleet_spec, make_venv, node_wrapper
from smoke_support import ROOT, free_port
from test_fleet import fleet_env, stackgate

from stackgate.commands import fleet as command
from stackgate.edges import runner, ssh
from stackgate.flows import fleetengines
from stackgate.flows.fleetengine import Placement
from stackgate.flows.fleetnode import NodeRun, Shipment
from stackgate.flows.fleetrequest import FleetRequest
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.models.fleetoptions import EngineOption
from stackgate.models.inventory import Node
from stackgate.render.ui import UI


class LocalSession:
    """A node's session: each command a local ``sh -c`` through the runner, its TMPDIR the node's."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp

    def run(
        self,
        command: str,
        *,
        timeout_s: float,
        stdin: bytes | None = None,
        stop: threading.Event | None = None,
        limit: int = ssh.OUTPUT_CAP,
    ) -> ssh.Completed:
        done = runner.run(
            ["sh", "-c", command],
            timeout_s=timeout_s,
            stdin=stdin.decode() if stdin is not None else None,
            env={**os.environ, "TMPDIR": str(self.tmp)},
        )
        if done.timed_out:
            raise ssh.CommandTimeout(f"no end within {timeout_s:g} s")
        return ssh.Completed(done.returncode or 0, done.stdout, done.stderr)

    def close(self) -> None:
        pass


class LocalTransport:
    def connect(self, node: Node) -> LocalSession:
        return LocalSession(Path(node.stackgate).parent / "tmp")


class LocalEngine:
    """Nodes that are folders of this machine (``--engine-option folders=A,B``)."""

    name = "local"
    summary = "folders of this machine, each a node"
    options: Mapping[str, EngineOption] = {"folders": EngineOption("the nodes' folders, comma-separated")}

    def parse_options(self, given: Mapping[str, Sequence[str]]) -> tuple[Path, ...]:
        return tuple(Path(f) for f in given.get("folders", [""])[-1].split(",") if f)

    def check(self, request: FleetRequest) -> None:
        if not request.options:
            raise UsageError("fleet --engine local: name the nodes' folders (--engine-option folders=A,B)")

    def place(self, request: FleetRequest, ui: UI) -> Placement:
        nodes = [Node(name=f.name, host="localhost", port=0, stackgate=str(f / "stackgate")) for f in request.options]
        return Placement(nodes, part={"name": self.name, "folders": len(nodes)})

    def transport(self, placement: Placement, stop: threading.Event) -> ssh.Transport:
        return LocalTransport()

    def collect(
        self, request: FleetRequest, placement: Placement, shipment: Shipment, stop: threading.Event, ui: UI
    ) -> Sequence[NodeRun] | None:
        return None


@pytest.fixture
def local_engine() -> Any:
    fleetengines.register(LocalEngine())
    yield
    del fleetengines.ENGINES["local"]


def test_a_third_engine_from_the_registry_runs_a_fleet_verify_end_to_end(tmp_path: Path, local_engine: None) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    python = make_venv(tmp_path / "stack")
    spec = fleet_spec(tmp_path / "fleet.toml", model, python)
    folders = []
    for name in ("a", "b"):
        home = tmp_path / name
        home.mkdir()
        node_wrapper(home / "stackgate", fleet_env(home, python, free_port(), home / "events.jsonl", home / "runs"))
        (home / "tmp").mkdir()
        folders.append(str(home))
    options = fleetengines.engine_options("local", {}, [f"folders={','.join(folders)}"])
    request = FleetRequest(
        action="verify",
        engine="local",
        options=options,
        checks=("gpu.*",),
        spec_path=spec,
        json_path=tmp_path / "v.json",
    )
    console = io.StringIO()
    assert command.run(request, UI(stream=console, force_plain=True)) == ExitCode.PASSED, console.getvalue()
    doc = json.loads((tmp_path / "v.json").read_text())
    assert doc["command"] == "fleet verify" and doc["reason"] == "2 node(s) passed"
    assert [(n["name"], n["status"]) for n in doc["nodes"]] == [("a", "passed"), ("b", "passed")]
    assert all(n["counts"]["PASS"] >= 1 and n["counts"].get("FAIL", 0) == 0 for n in doc["nodes"])
    assert doc["engine"] == {"name": "local", "folders": 2}
    for name in ("a", "b"):  # the spec was shipped into a fresh folder there, removed at the end
        assert (tmp_path / name / "tmp").is_dir() and not list((tmp_path / name / "tmp").iterdir())


def _engine_names_compared(path: Path, names: Sequence[str]) -> list[str]:
    """Where ``path`` compares a value with an engine's name (``engine == "slurm"``, ``in ("ssh", ...)``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                for const in ast.walk(side):
                    if isinstance(const, ast.Constant) and const.value in names:
                        found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_controller_never_branches_on_an_engine_name() -> None:
    """Only an engine's own module (and its edge) knows its name: the flows and the command that
    choose and run an engine compare no value with one."""
    package = ROOT / "stackgate"
    engines = {f"fleet_{name}.py" for name in fleetengines.ENGINES}
    controller = [p for p in sorted((package / "flows").glob("fleet*.py")) if p.name not in engines]
    assert {p.name for p in controller} >= {"fleet.py", "fleetengine.py", "fleetengines.py"}
    found = [
        hit
        for path in [*controller, package / "commands" / "fleet.py"]
        for hit in _engine_names_compared(path, tuple(fleetengines.ENGINES))
    ]
    assert found == []


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--engine", "slrum"], "fleet: --engine 'slrum': did you mean slurm? (one of: ssh, slurm)"),
        (
            ["--hosts", "a", "--partition", "gpu"],
            "fleet: --partition is an option of --engine slurm, not of --engine ssh",
        ),
        (
            ["--engine", "slurm", "--engine-option", "partiton=gpu"],
            "fleet --engine slurm: no option 'partiton': did you mean partition?",
        ),
        (
            ["--engine", "slurm", "--nodes", "2", "--engine-option", "nodes=3"],
            "fleet --engine slurm: nodes given 2 times",
        ),
        (["--engine", "slurm", "--engine-option", "nodes=two"], "--nodes 'two': not a whole number"),
    ],
)
def test_an_option_of_another_engine_or_of_none_is_refused_before_anything_runs(
    tmp_path: Path, args: list[str], said: str
) -> None:
    done = stackgate("fleet", "gate", *args, history=tmp_path / "runs", timeout=60)
    assert done.returncode == ExitCode.USAGE, done.stdout + done.stderr
    assert said in done.stderr
    assert not (tmp_path / "runs").exists()
