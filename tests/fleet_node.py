"""The `stackgate` installed on a loopback test node: this checkout's program, with what one
machine cannot give each of several "nodes" taken from the node's environment instead.

A real node has its own filesystem, its own GPUs and its own ports; the loopback nodes of
tests/test_fleet.py share one machine, so three things the same spec names would collide or
cannot pass here. Each node's wrapper (tests/fleet_support.py) sets, and this module applies:

- ``FLEET_NODE_INTERPRETER``: the node's stack interpreter (the path the spec names is, on a real
  fleet, each node's own; here each node has its own venv, the drifted one another);
- ``FLEET_NODE_PORT``: the port the node's stand-in server listens on (one machine, one port each);
- ``FLEET_NODE_CHECKS``: the verify checks this machine can pass with the fake NVML and no CUDA
  torch (tests/test_gate.py's VERIFIABLE, handed to the gate as its library option ``verify_checks``).
- ``FLEET_NODE_UPGRADE="LIVE_RATE,NEW_RATE"``: ``stackgate upgrade`` with what needs a GPU and a
  built stack (build beside, verify, the smoke legs, the switch of ``current``) replaced by an A/B
  that measured those decode rates (ABBA, same greedy tokens). The command line, the shipped specs
  loaded, the plan's changes (runs/stackdiff), the decision (runs/abtest), the report and its JSON
  are upgrade's own. Each call is logged to ``FLEET_NODE_HOME/upgrades.jsonl`` with the sha256 of
  the specs it was given.

The lock's file and its sha256 are untouched: the fingerprint is the shipped spec's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # the checkout's stackgate, not on PYTHONPATH (test_fleet.fleet_env)

from stackgate.models import spec  # noqa: E402
from stackgate.models.spec import locate  # noqa: E402

_load = locate.load_spec


def load(path=None):
    spec = _load(path)
    port, python = os.environ.get("FLEET_NODE_PORT"), os.environ.get("FLEET_NODE_INTERPRETER")
    if port:
        spec = dataclasses.replace(spec, smoke=dataclasses.replace(spec.smoke, port=int(port)))
    if python:
        spec = dataclasses.replace(spec, python=dataclasses.replace(spec.python, interpreter=Path(python)))
    return spec


# The spec's loader is wrapped before any other stackgate module is imported: each binds
# `load_spec` by name when it is imported, so each then holds the wrapper.
locate.load_spec = spec.load_spec = load

from stackgate.commands import gate  # noqa: E402
from stackgate.facts.compare import environment_spec  # noqa: E402
from stackgate.flows import upgrade  # noqa: E402
from stackgate.runs import abtest, history, stackdiff  # noqa: E402
from stackgate.stack.generations import Generation  # noqa: E402

_gate = gate.run


def run_gate(request, ui):
    checks = tuple(c for c in os.environ.get("FLEET_NODE_CHECKS", "").split(",") if c)
    return _gate(dataclasses.replace(request, verify_checks=checks) if checks else request, ui)


def upgrade_node(request, ui, *, nvml_lib=None):
    live_rate, new_rate = (float(v) for v in os.environ["FLEET_NODE_UPGRADE"].split(","))
    new, live = load(request.to), load(request.spec_path)
    given = {str(p): hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in (request.to, request.spec_path)}
    with open(Path(os.environ["FLEET_NODE_HOME"]) / "upgrades.jsonl", "a") as log:
        log.write(
            json.dumps(
                {"to": str(request.to), "lock": str(request.spec_path), "sha256": given, "switch": request.switch}
            )
            + "\n"
        )
    root = new.python.root
    live_generation = Generation(root / "g0001", {"state": "ready"})
    changes = stackdiff.changes(live, None, None, new, environment_spec(new), None)
    done = upgrade.UpgradeRun(
        request, history.new_id("upgrade", time.time()), time.time(), root, live, new, live_generation, changes, []
    )
    done.new_generation = Generation(root / "g0002", {"state": "ready"})
    done.build = {
        "status": "built",
        "reason": "generation g0002 built beside g0001",
        "verify": "passed: the node's stand-in",
    }
    for position, side in enumerate(abtest.order(request.rounds), 1):
        rate = live_rate if side == abtest.LIVE else new_rate
        done.measured.append(abtest.Leg(side, position, True, (rate * 0.995, rate, rate * 1.005), (11, 12, 13)))
    sides = abtest.side(abtest.LIVE, done.measured), abtest.side(abtest.NEW, done.measured)
    done.decision = abtest.decide(request.switch, *sides, accept_output_change=request.accept_output_change)
    done.current_after = done.new_generation.id if done.decision.switch else None
    done.step = "done"
    return done


gate.run = run_gate
if os.environ.get("FLEET_NODE_UPGRADE"):
    upgrade.upgrade_node = upgrade_node

if __name__ == "__main__":
    from stackgate.main import run

    run()
