"""`stackgate fleet`: against real OpenSSH servers on loopback ports, each a node.

The fleet: three good nodes (``a``, ``b``, ``c``), a slow one (``d``: the stand-in decodes at
half the speed: an outlier that still passes the spec's floor), a drifted one (``drift``: its
stack interpreter holds one more distribution: another fingerprint), one that cannot be reached
(``down``: a closed port), one that refuses the key (``denied``), and one that hangs (``slow``:
its stackgate sleeps; its timeout is three seconds).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import exposition
import pytest
from fleet_support import (
    TESTS,
    VERIFIABLE,
    Sshd,
    behaviour,
    fleet_spec,
    keygen,
    make_venv,
    node_wrapper,
    nvml_file,
    stand_in_pids,
    why_no_sshd,
)
from smoke_support import FAKES, ROOT, free_port, living, wait_for
from support import run_program

from stackgate.models.exitcodes import ExitCode

pytestmark = pytest.mark.skipif(why_no_sshd() is not None, reason=why_no_sshd() or "")


def fleet_env(home: Path, python: Path, port: int, events: Path, runs: Path, **behave: object) -> dict[str, str]:
    return {
        # not the checkout itself: the node's stack interpreter inherits this, and a checkout
        # installed with `pip install -e` holds stackgate.egg-info, a distribution it would see
        # (fleet_node.py puts the checkout first on its own sys.path instead)
        "PYTHONPATH": f"{TESTS}{os.pathsep}{FAKES}",
        "STACKGATE_NVML_MODULE": "fakes.fake_nvml",
        "STACKGATE_FAKE_NVML": str(nvml_file(home / "nvml.json")),
        "STACKGATE_FAKE_SGLANG": str(behaviour(home / "behaviour.json", events, **behave)),
        "STACKGATE_HISTORY_DIR": str(runs),
        "STACKGATE_LOG_DIR": str(home / "logs"),
        "STACKGATE_DEEP_DIR": str(home / "deep"),
        "FLEET_NODE_PORT": str(port),
        "FLEET_NODE_INTERPRETER": str(python),
        "FLEET_NODE_CHECKS": ",".join(VERIFIABLE),
        "NO_COLOR": "1",
    }


class Fleet:
    """The loopback nodes, their keys, known_hosts and the inventory that names them."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.key = keygen(home / "user_ed25519")
        self.stranger = keygen(home / "stranger_ed25519")
        self.authorized = home / "authorized_keys"
        self.authorized.write_text((home / "user_ed25519.pub").read_text())
        self.model = home / "model"
        self.model.mkdir()
        (self.model / "config.json").write_text(
            json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 4})
        )
        self.python = make_venv(home / "stack")
        self.drifted_python = make_venv(home / "stack-drift", {"flashinfer-python": "0.6.3"})
        self.spec = fleet_spec(home / "fleet.toml", self.model, self.python)
        self.servers: dict[str, Sshd] = {}
        self.entries: list[dict[str, object]] = []
        self.started = home / "started"

    def node(self, name: str, *, python: Path | None = None, hang: bool = False, **behave: object) -> Sshd:
        home = self.home / name
        home.mkdir()
        server = Sshd(home, self.authorized).start()
        self.servers[name] = server
        env = fleet_env(
            home,
            python or self.python,
            free_port(),
            home / "events.jsonl",
            home / "runs",
            **{"rate": 400.0, "load_s": 0.2, **behave},
        )
        program = node_wrapper(home / "stackgate", env, hang=hang, started=self.started)
        self.entries.append(
            {"name": name, "port": server.port, "stackgate": str(program), **({"timeout_s": 3} if hang else {})}
        )
        return server

    def server(self, name: str) -> Sshd:
        """An sshd alone (in known_hosts, with the fleet's authorized key), for a node that is never logged into."""
        home = self.home / name
        home.mkdir()
        self.servers[name] = Sshd(home, self.authorized).start()
        return self.servers[name]

    def inventory(self, *entries: dict[str, object]) -> Path:
        known = self.home / "known_hosts"
        known.write_text("".join(s.known_hosts_line() + "\n" for s in self.servers.values()))
        lines = [
            "[fleet]",
            f'user = "{os.environ.get("USER") or "root"}"',
            f'identity = "{self.key}"',
            f'known_hosts = "{known}"',
            "connect_timeout_s = 5",
            "",
        ]
        for entry in [*self.entries, *entries]:
            lines += ["[[node]]", 'host = "127.0.0.1"', *(f"{k} = {json.dumps(v)}" for k, v in entry.items()), ""]
        path = self.home / "inventory.toml"
        path.write_text("\n".join(lines))
        return path

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()


def stackgate(*args: str, history: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return run_program(*args, env={"STACKGATE_HISTORY_DIR": str(history)}, timeout=timeout)


def test_a_fleet_gate_over_loopback_nodes(tmp_path):
    """One `stackgate fleet gate` over the whole loopback fleet (the module's docstring), then
    what it found, each part by a function below: one fleet run, read by each (a pytest-xdist
    worker per test would build the fleet again in each)."""
    home = tmp_path
    fleet = Fleet(home)
    try:
        for name in ("a", "b", "c"):
            fleet.node(name)
        fleet.node("d", rate=200.0)
        fleet.node("drift", python=fleet.drifted_python)
        fleet.node("slow", hang=True)
        inventory = fleet.inventory(
            {"name": "down", "port": free_port()},
            {
                "name": "denied",
                "port": fleet.server("denied").port,
                "identity": str(fleet.stranger),
                "stackgate": "stackgate",
            },
        )
        out = home / "report"
        done = stackgate(
            "fleet",
            "gate",
            "--inventory",
            str(inventory),
            "--lock",
            str(fleet.spec),
            "--parallel",
            "8",
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
            history=home / "controller-runs",
        )
        gated = (fleet, done, json.loads(Path(f"{out}.json").read_text()), out)
        for part in (
            the_fleet_verdict_and_each_node,
            the_groups_name_the_drifted_node_and_what_differs,
            the_outlier_is_named_with_both_numbers,
        ):
            part(gated)
        every_report_format_says_the_same(gated)
        each_node_run_is_kept_in_the_controller_history_and_nothing_is_left(gated)
    finally:
        fleet.stop()


def nodes(doc: dict) -> dict[str, dict]:
    return {n["name"]: n for n in doc["nodes"]}


def the_fleet_verdict_and_each_node(gated) -> None:
    fleet, done, doc, _ = gated
    assert done.returncode == ExitCode.FAILED, done.stdout + done.stderr
    by = nodes(doc)
    assert {name: n["status"] for name, n in by.items()} == {
        "a": "passed",
        "b": "passed",
        "c": "passed",
        "d": "passed",
        "drift": "passed",
        "slow": "timed out",
        "down": "unreachable",
        "denied": "unreachable",
    }
    assert by["a"]["stages"] == dict.fromkeys(["lock", "environment", "verify", "fast_smoke", "benchmark"], "passed")
    assert by["a"]["version"] == by["d"]["version"] and by["a"]["version"] is not None
    assert by["down"]["reason"] == f"{by['down']['address']}: cannot connect: Connection refused"
    assert "Authentication failed" in by["denied"]["reason"]
    assert by["slow"]["reason"] == "timed out: the node's run took longer than its 3 s"
    assert doc["reason"].startswith("3 of 8 node(s) did not pass: ")
    assert doc["shipped"] == {"fleet.toml": __import__("hashlib").sha256(fleet.spec.read_bytes()).hexdigest()}


def the_groups_name_the_drifted_node_and_what_differs(gated) -> None:
    _, done, doc, _ = gated
    stacks = [g for g in doc["groups"] if g["digest"]]
    assert [(g["nodes"], g["majority"]) for g in stacks] == [(["a", "b", "c", "d"], True), (["drift"], False)]
    assert stacks[1]["differences"] == {
        "drift": [{"section": "distributions", "name": "flashinfer-python", "majority": None, "node": "0.6.3"}]
    }
    assert ["down", "denied", "slow"] == sorted(
        doc["groups"][-1]["nodes"], key=["down", "denied", "slow"].index
    ) and doc["groups"][-1]["digest"] is None
    assert f"stack {stacks[1]['short']} (differs): drift" in done.stdout
    assert "    distributions: flashinfer-python: (none) -> 0.6.3" in done.stdout


def the_outlier_is_named_with_both_numbers(gated) -> None:
    _, done, doc, _ = gated
    (outlier,) = doc["outliers"]
    assert outlier["node"] == "d" and outlier["metric"] == "decode_tok_s"
    assert outlier["value"] == pytest.approx(200.0, rel=0.15) and outlier["median"] == pytest.approx(400.0, rel=0.15)
    assert f"outlier d: decode {outlier['value']:.2f} tok/s, fleet median {outlier['median']:.2f} tok/s" in done.stdout


def every_report_format_says_the_same(gated) -> None:
    _, _, doc, out = gated
    families = exposition.parse(Path(f"{out}.prom").read_text())
    assert families["stackgate_fleet_passed"].value(lock="fleetstack") == 0
    assert families["stackgate_fleet_node_passed"].value(lock="fleetstack", node="a") == 1
    assert families["stackgate_fleet_node_majority_stack"].value(lock="fleetstack", node="drift") == 0
    assert families["stackgate_fleet_outlier"].value(lock="fleetstack", node="d", metric="decode_tok_s") == 1
    suites = {s.attrib["name"]: s for s in ET.parse(f"{out}.xml").getroot().findall("testsuite")}
    assert (
        suites["stackgate.fleet.a"].attrib["failures"] == "0"
        and suites["stackgate.fleet.down"].attrib["failures"] == "1"
    )
    assert suites["stackgate.fleet"].attrib["failures"] == "1"  # two stacks
    markdown = Path(f"{out}.md").read_text()
    assert (
        markdown.startswith("## ❌ stackgate fleet gate: FAILED\n")
        and "| drift | passed |" in markdown
        and "- d: decode " in markdown
    )
    page = Path(f"{out}.html").read_text()
    assert "<script" not in page and "drift" in page and doc["reason"].split(":")[0] in page


def each_node_run_is_kept_in_the_controller_history_and_nothing_is_left(gated) -> None:
    fleet, _, doc, _ = gated
    kept = [json.loads(p.read_text()) for p in sorted((fleet.home / "controller-runs").glob("*.json"))]
    assert sorted(k["fleet"]["node"] for k in kept) == ["a", "b", "c", "d", "drift"]
    assert {k["fleet"]["fleet_run_id"] for k in kept} == {doc["run_id"]}
    listing = stackgate("report", history=fleet.home / "controller-runs")
    assert listing.returncode == 0 and len([line for line in listing.stdout.splitlines() if "-gate-" in line]) == 5, (
        listing.stdout + listing.stderr
    )
    for name in ("a", "b", "c", "d", "drift", "slow"):
        assert stand_in_pids(fleet.home / name / "events.jsonl") == []
    slow = [int(line.split()[0]) for line in fleet.started.read_text().splitlines() if line.split()[1:2] == ["gate"]]
    assert slow and living(slow) == []  # every node's gate ended, the hung one's process group killed


def test_ctrl_c_stops_every_remote_run_and_still_writes_the_report(tmp_path):
    """Ctrl-C while both nodes' stand-ins load their weights: each remote process group gets
    SIGTERM over a fresh connection, each node's gate tears its server down and writes its report,
    the fleet report says interrupted, the exit is 130, and no process is left on any node."""
    fleet = Fleet(tmp_path)
    try:
        for name in ("a", "b"):
            fleet.node(name, load_s=120.0)
        inventory = fleet.inventory()
        env = {
            **os.environ,
            "PYTHONPATH": f"{ROOT}{os.pathsep}{TESTS}",
            "NO_COLOR": "1",
            "STACKGATE_HISTORY_DIR": str(tmp_path / "controller-runs"),
        }
        argv = [
            sys.executable,
            "-m",
            "stackgate",
            "fleet",
            "gate",
            "--inventory",
            str(inventory),
            "--lock",
            str(fleet.spec),
            "--json",
            str(tmp_path / "fleet.json"),
        ]
        process = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        try:
            events = [tmp_path / name / "events.jsonl" for name in ("a", "b")]
            wait_for(lambda: all(e.exists() and '"started"' in e.read_text() for e in events), 60)
            process.send_signal(signal.SIGINT)
            _, err = process.communicate(timeout=90)
        finally:
            process.kill()
        assert process.returncode == ExitCode.INTERRUPTED and "stackgate: interrupted" in err
        doc = json.loads((tmp_path / "fleet.json").read_text())
        assert doc["interrupted"] is True and doc["exit_code"] == 130
        by = nodes(doc)
        assert {n["status"] for n in by.values()} == {"interrupted"}
        assert by["a"]["stages"]["fast_smoke"] == "interrupted"  # the node's own report, written as its gate stopped
        for name in ("a", "b"):
            assert stand_in_pids(tmp_path / name / "events.jsonl") == []
        gates = [int(line.split()[0]) for line in fleet.started.read_text().splitlines()]
        wait_for(lambda: living(gates) == [], 10)
    finally:
        fleet.stop()


def test_fleet_verify_runs_the_named_checks_on_every_node(tmp_path):
    fleet = Fleet(tmp_path)
    try:
        for name in ("a", "b"):
            fleet.node(name)
        done = stackgate(
            "fleet",
            "verify",
            "--inventory",
            str(fleet.inventory()),
            "--lock",
            str(fleet.spec),
            "-c",
            "gpu.*",
            "--json",
            str(tmp_path / "v.json"),
            history=tmp_path / "runs",
        )
        assert done.returncode == ExitCode.PASSED, done.stdout + done.stderr
        doc = json.loads((tmp_path / "v.json").read_text())
        assert doc["command"] == "fleet verify" and {n["status"] for n in doc["nodes"]} == {"passed"}
        assert doc["reason"] == "2 node(s) passed" and all(
            n["counts"]["PASS"] >= 1 and n["counts"].get("FAIL", 0) == 0 for n in doc["nodes"]
        )
        assert not list((tmp_path / "runs").glob("*.json"))  # verify runs are not kept, here as on one node
    finally:
        fleet.stop()


def test_fleet_verify_names_the_failed_checks_of_each_node(tmp_path):
    """A node whose fake NVML shows two H200s where the spec wants one: its failed check and the
    check's own reason reach the console, the JSON and the Markdown report."""
    from fakes.fake_nvml import gpu, machine

    fleet = Fleet(tmp_path)
    try:
        fleet.node("a")
        fleet.node("two")
        h200 = gpu("NVIDIA H200", (9, 0), memory=[141 * 2**30, 2**20])
        (tmp_path / "two" / "nvml.json").write_text(
            json.dumps(machine([h200, gpu("NVIDIA H200", (9, 0), uuid="GPU-0001", memory=[141 * 2**30, 2**20])]))
        )
        out = tmp_path / "v"
        done = stackgate(
            "fleet",
            "verify",
            "--inventory",
            str(fleet.inventory()),
            "--lock",
            str(fleet.spec),
            "-c",
            "gpu.*",
            "--json",
            f"{out}.json",
            "--markdown",
            f"{out}.md",
            history=tmp_path / "runs",
        )
        assert done.returncode == ExitCode.FAILED, done.stdout + done.stderr
        two = nodes(json.loads(Path(f"{out}.json").read_text()))["two"]
        (count,) = [c for c in two["failed_checks"] if c["check"] == "gpu.count"]
        assert count["status"] == "FAIL" and "2" in count["summary"] and "gpu.count" in two["reason"]
        assert (
            f"two: {len(two['failed_checks'])} check(s) failed:" in done.stdout
            and f"  gpu.count FAIL: {count['summary']}" in done.stdout
        )
        assert f"  gpu.count FAIL: {count['summary']}" in Path(f"{out}.md").read_text()
    finally:
        fleet.stop()


def test_a_node_that_answers_with_a_flood_costs_the_controller_a_capped_buffer(tmp_path):
    """A node whose `stackgate --version` prints 128 MiB: the controller keeps the first and last
    half MiB of it (edges/ssh.py's cap), the node fails saying its output was cut, and the
    controller's peak memory stays far below what the node sent (it held all of it before)."""
    fleet = Fleet(tmp_path)
    try:
        loud = tmp_path / "loud.sh"
        loud.write_text("#!/bin/sh\nhead -c 134217728 /dev/zero | tr '\\0' x\necho\n")
        loud.chmod(0o755)
        port = fleet.server("loud").port
        inventory = fleet.inventory({"name": "loud", "port": port, "stackgate": str(loud)})
        argv = ["fleet", "verify", "--inventory", str(inventory), "--lock", str(fleet.spec)]
        argv += ["--json", str(tmp_path / "f.json")]
        measure = (
            "import resource, subprocess, sys; subprocess.run(sys.argv[1:]); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
        )
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{TESTS}", "NO_COLOR": "1"}
        env["STACKGATE_HISTORY_DIR"] = str(tmp_path / "runs")
        done = subprocess.run(
            [sys.executable, "-c", measure, sys.executable, "-m", "stackgate", *argv],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        fleet.stop()
    peak_kib = int(done.stdout.split()[-1])
    assert peak_kib < 128 * 1024, f"the controller's peak RSS: {peak_kib} KiB"
    (node,) = json.loads((tmp_path / "f.json").read_text())["nodes"]
    assert node["status"] == "failed" and node["reason"].startswith(f"`{loud} --version` on the node: exit 0: "), node
    assert node["reason"].endswith(
        f"(its output was cut: {(128 << 20) + 1 - (1 << 20)} bytes left out, the first and last part kept)"
    ), node["reason"]
