"""`stackgate slurm-health` as slurmd runs it: the session's cluster (tests/slurm_cluster.py) has

    HealthCheckProgram=<cluster>/healthcheck
    HealthCheckInterval=2
    HealthCheckNodeState=ANY

and its healthcheck runs, on each node, the node's own ``health`` script where a test wrote one:
that script exports the node's environment (fake NVML, its stack interpreter) and runs
``stackgate slurm-health --config <node>/health.toml``, with slurmd's bare environment otherwise
(no PATH, no SLURM_CONF: the config names them). The GPUs are the fake NVML's: a node whose
machine file says no GPU fails ``gpu.*``; writing the one-GPU file back is the fix.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Iterator

import pytest
from fakes.fake_nvml import machine
from fleet_support import TESTS, VERIFIABLE, nvml_file
from slurm_cluster import Cluster
from smoke_support import living, wait_for
from test_fleet_slurm import HOSTILE, SlurmFleet, slurm_fleet

from stackgate.models.exitcodes import ExitCode


@pytest.fixture
def fleet(slurm: Cluster, tmp_path: Path) -> Iterator[SlurmFleet]:
    """The Slurm fleet of test_fleet_slurm, for one test."""
    yield from slurm_fleet(slurm, tmp_path)


def health(fleet: SlurmFleet, name: str, *, forked: bool = False) -> Path:
    """The node's health script and config (see the module's docstring); its runs counted in
    ``runs``. ``forked``: verify runs in a forked child of slurm-health (the default of an
    installed stackgate), else through the node's stackgate program (the config's ``stackgate``)."""
    env = fleet.node(name)
    home = fleet.home / name
    config = home / "health.toml"
    config.write_text(
        "[slurm-health]\n"
        f'lock = "{fleet.spec}"\nprom = "{home / "stackgate_verify.prom"}"\ntimeout_s = 60\n'
        f"checks = {json.dumps(list(VERIFIABLE))}\n"
        + ("" if forked else f'stackgate = "{fleet.program}"\n')
        + f'slurm_bin = "/usr/bin"\nslurm_conf = "{fleet.cluster.conf}"\n'
    )
    exports = "".join(f"export {k}='{v}'\n" for k, v in env.items())
    script = fleet.cluster.node_dir(name) / "health"
    script.write_text(
        f"#!/bin/sh\n{exports}{sys.executable} {TESTS / 'fleet_node.py'} slurm-health --config {config}"
        f" >> {home / 'health.log'} 2>&1\n"
        f"echo $? >> {home / 'runs'}\n"
    )
    script.chmod(0o755)
    return home


def runs(home: Path) -> list[int]:
    path = home / "runs"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def break_gpus(home: Path) -> None:
    (home / "nvml.json").write_text(json.dumps(machine([])))


def test_a_failing_node_is_drained_with_its_reason_and_resumed_after_the_fix(fleet: SlurmFleet) -> None:
    cluster: Cluster = fleet.cluster
    home = health(fleet, "n3", forked=True)
    break_gpus(home)
    cluster.wait_states({"n3": "drain"}, 60)
    reason = cluster.reason("n3")
    assert reason.startswith("stackgate: gpu.") and len(reason) <= 120 and "\n" not in reason, reason
    wait_for(lambda: ExitCode.FAILED in runs(home), 30)  # the run that drained it has ended
    assert "stackgate_verify_passed" in (home / "stackgate_verify.prom").read_text()
    nvml_file(home / "nvml.json")  # the fix
    cluster.wait_states({"n3": "idle"}, 60)
    wait_for(lambda: "resumed (this check had drained it" in (home / "health.log").read_text(), 30)
    log = (home / "health.log").read_text()
    assert (
        "n3: FAIL gpu." in log
        and "; drained: stackgate: gpu." in log
        and "n3: healthy" in log
        and "resumed (this check had drained it" in log
    )


def test_an_admin_drain_stays_drained_with_its_reason_whatever_the_check_finds(fleet: SlurmFleet) -> None:
    cluster: Cluster = fleet.cluster
    cluster.run("scontrol", "update", "nodename=n2", "state=drain", f"reason={HOSTILE}")
    home = health(fleet, "n2")
    wait_for(lambda: len(runs(home)) >= 1, 60)  # healthy: not resumed
    assert runs(home)[0] == ExitCode.PASSED
    assert cluster.states()["n2"] == "drain" and cluster.reason("n2") == HOSTILE
    break_gpus(home)
    seen = len(runs(home))
    wait_for(lambda: len(runs(home)) >= seen + 2, 60)  # failing: the admin's reason is not overwritten
    assert runs(home)[-1] == ExitCode.FAILED
    assert cluster.states()["n2"] == "drain" and cluster.reason("n2") == HOSTILE
    assert "left alone: drained by an admin (" + HOSTILE + ")" in (home / "health.log").read_text()
    assert not Path("/tmp/sg-pwned").exists()


def test_settings_it_cannot_use_exit_2_and_touch_nothing(fleet: SlurmFleet, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[slurm-health]\nlock = "relative.toml"\ntimeout_s = "soon"\n')
    done = fleet.stackgate("slurm-health", "--config", str(bad), "--node", "n1")
    assert done.returncode == ExitCode.USAGE, done.stdout + done.stderr
    assert (
        "slurm-health.lock: 'relative.toml' is not an absolute path" in done.stderr
        and "slurm-health.timeout_s: 'soon'" in done.stderr
    )
    assert fleet.cluster.states()["n1"] == "idle"


def test_a_verify_past_the_time_cap_is_killed_and_drains_the_node(fleet: SlurmFleet, tmp_path: Path) -> None:
    """The node's stackgate hangs: past --timeout its process group is killed, the node drained
    with `stackgate: verify: no verdict within 2 s (killed)`; run by hand, flags only, no config."""
    env = fleet.node("n4", own={"FLEET_NODE_HANG": "1"})
    argv = ["--lock", str(fleet.spec), "--stackgate", str(fleet.program), "--timeout", "2", "--node", "n4"]
    done = fleet.stackgate(
        "slurm-health", *argv, "--slurm-bin", "/usr/bin", "--slurm-conf", str(fleet.cluster.conf), env=env
    )
    assert done.returncode == ExitCode.FAILED, done.stdout + done.stderr
    assert fleet.cluster.states()["n4"] == "drain"
    assert fleet.cluster.reason("n4") == "stackgate: verify: no verdict within 2 s (killed)"
    hung = [int(line.split()[0]) for line in fleet.started.read_text().splitlines()]
    assert hung and living(hung) == []


def test_a_forked_verify_past_its_cap_is_killed_with_its_group(tmp_path: Path) -> None:
    """runner.call_forked, as slurm-health runs verify: the child's group (a grandchild too) is
    killed at the cap, what it printed is kept; a child that returns gives its exit status."""
    import os
    import subprocess

    from stackgate.edges import runner

    pids = tmp_path / "pids"

    def hangs() -> int:
        child = subprocess.Popen(["sleep", "600"])
        pids.write_text(f"{os.getpid()} {child.pid}")
        print("verify: started", flush=True)
        child.wait()
        return 0

    done = runner.call_forked(hangs, timeout_s=1.0, output=tmp_path / "out")
    assert done.timed_out and "verify: started" in done.stderr
    wait_for(lambda: living([int(p) for p in pids.read_text().split()]) == [], 10)
    assert runner.call_forked(lambda: 7, timeout_s=10.0, output=tmp_path / "out2").returncode == 7
