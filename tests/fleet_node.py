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

The lock's file and its sha256 are untouched: the fingerprint is the shipped spec's.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's stackgate, not on PYTHONPATH (test_fleet.fleet_env)

from stackgate.commands import gate
from stackgate.models import spec as lockmodel

_load = lockmodel.load
_gate = gate.run


def load(path=None):
    lock = _load(path)
    port, python = os.environ.get("FLEET_NODE_PORT"), os.environ.get("FLEET_NODE_INTERPRETER")
    if port:
        lock = dataclasses.replace(lock, smoke=dataclasses.replace(lock.smoke, port=int(port)))
    if python:
        lock = dataclasses.replace(lock, python=dataclasses.replace(lock.python, interpreter=Path(python)))
    return lock


def run_gate(request, ui):
    checks = tuple(c for c in os.environ.get("FLEET_NODE_CHECKS", "").split(",") if c)
    return _gate(dataclasses.replace(request, verify_checks=checks) if checks else request, ui)


lockmodel.load = load
gate.run = run_gate

if __name__ == "__main__":
    from stackgate.main import run

    run()
