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
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
from fakes.fake_nvml import gpu, machine
from fleet_support import CODE, TESTS, VERIFIABLE, nvml_file
from slurm_cluster import Cluster
from smoke_support import ROOT, living, wait_for
from test_fleet_slurm import CANARY, HOSTILE, SlurmFleet, slurm_fleet

from stackgate.models.exitcodes import ExitCode


@pytest.fixture
def fleet(slurm: Cluster, tmp_path: Path) -> Iterator[SlurmFleet]:
    """The Slurm fleet of test_fleet_slurm, for one test."""
    yield from slurm_fleet(slurm, tmp_path)


def health(fleet: SlurmFleet, name: str, *, forked: bool = False, hook: str = "health") -> Path:
    """The node's health script and config (see the module's docstring); its runs counted in
    ``runs``. ``forked``: verify runs in a forked child of slurm-health (the default of an
    installed stackgate), else through the node's stackgate program (the config's ``stackgate``).
    ``hook``: the slurm.conf hook that runs it (health, prolog or epilog: its ``role``)."""
    env = fleet.node(name)
    home = fleet.home / name
    config = home / "health.toml"
    config.write_text(
        "[slurm-health]\n"
        f'lock = "{fleet.spec}"\nprom = "{home / "stackgate_verify.{node}.prom"}"\ntimeout_s = 60\n'
        f"checks = {json.dumps(list(VERIFIABLE))}\n"
        + ("" if forked else f'stackgate = "{fleet.program}"\n')
        + f'slurm_bin = "/usr/bin"\nslurm_conf = "{fleet.cluster.conf}"\nstate_dir = "{home / "state"}"\n'
        + f'role = "{"check" if hook == "health" else hook}"\n'
    )
    exports = "".join(f"export {k}='{v}'\n" for k, v in env.items())
    script = fleet.cluster.node_dir(name) / hook
    script.write_text(
        f"#!/bin/sh\n{exports}{sys.executable} {TESTS / 'fleet_node.py'} slurm-health --config {config}"
        f" >> {home / 'health.log'} 2>&1\n"
        f"rc=$?; echo $rc >> {home / 'runs'}; exit $rc\n"
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
    prom = (home / "stackgate_verify.n3.prom").read_text()  # named by the node's Slurm name
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
    bad.write_text('[slurm-health]\nlock = "relative.toml"\ntimeout_s = "soon"\nrole = "reboot"\nstate_dir = "st"\n')
    done = fleet.stackgate("slurm-health", "--config", str(bad), "--node", "n1")
    assert done.returncode == ExitCode.USAGE, done.stdout + done.stderr
    assert (
        "slurm-health.lock: 'relative.toml' is not an absolute path" in done.stderr
        and "slurm-health.timeout_s: 'soon'" in done.stderr
        and "slurm-health.role: 'reboot' is not one of check, prolog, epilog, judge" in done.stderr
        and "slurm-health.state_dir: 'st' is not an absolute path" in done.stderr
    )
    assert fleet.cluster.states()["n1"] == "idle"


def test_a_verify_past_the_time_cap_is_killed_and_drains_the_node(fleet: SlurmFleet, tmp_path: Path) -> None:
    """The node's stackgate hangs: past --timeout its process group is killed, the node drained
    with `stackgate: verify: no verdict within 2 s (killed)`; run by hand, flags only, no config."""
    env = fleet.node("n4", own={"FLEET_NODE_HANG": "1"})
    argv = ["--lock", str(fleet.spec), "--stackgate", str(fleet.program), "--timeout", "2", "--node", "n4"]
    argv += ["--state-dir", str(tmp_path / "state")]
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


def by_hand(fleet: SlurmFleet, node: str, env: dict[str, str], state: Path, *extra: str) -> Any:
    """``stackgate slurm-health`` on ``node``, run by hand with flags (the node's fake GPUs in ``env``)."""
    argv = ["--lock", str(fleet.spec), "--node", node, "--slurm-bin", "/usr/bin", "--state-dir", str(state)]
    argv += ["--slurm-conf", str(fleet.cluster.conf), *extra]
    if "--check" not in extra:
        argv += [a for c in VERIFIABLE for a in ("--check", c)]
    return fleet.stackgate("slurm-health", *argv, env=env)


def history(state: Path, node: str) -> list[dict[str, Any]]:
    return list(json.loads((state / f"{node}.json").read_text())["history"])


def test_a_flapping_check_drains_only_at_its_nth_failure_and_resumes_after_revalidation(
    fleet: SlurmFleet, tmp_path: Path
) -> None:
    """The spec's `[slurm] drain_after = 3`: fail, fail, pass (the count clears), fail, fail leave
    n1 in service, each run saying how far it is; the third failure in a row drains it. Fixed, the
    cached check passes and a fresh verify (the re-validation) passes too before the resume, which
    the node's reason history records."""
    with fleet.spec.open("a") as spec_file:
        spec_file.write("\n[slurm]\ndrain_after = 3\n")
    env, home, state = fleet.node("n1"), fleet.home / "n1", tmp_path / "state"
    said = []
    for broken, drained in ((1, 0), (1, 0), (0, 0), (1, 0), (1, 0), (1, 1)):
        break_gpus(home) if broken else nvml_file(home / "nvml.json")
        done = by_hand(fleet, "n1", env, state)
        assert done.returncode == (ExitCode.FAILED if broken else ExitCode.PASSED), done.stdout + done.stderr
        assert fleet.cluster.states()["n1"].startswith("drain" if drained else "idle"), done.stdout
        said.append(done.stdout)
    assert "not drained: gpu.count has failed 2 consecutive time(s), the spec drains after 3" in said[1], said[1]
    assert "not drained: gpu.count has failed 1 consecutive time(s)" in said[3], said[3]  # the pass cleared it
    assert "; drained: stackgate: gpu.count: 0 GPU(s) visible" in said[5], said[5]
    nvml_file(home / "nvml.json")
    done = by_hand(fleet, "n1", env, state)
    assert done.returncode == ExitCode.PASSED, done.stdout + done.stderr
    fleet.cluster.wait_states({"n1": "idle"})
    assert "resumed (this check had drained it; re-validated (verify, " in done.stdout, done.stdout
    events = history(state, "n1")
    assert [e["event"] for e in events] == ["drained", "resumed"], events
    assert (
        events[1]["detail"].startswith("re-validated (verify, ")
        and "after: stackgate: gpu.count" in events[1]["detail"]
    )


def test_the_breaker_drains_at_most_its_share_with_every_node_failing(fleet: SlurmFleet, tmp_path: Path) -> None:
    """4 of 4 nodes fail, the spec's share is 0.5: n1 and n2 are drained, n3 and n4 are not, and say so
    loudly; once n1 is fixed and resumed, n3's next failing run may drain it."""
    with fleet.spec.open("a") as spec_file:
        spec_file.write("\n[slurm]\nmax_drained_share = 0.5\n")
    state, envs, runs_ = tmp_path / "state", {}, {}
    for node in fleet.cluster.nodes:
        envs[node] = fleet.node(node)
        break_gpus(fleet.home / node)
        runs_[node] = by_hand(fleet, node, envs[node], state)
        assert runs_[node].returncode == ExitCode.FAILED, runs_[node].stdout + runs_[node].stderr
    assert {n: s.rstrip("*") for n, s in fleet.cluster.states().items()} == {
        "n1": "drain",
        "n2": "drain",
        "n3": "idle",
        "n4": "idle",
    }
    held = "breaker: stackgate has drained 2 of the 4 nodes of partition debug (n1, n2); the spec's [slurm]"
    for node in ("n3", "n4"):
        assert f"NOT drained: {held}" in runs_[node].stdout, runs_[node].stdout
        assert f"slurm-health {node}: BREAKER HOLDS, node not drained: {held}" in runs_[node].stderr
        assert [e["event"] for e in history(state, node)] == ["breaker"]
    nvml_file(fleet.home / "n1" / "nvml.json")
    assert by_hand(fleet, "n1", envs["n1"], state).returncode == ExitCode.PASSED
    assert by_hand(fleet, "n3", envs["n3"], state).returncode == ExitCode.FAILED
    assert {n: s.rstrip("*") for n, s in fleet.cluster.states().items()} == {
        "n1": "idle",
        "n2": "drain",
        "n3": "drain",
        "n4": "idle",
    }


def test_a_gres_that_disagrees_with_nvml_is_named_and_drains(fleet: SlurmFleet, tmp_path: Path) -> None:
    """Slurm schedules n2 as `Gres=gpu:h200:1`; NVML sees two H200s (the checks asked for pass)."""
    env, home = fleet.node("n2"), fleet.home / "n2"
    two = [gpu("NVIDIA H200", (9, 0), uuid=f"GPU-000{i}", memory=[141 * 2**30, 2**20]) for i in range(2)]
    (home / "nvml.json").write_text(json.dumps(machine(two)))
    done = by_hand(fleet, "n2", env, tmp_path / "state", "--check", "python.*")
    assert done.returncode == ExitCode.FAILED, done.stdout + done.stderr
    named = "slurm.gres: Slurm's Gres=gpu:h200:1 counts 1 GPU(s), NVML sees 2 (NVIDIA H200)"
    assert f"FAIL {named}" in done.stdout, done.stdout
    assert fleet.cluster.states()["n2"].startswith("drain") and fleet.cluster.reason("n2") == f"stackgate: {named}"


def test_a_failing_prolog_drains_and_requeues_the_job(fleet: SlurmFleet) -> None:
    """slurm.conf's Prolog runs `slurm-health --role prolog` on n3, whose GPU is gone: the node is
    drained with the check's reason and Slurm requeues the job (held: Slurm's default)."""
    home = health(fleet, "n3", forked=True, hook="prolog")
    break_gpus(home)
    job = fleet.cluster.run("sbatch", "--parsable", "-w", "n3", "--output=/dev/null", "--wrap", "true").stdout.strip()
    try:
        fleet.cluster.wait_states({"n3": "drain"}, 60)
        assert fleet.cluster.reason("n3").startswith("stackgate: gpu."), fleet.cluster.reason("n3")
        wait_for(lambda: "Restarts=1" in fleet.cluster.run("scontrol", "show", "job", job).stdout, 30)
        shown = fleet.cluster.run("scontrol", "show", "job", job).stdout
        assert "JobState=PENDING" in shown and "requeued" in shown, shown
        assert "stackgate slurm-health prolog n3: FAIL gpu." in (home / "health.log").read_text()
    finally:
        fleet.cluster.run("scancel", job, check=False)


def test_an_epilog_finds_the_process_a_job_left_behind(fleet: SlurmFleet) -> None:
    """A job on n4 starts a process in a session of its own, which outlives it; slurm.conf's Epilog
    (`slurm-health --role epilog`) finds it by the job's id in its environment and drains n4."""
    home = health(fleet, "n4", forked=True, hook="epilog")
    leak = 'setsid sh -c "exec sleep 300" </dev/null >/dev/null 2>&1 & sleep 1'
    job = fleet.cluster.run("sbatch", "--parsable", "-w", "n4", "--output=/dev/null", "--wrap", leak).stdout.strip()
    try:
        fleet.cluster.wait_states({"n4": "drain"}, 60)
        reason = fleet.cluster.reason("n4")
        assert reason.startswith(f"stackgate: epilog.processes: job {job} left 1 process(es) running: pid "), reason
        assert reason.endswith("(sleep 300)"), reason
        assert "stackgate slurm-health epilog n4: FAIL epilog.processes: job" in (home / "health.log").read_text()
    finally:
        for pid in _job_processes(job, fleet.cluster.name):
            os.kill(pid, signal.SIGKILL)


def _job_processes(job: str, cluster: str) -> list[int]:
    from stackgate.flows.nodehealth import job_processes

    return [leak.pid for leak in job_processes(job, cluster) if leak.command == "sleep 300"]


def test_the_nhc_hook_hands_nhc_the_failing_check_and_leaves_slurm_alone(fleet: SlurmFleet, tmp_path: Path) -> None:
    """The shipped stackgate.nhc, sourced by bash as LBNL NHC sources its scripts (NHC itself is not
    installable here: its `die` is a stand-in that prints what NHC would drain with): a node without
    its GPU gives `die 1 "n2: FAIL gpu.count: ..."` and Slurm is not touched; fixed, the check passes."""
    env, home = fleet.node("n2"), fleet.home / "n2"
    break_gpus(home)
    config = tmp_path / "health.toml"
    config.write_text(
        f'[slurm-health]\nlock = "{fleet.spec}"\nchecks = {json.dumps(list(VERIFIABLE))}\nslurm_bin = "/usr/bin"\n'
        f'slurm_conf = "{fleet.cluster.conf}"\nstate_dir = "{tmp_path / "state"}"\nnode = "n2"\n'
    )
    program = tmp_path / "stackgate"
    program.write_text(f'#!/bin/sh\nexec {sys.executable} -m stackgate "$@"\n')
    program.chmod(0o755)
    nhc = ROOT / "stackgate" / "slurm" / "stackgate.nhc"
    script = f'die() {{ echo "DIE $1 $2"; }}\nsource {nhc}\ncheck_stackgate {config}; echo "rc=$?"\n'
    run_env = {**env, **fleet.cluster.env, "STACKGATE": str(program), "PYTHONPATH": f"{CODE}{os.pathsep}{TESTS}"}
    done = subprocess.run(["bash", "-c", script], env=run_env, capture_output=True, text=True, timeout=120)
    assert "DIE 1 n2: FAIL gpu.count: 0 GPU(s) visible, the lock wants 1" in done.stdout, done.stdout + done.stderr
    assert done.stdout.endswith("rc=1\n") and "Slurm left to the caller" in done.stdout
    assert fleet.cluster.states()["n2"].rstrip("*") == "idle" and fleet.cluster.reason("n2") == ""
    nvml_file(home / "nvml.json")
    done = subprocess.run(["bash", "-c", script], env=run_env, capture_output=True, text=True, timeout=120)
    assert done.stdout == "rc=0\n", done.stdout + done.stderr


def test_the_cluster_summary_groups_nodes_by_verdict_drift_and_reason(fleet: SlurmFleet, tmp_path: Path) -> None:
    """`slurm-health --summary` over the cluster: n1 drained by an admin (a hostile reason), n2 by
    stackgate for python.pins, n3 and n4 healthy; console, JSON and Markdown agree, nothing ran."""
    cluster = fleet.cluster
    cluster.run("scontrol", "update", "nodename=n1", "state=drain", f"reason={HOSTILE}")
    cluster.run("scontrol", "update", "nodename=n2", "state=drain", "reason=stackgate: python.pins: torch 2.9.0 | <b>")
    argv = ["--summary", "--slurm-conf", str(cluster.conf), "--slurm-bin", "/usr/bin", "--partition", "debug"]
    done = fleet.stackgate(
        "slurm-health", *argv, "--json", str(tmp_path / "s.json"), "--markdown", str(tmp_path / "s.md")
    )
    assert done.returncode == ExitCode.FAILED, done.stdout + done.stderr
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["by_verdict"] == {"held by an admin": ["n1"], "failing": ["n2"], "healthy": ["n3", "n4"]}, doc
    assert doc["by_drift"] == {"python.pins": ["n2"]} and doc["by_reason"][HOSTILE] == ["n1"]
    assert "     2  healthy: n3, n4" in done.stdout and "     1  python.pins: n2" in done.stdout, done.stdout
    md = (tmp_path / "s.md").read_text()
    assert "| python.pins | n2 | 1 |" in md and "torch 2.9.0 \\| &lt;b>" in md, md
    assert not CANARY.exists()


def test_the_specs_slurm_section_is_checked_with_its_key_paths() -> None:
    """`[slurm]` in a spec: each value it cannot use is named with its key path (exit 2 at load);
    none given, the defaults (drain on the first failure, at most half a partition, a fresh verify)."""
    from stackgate.models.spec import SpecError, loads_spec

    text = (ROOT / "stackgate" / "lockfiles" / "hopper-sm90-cu130.toml").read_text()
    assert (loads_spec(text).slurm.drain_after, loads_spec(text).slurm.max_drained_share) == (1, 0.5)
    hostile = text + (
        '\n[slurm]\ndrain_after = 0\nmax_drained_share = 2\nrevalidate = "never"\ngpus_per_node = true\n'
        'container_image = "$(touch /tmp/x) img"\ndrain_afer = 3\n'
    )
    with pytest.raises(SpecError) as caught:
        loads_spec(hostile)
    assert sorted(caught.value.problems) == [
        "slurm.container_image: '$(touch /tmp/x) img' is not a container image name (pyxis: [REGISTRY#]IMAGE[:TAG])",
        "slurm.drain_afer: unknown key (did you mean 'drain_after'?)",
        "slurm.drain_after: must be greater than 0, not 0",
        "slurm.gpus_per_node: must be an integer, not a boolean",
        "slurm.max_drained_share: must be a share of the partition, at most 1, not 2",
        "slurm.revalidate: must be one of verify, deep, not 'never'",
    ]


def test_a_state_file_that_is_not_to_be_trusted_is_set_aside_and_counting_starts_afresh(tmp_path: Path) -> None:
    """The damping's counts are read only from this user's own file: a damaged one, a symbolic link
    planted in its place, or one others may write, each gives an empty record with the reason."""
    from stackgate.runs import healthstate

    folder = tmp_path / "state"
    record = healthstate.NodeRecord("n1", {"gpu.count": 2}).with_event("drained", "stackgate: gpu.count: x")
    assert healthstate.save(folder, record) is None
    assert healthstate.load(folder, "n1").counts == {"gpu.count": 2}
    (folder / "n1.json").write_text('{"schema": "stackgate.slurm-health/1", "node": "n1", "counts": {"x": -1}}')
    damaged = healthstate.load(folder, "n1")
    assert damaged.counts == {} and "damaged (counts: not check names with counts)" in damaged.note
    (folder / "n1.json").unlink()
    (folder / "n1.json").symlink_to(tmp_path / "elsewhere.json")
    planted = healthstate.load(folder, "n1")
    assert planted.counts == {} and "is a symbolic link" in planted.note, planted.note
    (folder / "n1.json").unlink()
    assert healthstate.save(folder, record) is None
    (folder / "n1.json").chmod(0o666)
    shared = healthstate.load(folder, "n1")
    assert shared.counts == {} and "is writable by others" in shared.note, shared.note
