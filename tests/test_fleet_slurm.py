"""`stackgate fleet --engine slurm` on a real Slurm cluster (tests/slurm_cluster.py, one per
pytest-xdist worker, shared by the tests): munged, slurmctld and four ``slurmd -N nK``.

The fleet: ``n1`` good, ``n2`` drifted (its stack interpreter holds one more distribution:
another fingerprint), ``n3`` slow (its stand-in decodes at half the speed: an outlier that still
passes), ``n4`` DOWN with a reason full of shell characters. Each node's differences reach its
tasks through the cluster's TaskProlog, as FACTS.md (Slurm) describes; every node runs this
checkout's stackgate through tests/fleet_node.py (fake NVML, the stand-in server on its own port).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest
import test_fleet
from fleet_support import (
    CODE,
    TESTS,
    VERIFIABLE,
    behaviour,
    fleet_spec,
    make_venv,
    nvml_file,
    stand_in_pids,
    why_no_sshd,
)
from slurm_cluster import NODE_LOCAL, Cluster
from smoke_support import FAKES, ROOT, free_port, living, wait_for
from test_fleet import Fleet

from stackgate.flows.fleet_slurm import SlurmOptions
from stackgate.flows.fleetrequest import FleetRequest
from stackgate.models.exitcodes import ExitCode, UsageError

# The canary a hostile reason would create if it ever ran: one path per test process, so that a
# stale one (left by a run where the bug fired) cannot fail another run.
CANARY = Path(tempfile.gettempdir()) / f"sg-pwned-{os.getpid()}"
HOSTILE = f'psu "B" failed; $(touch {CANARY}) `id` & rm -rf x'


class SlurmFleet:
    """The nodes' homes, their shared stackgate wrapper and spec, on the session's cluster."""

    def __init__(self, cluster: Cluster, home: Path) -> None:
        self.cluster, self.home = cluster, home
        model = home / "model"
        model.mkdir()
        (model / "config.json").write_text(
            json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 4})
        )
        self.model = model
        self.python = make_venv(home / "stack")
        self.drifted_python = make_venv(home / "stack-drift", {"flashinfer-python": "0.6.3"})
        self.spec = fleet_spec(home / "fleet.toml", model, self.python)
        self.started = home / "started"
        self.program = home / "stackgate"
        self.program.write_text(
            f'#!/bin/sh\n[ "$1" = --version ] || echo "$$ $SLURMD_NODENAME $*" >> {self.started}\n'
            '[ -n "${FLEET_NODE_BROKEN:-}" ] && { echo "stackgate: cannot start: $FLEET_NODE_BROKEN" >&2; exit 127; }\n'
            '[ -n "${FLEET_NODE_HANG:-}" ] && [ "$1" != --version ] && exec sleep 600\n'
            f'exec {sys.executable} {TESTS / "fleet_node.py"} "$@"\n'
        )
        self.program.chmod(0o755)

    def node(
        self, name: str, *, python: Path | None = None, own: dict[str, str] | None = None, **behave: Any
    ) -> dict[str, str]:
        """The node's home and what its tasks get (through the TaskProlog): that environment."""
        home = self.home / name
        home.mkdir()
        events = home / "events.jsonl"
        env = {
            "PYTHONPATH": f"{TESTS}{os.pathsep}{FAKES}",
            "STACKGATE_NVML_MODULE": "fakes.fake_nvml",
            "STACKGATE_FAKE_NVML": str(nvml_file(home / "nvml.json")),
            "STACKGATE_FAKE_SGLANG": str(
                behaviour(home / "behaviour.json", events, **{"rate": 400.0, "load_s": 0.2, **behave})
            ),
            "STACKGATE_HISTORY_DIR": str(home / "runs"),
            "STACKGATE_LOG_DIR": str(home / "logs"),
            "FLEET_NODE_PORT": str(free_port()),
            "FLEET_NODE_INTERPRETER": str(python or self.python),
            "FLEET_NODE_CHECKS": ",".join(VERIFIABLE),
            **(own or {}),
        }
        self.cluster.set_env(name, env)
        return env

    def stackgate(
        self, *args: str, timeout: float = 240, popen: bool = False, env: dict[str, str] | None = None
    ) -> Any:
        env = {
            **(env or {}),
            **self.cluster.env,
            "PYTHONPATH": f"{CODE}{os.pathsep}{TESTS}",
            "NO_COLOR": "1",
            "STACKGATE_HISTORY_DIR": str(self.home / "controller-runs"),
        }
        env.pop("STACKGATE_LOCK", None)
        argv = [sys.executable, "-m", "stackgate", *args]
        if popen:
            return subprocess.Popen(
                argv,
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)

    def slurm_args(self) -> list[str]:
        return [
            "--engine",
            "slurm",
            "--stackgate",
            str(self.program),
            "--node-dir",
            str(NODE_LOCAL),
            "--lock",
            str(self.spec),
        ]

    def left_behind(self) -> dict[str, list[str]]:
        """What any node's local storage still holds, and the cluster's jobs and steps."""
        left = {n: sorted(p.name for p in self.cluster.local(n).iterdir()) for n in self.cluster.nodes}
        left["jobs"] = self.cluster.run("squeue", "-h", "-o", "%i %j").stdout.split()
        return {k: v for k, v in left.items() if v}


def slurm_fleet(slurm: Cluster, tmp_path: Path) -> Iterator[SlurmFleet]:
    """A Slurm fleet on the test cluster for one test; the cluster is reset after it."""
    made = SlurmFleet(slurm, tmp_path)
    try:
        yield made
    finally:
        slurm.reset()


@pytest.fixture
def fleet(slurm: Cluster, tmp_path: Path) -> Iterator[SlurmFleet]:
    yield from slurm_fleet(slurm, tmp_path)


def statuses(nodes: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {name: node["status"] for name, node in nodes.items()}


def by_name(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["name"]: n for n in doc["nodes"]}


def test_a_drifted_a_slow_and_a_down_node_through_slurm(fleet: SlurmFleet, tmp_path: Path) -> None:
    """One `fleet gate --engine slurm --nodelist n[1-4]` outside any allocation: the allocation
    is asked for and released, n4 (DOWN) is listed with its state and its reason as data, the
    drifted node is named with what differs, the slow one is the outlier, every report format
    says so, and no file, job or process is left."""
    for name in ("n1", "n2", "n3"):
        fleet.node(name, python=fleet.drifted_python if name == "n2" else None, rate=200.0 if name == "n3" else 400.0)
    fleet.cluster.run("scontrol", "update", "nodename=n4", "state=down", f"reason={HOSTILE}")
    out = tmp_path / "report"
    done = fleet.stackgate(
        "fleet",
        "gate",
        *fleet.slurm_args(),
        "--nodelist",
        "n[1-4]",
        "--time",
        "10",
        "--json",
        f"{out}.json",
        "--junit",
        f"{out}.xml",
        "--markdown",
        f"{out}.md",
        "--prom",
        f"{out}.prom",
        "--html",
        f"{out}.html",
    )
    assert done.returncode == ExitCode.FAILED, done.stdout + done.stderr
    doc = json.loads(Path(f"{out}.json").read_text())
    nodes = by_name(doc)
    assert statuses(nodes) == {"n1": "passed", "n2": "passed", "n3": "passed", "n4": "unavailable"}, nodes
    assert (
        nodes["n4"]["reason"] == f"not dialled: Slurm state down ({HOSTILE})" and nodes["n4"]["address"] == "slurm:n4"
    )
    assert not CANARY.exists()
    assert nodes["n1"]["stages"] == dict.fromkeys(
        ["lock", "environment", "verify", "fast_smoke", "benchmark"], "passed"
    )
    assert nodes["n1"]["version"] == nodes["n3"]["version"] is not None
    assert doc["shipped"] == {"fleet.toml": hashlib.sha256(fleet.spec.read_bytes()).hexdigest()}
    assert (
        doc["engine"]["name"] == "slurm"
        and doc["engine"]["allocated_here"] is True
        and doc["engine"]["step_id"].startswith(doc["engine"]["job_id"] + ".")
    )
    stacks = [g for g in doc["groups"] if g["digest"]]
    assert [(g["nodes"], g["majority"]) for g in stacks] == [(["n1", "n3"], True), (["n2"], False)]
    assert stacks[1]["differences"] == {
        "n2": [{"section": "distributions", "name": "flashinfer-python", "majority": None, "node": "0.6.3"}]
    }
    assert "    distributions: flashinfer-python: (none) -> 0.6.3" in done.stdout
    (outlier,) = doc["outliers"]
    assert (
        outlier["node"] == "n3"
        and outlier["value"] == pytest.approx(200.0, rel=0.15)
        and outlier["median"] == pytest.approx(400.0, rel=0.15)
    )
    assert nodes["n4"]["judged"] is True  # --nodelist named it
    assert doc["reason"].startswith("1 of 4 node(s) did not pass: n4 unavailable")
    assert (
        "| n2 | passed |" in Path(f"{out}.md").read_text()
        and 'name="stackgate.fleet.n4"' in Path(f"{out}.xml").read_text()
    )
    assert 'stackgate_fleet_node_passed{lock="fleetstack",node="n4"} 0' in Path(f"{out}.prom").read_text()
    wait_for(lambda: fleet.left_behind() == {}, 20)
    for name in ("n1", "n2", "n3"):
        assert stand_in_pids(fleet.home / name / "events.jsonl") == []
    kept = [json.loads(p.read_text()) for p in sorted((fleet.home / "controller-runs").glob("*.json"))]
    assert sorted(k["fleet"]["node"] for k in kept) == ["n1", "n2", "n3"]
    if why_no_sshd() is None:
        the_same_fleet_over_ssh_gives_the_same_report(tmp_path / "ssh", doc)


def the_same_fleet_over_ssh_gives_the_same_report(home: Path, through_slurm: dict[str, Any]) -> None:
    """The fleet above as loopback SSH nodes (tests/test_fleet.py): n4 a closed port. The same
    statuses, stacks, differences, outlier and verdict; only the down node's reason and the
    addresses say which engine reached them."""
    home.mkdir()
    ssh = Fleet(home)
    try:
        ssh.node("n1")
        ssh.node("n2", python=ssh.drifted_python)
        ssh.node("n3", rate=200.0)
        done = test_fleet.stackgate(
            "fleet",
            "gate",
            "--inventory",
            str(ssh.inventory({"name": "n4", "port": free_port()})),
            "--lock",
            str(ssh.spec),
            "--json",
            str(home / "f.json"),
            history=home / "runs",
        )
    finally:
        ssh.stop()
    assert done.returncode == ExitCode.FAILED, done.stdout + done.stderr
    doc = json.loads((home / "f.json").read_text())

    def seen(report: dict[str, Any]) -> dict[str, Any]:
        return {
            "statuses": {n["name"]: n["status"] for n in report["nodes"]},
            "stages": {n["name"]: n["stages"] for n in report["nodes"]},
            "groups": [(g["nodes"], g["majority"], g["differences"], g["digest"] is None) for g in report["groups"]],
            "outliers": [(o["node"], o["metric"]) for o in report["outliers"]],
            "verdict": (report["verdict"], report["exit_code"], report["reason"]),
        }

    # n4: unavailable through Slurm (listed, not dialled), unreachable over SSH (a closed port)
    said = json.loads(
        json.dumps(through_slurm).replace('"unavailable"', '"unreachable"').replace("n4 unavailable", "n4 unreachable")
    )
    assert seen(doc) == seen(said)


def test_a_drained_node_of_the_partition_is_unavailable_and_not_judged_unless_asked(
    fleet: SlurmFleet, tmp_path: Path
) -> None:
    """`fleet verify --nodes 3` of a partition whose n4 an admin drained: the three pass, n4 is
    listed as unavailable with its state and reason and is not judged; --count-unavailable
    counts it, and then the verdict fails."""
    for name in ("n1", "n2", "n3"):
        fleet.node(name)
    fleet.cluster.run("scontrol", "update", "nodename=n4", "state=drain", "reason=RMA 7")
    argv = [*fleet.slurm_args(), "--nodes", "3", "-c", "gpu.*", "--json", str(tmp_path / "v.json")]
    done = fleet.stackgate("fleet", "verify", *argv)
    assert done.returncode == ExitCode.PASSED, done.stdout + done.stderr
    doc = json.loads((tmp_path / "v.json").read_text())
    nodes = by_name(doc)
    assert statuses(nodes) == {"n1": "passed", "n2": "passed", "n3": "passed", "n4": "unavailable"}
    assert nodes["n4"]["reason"] == "not dialled: Slurm state drained (RMA 7)" and nodes["n4"]["judged"] is False
    assert doc["reason"] == "3 node(s) passed; 1 unavailable, not judged (n4)"
    counted = fleet.stackgate("fleet", "verify", *argv, "--count-unavailable")
    assert counted.returncode == ExitCode.FAILED, counted.stdout + counted.stderr
    doc = json.loads((tmp_path / "v.json").read_text())
    assert doc["reason"] == "1 of 4 node(s) did not pass: n4 unavailable" and by_name(doc)["n4"]["judged"] is True
    wait_for(lambda: fleet.left_behind() == {}, 20)


def test_failures_are_values_a_task_that_cannot_start_and_a_node_past_its_timeout(
    fleet: SlurmFleet, tmp_path: Path
) -> None:
    """n2's stackgate cannot start (its --version fails), n3's hangs past --timeout: n2 failed with
    its words, n3 timed out (its step got SIGTERM, its stackgate ended), and nothing is left."""
    fleet.node("n2", own={"FLEET_NODE_BROKEN": "libpython3.so: not found"})
    fleet.node("n3", own={"FLEET_NODE_HANG": "1"})
    argv = [*fleet.slurm_args(), "--nodelist", "n[2-3]", "-c", "gpu.*", "--timeout", "10"]
    done = fleet.stackgate("fleet", "verify", *argv, "--json", str(tmp_path / "v.json"))
    assert done.returncode == ExitCode.FAILED, done.stdout + done.stderr
    nodes = by_name(json.loads((tmp_path / "v.json").read_text()))
    assert {n: v["status"] for n, v in nodes.items()} == {"n2": "failed", "n3": "timed out"}, nodes
    broken = f"`{fleet.program} --version` on the node: exit 127: stackgate: cannot start: libpython3.so: not found"
    assert nodes["n2"]["reason"] == broken
    assert nodes["n3"]["reason"].startswith("timed out: "), nodes["n3"]
    wait_for(lambda: fleet.left_behind() == {}, 20)
    hung = [int(line.split()[0]) for line in fleet.started.read_text().splitlines() if " n3 " in line]
    assert hung and living(hung) == []


def test_inside_an_allocation_with_a_shared_folder(fleet: SlurmFleet, tmp_path: Path) -> None:
    """`fleet verify --engine slurm` run inside `salloc -N2`: the allocation's nodes, its
    documents through --shared-dir; the allocation is the caller's, so it is not released."""
    for name in ("n1", "n2"):
        fleet.node(name)
    shared = tmp_path / "shared"
    shared.mkdir()
    done = fleet.stackgate(
        "fleet",
        "verify",
        *fleet.slurm_args(),
        "--shared-dir",
        str(shared),
        "-c",
        "gpu.*",
        "--json",
        str(tmp_path / "v.json"),
    )
    assert (
        done.returncode == ExitCode.USAGE and "--nodes N or --nodelist" in done.stderr
    )  # outside an allocation, nothing asked: nothing run
    argv = [
        sys.executable,
        "-m",
        "stackgate",
        "fleet",
        "verify",
        *fleet.slurm_args(),
        "--shared-dir",
        str(shared),
        "-c",
        "gpu.*",
        "--json",
        str(tmp_path / "v.json"),
    ]
    env = {**fleet.cluster.env, "PYTHONPATH": f"{CODE}{os.pathsep}{TESTS}", "NO_COLOR": "1"}
    inside = subprocess.run(
        ["salloc", "-N2", "-w", "n1,n2", "--job-name=caller", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert inside.returncode == ExitCode.PASSED, inside.stdout + inside.stderr
    doc = json.loads((tmp_path / "v.json").read_text())
    assert doc["engine"]["allocated_here"] is False and doc["command"] == "fleet verify"
    assert {n["name"]: n["status"] for n in doc["nodes"]} == {"n1": "passed", "n2": "passed"}
    assert all(n["counts"]["PASS"] >= 1 and n["counts"].get("FAIL", 0) == 0 for n in doc["nodes"])
    assert list(shared.iterdir()) == []
    wait_for(lambda: fleet.left_behind() == {}, 20)  # the caller's own job ends as its salloc does


def test_ctrl_c_cancels_the_step_keeps_the_reports_and_leaves_nothing(fleet: SlurmFleet, tmp_path: Path) -> None:
    """Ctrl-C while both nodes' stand-ins load: the step gets SIGTERM (scancel), each node's gate
    tears its server down and writes its report, which comes back; exit 130, the allocation is
    released, and no stackgate, stand-in or task is left on any node."""
    for name in ("n1", "n2"):
        fleet.node(name, load_s=120.0)
    process = fleet.stackgate(
        "fleet", "gate", *fleet.slurm_args(), "--nodes", "2", "--json", str(tmp_path / "f.json"), popen=True
    )
    try:
        events = [fleet.home / name / "events.jsonl" for name in ("n1", "n2")]
        wait_for(lambda: all(e.exists() and '"started"' in e.read_text() for e in events), 90)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=90)
    finally:
        process.kill()
    assert process.returncode == ExitCode.INTERRUPTED and "stackgate: interrupted" in err, err
    doc = json.loads((tmp_path / "f.json").read_text())
    assert doc["interrupted"] is True and doc["exit_code"] == 130
    nodes = by_name(doc)
    assert {n["status"] for n in nodes.values()} == {"interrupted"}, nodes
    assert {n["stages"]["fast_smoke"] for n in nodes.values()} == {
        "interrupted"
    }  # each node's own report, written as its gate stopped
    for name in ("n1", "n2"):
        assert stand_in_pids(fleet.home / name / "events.jsonl") == []
    gates = [int(line.split()[0]) for line in fleet.started.read_text().splitlines()]
    wait_for(lambda: living(gates) == [], 10)
    wait_for(lambda: fleet.left_behind() == {}, 20)


def test_fleet_upgrade_through_slurm_keeps_its_canary_and_batch_order(fleet: SlurmFleet, tmp_path: Path) -> None:
    """`fleet upgrade --engine slurm`: canary n1 wins (400 -> 440 tok/s), then n2 (wins) and n3
    (300 tok/s: keeps its stack) in one batch; n4, drained by an admin, is not run. Each command a
    one-task srun step: the SSH engine's shipping, sha256 checks and the node's real `stackgate
    upgrade` command line (tests/fleet_node.py measures the given rates)."""

    def upgrading(path: Path, extra: str = "") -> Path:
        text = fleet_spec(path, fleet.model, fleet.python).read_text()
        path.write_text(text.replace(f'interpreter = "{fleet.python}"', f'root = "{tmp_path / "root"}"') + extra)
        return path

    live, new = (
        upgrading(tmp_path / "live.toml"),
        upgrading(tmp_path / "new.toml", '\n[env]\nSGLANG_ENABLE_DEMO = "1"\n'),
    )
    for name, rates in (("n1", "400,440"), ("n2", "400,441"), ("n3", "400,300")):
        env = fleet.node(name, own={"FLEET_NODE_UPGRADE": rates, "FLEET_NODE_HOME": str(fleet.home / name)})
        del env["FLEET_NODE_INTERPRETER"]  # the spec's python.root stays as shipped
        fleet.cluster.set_env(name, env)
    fleet.cluster.run("scontrol", "update", "nodename=n4", "state=drain", f"reason={HOSTILE}")
    argv = ["--engine", "slurm", "--stackgate", str(fleet.program), "--nodelist", "n[1-4]", "--to", str(new)]
    argv += ["--lock", str(live), "--canary", "1", "--batch", "2", "--json", str(tmp_path / "u.json")]
    done = fleet.stackgate("fleet", "upgrade", *argv)
    assert done.returncode == ExitCode.FAILED, done.stdout + done.stderr
    doc = json.loads((tmp_path / "u.json").read_text())
    nodes = by_name(doc)
    assert statuses(nodes) == {"n1": "passed", "n2": "passed", "n3": "failed", "n4": "not run"}
    assert nodes["n4"]["reason"] == f"not run: Slurm state drained ({HOSTILE})"
    assert doc["upgrade"]["canary_nodes"] == ["n1"] and doc["upgrade"]["moved"] == ["n1", "n2"]
    assert doc["upgrade"]["kept"] == ["n3"] and doc["upgrade"]["untouched"] == ["n4"]
    assert doc["reason"].startswith("n3 did not win (failed: upgrade exit 1: kept the live stack: slower")
    shipped = {hashlib.sha256(p.read_bytes()).hexdigest() for p in (new, live)}
    for name in ("n1", "n2", "n3"):
        (call,) = [json.loads(line) for line in (fleet.home / name / "upgrades.jsonl").read_text().splitlines()]
        assert set(call["sha256"].values()) == shipped and not Path(call["to"]).parent.exists()
    wait_for(lambda: fleet.left_behind() == {}, 20)


def test_what_a_node_prints_is_data_only_where_it_is_a_frame() -> None:
    """srun's labelled output read back (edges/slurm.py): lines that are not frames, values that
    are not base64 or not UTF-8, and a task's frame split across lines; nothing is executed."""
    import base64

    from stackgate.edges.slurmframes import parse_frames

    def value(task: int, key: str, text: bytes) -> list[str]:
        encoded = base64.b64encode(text).decode()
        return [f"{task}: @sg {key} ", *(f"{task}: @sg {key} {encoded[i : i + 8]}" for i in range(0, len(encoded), 8))]

    lines = [
        *value(0, "node", b"n1"),
        "0: $(rm -rf /) plain output",
        *value(0, "reason", "a `b` $(c) ;\u00e9".encode()),
    ]
    lines += [
        "1: @sg node not-base64!",
        *value(1, "exit", b"\xff\xfe"),
        "garbage without a label",
        *value(2, "node", b"n3"),
    ]
    frames = {f.task: f.fields for f in parse_frames(lines)}
    assert frames == {0: {"node": "n1", "reason": "a `b` $(c) ;\u00e9"}, 1: {}, 2: {"node": "n3"}}


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        (
            {"hosts": "a,b"},
            "the nodes are Slurm's (the allocation's, or --nodes/--nodelist): not --hosts or --inventory",
        ),
        ({"slurm": {"nodes": 2, "nodelist": "n[1-2]"}}, "--nodes N or --nodelist LIST, not both"),
        ({"slurm": {}}, "outside an allocation, ask for nodes with --nodes N or --nodelist LIST"),
        ({"action": "gate", "batch": 2, "slurm": {"nodes": 2}}, "--batch is for `fleet provision` and `fleet upgrade`"),
        ({"action": "upgrade", "slurm": {"nodes": 2}}, "fleet upgrade: --to NEW_SPEC is required"),
        (
            {"action": "provision", "slurm": {"nodes": 2, "shared_dir": Path("/")}},
            "--shared-dir is for gate and verify",
        ),
        ({"checks": ("gpu.*",), "slurm": {"nodes": 2}}, "--check is for `fleet verify`"),
    ],
)
def test_what_the_slurm_engine_cannot_take_is_refused_before_slurm_is_asked(
    changes: dict[str, Any], said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stackgate.flows import fleetengines

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    fields = {"action": "gate", "engine": "slurm", **changes}
    fields["options"] = SlurmOptions(**fields.pop("slurm", {}))
    with pytest.raises(UsageError, match=re.escape(said)):
        fleetengines.named("slurm").check(FleetRequest(**fields))


def test_a_node_lost_mid_run_fails_alone(fleet: SlurmFleet, tmp_path: Path) -> None:
    """n2 goes DOWN while its stand-in loads, after n1 has sent its report (Slurm may end the whole
    step on a node failure: what a node had sent stays): n1 passed, n2 is unreachable with srun's
    words about it; the allocation (asked for with --no-kill) is released, no process is left."""
    fleet.node("n1")
    fleet.node("n2", load_s=120.0)
    process = fleet.stackgate(
        "fleet", "gate", *fleet.slurm_args(), "--nodelist", "n[1-2]", "--json", str(tmp_path / "f.json"), popen=True
    )
    try:
        events = fleet.home / "n2" / "events.jsonl"
        wait_for(lambda: events.exists() and '"started"' in events.read_text(), 90)
        # n1's task removes its folder right after printing its report
        wait_for(
            lambda: list((fleet.home / "n1" / "runs").glob("*.json")) and not any(fleet.cluster.local("n1").iterdir()),
            90,
        )
        fleet.cluster.run("scontrol", "update", "nodename=n2", "state=down", "reason=lost power")
        out, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == ExitCode.FAILED, out + err
    nodes = by_name(json.loads((tmp_path / "f.json").read_text()))
    assert statuses(nodes) == {"n1": "passed", "n2": "unreachable"}, {n: v["reason"] for n, v in nodes.items()}
    assert nodes["n2"]["reason"] == "the node's task did not start or was lost: srun: error: Node failure on n2"
    assert nodes["n1"]["stages"]["benchmark"] == "passed"
    # Slurm killed n2's processes; its task could not clean up, so its folder stays (as over SSH, a
    # node that went away keeps a folder in its temp dir): removed here, after the check
    wait_for(lambda: [k for k in fleet.left_behind() if k != "n2"] == [], 30)
    (left,) = fleet.cluster.local("n2").iterdir()
    assert left.name.startswith("stackgate-fleet.")
    shutil.rmtree(left)
    wait_for(lambda: stand_in_pids(fleet.home / "n2" / "events.jsonl") == [], 30)
    gates = [int(line.split()[0]) for line in fleet.started.read_text().splitlines()]
    wait_for(lambda: living(gates) == [], 30)


def test_what_a_node_prints_is_kept_up_to_a_cap(
    fleet: SlurmFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A one-task step (SrunTransport, fleet provision/upgrade) printing 48 MiB: the first and last
    half MiB are kept with a line saying how much was left out; a node whose `stackgate --version`
    prints 32 MiB sends back 4 KiB of it (the task's own cap) and fails with that."""
    from stackgate.edges import slurm
    from stackgate.models.inventory import Node

    monkeypatch.setenv("SLURM_CONF", str(fleet.cluster.conf))
    allocation = slurm.allocate(["n1"], None, None, None, ())
    try:
        session = slurm.SrunTransport(allocation).connect(Node(name="n1", host="n1", port=0, engine="slurm"))
        done = session.run("head -c 50331648 /dev/zero | tr '\\0' x; echo; echo the end", timeout_s=120)
    finally:
        slurm.release(allocation)
    assert done.returncode == 0 and done.cut == (48 << 20) + len("\nthe end\n") - (1 << 20)
    assert len(done.stdout) < (1 << 20) + 200 and done.stdout.endswith("x\nthe end\n")
    assert f"[stackgate: {done.cut} bytes of output left out here: over the cap of 1048576 bytes kept]" in done.stdout
    loud = tmp_path / "loud.sh"
    loud.write_text("#!/bin/sh\nhead -c 33554432 /dev/zero | tr '\\0' x\n")
    loud.chmod(0o755)
    argv = ["--engine", "slurm", "--stackgate", str(loud), "--node-dir", str(NODE_LOCAL), "--lock", str(fleet.spec)]
    ran = fleet.stackgate("fleet", "verify", *argv, "--nodelist", "n2", "--json", str(tmp_path / "v.json"))
    assert ran.returncode == ExitCode.FAILED, ran.stdout + ran.stderr
    (node,) = json.loads((tmp_path / "v.json").read_text())["nodes"]
    assert (
        node["status"] == "failed"
        and node["reason"]
        == f"the node has {'x' * 4096}, this controller stackgate "
        + node["reason"].split("this controller stackgate ")[1]
    )
    wait_for(lambda: fleet.left_behind() == {}, 20)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_the_allocation_is_pending_cancels_the_request(fleet: SlurmFleet, signum: int) -> None:
    """Every node is busy with another job, so `fleet verify --nodes 2` waits in Slurm's queue: it
    says so, with Slurm's reason; a signal then ends it (exit 130) and its request is cancelled,
    not left PENDING to be granted later."""
    cluster: Cluster = fleet.cluster
    blocker = ["sbatch", "--parsable", "-N4", "--job-name=blocker", "--output=/dev/null", "--wrap", "sleep 300"]
    job = cluster.run(*blocker).stdout.strip()
    try:
        wait_for(lambda: cluster.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "RUNNING", 30)
        process = fleet.stackgate("fleet", "verify", *fleet.slurm_args(), "--nodes", "2", "-c", "gpu.*", popen=True)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)
        reader.start()
        try:
            wait_for(lambda: any("queued: Slurm job" in line for line in lines), 60)
            process.send_signal(signum)
            process.wait(60)
        finally:
            process.kill()
        reader.join(10)
        queued = next(line for line in lines if "queued: Slurm job" in line)
        assert "is pending (Resources); waiting for the allocation (Ctrl-C cancels it)" in queued, queued
        assert process.returncode == ExitCode.INTERRUPTED, "".join(lines)
        names = lambda: cluster.run("squeue", "-h", "-o", "%j").stdout.split()  # noqa: E731
        wait_for(lambda: names() == ["blocker"], 20)
    finally:
        left = cluster.run("squeue", "-h", "-o", "%i").stdout.split()
        cluster.run("scancel", *left, check=False)


def test_the_specs_gpus_per_node_and_container_reach_salloc_and_srun(fleet: SlurmFleet, tmp_path: Path) -> None:
    """The spec's `[slurm] gpus_per_node = 1`: the allocation asks for n1's GPU (Slurm's record of the
    job says so) and the step runs with it, so the gate judges the GPUs a job would own. With a
    `container_image` the step is `srun --container-image=...`: pyxis cannot be installed here, so
    this Slurm refuses the flag, and the node's failure quotes srun refusing exactly that argument."""
    fleet.node("n1")
    text = fleet.spec.read_text()
    fleet.spec.write_text(text + "\n[slurm]\ngpus_per_node = 1\n")
    argv = [*fleet.slurm_args(), "--nodelist", "n1", "-c", "gpu.*", "--json", str(tmp_path / "v.json")]
    done = fleet.stackgate("fleet", "verify", *argv)
    assert done.returncode == ExitCode.PASSED, done.stdout + done.stderr
    job = json.loads((tmp_path / "v.json").read_text())["engine"]["job_id"]
    shown = fleet.cluster.run("scontrol", "show", "job", job).stdout
    assert "TresPerNode=gres:gpu:1" in shown, shown
    image = "nvcr.io#nvidia/pytorch:25.01-py3"
    fleet.spec.write_text(text + f'\n[slurm]\ngpus_per_node = 1\ncontainer_image = "{image}"\n')
    done = fleet.stackgate("fleet", "verify", *argv)
    assert done.returncode == ExitCode.FAILED, done.stdout + done.stderr
    reason = by_name(json.loads((tmp_path / "v.json").read_text()))["n1"]["reason"]
    assert f"--container-image={image}" in reason, reason
    for sent in fleet.cluster.local("n1").glob(
        "stackgate-fleet.*"
    ):  # sbcast's copies: the refused step never took them
        sent.unlink()
    wait_for(lambda: fleet.left_behind() == {}, 20)


def test_the_shipped_sbatch_script_waits_in_the_queue_and_reports_how_long(fleet: SlurmFleet, tmp_path: Path) -> None:
    """stackgate/slurm/stackgate-fleet.sbatch on n1 and n2, submitted while another job holds n1 (until
    the test lets it end, 2 s after the script's job is seen pending): the job waits, then judges its
    nodes in one step, and the report's engine part gives the queue wait from Slurm's record."""
    for name in ("n1", "n2"):
        fleet.node(name)
    let_go = tmp_path / "let-go"
    hold = f"while [ ! -e {let_go} ]; do sleep 0.2; done"
    fleet.cluster.run("sbatch", "--parsable", "-w", "n1", "--output=/dev/null", "--wrap", hold)
    program = tmp_path / "stackgate"
    # the batch step gets n1's environment from the cluster's TaskProlog: the checkout is named here
    program.write_text(f'#!/bin/sh\nPYTHONPATH={CODE}:$PYTHONPATH exec {sys.executable} -m stackgate "$@"\n')
    program.chmod(0o755)
    env = {
        **fleet.cluster.env,
        "PYTHONPATH": f"{CODE}{os.pathsep}{TESTS}",
        "NO_COLOR": "1",
        "STACKGATE": str(program),
        "STACKGATE_ACTION": "verify",
        "STACKGATE_JSON": str(tmp_path / "v.json"),
        "STACKGATE_HISTORY_DIR": str(tmp_path / "runs"),
    }
    script = ROOT / "stackgate" / "slurm" / "stackgate-fleet.sbatch"
    argv = ["sbatch", "--parsable", "-N", "2", "-w", "n1,n2", f"--output={tmp_path / 'out'}", f"--chdir={tmp_path}"]
    argv += [str(script), str(fleet.spec), "--stackgate", str(fleet.program), "--node-dir", str(NODE_LOCAL)]
    job = subprocess.run([*argv, "-c", "gpu.*"], env=env, capture_output=True, text=True, check=True).stdout.strip()
    wait_for(lambda: fleet.cluster.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "PENDING", 30)
    threading.Event().wait(2.0)  # the queue wait the report must show: at least this long
    let_go.touch()
    wait_for(lambda: fleet.cluster.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "", 180)
    out = (tmp_path / "out").read_text()
    doc = json.loads((tmp_path / "v.json").read_text())
    assert doc["verdict"] == "passed" and statuses(by_name(doc)) == {"n1": "passed", "n2": "passed"}, out
    engine = doc["engine"]
    assert engine["job_id"] == job and engine["allocated_here"] is False, engine
    assert engine["queue_wait_s"] >= 1, engine
    assert f"Slurm job {job}: waited {engine['queue_wait_s']:.0f} s in the queue" in out, out
    wait_for(lambda: fleet.left_behind() == {}, 20)
