"""The fleet controller above its transport: the inventory as hostile input, the version and
sha256 checks, rolling provision, and the aggregation (groups, outliers), with simulated nodes
(tests/fleet_sim.py) at the transport edge. Real SSH: tests/test_fleet.py."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fleet_sim import SimNode, SimTransport, rollbacks
from smoke_support import ROOT

from stackgate.commands import fleet
from stackgate.flows.fleetrequest import MAX_NODES, FleetRequest, nodes_of
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.models.inventory import parse_hosts, parse_inventory
from stackgate.models.spec import SpecError
from stackgate.render.ui import UI
from stackgate.runs import aggregate

LOCK = ROOT / "lockfiles" / "blackwell-sm120-cu128.toml"  # a spec with a pylock beside it: both are shipped


def run(action: str, names: list[str], sims: dict[str, SimNode], tmp_path: Path, **request: object) -> tuple[int, dict]:
    out = tmp_path / "fleet.json"
    chosen = FleetRequest(action=action, hosts=",".join(names), spec_path=LOCK, json_path=out, **request)  # type: ignore[arg-type]
    code = fleet.run(chosen, UI(stream=io.StringIO(), force_plain=True), SimTransport(sims))
    return code, json.loads(out.read_text())


def statuses(doc: dict) -> dict[str, str]:
    return {n["name"]: n["status"] for n in doc["nodes"]}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('[[node]]\nhost = "a"\nport = 70000\n', "node[0].port: port 70000 is not a port number (1-65535)"),
        (
            '[[node]]\nhost = "-oProxyCommand=touch /tmp/x"\n',
            "node[0].host: '-oProxyCommand=touch /tmp/x' is not a host name or address",
        ),
        (
            '[[node]]\nhost = "a"\nstackgate = "stackgate; rm -rf /"\n',
            "node[0].stackgate: 'stackgate; rm -rf /' is not a program path",
        ),
        ('[[node]]\nhost = "a"\nprot = 22\n', "node[0].prot: unknown key (did you mean 'port'?)"),
        ('[fleet]\ntimeout_s = -1\n[[node]]\nhost = "a"\n', "fleet.timeout_s: -1 is not a number of seconds above 0"),
        ('[[node]]\nhost = "a"\n[[node]]\nhost = "a"\n', "node: the node name 'a' is given twice"),
        ('[fleet]\nuser = "ops"\n', "node: no [[node]] table"),
        ("[[node]\n", "not valid TOML"),
        ('[[node]]\nhost = "a"\nname = "a b"\n', "node[0].name: 'a b' is not a node name"),
        (
            '[[node]]\nhost = "127.0.0.1:65536"\n',
            "node[0].host: '127.0.0.1:65536' is not a host name or address (a colon makes it an IPv6",
        ),
        ('[[node]]\nhost = ":"\n', "node[0].host: ':' is not a host name or address (a colon makes it an IPv6 address"),
        (
            '[[node]]\nhost = "1:2:3:4:5:6:7:8:9:10"\n',
            "node[0].host: '1:2:3:4:5:6:7:8:9:10' is not a host name or address",
        ),
        ('[[node]]\nhost = "[10.0.0.1]"\n', "node[0].host: '[10.0.0.1]' is not a host name or address"),
        (
            '[[node]]\nhost = "10.0.0.256"\n',
            "node[0].host: '10.0.0.256' is not a host name or address (digits and dots make it an IPv4",
        ),
        ('[[node]]\nhost = "a..b"\n', "node[0].host: 'a..b' is not a host name or address (a host name is labels"),
        (
            '[[node]]\nname = "a"\nhost = "10.0.0.1"\n[[node]]\nname = "b"\nhost = "10.0.0.1"\nport = 22\n',
            "node: 'b' has the address 10.0.0.1:22 of 'a' (the same node twice)",
        ),
        (
            '[[node]]\nname = "a"\nhost = "fe80::1"\n[[node]]\nname = "b"\nhost = "[FE80:0::1]"\n',
            "node: 'b' has the address FE80:0::1:22 of 'a' (the same node twice)",
        ),
    ],
)
def test_a_hostile_inventory_is_refused_naming_the_key(text, problem):
    with pytest.raises(UsageError) as caught:
        parse_inventory(text, "fleet.toml")
    assert problem in str(caught.value) and str(caught.value).startswith("fleet.toml: ")


def test_host_forms_are_judged_as_text_never_looked_up(monkeypatch):
    def no_dns(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a DNS lookup of {args[0]!r} while reading the nodes")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    monkeypatch.setattr(socket, "gethostbyname", no_dns)
    for bad, why in (
        ("1:2:3:4:5:6:7:8:9:10", "IPv6"),
        ("127.0.0.1:65536", "port"),
        (":", "no host"),
        ("a,b,A", "twice"),
    ):
        with pytest.raises(UsageError) as caught:
            parse_hosts(bad)
        assert caught.value.args[0].startswith("--hosts: "), why
    assert [n.address for n in parse_hosts("gpu-01.example,10.0.0.1:2222,[fe80::1]:22")] == [
        "gpu-01.example:22",
        "10.0.0.1:2222",
        "fe80::1:22",
    ]


def test_more_nodes_than_the_cap_are_refused_before_any_is_dialled(tmp_path):
    sims: dict[str, SimNode] = {}
    many = ",".join(f"n{i}" for i in range(MAX_NODES + 1))
    request = FleetRequest(action="gate", hosts=many, spec_path=LOCK, json_path=tmp_path / "fleet.json")
    with pytest.raises(
        UsageError,
        match=rf"^fleet: {MAX_NODES + 1} nodes, more than {MAX_NODES} \(--max-nodes\): nothing was dialled",
    ):
        fleet.run(request, UI(stream=io.StringIO(), force_plain=True), SimTransport(sims))
    assert sims == {} and not (tmp_path / "fleet.json").exists()
    raised = dataclasses.replace(request, max_nodes=MAX_NODES + 1)
    assert len(nodes_of(raised)) == MAX_NODES + 1


def test_an_inventory_sets_defaults_and_each_node_overrides_them(tmp_path):
    nodes = parse_inventory(
        (
            '[fleet]\nuser = "ops"\nport = 2222\nidentity = "keys/id"\n[[node]]\nhost = "10.0.0.1"\n[[node]]\nname = '
            '"g2"\nhost '
            '= "h2"\nport = 22\n'
        ),
        base=tmp_path,
    )
    assert [(n.name, n.address, n.identity) for n in nodes] == [
        ("10.0.0.1", "ops@10.0.0.1:2222", tmp_path / "keys" / "id"),
        ("g2", "ops@h2:22", tmp_path / "keys" / "id"),
    ]
    assert [n.address for n in parse_hosts("a,root@b:2200,[::1]:22")] == ["a:22", "root@b:2200", "::1:22"]


def test_a_bad_inventory_on_the_command_line_exits_2_before_connecting(tmp_path):
    from test_fleet import stackgate  # the program in a subprocess, as a user runs it

    bad = tmp_path / "fleet.toml"
    bad.write_text('[[node]]\nhost = "a"\nport = "x"\n')
    done = stackgate("fleet", "gate", "--inventory", str(bad), "--lock", str(LOCK), history=tmp_path / "runs")
    assert (
        done.returncode == ExitCode.USAGE
        and "node[0].port: port 'x' is not a port number" in done.stderr
        and "Traceback" not in done.stderr
    )
    both = stackgate("fleet", "verify", "--hosts", "a", "--inventory", str(bad), history=tmp_path / "runs")
    assert both.returncode == ExitCode.USAGE and "one of them" in both.stderr
    assert "  fix: stackgate fleet verify --hosts gpu01,gpu02" in both.stderr
    unknown = stackgate("fleet", "deploy", "--hosts", "a", history=tmp_path / "runs")
    assert unknown.returncode == ExitCode.USAGE and "unknown action 'deploy'" in unknown.stderr
    typo = stackgate("fleet", "verfy", "--hosts", "a", history=tmp_path / "runs")
    assert typo.returncode == ExitCode.USAGE and "unknown action 'verfy': did you mean verify?" in typo.stderr
    for flags, said in (
        (["--parallel", "x"], "--parallel 'x': not a whole number"),
        (["--timeout", "0"], "--timeout '0': must be a number of seconds above 0"),
    ):
        done = stackgate("fleet", "gate", "--hosts", "a", *flags, history=tmp_path / "runs")
        assert done.returncode == ExitCode.USAGE and said in done.stderr and "Traceback" not in done.stderr


def test_another_version_on_a_node_or_a_damaged_spec_fails_that_node_only(tmp_path):
    sims = {"old": SimNode(version="0.0.9"), "bent": SimNode(corrupt=True), "down": SimNode(reachable=False)}
    code, doc = run("gate", ["ok1", "ok2", "old", "bent", "down"], sims, tmp_path)
    assert code == ExitCode.FAILED
    by = {n["name"]: n for n in doc["nodes"]}
    assert statuses(doc) == {"ok1": "passed", "ok2": "passed", "old": "failed", "bent": "failed", "down": "unreachable"}
    assert by["old"]["reason"].startswith("the node has stackgate 0.0.9, this controller ")
    assert by["bent"]["reason"].startswith("blackwell-sm120-cu128.toml arrived damaged: sha256 ")
    assert sorted(doc["shipped"]) == ["blackwell-sm120-cu128.toml", "pylock.blackwell-sm120-cu128.toml"]
    assert not any("setsid" in c for c in sims["old"].calls)  # nothing ran on a node of another version


def test_rolling_provision_stops_at_the_first_failed_batch_and_rolls_that_node_back(tmp_path):
    sims = {f"n{i}": SimNode() for i in range(1, 8)}
    sims["n4"] = SimNode(gate_exit=1)
    code, doc = run("provision", list(sims), sims, tmp_path, batch=2)
    assert code == ExitCode.FAILED
    assert statuses(doc) == {
        "n1": "passed",
        "n2": "passed",
        "n3": "passed",
        "n4": "failed",
        "n5": "not run",
        "n6": "not run",
        "n7": "not run",
    }
    steps = {n["name"]: n["steps"] for n in doc["nodes"]}
    assert (
        steps["n1"] == ["provisioned", "gated"]
        and steps["n4"] == ["provisioned", "gate failed", "rolled back"]
        and steps["n5"] == []
    )
    assert [rollbacks(sims[n]) for n in sims] == [0, 0, 0, 1, 0, 0, 0]
    assert not sims["n5"].calls  # never touched
    assert "an earlier batch failed (n4)" in {n["name"]: n for n in doc["nodes"]}["n6"]["reason"]


def test_a_failed_provision_is_not_rolled_back_nothing_moved(tmp_path):
    sims = {"a": SimNode(provision_exit=1), "b": SimNode()}
    code, doc = run("provision", ["a", "b"], sims, tmp_path)
    assert code == ExitCode.FAILED and statuses(doc) == {"a": "failed", "b": "not run"}
    assert doc["nodes"][0]["steps"] == ["provision failed"] and rollbacks(sims["a"]) == 0


def test_groups_and_outliers_across_simulated_nodes(tmp_path):
    sims = {f"n{i}": SimNode(rate=92.6 + i * 0.05) for i in range(6)}
    sims["n5"] = SimNode(rate=61.0)
    sims["n2"] = SimNode(distributions={"torch": "2.10.0", "sglang": "0.5.9", "flashinfer-python": "0.6.4"})
    code, doc = run("gate", list(sims), sims, tmp_path)
    assert code == ExitCode.FAILED and doc["reason"].startswith(
        "the nodes run 2 different stacks: n2 differs from the majority "
    )
    assert doc["groups"][1]["differences"] == {
        "n2": [{"section": "distributions", "name": "torch", "majority": "2.9.1+cu130", "node": "2.10.0"}]
    }
    assert [(o["node"], o["metric"]) for o in doc["outliers"]] == [("n5", "decode_tok_s")]


def test_a_node_that_failed_before_smoke_differs_by_one_line_not_by_every_server_argument(tmp_path):
    """Its report has no /server_info: the stack diff leaves out the ~210 server arguments it never
    measured (one line says it was not measured), and still names what it did measure."""
    sims = {"n1": SimNode(), "n2": SimNode(), "n3": SimNode(gate_exit=1, smoked=False)}
    sims["n3"].distributions["torch"] = "2.10.0"
    out, console = tmp_path / "fleet.json", io.StringIO()
    request = FleetRequest(action="gate", hosts="n1,n2,n3", spec_path=LOCK, json_path=out)
    fleet.run(request, UI(stream=console, force_plain=True), SimTransport(sims))
    doc = json.loads(out.read_text())
    assert doc["groups"][1]["differences"] == {
        "n3": [
            {"section": "distributions", "name": "torch", "majority": "2.9.1+cu130", "node": "2.10.0"},
            {"section": "server", "name": "unavailable", "majority": None, "node": "no smoke stage read /server_info"},
        ]
    }
    text = console.getvalue()
    assert "  n3: 2 component(s) differ from " in text and "-> (none)" not in text, text
    assert "    server: not measured on the node (no smoke stage read /server_info)" in text


def test_fleet_verify_says_nothing_of_fingerprints_it_never_takes(tmp_path):
    """verify's node reports carry no fingerprint (the gate takes it): no 'no fingerprint' line,
    no stack groups, no fleet.stacks case."""
    out, console, junit = tmp_path / "fleet.json", io.StringIO(), tmp_path / "fleet.xml"
    request = FleetRequest(action="verify", hosts="n1,n2", spec_path=LOCK, json_path=out, junit_path=junit)
    code = fleet.run(request, UI(stream=console, force_plain=True), SimTransport({}))
    doc = json.loads(out.read_text())
    assert code == ExitCode.PASSED and doc["groups"] == []
    assert "fingerprint" not in console.getvalue() and "fleet.stacks" not in junit.read_text(), console.getvalue()


def test_the_ssh_layers_log_is_named_by_an_absolute_path(monkeypatch, tmp_path):
    """paramiko's log of a fleet run: under $STACKGATE_LOG_DIR (default reports/) resolved
    against the folder the run started in, so the path printed is one that can be opened anywhere."""
    from stackgate.flows.fleet import ssh_log

    monkeypatch.delenv("STACKGATE_LOG_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert ssh_log("r1") == tmp_path / "reports" / "fleet" / "r1-ssh.log"


def test_outliers_need_three_nodes_and_a_real_difference():
    assert aggregate.outliers([("a", {"decode_tok_s": 10.0}), ("b", {"decode_tok_s": 50.0})]) == []
    same = [(n, {"busbw_gbs": 38.0 + d}) for n, d in (("a", 0.0), ("b", 0.01), ("c", 0.0), ("d", 0.02))]
    assert aggregate.outliers(same) == []  # MAD near 0: a 0.05% difference is not an outlier


def test_lock_is_loaded_before_any_node_is_touched(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[stack]\nname = 1\n")
    sims: dict[str, SimNode] = {}
    with pytest.raises(SpecError):
        fleet.run(
            FleetRequest(action="gate", hosts="a", spec_path=bad),
            UI(stream=io.StringIO(), force_plain=True),
            SimTransport(sims),
        )
    assert sims == {}


def test_a_hostile_node_report_fails_that_node_with_the_reason_and_prints_nothing_raw(tmp_path):
    evil = json.dumps(
        {
            "schema": "stackgate.report/1",
            "verdict": "passed",
            "exit_code": 0,
            "results": [],
            "reason": "ok\x1b]0;pwned\x07\x1b[2J",
        }
    )
    sims = {
        "notjson": SimNode(raw_report="{not json"),
        "foreign": SimNode(raw_report=json.dumps({"schema": "other/1"})),
        "damaged": SimNode(
            raw_report=json.dumps({"schema": "stackgate.report/1", "verdict": 1, "exit_code": "0", "results": {}})
        ),
        "escapes": SimNode(raw_report=evil),
    }
    stream = io.StringIO()
    out = tmp_path / "fleet.json"
    code = fleet.run(
        FleetRequest(action="gate", hosts=",".join(sims), spec_path=LOCK, json_path=out),
        UI(stream=stream, force_plain=True),
        SimTransport(sims),
    )
    doc = json.loads(out.read_text())
    by = {n["name"]: n for n in doc["nodes"]}
    assert code == ExitCode.FAILED
    assert by["notjson"]["reason"].startswith("the node's report is not JSON (")
    assert by["foreign"]["reason"] == "the node's report is not a stackgate.report/1 document"
    assert (
        by["damaged"]["reason"]
        == "the node's report is damaged: verdict: 1, not text; exit_code: text ('0'), not a whole number; "
        "results: an object, not a list"
    )
    assert by["escapes"]["status"] == "passed" and by["escapes"]["reason"] == "ok?]0;pwned??[2J"
    assert "\x1b" not in stream.getvalue() and "\\u001b" not in out.read_text()


def test_a_nodes_report_with_1e999_or_a_word_for_a_figure_fails_that_node_and_the_others_are_kept(
    tmp_path, monkeypatch
):
    from fleet_sim import report

    from stackgate.models.inventory import Node

    monkeypatch.setenv("STACKGATE_HISTORY_DIR", str(tmp_path / "runs"))
    sims = {name: SimNode() for name in ("a", "huge", "worded", "d")}
    huge = json.dumps(report(Node("huge", "huge"), sims["huge"], "gate")).replace("92.6", "1e999")
    worded = report(Node("worded", "worded"), sims["worded"], "gate")
    worded["gate"]["benchmark"]["floor_tok_s"] = "<script>alert(1)</script>"
    sims["huge"].raw_report, sims["worded"].raw_report = huge, json.dumps(worded)
    page = tmp_path / "fleet.html"
    code, doc = run("gate", list(sims), sims, tmp_path, html_path=page, markdown_path=tmp_path / "fleet.md")
    by = {n["name"]: n for n in doc["nodes"]}
    assert code == ExitCode.FAILED and statuses(doc) == {
        "a": "passed",
        "huge": "failed",
        "worded": "failed",
        "d": "passed",
    }
    assert (
        by["huge"]["reason"]
        == "the node's report is damaged: gate.benchmark.decode_tok_s.mean: inf, not a finite number"
    )
    assert by["worded"]["reason"].startswith("the node's report is damaged: gate.benchmark.floor_tok_s: text (")
    assert "<script" not in page.read_text() + (tmp_path / "fleet.md").read_text()
    kept = {json.loads(p.read_text())["fleet"]["node"] for p in (tmp_path / "runs").glob("*.json")}
    assert kept == {"a", "d"}  # the nodes after the bad ones too


def _verify_report(failed: dict[str, str]) -> str:
    results = [{"check": "gpu.driver", "status": "PASS", "summary": "driver 580.82.07"}]
    results += [{"check": name, "status": "FAIL", "summary": summary} for name, summary in failed.items()]
    return json.dumps(
        {
            "schema": "stackgate.report/1",
            "command": "verify",
            "run_id": "20261130T000000Z-verify-abc123",
            "host": {"hostname": "vm"},
            "results": results,
            "counts": {"PASS": 1, "FAIL": len(failed)},
            "verdict": "failed",
            "reason": f"{len(failed)} check(s) failed",
            "exit_code": 1,
        }
    )


def _verify_fleet(tmp_path: Path) -> tuple[dict[str, dict], str, str]:
    """``fleet verify`` of three nodes: one passes, one fails two checks (one reason long), one a single check."""
    long = "python.pins: " + "torch is 2.10.0, locked ==2.9.1+cu130; " * 8
    sims = {
        "ok": SimNode(),
        "wordy": SimNode(
            gate_exit=1,
            raw_report=_verify_report({"gpu.count": "2 GPU(s) visible, the lock wants 1", "python.pins": long}),
        ),
        "terse": SimNode(gate_exit=1, raw_report=_verify_report({"gpu.ecc": "GPU 0: 3 uncorrectable ECC errors"})),
    }
    stream, out, md, page = io.StringIO(), tmp_path / "fleet.json", tmp_path / "fleet.md", tmp_path / "fleet.html"
    request = FleetRequest(action="verify", hosts="ok,wordy,terse", spec_path=LOCK, json_path=out, markdown_path=md)
    request = dataclasses.replace(request, html_path=page)
    assert fleet.run(request, UI(stream=stream, force_plain=True), SimTransport(sims)) == ExitCode.FAILED
    html = page.read_text()
    assert "<h2>Failed checks</h2>" in html and "gpu.ecc FAIL: GPU 0: 3 uncorrectable ECC errors" in html
    return {n["name"]: n for n in json.loads(out.read_text())["nodes"]}, stream.getvalue(), md.read_text()


def test_fleet_verify_names_each_nodes_failed_checks_with_their_reasons(tmp_path):
    by, console, markdown = _verify_fleet(tmp_path)
    assert by["terse"]["failed_checks"] == [
        {"check": "gpu.ecc", "status": "FAIL", "summary": "GPU 0: 3 uncorrectable ECC errors"}
    ]
    assert [c["check"] for c in by["wordy"]["failed_checks"]] == ["gpu.count", "python.pins"] and by["ok"][
        "failed_checks"
    ] == []
    assert by["wordy"]["reason"] == "verify exit 1: 2 check(s) failed (gpu.count, python.pins)"
    assert "terse: 1 check(s) failed:\n  gpu.ecc FAIL: GPU 0: 3 uncorrectable ECC errors\n" in console
    assert (
        "wordy: 2 check(s) failed:\n  gpu.count FAIL: 2 GPU(s) visible, the lock wants 1\n  python.pins FAIL: "
        "python.pins: "
        "torch is 2.10.0"
    ) in console
    assert "### Failed checks" in markdown and "  gpu.ecc FAIL: GPU 0: 3 uncorrectable ECC errors" in markdown


def test_the_fleet_consoles_reason_column_is_left_aligned_and_unpadded(tmp_path):
    by, console, _ = _verify_fleet(tmp_path)
    lines = console.splitlines()
    column = next(line for line in lines if line.startswith("node ")).index("reason")
    rows = {
        line.split()[0]: line
        for line in lines
        if line.split()[:1] in (["ok"], ["wordy"], ["terse"]) and "check(s) failed:" not in line
    }
    assert rows["terse"][column:] == by["terse"]["reason"] and rows["wordy"][column:] == by["wordy"]["reason"], rows
    assert len(rows["ok"]) <= column and all(row == row.rstrip() for row in rows.values())


class Listener:
    """A loopback TCP port that accepts connections and then says ``greeting`` (nothing: never speaks SSH)."""

    def __init__(self, greeting: bytes = b"") -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self.greeting = greeting
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.accepted.append(conn)
            if self.greeting:
                conn.sendall(self.greeting)

    def close(self) -> None:
        for conn in [*self.accepted, self.server]:
            conn.close()


def _fleet_process(tmp_path: Path, hosts: str, connect_timeout: int, logs: Path | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "STACKGATE_HISTORY_DIR": str(tmp_path / "runs")}
    env["STACKGATE_LOG_DIR"] = str(logs or tmp_path / "logs")
    argv = [sys.executable, "-m", "stackgate", "fleet", "verify", "--hosts", hosts, "--lock", str(LOCK)]
    argv += ["--connect-timeout", str(connect_timeout), "--json", str(tmp_path / "f.json")]
    piped = subprocess.PIPE
    return subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=piped, stderr=piped, text=True, start_new_session=True)


def test_a_port_that_never_speaks_ssh_is_named_and_paramikos_log_stays_off_the_terminal(tmp_path):
    mute, bogus = Listener(), Listener(b"SSH-2.0-NotReally\r\n\x00\x00\x00\x0cnot a packet")
    try:
        process = _fleet_process(tmp_path, f"127.0.0.1:{mute.port},localhost:{bogus.port}", 2)
        out, err = process.communicate(timeout=120)
    finally:
        mute.close()
        bogus.close()
    by = {n["address"]: n for n in json.loads((tmp_path / "f.json").read_text())["nodes"]}
    assert process.returncode == ExitCode.FAILED, out + err
    silent, hostile = by[f"127.0.0.1:{mute.port}"], by[f"localhost:{bogus.port}"]
    banner = "no SSH banner within 2 s (the banner timeout): the port accepts TCP"
    assert silent["reason"].startswith(f"127.0.0.1:{mute.port}: {banner}")
    assert hostile["status"] == "unreachable" and "the SSH handshake failed (IndexError" in hostile["reason"]
    assert "Exception (client)" not in err and "paramiko.transport" not in err and "Traceback" not in err, err
    (log,) = (tmp_path / "logs" / "fleet").glob("*-ssh.log")  # paramiko's own words went here
    assert "paramiko.transport" in log.read_text() and f"the SSH layer's log: {log}" in err


def test_an_ssh_log_that_cannot_be_written_is_dropped_not_printed(tmp_path):
    (tmp_path / "file").write_text("")
    bogus = Listener(b"SSH-2.0-NotReally\r\n\x00\x00\x00\x0cnot a packet")
    try:
        process = _fleet_process(tmp_path, f"127.0.0.1:{bogus.port}", 5, tmp_path / "file" / "logs")
        _, err = process.communicate(timeout=120)
    finally:
        bogus.close()
    assert (
        "Traceback" not in err and "the SSH handshake failed (IndexError" in err and "the SSH layer's log:" not in err
    ), err


def test_ctrl_c_while_nodes_connect_cancels_the_connects_at_once(tmp_path):
    mute = Listener()
    try:
        process = _fleet_process(tmp_path, f"127.0.0.1:{mute.port},localhost:{mute.port}", 600)
        try:
            deadline = time.monotonic() + 60
            while len(mute.accepted) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(mute.accepted) == 2  # both nodes are waiting for an SSH banner that never comes
            process.send_signal(signal.SIGINT)
            _, err = process.communicate(timeout=120)  # far below the 600 s connect timeout: cancelled
        finally:
            process.kill()
    finally:
        mute.close()
    doc = json.loads((tmp_path / "f.json").read_text())
    assert process.returncode == ExitCode.INTERRUPTED and doc["interrupted"] is True, err
    assert {n["reason"] for n in doc["nodes"]} == {"interrupted (Ctrl-C or SIGTERM) while connecting"}
