"""An in-process transport: simulated nodes that answer the fleet controller's shell commands.

It stands in for SSH at the transport edge (stackgate.edges.ssh.Transport) and nothing else: the
controller's code above it (version check, shipping and hashing the spec, the remote run, reading
the report back, groups, outliers, batches, rollbacks) runs unchanged. Each node answers from a
:class:`SimNode`: its version, what its gate/provision/rollback exit with, its decode rate and its
stack's distributions (its fingerprint). Used by tests/test_fleet_logic.py and
benchmarks/fleet_scale.py (1,000 nodes in one process).
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import threading
from dataclasses import dataclass, field
from typing import Any

from stackgate import __version__
from stackgate.edges.ssh import Completed, TransportError
from stackgate.models.fleet import Node
from stackgate.runs import fingerprint


@dataclass
class SimNode:
    version: str = __version__
    gate_exit: int = 0
    provision_exit: int = 0
    rollback_exit: int = 0
    rate: float = 92.6
    distributions: dict[str, str] = field(default_factory=lambda: {"torch": "2.9.1+cu130", "sglang": "0.5.9", "flashinfer-python": "0.6.4"})
    reachable: bool = True
    corrupt: bool = False  #: the shipped files arrive damaged
    raw_report: str | None = None  #: what the node writes as its report instead of a real one
    calls: list[str] = field(default_factory=list)


def report(node: Node, sim: SimNode, command: str) -> dict[str, Any]:
    """A node's report as stackgate writes it (the parts the fleet reads)."""
    components = {"lock": {"name": "sim", "sha256": "0" * 64}, "gpu": {"driver": "580.82.07", "count": "8"}, "distributions": dict(sim.distributions)}
    passed = sim.gate_exit == 0
    stages = [{"name": s, "status": "passed" if passed or s != "verify" else "failed"} for s in ("lock", "environment", "verify", "fast_smoke", "benchmark")]
    return {
        "schema": "stackgate.report/1",
        "command": command,
        "run_id": f"20261130T000000Z-{command}-{hashlib.sha256(node.name.encode()).hexdigest()[:6]}",
        "host": {"hostname": node.name},
        "started": "2026-11-30T00:00:00+00:00",
        "results": [{"check": "deep.collective", "status": "PASS", "summary": "", "data": {"peak_busbw_gbs": 38.0}}],
        "counts": {"PASS": 10},
        "verdict": "passed" if passed else "failed",
        "reason": "passed" if passed else "1 check(s) failed",
        "exit_code": sim.gate_exit,
        "gate": {
            "stages": stages,
            "fingerprint": {"digest": fingerprint.digest(components), "short": fingerprint.digest(components)[:12], "components": components},
            "benchmark": {"decode_tok_s": {"mean": sim.rate}},
        },
    }


FOLDER = "/tmp/stackgate-fleet.Sim00000"


class SimSession:
    def __init__(self, node: Node, sim: SimNode) -> None:
        self.node, self.sim = node, sim
        self.files: dict[str, bytes] = {}

    def run(self, command: str, *, timeout_s: float, stdin: bytes | None = None, stop: threading.Event | None = None) -> Completed:
        self.sim.calls.append(command)
        if command.endswith(" --version"):
            return Completed(0, f"stackgate {self.sim.version}\n", "")
        if command.startswith("umask 077 && d=$(mktemp"):
            return self._ship(command, stdin or b"")
        if "setsid -w" in command:
            return self._stackgate(shlex.split(command.split(" pgid ", 1)[1].replace(" </dev/null", "")))
        if command.startswith("test -f "):
            found = next((data for path, data in self.files.items() if path.endswith("/report.json")), None)
            return Completed(3, "", "") if found is None else Completed(0, found.decode(), "")
        return Completed(0, "", "")  # rm -rf, the kill script

    def _ship(self, command: str, stdin: bytes) -> Completed:
        """The controller's one shipping command: each ``head -c N > "$d"/NAME`` takes N bytes of stdin."""
        lines = [FOLDER]
        for size, name in re.findall(r'head -c (\d+) > "\$d"/(\S+)', command):
            data, stdin = stdin[: int(size)], stdin[int(size) :]
            self.files[f"{FOLDER}/{shlex.split(name)[0]}"] = data + (b"x" if self.sim.corrupt else b"")
            lines.append(f"{hashlib.sha256(self.files[f'{FOLDER}/{shlex.split(name)[0]}']).hexdigest()}  {shlex.split(name)[0]}")
        return Completed(0, "\n".join(lines) + "\n", "")

    def _stackgate(self, argv: list[str]) -> Completed:
        what = argv[1]
        if what in ("gate", "verify"):
            written = self.sim.raw_report if self.sim.raw_report is not None else json.dumps(report(self.node, self.sim, what))
            self.files[argv[argv.index("--json") + 1]] = written.encode()
            return Completed(self.sim.gate_exit, "", "")
        code = self.sim.provision_exit if what == "provision" else self.sim.rollback_exit
        return Completed(code, "", "" if code == 0 else f"{what} failed on {self.node.name}\n")

    def close(self) -> None:
        pass


class SimTransport:
    """Sessions on simulated nodes, by node name (a node not named is a default SimNode)."""

    def __init__(self, sims: dict[str, SimNode] | None = None) -> None:
        self.sims = sims or {}

    def connect(self, node: Node) -> SimSession:
        sim = self.sims.setdefault(node.name, SimNode())
        if not sim.reachable:
            raise TransportError(f"{node.address}: cannot connect: Connection refused")
        return SimSession(node, sim)


def rollbacks(sim: SimNode) -> int:
    return len([c for c in sim.calls if re.search(r"\brollback\b", c)])
