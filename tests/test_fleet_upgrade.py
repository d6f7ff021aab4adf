"""`stackgate fleet upgrade`: a canary rollout of `stackgate upgrade`.

The order of nodes and what the fleet reads from each node's upgrade report, with simulated nodes
(tests/fleet_sim.py) at the transport edge; then one run over real loopback sshd nodes whose
`stackgate upgrade` is this checkout's program with only the node's own upgrade (build, A/B on
GPUs) replaced by a controlled outcome (tests/fleet_node.py): SSH, shipping, the node's command
line, its JSON report written and read back are all real.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import threading
from pathlib import Path

import exposition
import pytest
from fleet_sim import SimNode, SimTransport, rollbacks
from fleet_support import Sshd, fleet_spec, node_wrapper, why_no_sshd
from smoke_support import ROOT, free_port
from test_fleet import Fleet, fleet_env, stackgate

from stackgate.commands import fleet
from stackgate.flows import fleetnode
from stackgate.flows.fleet import canary_rollout
from stackgate.flows.fleetnode import NodeRun
from stackgate.flows.fleetrequest import FleetRequest
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.models.inventory import parse_hosts
from stackgate.render.ui import UI

LIVE = ROOT / "lockfiles" / "blackwell-sm120-cu128.toml"  # with its pylock beside it


def new_spec(tmp_path: Path) -> Path:
    """The new spec: the live one's copy under another name, its pylock beside it (what the
    nodes do with it is the simulation's to decide)."""
    folder = tmp_path / "specs"
    folder.mkdir(exist_ok=True)
    shutil.copy(LIVE, folder / "new.toml")
    shutil.copy(LIVE.parent / "pylock.blackwell-sm120-cu128.toml", folder / "pylock.new.toml")
    return folder / "new.toml"


def upgrade(
    names: list[str], sims: dict[str, SimNode], tmp_path: Path, **request: object
) -> tuple[int, dict, SimTransport, str]:
    out, stream = tmp_path / "fleet.json", io.StringIO()
    chosen = FleetRequest(
        action="upgrade", hosts=",".join(names), to_path=new_spec(tmp_path), spec_path=LIVE, json_path=out, **request
    )  # type: ignore[arg-type]
    transport = SimTransport(sims)
    code = fleet.run(chosen, UI(stream=stream, force_plain=True), transport)
    return code, json.loads(out.read_text()), transport, stream.getvalue()


def by_name(doc: dict) -> dict[str, dict]:
    return {n["name"]: n for n in doc["nodes"]}


def test_the_canary_wins_then_the_rest_roll_in_batches(tmp_path):
    sims = {f"n{i}": SimNode(rate=92.6, new_rate=99.8) for i in range(1, 6)}
    code, doc, transport, console = upgrade(
        list(sims), sims, tmp_path, batch=2, html_path=tmp_path / "f.html", junit_path=tmp_path / "f.xml"
    )
    assert code == ExitCode.PASSED and doc["command"] == "fleet upgrade"
    page = (tmp_path / "f.html").read_text()
    assert (
        "<h2>Upgrade (canary first)</h2>" in page
        and "<script" not in page
        and "moved to the new stack: n1, n2, n3, n4, n5" in page
    )
    assert 'name="stackgate.fleet.n1"' in (tmp_path / "f.xml").read_text()
    assert (
        transport.begun[0] == "n1"
        and set(transport.begun[1:3]) == {"n2", "n3"}
        and set(transport.begun[3:5]) == {"n4", "n5"}
    )
    assert (
        doc["upgrade"]["canary_nodes"] == ["n1"]
        and doc["upgrade"]["moved"] == ["n1", "n2", "n3", "n4", "n5"]
        and doc["upgrade"]["untouched"] == []
    )
    assert doc["reason"] == "5 of 5 node(s) moved to the new stack"
    n1 = by_name(doc)["n1"]
    assert (
        n1["status"] == "passed"
        and n1["steps"] == ["canary", "upgraded", "switched"]
        and by_name(doc)["n2"]["steps"] == ["upgraded", "switched"]
    )
    assert n1["upgrade"]["decision"] == "switched" and n1["upgrade"]["reason"].startswith("switched: it passes")
    assert n1["upgrade"]["live_tok_s"] == {
        "mean": 92.6,
        "ci_low": pytest.approx(92.2),
        "ci_high": pytest.approx(93.0),
        "n": 4,
    }
    assert n1["upgrade"]["new_tok_s"]["mean"] == 99.8
    # both specs and both pylocks shipped, sha256-checked; the node's upgrade named the shipped files
    assert sorted(doc["shipped"]) == [
        "blackwell-sm120-cu128.toml",
        "new.toml",
        "pylock.blackwell-sm120-cu128.toml",
        "pylock.new.toml",
    ]
    (argv,) = sims["n3"].upgrades
    assert (
        argv[:3] == ["upgrade", "--to", "/tmp/stackgate-fleet.Sim00000/new.toml"]
        and "--lock" in argv
        and argv[argv.index("--lock") + 1].endswith("/blackwell-sm120-cu128.toml")
    )
    assert argv[-2:] == ["shipped:True", "shipped:True"] and argv[argv.index("--switch") + 1] == "if-better"
    assert "canary n1: switched: it passes" in console
    assert (
        "  decode live 92.60 tok/s (95% CI 92.20-93.00, n=4) -> new 99.80 tok/s (95% CI 99.40-100.20, n=4); new - "
        "live "
        "+7.20 tok/s"
    ) in console
    assert "moved to the new stack: n1, n2, n3, n4, n5" in console


def test_a_canary_that_keeps_its_stack_leaves_every_other_node_untouched(tmp_path):
    sims = {f"n{i}": SimNode() for i in range(1, 5)}
    sims["n1"] = SimNode(upgrade="keep")
    code, doc, transport, console = upgrade(list(sims), sims, tmp_path, batch=2)
    assert code == ExitCode.FAILED and transport.begun == ["n1"]
    assert all(not sims[n].calls for n in ("n2", "n3", "n4"))  # not even connected to
    assert doc["reason"].startswith(
        "the canary n1 did not win (failed: upgrade exit 1: kept the live stack: slower beyond the measured noise"
    ) and doc["reason"].endswith("no other node was touched")
    n1 = by_name(doc)["n1"]
    assert (
        n1["steps"] == ["canary", "upgrade", fleetnode.KEPT]
        and n1["upgrade"]["decision"] == "kept"
        and rollbacks(sims["n1"]) == 0
    )
    assert [by_name(doc)[n]["reason"] for n in ("n2", "n4")] == ["not run: the canary did not win (n1)"] * 2
    assert (
        doc["upgrade"]["moved"] == []
        and doc["upgrade"]["kept"] == ["n1"]
        and doc["upgrade"]["untouched"] == ["n2", "n3", "n4"]
    )
    assert (
        "canary n1: kept the live stack: slower beyond the measured noise: decode new - live: -7.20 tok/s (-7.8%; "
        "95% "
        "CI -8.10 to -6.30) (nothing to roll back: current never moved)"
    ) in console


def test_a_node_that_keeps_its_stack_mid_rollout_stops_the_rollout_after_its_batch(tmp_path):
    sims = {f"n{i}": SimNode() for i in range(1, 8)}
    sims["n3"] = SimNode(
        upgrade="keep", keep_reason="kept the live stack: greedy outputs differ: first differing token at position 7"
    )
    code, doc, transport, _ = upgrade(list(sims), sims, tmp_path, batch=2, prom_path=tmp_path / "fleet.prom")
    assert code == ExitCode.FAILED
    upgraded = exposition.parse((tmp_path / "fleet.prom").read_text())["stackgate_fleet_node_upgraded"]
    assert [upgraded.value(lock="blackwell-sm120-cu128", node=n) for n in ("n1", "n2", "n3", "n4")] == [1, 1, 0, 0]
    assert {n: d["status"] for n, d in by_name(doc).items()} == {
        "n1": "passed",
        "n2": "passed",
        "n3": "failed",
        "n4": "not run",
        "n5": "not run",
        "n6": "not run",
        "n7": "not run",
    }
    assert sorted(transport.begun) == ["n1", "n2", "n3"] and not sims["n4"].calls
    assert (
        doc["upgrade"]["moved"] == ["n1", "n2"]
        and doc["upgrade"]["kept"] == ["n3"]
        and doc["upgrade"]["untouched"] == ["n4", "n5", "n6", "n7"]
    )
    assert doc["reason"].startswith(
        (
            "n3 did not win (failed: upgrade exit 1: kept the live stack: greedy outputs differ: first differing token "
            "at "
            "position 7)"
        )
    )
    assert doc["reason"].endswith(
        "the rollout stopped after its batch; 2 node(s) moved, 1 kept their live stack, 4 not touched"
    )
    assert sum(rollbacks(s) for s in sims.values()) == 0  # a node that did not win never moved: nothing to roll back
    assert by_name(doc)["n5"]["reason"] == "not run: an earlier batch did not win (n3)"


def test_an_unreachable_canary_touches_nothing(tmp_path):
    sims = {"n1": SimNode(reachable=False), "n2": SimNode(), "n3": SimNode()}
    code, doc, transport, _ = upgrade(list(sims), sims, tmp_path)
    assert code == ExitCode.FAILED and transport.begun == [] and not sims["n2"].calls
    assert by_name(doc)["n1"]["status"] == "unreachable" and "upgrade" not in by_name(doc)["n1"]
    assert doc["reason"] == (
        "the canary n1 did not win (unreachable: n1:22: cannot connect: Connection refused): no other node was touched"
    )


def test_two_canaries_and_a_node_already_on_the_new_stack(tmp_path):
    sims = {"n1": SimNode(), "n2": SimNode(upgrade="current"), "n3": SimNode()}
    code, doc, transport, _ = upgrade(list(sims), sims, tmp_path, canary=2)
    assert code == ExitCode.PASSED and set(transport.begun[:2]) == {"n1", "n2"} and transport.begun[2] == "n3"
    assert (
        by_name(doc)["n2"]["steps"] == ["canary", "already on the new stack"]
        and by_name(doc)["n2"]["upgrade"]["reason"] == "already on the new stack: nothing to upgrade"
    )
    assert (
        doc["upgrade"]["moved"] == ["n1", "n3"]
        and doc["reason"] == "2 of 3 node(s) moved to the new stack, 1 already on it"
    )


def test_a_live_spec_of_the_same_name_is_shipped_beside_the_new_one(tmp_path):
    sims = {"n1": SimNode()}
    out = tmp_path / "fleet.json"
    request = FleetRequest(
        action="upgrade",
        hosts="n1",
        to_path=LIVE,
        spec_path=LIVE,
        json_path=out,
        switch="if-passes",
        accept_output_change=True,
        model="/models/m",
    )
    assert fleet.run(request, UI(stream=io.StringIO(), force_plain=True), SimTransport(sims)) == ExitCode.PASSED
    assert sorted(json.loads(out.read_text())["shipped"]) == [
        "blackwell-sm120-cu128.toml",
        "live-blackwell-sm120-cu128.toml",
        "pylock.blackwell-sm120-cu128.toml",
        "pylock.live-blackwell-sm120-cu128.toml",
    ]
    (argv,) = sims["n1"].upgrades
    assert argv[argv.index("--lock") + 1].endswith("/live-blackwell-sm120-cu128.toml") and argv[-2:] == [
        "shipped:True",
        "shipped:True",
    ]
    assert (
        argv[argv.index("--switch") + 1] == "if-passes"
        and "--accept-output-change" in argv
        and argv[argv.index("--model") + 1] == "/models/m"
    )


@pytest.mark.parametrize(
    ("request_", "said"),
    [
        ({"switch": "never"}, "--switch 'never': one of if-better, if-passes"),
        ({"to_path": None}, "--to NEW_SPEC is required"),
        ({"canary": 4}, "--canary 4: the fleet has 3 node(s)"),
        ({"action": "gate"}, "--to, --canary, --switch, --accept-output-change and --model are for `fleet upgrade`"),
        (
            {"spec_path": ROOT / "lockfiles" / "blackwell-sm120-cu130.toml"},
            "python.root is /opt/stackgate-cu128, but the live spec",
        ),
    ],
)
def test_what_fleet_upgrade_cannot_take_is_refused_before_any_node_is_touched(tmp_path, request_, said):
    sims: dict[str, SimNode] = {}
    chosen = {"action": "upgrade", "hosts": "a,b,c", "to_path": new_spec(tmp_path), "spec_path": LIVE, **request_}
    with pytest.raises(UsageError) as caught:
        fleet.run(FleetRequest(**chosen), UI(stream=io.StringIO(), force_plain=True), SimTransport(sims))  # type: ignore[arg-type]
    assert said in str(caught.value) and sims == {}


# --- over real loopback sshd nodes -----------------------------------------------------------------


def loopback_spec(path: Path, cluster: Fleet, root: Path, extra: str = "") -> Path:
    """The fleet tests' spec (the stand-in's profile), under a python.root as an upgrade needs."""
    text = (
        fleet_spec(path, cluster.model, cluster.python)
        .read_text()
        .replace(f'interpreter = "{cluster.python}"', f'root = "{root}"')
    )
    path.write_text(text + extra)
    return path


def upgrading_node(cluster: Fleet, name: str, rates: str) -> None:
    """A loopback node whose `stackgate upgrade` measures ``rates`` (live,new decode tok/s: tests/fleet_node.py)."""
    home = cluster.home / name
    home.mkdir()
    server = Sshd(home, cluster.authorized).start()
    cluster.servers[name] = server
    env = fleet_env(home, cluster.python, free_port(), home / "events.jsonl", home / "runs")
    del env["FLEET_NODE_INTERPRETER"]  # the spec's python.root stays as shipped
    program = node_wrapper(
        home / "stackgate", {**env, "FLEET_NODE_UPGRADE": rates, "FLEET_NODE_HOME": str(home)}, started=cluster.started
    )
    cluster.entries.append({"name": name, "port": server.port, "stackgate": str(program)})


@pytest.mark.skipif(why_no_sshd() is not None, reason=why_no_sshd() or "")
def test_fleet_upgrade_over_loopback_sshd_nodes(tmp_path):
    """Canary ``a`` wins (400 -> 440 tok/s), then ``b`` (wins) and ``c`` (300 tok/s: keeps its
    stack) in one batch; ``d`` is never touched. Real sshd, real shipping and sha256 checks, the
    node's real `stackgate upgrade` command line and JSON report read back."""
    cluster = Fleet(tmp_path)
    try:
        live = loopback_spec(tmp_path / "live.toml", cluster, tmp_path / "root")
        new = loopback_spec(tmp_path / "new.toml", cluster, tmp_path / "root", '\n[env]\nSGLANG_ENABLE_DEMO = "1"\n')
        for name, rates in (("a", "400,440"), ("b", "400,441"), ("c", "400,300"), ("d", "400,440")):
            upgrading_node(cluster, name, rates)
        out = tmp_path / "fleet"
        done = stackgate(
            "fleet",
            "upgrade",
            "--inventory",
            str(cluster.inventory()),
            "--to",
            str(new),
            "--lock",
            str(live),
            "--canary",
            "1",
            "--batch",
            "2",
            "--json",
            f"{out}.json",
            "--markdown",
            f"{out}.md",
            history=tmp_path / "controller-runs",
            timeout=120,
        )
        assert done.returncode == ExitCode.FAILED, done.stdout + done.stderr
        doc = json.loads(Path(f"{out}.json").read_text())
        nodes = by_name(doc)
        assert {n: d["status"] for n, d in nodes.items()} == {
            "a": "passed",
            "b": "passed",
            "c": "failed",
            "d": "not run",
        }
        assert doc["reason"].startswith(
            (
                "c did not win (failed: upgrade exit 1: kept the live stack: slower beyond the measured noise: decode "
                "new "
                "- live: -100.00 tok/s"
            )
        )
        assert (
            doc["upgrade"]["moved"] == ["a", "b"]
            and doc["upgrade"]["kept"] == ["c"]
            and doc["upgrade"]["untouched"] == ["d"]
        )
        a = nodes["a"]["upgrade"]
        assert (
            a["decision"] == "switched"
            and a["generation"] == {"before": "g0001", "after": "g0002"}
            and a["reason"].startswith("switched: it passes, gives the same greedy tokens and is faster")
        )
        assert (
            a["live_tok_s"]["mean"] == pytest.approx(400.0)
            and a["new_tok_s"]["mean"] == pytest.approx(440.0)
            and a["new_tok_s"]["n"] == 6
        )
        assert a["live_tok_s"]["ci_low"] < 400.0 < a["live_tok_s"]["ci_high"] and a["difference_text"].startswith(
            "+40.00 tok/s"
        )
        assert nodes["c"]["steps"] == ["upgrade", fleetnode.KEPT] and nodes["c"]["upgrade"]["generation"] == {
            "before": "g0001",
            "after": "g0001",
        }
        shipped = {
            "new": hashlib.sha256(new.read_bytes()).hexdigest(),
            "live": hashlib.sha256(live.read_bytes()).hexdigest(),
        }
        for name in ("a", "b", "c"):
            (call,) = [json.loads(line) for line in (tmp_path / name / "upgrades.jsonl").read_text().splitlines()]
            assert re.search(r"/stackgate-fleet\.[A-Za-z0-9]{8}/new\.toml$", call["to"]) and call["lock"] == str(
                Path(call["to"]).parent / "live.toml"
            )
            assert (
                call["sha256"] == {call["to"]: shipped["new"], call["lock"]: shipped["live"]}
                and call["switch"] == "if-better"
            )
            assert not Path(call["to"]).parent.exists()  # the node's folder removed after its report was read
        assert not (tmp_path / "d" / "upgrades.jsonl").exists()
        assert (
            "canary a: switched: it passes" in done.stdout
            and "d: not run: an earlier batch did not win (c)" in done.stdout
        )
        assert "kept their live stack: c" in done.stdout and "not touched: d" in done.stdout
        markdown = Path(f"{out}.md").read_text()
        assert (
            "### Upgrade (canary first)" in markdown
            and "| a | canary | passed | switched | 400.00 -> 440.00 |" in markdown
        )
    finally:
        cluster.stop()


def test_ctrl_c_during_the_canary_touches_no_other_node():
    nodes = parse_hosts("a,b,c")
    stop = threading.Event()
    began: list[str] = []

    def work(node, stop):
        began.append(node.name)
        stop.set()  # Ctrl-C while the canary runs: its remote group is stopped (tests/test_fleet.py, over real sshd)
        return NodeRun(node, fleetnode.INTERRUPTED, "interrupted (Ctrl-C or SIGTERM)")

    ran = canary_rollout(nodes, 1, 2, work, stop)
    assert (
        began == ["a"]
        and [(n.status, n.reason) for n in ran[1:]] == [("not run", "not run: the fleet was interrupted")] * 2
    )
    assert ran[0].steps == ("canary",)


def test_fleet_upgrade_usage_on_the_command_line_exits_2(tmp_path):
    for flags, said in (
        ([], "--to NEW_SPEC is required"),
        (["--to", str(LIVE), "--canary", "x"], "--canary 'x': not a whole number"),
    ):
        done = stackgate("fleet", "upgrade", "--hosts", "a", *flags, history=tmp_path / "runs")
        assert done.returncode == ExitCode.USAGE and said in done.stderr and "Traceback" not in done.stderr
    done = stackgate("fleet", "gate", "--hosts", "a", "--canary", "2", history=tmp_path / "runs")
    assert done.returncode == ExitCode.USAGE and "takes no --canary: it is an option of fleet upgrade" in done.stderr
