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
from fakes.fake_nvml import gpu, machine
from fleet_support import TESTS, VERIFIABLE, nvml_file
from slurm_cluster import Cluster
from smoke_support import living, wait_for
from test_fleet_slurm import CANARY, HOSTILE, SlurmFleet, slurm_fleet

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
    prom = (home / "stackgate_verify.prom").read_text()
    assert 'stackgate_verify_passed{lock="fleetstack",host="n3"} 0' in prom, prom  # Slurm's name, not the hostname
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
    assert f"left alone: drained ({HOSTILE}), not set by stackgate" in (home / "health.log").read_text()
    assert not CANARY.exists()


RMA = "RMA ticket 99: bad HBM, do not resume"


@pytest.mark.parametrize(("state", "shown"), [("down", "down"), ("fail", "fail")])
def test_an_admin_down_or_fail_keeps_its_state_and_reason_whatever_the_check_finds(
    fleet: SlurmFleet, state: str, shown: str
) -> None:
    """A node an admin set DOWN or FAIL (an RMA ticket): a failing check neither takes it over (its
    reason stays the admin's) nor, once the check passes again, resumes it."""
    cluster: Cluster = fleet.cluster
    cluster.run("scontrol", "update", "nodename=n1", f"state={state}", f"reason={RMA}")
    home = health(fleet, "n1", forked=True)
    break_gpus(home)
    wait_for(lambda: runs(home).count(ExitCode.FAILED) >= 2, 180)
    assert cluster.states()["n1"] == shown and cluster.reason("n1") == RMA
    nvml_file(home / "nvml.json")  # the GPU is back: the check passes, the node stays the admin's
    seen = len(runs(home))
    wait_for(lambda: len(runs(home)) >= seen + 2 and runs(home)[-1] == ExitCode.PASSED, 180)
    assert cluster.states()["n1"] == shown and cluster.reason("n1") == RMA
    log = (home / "health.log").read_text()
    assert f"left alone: {shown} ({RMA}), not set by stackgate" in log
    assert "drained:" not in log and "resumed" not in log


def test_a_node_running_a_job_is_not_drained_for_the_memory_its_job_holds(fleet: SlurmFleet) -> None:
    """n2 runs `sbatch -w n2 --wrap 'sleep 60'` and its GPU holds the job's memory: gpu.processes
    fails, but on a node Slurm has allocated it judges nothing (the line says so) and the node is
    not drained under the job. Once the job is gone, the same GPU state drains the node."""
    cluster: Cluster = fleet.cluster
    sbatch = ["sbatch", "--parsable", "-w", "n2", "--job-name=busy", "--output=/dev/null", "--wrap", "sleep 60"]
    job = cluster.run(*sbatch).stdout.strip()
    try:
        cluster.wait_states({"n2": "alloc"}, 30)
        home = health(fleet, "n2", forked=True)
        busy = gpu("NVIDIA H200", (9, 0), uuid="GPU-0000", memory=[141 * 2**30, 135 * 2**30])
        busy["processes"] = [{"pid": 4242, "used": 135 * 2**30}]
        (home / "nvml.json").write_text(json.dumps(machine([busy])))
        wait_for(lambda: len(runs(home)) >= 2, 60)
        assert set(runs(home)) == {ExitCode.PASSED}, (home / "health.log").read_text()
        assert cluster.states()["n2"] == "alloc" and cluster.reason("n2") == ""
        log = (home / "health.log").read_text()
        assert "n2: healthy (gpu.processes not judged: Slurm has given the node to a job" in log, log
    finally:
        cluster.run("scancel", job, check=False)
    cluster.wait_states({"n2": "drain"}, 60)  # idle now: the memory held is a fault
    assert cluster.reason("n2").startswith("stackgate: gpu.processes: GPU 0")


def test_occupancy_is_excused_only_on_a_node_given_to_a_job() -> None:
    """slurm-health's rule, by Slurm state: a failed gpu.processes is not judged on an allocated,
    mixed, completing or draining node; any other failure still counts."""
    from stackgate.commands.slurmhealth import HealthVerdict, excuse
    from stackgate.edges.slurm import NodeState

    held_by = (("gpu.processes", "FAIL", "GPU 0 .."),)
    held = HealthVerdict(False, "gpu.processes", "GPU 0 has 6144 MiB free", 1.0, held_by)
    both_by = (("gpu.processes", "FAIL", "x"), ("gpu.count", "FAIL", "0 GPU"))
    both = HealthVerdict(False, "gpu.processes", "x", 1.0, both_by)
    crashed = HealthVerdict(False, "gpu.processes", "boom", 1.0, (("gpu.processes", "ERROR", "boom"),))
    for state in ("allocated", "mixed", "completing", "draining", "mixed*"):
        done = excuse(held, NodeState("n1", state))
        assert done.healthy and done.excused == ("gpu.processes",), state
        assert excuse(both, NodeState("n1", state)) == HealthVerdict(
            False, "gpu.count", "0 GPU", 1.0, both.failed, ("gpu.processes",)
        )
        assert excuse(crashed, NodeState("n1", state)) == crashed  # a check that crashed is not the job's doing
    for state in ("idle", "drained", "down", "fail"):
        assert excuse(held, NodeState("n1", state)) == held, state
    assert excuse(held, None, NodeState("n1", "allocated")).healthy  # allocated before verify: the job ended since


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
    assert done.stdout.startswith("stackgate slurm-health n4: FAIL verify: no verdict within 2 s"), done.stdout
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
