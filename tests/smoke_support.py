"""What smoke's tests share: a rig around the stand-in SGLang server and the fake NVML.

The stand-in is a real process started with the real command line from a fake `sglang` package
(tests/fakes, put on its PYTHONPATH through the lock's [smoke].env); the fake NVML
(tests/fakes/fake_nvml.py, shared with verify's tests) is handed to smoke as a module, or named
by $STACKGATE_NVML_MODULE in subprocess tests.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fakes import fake_nvml
from fakes.fake_nvml import gpu, machine
from specs import THIS_PYTHON, minimal_spec

from stackgate.flows import smoke
from stackgate.models.result import Result
from stackgate.models.spec import load_spec
from stackgate.render.ui import UI
from stackgate.serve.procs import read_stat

ROOT = Path(__file__).resolve().parents[1]
FAKES = ROOT / "tests" / "fakes"
#: Drain polls this short keep the tests quick; one test keeps SGLang's real 5 s.
FAST_DRAIN = {"drain_poll_s": 0.2}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def toml_value(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, bool) else ("true" if value else "false")


@dataclass
class Rig:
    """A directory with a model, a behaviour file, a fake GPU machine and a lock that ties them."""

    tmp: Path
    port: int

    def __post_init__(self) -> None:
        self.model = self.tmp / "model"
        self.model.mkdir(exist_ok=True)
        self.write_model(num_hidden_layers=32)
        self.behaviour_path = self.tmp / "behaviour.json"
        self.events_path = self.tmp / "events.jsonl"
        self.holders_path = self.tmp / "holders.jsonl"
        self.nvml_path = self.tmp / "nvml.json"
        self.runs = self.tmp / "runs"
        self.gpus(1)
        self.behave()

    def write_model(self, **config: Any) -> None:
        body = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **config}
        (self.model / "config.json").write_text(json.dumps(body))

    def gpus(self, count: int) -> None:
        """The fake NVML's machine: ``count`` H200s, plus the file where stand-ins record GPU memory."""
        spec = machine(
            [gpu("NVIDIA H200", (9, 0), uuid=f"GPU-{i:04d}", memory=[141 * 2**30, 2**20]) for i in range(count)]
        )
        self.nvml_path.write_text(json.dumps({**spec, "holders": str(self.holders_path)}))

    def behave(self, **behaviour: Any) -> None:
        chosen = {
            **FAST_DRAIN,
            "events": str(self.events_path),
            "gpu_state": str(self.holders_path),
            "gpu_bytes": 2 * 2**30,
            **behaviour,
        }
        self.behaviour_path.write_text(json.dumps(chosen))

    def spec(
        self,
        *,
        tp: int = 1,
        flags: tuple[str, ...] = (),
        evidence: dict[str, str] | None = None,
        smoke_extra: str = "",
        benchmark: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        tables: str = "",
        engine: str = "sglang",
    ) -> Path:
        bench = {"output_tokens": 200, "runs": 2, "warmup": 1, **(benchmark or {})}
        fake = {"sglang": "STACKGATE_FAKE_SGLANG"}.get(engine, f"STACKGATE_FAKE_{engine.upper()}")
        env_lines = {"PYTHONPATH": str(FAKES), fake: str(self.behaviour_path), **(env or {})}
        engine_line = f'engine = "{engine}"' if engine != "sglang" else ""
        evidence_line = (
            f"evidence = {{ {', '.join(f'{json.dumps(k)} = {json.dumps(v)}' for k, v in (evidence or {}).items())} }}"
            if evidence
            else ""
        )
        head = minimal_spec(
            name="standin",
            gpu_count=tp,
            compute_capability="9.0",
            gpu_name="H200",
            version=THIS_PYTHON,
            interpreter=sys.executable,
        )
        text = (
            head
            + f"""
[smoke]
{engine_line}
model = "{self.model}"
tp = {tp}
port = {self.port}
attention_backend = "flashinfer"
flags = {json.dumps(list(flags))}
{evidence_line}
ready_timeout_s = 60
stop_grace_s = 3
{smoke_extra}

[smoke.env]
{chr(10).join(f"{k} = {json.dumps(v)}" for k, v in env_lines.items())}

{tables}

[benchmark]
{chr(10).join(f"{k} = {toml_value(v)}" for k, v in bench.items())}
"""
        )
        path = self.tmp / "lock.toml"
        path.write_text(text)
        return path

    def run(self, spec_path: Path, **request: Any) -> smoke.SmokeRun:
        spec = load_spec(spec_path)
        chosen = smoke.SmokeRequest(spec_path=spec_path, run_dir=self.runs, **request)
        ui = UI(stream=io.StringIO(), force_plain=True)
        return smoke.run_smoke(spec, chosen, ui, nvml_lib=fake_nvml)

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        if not self.events_path.exists():
            return []
        rows = [json.loads(line) for line in self.events_path.read_text().splitlines() if line.strip()]
        return [r for r in rows if name is None or r["event"] == name]

    def processes(self) -> list[int]:
        """Every stand-in process ever started (leaders and workers)."""
        pids = [e["pid"] for e in self.events("started")]
        pids += [p for e in self.events("workers") for p in e["pids"]]
        pids += [e["pid"] for e in self.events("leaked")]
        return pids

    def environ(self) -> dict[str, str]:
        """For `python -m invoke smoke` in a subprocess: the fake NVML and the checkout on the path."""
        env = dict(os.environ)
        env.update(
            STACKGATE_NVML_MODULE="fakes.fake_nvml",
            STACKGATE_FAKE_NVML=str(self.nvml_path),
            PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}",
            NO_COLOR="1",
        )
        return env


def kill_leftovers(rig: Rig) -> None:
    """Whatever a failed test left running in this rig, killed."""
    for pid in living(rig.processes()):
        os.kill(pid, signal.SIGKILL)


def living(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        stat = read_stat(pid)
        if stat is not None and stat.alive:
            alive.append(pid)
    return alive


def group_members(pgid: int) -> list[int]:
    """Living processes of a process group or session (zombies hold nothing and are left out)."""
    members = []
    for entry in Path("/proc").iterdir():
        stat = read_stat(int(entry.name)) if entry.name.isdigit() else None
        if stat is not None and stat.alive and (stat.pgrp == pgid or stat.session == pgid):
            members.append(stat.pid)
    return members


def assert_nothing_left(rig: Rig) -> None:
    """No process of any stand-in launched in this rig is alive, and their groups are empty."""
    started = rig.events("started")
    assert started or not rig.events(), "events without a start"
    deadline = time.monotonic() + 3  # init may take a moment to reap orphans it inherited
    while time.monotonic() < deadline and (living(rig.processes()) or any(group_members(e["pgid"]) for e in started)):
        time.sleep(0.05)
    assert living(rig.processes()) == []
    for e in started:
        assert group_members(e["pgid"]) == []


_ORPHANS = """
import subprocess, sys, time
workers = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]
print(" ".join(str(w.pid) for w in workers), flush=True)
time.sleep(600)
"""


def dead_runs_server(recorded: int = 2) -> tuple[list[int], Path]:
    """A server as a run killed with SIGKILL leaves it: a process group (a leader and two workers
    that set no parent-death signal) started as a launch starts one (its own session, the launch
    marker in its environment), whose record under the state folder names a launcher that is gone,
    and only the first ``recorded`` of its processes (the last look missed the others).
    Returns the group's pids (leader first) and the record."""
    import subprocess

    from stackgate.serve import launched

    argv = [sys.executable, "-c", _ORPHANS]
    token = launched.new_token()
    env = {**os.environ, launched.MARKER: token}
    leader = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True, env=env)
    pids = [leader.pid, *(int(p) for p in leader.stdout.readline().split())]  # type: ignore[union-attr]
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid names no running process: the launcher killed outright
    body = {
        "schema": launched.SCHEMA,
        "launcher": {"pid": gone.pid, "starttime": 1, "command": "python -m stackgate smoke --benchmark"},
        "launched_at": time.time(),
        **launched.this_machine(),
        "pgid": leader.pid,
        "argv": argv,
        "command_sha256": launched.command_sha256(argv),
        "token": token,
        "processes": {str(pid): read_stat(pid).starttime for pid in pids[:recorded]},  # type: ignore[union-attr]
    }
    record = launched.folder() / f"{leader.pid}-{gone.pid}.json"
    record.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    record.write_text(json.dumps(body))
    return pids, record


def by_name(results: list[Result]) -> dict[str, Result]:
    return {r.check: r for r in results}


def wait_for(predicate: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {predicate}")
