"""An in-process transport: simulated nodes that answer the fleet controller's shell commands.

It stands in for SSH at the transport edge (stackgate.edges.ssh.Transport) and nothing else: the
controller's code above it (version check, shipping and hashing the spec, the remote run, reading
the report back, groups, outliers, batches, rollbacks) runs unchanged. Each node answers from a
:class:`SimNode`: its version, what its gate/provision/rollback exit with, its decode rate and its
stack's distributions (its fingerprint), and what its ``stackgate upgrade`` decides (switch, keep
or "already on it") with the decode rate of each side. Used by tests/test_fleet_logic.py,
tests/test_fleet_upgrade.py and benchmarks/fleet_scale.py (1,000 nodes in one process).
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
from stackgate.models.inventory import Node
from stackgate.runs import fingerprint


@dataclass
class SimNode:
    version: str = __version__
    gate_exit: int = 0
    provision_exit: int = 0
    rollback_exit: int = 0
    rate: float = 92.6
    distributions: dict[str, str] = field(
        default_factory=lambda: {"torch": "2.9.1+cu130", "sglang": "0.5.9", "flashinfer-python": "0.6.4"}
    )
    reachable: bool = True
    smoked: bool = True  #: its gate reached the smoke stage (read /server_info); else it failed before
    corrupt: bool = False  #: the shipped files arrive damaged
    raw_report: str | None = None  #: what the node writes as its report instead of a real one
    upgrade: str = "switch"  #: what its `stackgate upgrade` does: switch, keep, or current (already on the new stack)
    new_rate: float = 99.8  #: the new stack's decode tok/s in its A/B (``rate`` is the live one's)
    keep_reason: str = (
        "kept the live stack: slower beyond the measured noise: decode new - live: -7.20 tok/s "
        "(-7.8%; "
        "95% CI -8.10 to -6.30)"
    )
    calls: list[str] = field(default_factory=list)
    upgrades: list[list[str]] = field(
        default_factory=list
    )  #: each `stackgate upgrade` argv, and the shipped files it named were there


def report(node: Node, sim: SimNode, command: str) -> dict[str, Any]:
    """A node's report as stackgate writes it (the parts the fleet reads)."""
    components = {
        "lock": {"name": "sim", "sha256": "0" * 64},
        "gpu": {"driver": "580.82.07", "count": "8"},
        "distributions": dict(sim.distributions),
        "server": {f"arg{i:03d}": "flashinfer" for i in range(210)}
        if sim.smoked
        else {fingerprint.UNAVAILABLE: "no smoke stage read /server_info"},
    }
    passed = sim.gate_exit == 0
    stages = [
        {"name": s, "status": "passed" if passed or s != "verify" else "failed"}
        for s in ("lock", "environment", "verify", "fast_smoke", "benchmark")
    ]
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
            "fingerprint": {
                "digest": fingerprint.digest(components),
                "short": fingerprint.digest(components)[:12],
                "components": components,
            },
            "benchmark": {"decode_tok_s": {"mean": sim.rate}},
        },
    }


def upgrade_report(node: Node, sim: SimNode) -> dict[str, Any]:
    """A node's `stackgate upgrade --json` report (the parts the fleet reads: commands/upgrade.py)."""
    won, same = sim.upgrade == "switch", sim.upgrade == "current"
    decision = (
        None
        if same
        else {
            "mode": "if-better",
            "switch": won,
            "reason": "switched: it passes, gives the same greedy tokens and is faster" if won else sim.keep_reason,
        }
    )
    sides = {
        name: {"decode_tok_s": {"mean": rate, "ci_low": rate - 0.4, "ci_high": rate + 0.4, "n": 4}}
        for name, rate in (("live", sim.rate), ("new", sim.new_rate))
    }
    delta = sim.new_rate - sim.rate
    ab = {
        "sides": sides,
        "difference": {
            "delta": delta,
            "ci": [delta - 0.6, delta + 0.6],
            "relative": delta / sim.rate,
            "significant": True,
        },
        "difference_text": f"{delta:+.2f} tok/s",
    }
    part = {
        "schema": "stackgate.upgrade/1",
        "step": "done",
        "plan": {
            "changes": []
            if same
            else [{"kind": "distribution", "name": "flashinfer-python", "old": "0.6.3", "new": "0.6.4"}]
        },
        "ab": ab if not same else {"sides": {}, "difference": None, "difference_text": None},
        "decision": decision,
        "current": {"before": "g1", "after": "g2" if won else "g1", "switched": won},
    }
    code = 0 if won or same else 1
    reason = decision["reason"] if decision else "plan only (--dry-run)"
    return {
        "schema": "stackgate.report/1",
        "command": "upgrade",
        "run_id": "20261130T000000Z-upgrade-abc123",
        "host": {"hostname": node.name},
        "results": [],
        "counts": {},
        "verdict": "passed" if code == 0 else "failed",
        "reason": reason,
        "exit_code": code,
        "upgrade": part,
    }


FOLDER = "/tmp/stackgate-fleet.Sim00000"


class SimSession:
    def __init__(self, node: Node, sim: SimNode, begun: list[str] | None = None) -> None:
        self.node, self.sim = node, sim
        self.files: dict[str, bytes] = {}
        self.begun = (
            begun if begun is not None else []
        )  #: the transport's: node names, as each remote stackgate run began

    def run(
        self,
        command: str,
        *,
        timeout_s: float,
        stdin: bytes | None = None,
        stop: threading.Event | None = None,
        limit: int = 1 << 20,
    ) -> Completed:
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
            lines.append(
                f"{hashlib.sha256(self.files[f'{FOLDER}/{shlex.split(name)[0]}']).hexdigest()}  {shlex.split(name)[0]}"
            )
        return Completed(0, "\n".join(lines) + "\n", "")

    def _stackgate(self, argv: list[str]) -> Completed:
        what = argv[1]
        self.begun.append(self.node.name)
        if what in ("gate", "verify"):
            written = (
                self.sim.raw_report
                if self.sim.raw_report is not None
                else json.dumps(report(self.node, self.sim, what))
            )
            self.files[argv[argv.index("--json") + 1]] = written.encode()
            return Completed(self.sim.gate_exit, "", "")
        if what == "upgrade":
            named = [argv[argv.index(flag) + 1] for flag in ("--to", "--lock") if flag in argv]
            self.sim.upgrades.append([*argv[1:], *(f"shipped:{path in self.files}" for path in named)])
            doc = upgrade_report(self.node, self.sim)
            self.files[argv[argv.index("--json") + 1]] = json.dumps(doc).encode()
            return Completed(doc["exit_code"], "", "")
        code = self.sim.provision_exit if what == "provision" else self.sim.rollback_exit
        return Completed(code, "", "" if code == 0 else f"{what} failed on {self.node.name}\n")

    def close(self) -> None:
        pass


class SimTransport:
    """Sessions on simulated nodes, by node name (a node not named is a default SimNode)."""

    def __init__(self, sims: dict[str, SimNode] | None = None) -> None:
        self.sims = sims or {}
        self.begun: list[str] = []  #: every node's remote stackgate runs, in the order they began

    def connect(self, node: Node) -> SimSession:
        sim = self.sims.setdefault(node.name, SimNode())
        if not sim.reachable:
            raise TransportError(f"{node.address}: cannot connect: Connection refused")
        return SimSession(node, sim, self.begun)


def rollbacks(sim: SimNode) -> int:
    return len([c for c in sim.calls if re.search(r"\brollback\b", c)])
