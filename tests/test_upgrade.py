"""`stackgate upgrade` end to end: real provisioning with uv against the local index (spec A:
sglang's own flashinfer 0.6.3 pin; spec B: the 0.6.4 override), each generation served by the
SGLang stand-in at the rate and token stream its backend is given, real processes killed with
SIGKILL at each step. Only NVML (no GPU here) and SGLang are stood in for."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterator

import pytest
from fakes import fake_nvml
from fakes.fake_nvml import gpu, machine
from pkgindex import IndexServer, lock_stack, write_sglang0523_spec, write_stack_lock
from smoke_support import FAKES, Rig, assert_nothing_left, dead_runs_server, free_port, kill_leftovers, living
from support import run_program

from stackgate.commands import provision, report, upgrade
from stackgate.flows.upgrade import UpgradeRequest, UpgradeRun, upgrade_node
from stackgate.models import pylock
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.render.ui import UI
from stackgate.stack import generations

ROOT = Path(__file__).resolve().parents[1]
#: The verify checks a machine without GPUs can pass (the fake NVML describes one RTX PRO 6000).
VERIFY = ("gpu.*", "python.interpreter", "python.pins", "python.frozen", "python.consistency")
BENCH = {"output_tokens": 120, "runs": 2, "warmup": 1}
#: The stand-in decodes 200 tok/s with flashinfer and 150 with triton (the reference deployment's
#: story: the default backend silently changed and cost tokens).
TRITON_SLOW = [{"when": {"attention_backend": "triton"}, "set": {"rate": 150.0}}]


def _spec(
    path: Path,
    server: IndexServer,
    root: Path,
    environ: dict[str, str],
    rig: Rig,
    *,
    flashinfer: str,
    backend: str,
    hardware: dict[str, str] | None = None,
    tp: int = 1,
    fusion: bool = False,
    tail: str = "",
) -> Path:
    """A spec of the test stack with its pylock: flashinfer 0.6.3 as sglang pins it, or 0.6.4 by
    the declared override; smoke launches the stand-in with ``backend`` on ``tp`` GPUs, with the
    FlashInfer all-reduce fusion and its evidence line when ``fusion``."""
    hardware = {**({"gpu_count": str(tp)} if tp != 1 else {}), **(hardware or {})}
    write_stack_lock(path, server, root)
    text = path.read_text()
    if flashinfer == "0.6.3":
        text = text.replace('flashinfer-python = "==0.6.4"', 'flashinfer-python = "==0.6.3"').replace(
            'flashinfer-cubin = "==0.6.4"', 'flashinfer-cubin = "==0.6.3"'
        )
        text = text.split("[[python.override]]")[0] + "[env]" + text.split("[env]", 1)[1]
    for key, value in hardware.items():
        text = text.replace(f"{key} = ", f"{key} = {value}\n# was: {key} = ", 1)
    path.write_text(text + _smoke(rig, backend=backend, tp=tp, fusion=fusion) + tail)
    lock_stack(path, environ)
    return path


def _smoke(rig: Rig, *, backend: str, tp: int, fusion: bool) -> str:
    """A spec's [smoke], [smoke.env] and [benchmark]: the stand-in launched with ``backend`` on ``tp`` GPUs."""
    bench = "\n".join(f"{k} = {v}" for k, v in BENCH.items())
    return textwrap.dedent(f"""
        [smoke]
        model = "{rig.model}"
        tp = {tp}
        port = {rig.port}
        attention_backend = "{backend}"
        flags = {json.dumps(["--enable-flashinfer-allreduce-fusion"] if fusion else [])}
        {'evidence = { "--enable-flashinfer-allreduce-fusion" = "FlashInfer workspace initialized" }' if fusion else ""}
        ready_timeout_s = 60
        stop_grace_s = 3

        [smoke.env]
        PYTHONPATH = "{FAKES}"
        STACKGATE_FAKE_SGLANG = "{rig.behaviour_path}"

        [benchmark]
        {bench}
        """)


def _spec_0523(path: Path, server: IndexServer, root: Path, environ: dict[str, str], rig: Rig) -> Path:
    """A spec of the SGLang 0.5.23 stack (the shipped profile's shape) with its pylock, smoke on the stand-in."""
    write_sglang0523_spec(path, server, root)
    path.write_text(path.read_text() + _smoke(rig, backend="flashinfer", tp=1, fusion=False))
    lock_stack(path, environ)
    return path


@pytest.fixture(scope="module")
def live_root(
    tmp_path_factory: pytest.TempPathFactory, stack_index: IndexServer, install_environ: dict[str, str]
) -> Iterator[Path]:
    """A root with spec A provisioned once; each test upgrades a copy of it."""
    base = tmp_path_factory.mktemp("live")
    rig = Rig(base, free_port())
    spec = _spec(
        base / "a.toml", stack_index, base / "root", install_environ, rig, flashinfer="0.6.3", backend="triton"
    )
    assert (
        provision.run(
            provision.ProvisionRequest(spec_path=spec, yes=True, environ=install_environ),
            UI(stream=io.StringIO(), force_plain=True),
        )
        == ExitCode.PASSED
    )
    yield base / "root"


class Node:
    """A copy of the live root, the stand-in's rig, spec A (live) and spec B (new) for it."""

    def __init__(
        self,
        live_root: Path,
        tmp: Path,
        server: IndexServer,
        environ: dict[str, str],
        monkeypatch: pytest.MonkeyPatch,
        gpus: int = 1,
    ) -> None:
        self.root = tmp / "root"
        shutil.copytree(live_root, self.root, symlinks=True)
        self.tmp, self.server = tmp, server
        self.rig = Rig(tmp, free_port())
        self.gpus = gpus
        spec = machine([gpu(uuid=f"GPU-{i:04d}", memory=[96 * 2**30, 2**20]) for i in range(gpus)])
        self.rig.nvml_path.write_text(json.dumps({**spec, "holders": str(self.rig.holders_path)}))
        self.rig.behave(profiles=TRITON_SLOW)
        self.environ = {
            **environ,
            "STACKGATE_NVML_MODULE": "fakes.fake_nvml",
            "STACKGATE_FAKE_NVML": str(self.rig.nvml_path),
            "STACKGATE_LOG_DIR": str(tmp / "logs"),
        }
        self.environ["XDG_STATE_HOME"] = os.environ["XDG_STATE_HOME"]  # this test's state folder (what launches record)
        for key in ("STACKGATE_NVML_MODULE", "STACKGATE_FAKE_NVML", "STACKGATE_LOG_DIR"):
            monkeypatch.setenv(key, self.environ[key])
        self.a = _spec(
            tmp / "a.toml", server, self.root, environ, self.rig, flashinfer="0.6.3", backend="triton", tp=gpus
        )
        self.live = os.readlink(self.root / "current")

    def spec_b(
        self,
        *,
        backend: str = "flashinfer",
        hardware: dict[str, str] | None = None,
        fusion: bool = False,
        tail: str = "",
    ) -> Path:
        return _spec(
            self.tmp / "b.toml",
            self.server,
            self.root,
            self.environ,
            self.rig,
            flashinfer="0.6.4",
            backend=backend,
            hardware=hardware,
            tp=self.gpus,
            fusion=fusion,
            tail=tail,
        )

    def upgrade(self, to: Path, **request: Any) -> tuple[UpgradeRun, dict[str, Any], str]:
        out = io.StringIO()
        chosen = UpgradeRequest(
            to=to,
            spec_path=self.a,
            verify_checks=VERIFY,
            environ=self.environ,
            run_dir=self.tmp / "servers",
            json_path=self.tmp / "up.json",
            **request,
        )
        done = upgrade_node(chosen, UI(stream=out, force_plain=True), nvml_lib=fake_nvml)
        upgrade.keep_legs(done, UI(stream=out, force_plain=True))  # as the command does
        doc = done.document()
        upgrade.write_reports(doc, chosen)
        upgrade_console(doc, out)
        return done, json.loads((self.tmp / "up.json").read_text()), out.getvalue()

    def current(self) -> str:
        return os.readlink(self.root / "current")

    def serves(self) -> str:
        """What `current`'s interpreter imports (it still works)."""
        script = "import flashinfer, sglang, torch; print(flashinfer.__version__, torch.__version__)"
        done = subprocess.run(
            [str(self.root / "current" / "bin" / "python"), "-c", script],
            capture_output=True,
            text=True,
            env=self.environ,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()


def upgrade_console(doc: dict[str, Any], out: io.StringIO) -> None:
    from stackgate.render import upgradereport as render

    render.console(doc, UI(stream=out, force_plain=True))


@pytest.fixture
def node(
    live_root: Path,
    tmp_path: Path,
    stack_index: IndexServer,
    install_environ: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Node]:
    made = Node(live_root, tmp_path, stack_index, install_environ, monkeypatch)
    yield made
    kill_leftovers(made.rig)


@pytest.fixture
def node2(
    live_root: Path,
    tmp_path: Path,
    stack_index: IndexServer,
    install_environ: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Node]:
    """A node of two GPUs: both sides launch with TP 2, where the fusion's evidence is logged."""
    made = Node(live_root, tmp_path, stack_index, install_environ, monkeypatch, gpus=2)
    yield made
    kill_leftovers(made.rig)


def test_a_faster_new_stack_with_the_same_tokens_is_switched_to(node2: Node) -> None:
    node = node2
    done, doc, out = node.upgrade(node.spec_b(fusion=True))
    assert done.exit_code == ExitCode.PASSED and done.won, out
    part = doc["upgrade"]
    assert part["ab"]["order"] == ["live", "new", "new", "live"]
    assert [leg["side"] for leg in part["ab"]["legs"]] == ["live", "new", "new", "live"]
    assert {leg["attention_backend"] for leg in part["ab"]["legs"] if leg["side"] == "live"} == {"triton"}
    assert {leg["attention_backend"] for leg in part["ab"]["legs"] if leg["side"] == "new"} == {"flashinfer"}
    assert part["decision"]["switch"] is True and part["decision"]["reason"].startswith(
        "switched: it passes, gives the same greedy tokens and is faster"
    )
    changes = {c["name"]: (c["old"], c["new"]) for c in part["plan"]["changes"]}
    assert changes["flashinfer-python"] == ("0.6.3", "0.6.4") and changes["attention_backend"] == (
        "triton",
        "flashinfer",
    )
    assert part["current"]["switched"] and node.current() == f"generations/{part['new']['generation']}"
    assert node.serves().startswith("0.6.4 ")
    assert "flashinfer-python: 0.6.3 -> 0.6.4" in out and "SWITCHED: switched" in out
    # The fusion's evidence, before (not asked for) and after (its log line seen, in every new leg).
    assert all(leg["evidence"] == [] for leg in part["ab"]["legs"] if leg["side"] == "live")
    assert all([e["status"] for e in leg["evidence"]] == ["PASS"] for leg in part["ab"]["legs"] if leg["side"] == "new")
    assert "new: attention backend flashinfer; evidence: enable-flashinfer-allreduce-fusion: PASS" in out
    assert changes["flags"] == ("(none)", "--enable-flashinfer-allreduce-fusion")
    # Each leg is kept in the history: `report LIVE NEW` names what changed between the sides.
    ids = [leg["run_id"] for leg in part["ab"]["legs"]]
    shown = io.StringIO()
    assert (
        report.run(
            report.ReportRequest(runs=(ids[0], ids[1]), runs_dir=Path(os.environ["STACKGATE_HISTORY_DIR"])),
            UI(stream=shown, force_plain=True),
        )
        == ExitCode.PASSED
    )
    assert "attention_backend: triton -> flashinfer" in shown.getvalue(), shown.getvalue()
    assert_nothing_left(node.rig)


def test_an_upgrade_from_the_059_stack_to_the_0523_stack_switches_and_rollback_returns(node: Node) -> None:
    # sgl-kernel (0.3.21+cu130, a URL wheel) gives way to sglang-kernel 0.4.10: both own sgl_kernel/.
    to = _spec_0523(node.tmp / "b.toml", node.server, node.root, node.environ, node.rig)
    done, doc, out = node.upgrade(to, switch="if-passes")
    assert done.exit_code == ExitCode.PASSED, out
    part = doc["upgrade"]
    changes = {c["name"]: (c["old"], c["new"]) for c in part["plan"]["changes"]}
    assert changes["sglang"] == ("0.5.9", "0.5.23") and changes["torch"] == ("2.9.1+cu130", "2.14.1")
    assert changes["sglang-kernel"][1] == "0.4.10" and changes["sgl-kernel"][0] == "0.3.21+cu130"
    assert "then sgl_kernel/ holds exactly its owner's RECORD" in json.dumps(part["plan"])
    assert part["current"]["switched"] and node.current() == f"generations/{part['new']['generation']}"
    assert node.serves() == "0.7.2 2.14.1"
    new = node.root / "generations" / part["new"]["generation"]
    site = next(new.glob("lib/python3*/site-packages"))
    assert sorted(p.name for p in site.glob("sgl*_kernel*.dist-info")) == ["sglang_kernel-0.4.10.dist-info"]
    shown = io.StringIO()
    back = provision.rollback(
        provision.RollbackRequest(spec_path=to, environ=node.environ), UI(stream=shown, force_plain=True)
    )
    assert back == ExitCode.PASSED, shown.getvalue()
    assert node.current() == node.live and node.serves() == "0.6.3 2.9.1+cu130"


def test_a_machine_that_slows_down_during_the_ab_does_not_make_the_new_stack_look_slower(node: Node) -> None:
    """The two stacks decode at the same rate on a machine that loses 15 tok/s per launch: in the
    order live, new, new, live the drift weighs on both sides alike (tests/test_abtest.py shows
    the order live, new alone calling the new stack slower on the same figures)."""
    node.rig.behave(slowdown_per_launch=15.0)
    done, doc, out = node.upgrade(node.spec_b(backend="triton"))
    assert [leg["side"] for leg in doc["upgrade"]["ab"]["legs"]] == ["live", "new", "new", "live"]
    assert done.won and "within the measured noise" in doc["upgrade"]["decision"]["reason"], out


def test_a_faster_new_stack_that_loses_accuracy_is_kept_out(node: Node) -> None:
    """The new stack decodes faster (flashinfer 200 tok/s, triton 150) and passes its own floor,
    but answers 2 of the 16 shipped prompts wrongly where the live one answers all."""
    wrong = {"when": {"attention_backend": "flashinfer"}, "set": {"wrong_answer_rate": 0.2}}
    node.rig.behave(profiles=[*TRITON_SLOW, wrong])
    done, doc, out = node.upgrade(node.spec_b(tail="\n[accuracy]\nfloor = 0.8\n"))
    assert not done.won, out
    part = doc["upgrade"]
    assert part["decision"]["reason"] == (
        "kept the live stack: less accurate: new 28 of 32 exact (87.5%), live 32 of 32 (100.0%)"
    )
    held = {c["name"]: c["held"] for c in part["decision"]["conditions"]}
    assert held == {"passes": True, "same_output": True, "not_slower": True, "as_accurate": False}
    assert node.current() == node.live
    assert_nothing_left(node.rig)


def test_a_slower_new_stack_is_kept_and_the_report_says_by_how_much(node: Node) -> None:
    node.rig.behave(profiles=[{"when": {"attention_backend": "flashinfer"}, "set": {"rate": 120.0}}])  # triton: 200
    done, doc, out = node.upgrade(node.spec_b(), markdown_path=node.tmp / "up.md", html_path=node.tmp / "up.html")
    assert done.exit_code == ExitCode.FAILED and not done.won, out
    part = doc["upgrade"]
    assert part["decision"]["switch"] is False
    assert part["decision"]["reason"].startswith(
        "kept the live stack: slower beyond the measured noise: decode new - live: -"
    )
    assert node.current() == node.live and part["current"] == {
        "before": Path(node.live).name,
        "after": Path(node.live).name,
        "switched": False,
    }
    new = generations.read(node.root).generations[-1]
    assert new.ready and not new.was_current  # built and verified, never switched to: the next run may resume it
    assert "KEPT: kept the live stack: slower" in out
    markdown = (node.tmp / "up.md").read_text()
    assert (
        "**KEPT: kept the live stack: slower" in markdown
        and "| distribution | flashinfer-python | 0.6.3 | 0.6.4 |" in markdown
    )
    assert (
        "flashinfer-python" in (node.tmp / "up.html").read_text()
        and "<script" not in (node.tmp / "up.html").read_text()
    )


def test_diverging_tokens_are_kept_naming_the_first_differing_position_unless_accepted(node: Node) -> None:
    # Faster, but its greedy outputs change from token 37 on.
    node.rig.behave(profiles=[{"when": {"attention_backend": "flashinfer"}, "set": {"shift_from": 37, "rate": 240.0}}])
    spec = node.spec_b()
    done, doc, out = node.upgrade(spec, rounds=1)
    assert done.exit_code == ExitCode.FAILED and node.current() == node.live, out
    reason = doc["upgrade"]["decision"]["reason"]
    assert reason.startswith(
        "kept the live stack: greedy outputs differ: first differing token at position 37 (live token id "
    ), reason
    assert "first 37 of 120 tokens identical" in reason
    # Accepted: the same (resumed, not rebuilt) generation is switched to, the difference still reported.
    built = doc["upgrade"]["new"]["generation"]
    done, doc, out = node.upgrade(spec, rounds=1, accept_output_change=True)
    assert (
        done.won and doc["upgrade"]["build"]["status"] == "resumed" and doc["upgrade"]["new"]["generation"] == built
    ), out
    same = next(c for c in doc["upgrade"]["decision"]["conditions"] if c["name"] == "same_output")
    assert same["held"] and same["text"].startswith(
        "greedy outputs differ, accepted with --accept-output-change: first differing token at position 37"
    )
    reason = doc["upgrade"]["decision"]["reason"]
    assert doc["reason"] == reason and "same greedy tokens" not in reason and same["text"] in reason, reason
    assert node.current() == f"generations/{built}"


def test_a_new_stack_failing_verify_is_kept_marked_failed_never_measured_nor_rolled_back_to(node: Node) -> None:
    spec = node.spec_b(hardware={"compute_capability": '"9.0"'})  # the fake GPU is an SM120
    done, doc, out = node.upgrade(spec)
    assert done.exit_code == ExitCode.FAILED and node.current() == node.live, out
    part = doc["upgrade"]
    assert part["build"]["status"] == "built" and part["build"]["verify"].startswith("failed")
    assert part["new"]["state"] == "failed" and part["ab"]["legs"] == [] and node.rig.events("started") == []
    assert part["decision"]["reason"].startswith(
        "kept the live stack: the new generation failed verify, so it was not launched: gpu."
    )
    assert any(r["check"].startswith("upgrade.verify.gpu.") and r["status"] == "FAIL" for r in doc["results"])
    assert "  verify FAIL: gpu." in out
    failed = generations.read(node.root).generations[-1]
    assert failed.failed and failed.path.is_dir() and f"kept for inspection at {failed.path}" in out
    with pytest.raises(
        generations.GenerationError, match="failed its checks .*kept for inspection, never rolled back to"
    ):
        generations.rollback(node.root, failed)
    assert node.current() == node.live and node.serves().startswith("0.6.3 ")
    # The next upgrade keeps it for inspection (a failed generation is not an unfinished one).
    assert generations.read(node.root).unfinished == ()


def test_an_upgrade_first_ends_what_a_dead_run_left_and_says_so(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    pids, record = dead_runs_server()
    node.upgrade(node.spec_b(hardware={"compute_capability": '"9.0"'}))  # fails verify: nothing is launched
    err = capsys.readouterr().err
    assert "ended 3 process(es) that a dead stackgate run left running (launched " in err, err
    assert living(pids) == [] and not record.exists()


def test_dry_run_shows_the_plan_and_changes_nothing(node: Node) -> None:
    before = sorted(p.name for p in (node.root / "generations").iterdir())
    done, doc, out = node.upgrade(node.spec_b(), dry_run=True)
    assert done.exit_code == ExitCode.PASSED and doc["upgrade"]["step"] == "plan", out
    assert (
        "distribution flashinfer-python: 0.6.3 -> 0.6.4" in out
        and "smoke        attention_backend: triton -> flashinfer" in out
    )
    assert "dry run (--dry-run): nothing was built, launched or switched; current: " in out and "KEPT" not in out
    assert (
        "build beside the live stack (current is not switched):" in out
        and "install the pylock's 9 distributions" in out
    )
    assert "switch" not in "\n".join(line for line in out.splitlines() if line.strip().startswith(tuple("0123456789")))
    assert sorted(p.name for p in (node.root / "generations").iterdir()) == before and node.current() == node.live
    assert node.rig.events("started") == []


def test_bad_usage_is_refused_before_anything_runs(node: Node, tmp_path: Path) -> None:
    spec = node.spec_b()
    for request, message in (
        ({"switch": "always"}, "--switch must be one of if-better, if-passes, never"),
        ({"json_path": tmp_path}, "--json .*: is a directory"),
    ):
        with pytest.raises(UsageError, match=message):
            upgrade_node(
                UpgradeRequest(to=spec, spec_path=node.a, **request), UI(stream=io.StringIO(), force_plain=True)
            )
    unlocked = node.spec_b()
    pylock.path_for(unlocked).unlink()
    with pytest.raises(UsageError, match="b.toml: .*pylock.* `stackgate lock --lock"):
        upgrade_node(UpgradeRequest(to=unlocked, spec_path=node.a), UI(stream=io.StringIO(), force_plain=True))
    empty = _spec(
        tmp_path / "c.toml",
        node.server,
        tmp_path / "elsewhere",
        node.environ,
        node.rig,
        flashinfer="0.6.4",
        backend="flashinfer",
    )
    with pytest.raises(UsageError, match="nothing live to upgrade: .* does not exist; provision builds") as caught:
        upgrade_node(UpgradeRequest(to=empty), UI(stream=io.StringIO(), force_plain=True))
    assert caught.value.hint == f"stackgate provision --lock {empty}"


_UPGRADE = """
import json, sys
from pathlib import Path
sys.path.insert(0, json.loads(sys.argv[1])["checkout"])
from invoke.exceptions import Exit
from stackgate import cli
from stackgate.commands import upgrade
from stackgate.flows.upgraderun import UpgradeRequest
from stackgate.render.ui import UI

args = json.loads(sys.argv[1])
request = UpgradeRequest(to=Path(args["to"]), spec_path=Path(args["lock"]), verify_checks=tuple(args["verify"]), run_dir=Path(args["run_dir"]), json_path=Path(args["json"]), rounds=1)
try:
    cli.run_command(lambda: upgrade.run(request, UI()))
except Exit as stop:
    print(stop.message or "", file=sys.stderr)
    sys.exit(stop.code)
"""  # noqa: E501 (a script for its own process, kept as written)


def _in_process_of_its_own(node: Node, spec: Path, fault: str) -> subprocess.CompletedProcess[str]:
    args = {
        "to": str(spec),
        "lock": str(node.a),
        "verify": list(VERIFY),
        "run_dir": str(node.tmp / "servers"),
        "json": str(node.tmp / "killed.json"),
        "checkout": str(ROOT),
    }
    # the checkout goes on sys.path in the process, not on PYTHONPATH: the stack interpreters it
    # starts inherit PYTHONPATH, and an editable install's stackgate.egg-info in the checkout is a
    # distribution the new generation's pylock check would rightly call extra
    environ = {**node.environ, "PYTHONPATH": str(ROOT / "tests"), "STACKGATE_FAULT": fault, "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-c", _UPGRADE, json.dumps(args)], env=environ, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "point",
    [
        "before:upgrade.build",
        "during:python.stack",
        "before:upgrade.verify",
        "smoke:ready",
        "before:upgrade.leg2",
        "before:upgrade.switch",
    ],
)
def test_kill_9_at_each_step_leaves_current_serving_the_old_stack_and_no_server(node: Node, point: str) -> None:
    spec = node.spec_b()
    killed = _in_process_of_its_own(node, spec, point)
    assert killed.returncode == -9, (point, killed.stderr[-3000:])
    assert node.current() == node.live and node.serves().startswith("0.6.3 "), point
    assert_nothing_left(node.rig)  # each server died with its parent (its parent-death signal)
    if point == "during:python.stack":
        # The half-built generation is removed by the next run, which then builds its own.
        half = generations.read(node.root).unfinished
        assert len(half) == 1
        done, doc, out = node.upgrade(spec, rounds=1, switch="never")
        assert f"remove unfinished generation(s) {half[0].id}" in out and not half[0].path.exists(), out
        assert doc["upgrade"]["build"]["status"] == "built" and node.current() == node.live
    if point == "smoke:ready":
        # Built and verified before the kill: the next run finishes it without building again.
        done, doc, out = node.upgrade(spec, rounds=1)
        assert doc["upgrade"]["build"]["status"] == "resumed" and done.won, out


def test_ctrl_c_during_the_ab_exits_130_with_the_report_and_current_unchanged(node: Node) -> None:
    stopped = _in_process_of_its_own(node, node.spec_b(), "smoke:ready=SIGINT")
    assert stopped.returncode == ExitCode.INTERRUPTED, stopped.stderr[-3000:]
    doc = json.loads((node.tmp / "killed.json").read_text())
    assert doc["upgrade"]["interrupted"] is True and doc["upgrade"]["step"] == "ab" and doc["exit_code"] == 130
    assert doc["reason"] == "interrupted (Ctrl-C or SIGTERM) during ab; current is unchanged"
    assert doc["upgrade"]["current"]["switched"] is False and node.current() == node.live
    assert "INTERRUPTED during ab (Ctrl-C or SIGTERM): every server was torn down; current: " in stopped.stdout
    assert_nothing_left(node.rig)


def test_a_spec_that_changes_only_smoke_flags_is_measured_on_the_live_generation(node: Node) -> None:
    """The reference deployment's last step: the same packages, the right backend flag."""
    flags_only = _spec(
        node.tmp / "flags.toml",
        node.server,
        node.root,
        node.environ,
        node.rig,
        flashinfer="0.6.3",
        backend="flashinfer",
    )
    pylock.path_for(flags_only).write_bytes(pylock.path_for(node.a).read_bytes())  # the same resolution, byte for byte
    done, doc, out = node.upgrade(flags_only, rounds=1)
    part = doc["upgrade"]
    assert part["build"]["status"] == "not needed" and part["new"]["generation"] == Path(node.live).name, out
    assert [c["name"] for c in part["plan"]["changes"]] == ["attention_backend"]
    assert done.won and done.exit_code == ExitCode.PASSED and node.current() == node.live, out
    assert "the new spec runs on the live generation" in out
    assert [g.id for g in generations.read(node.root).generations] == [Path(node.live).name]  # nothing built


def test_upgrading_to_the_live_spec_has_nothing_to_do(node: Node) -> None:
    done, doc, out = node.upgrade(node.a)
    assert (
        done.exit_code == ExitCode.PASSED and doc["upgrade"]["step"] == "plan" and node.rig.events("started") == []
    ), out
    assert f"nothing to upgrade: the live generation {Path(node.live).name} already is {node.a}'s stack" in out


def _program(node: Node, *args: str) -> subprocess.CompletedProcess[str]:
    return run_program("upgrade", *args, cwd="/", base=node.environ, timeout=120)


def test_the_program_shows_the_plan_and_refuses_bad_usage_with_exit_2(node: Node) -> None:
    spec = node.spec_b()
    shown = _program(node, "--to", str(spec), "-l", str(node.a), "-n")
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert shown.stdout.startswith(f"upgrade plan: live generation {Path(node.live).name} (from {node.a}) -> {spec}\n")
    assert (
        "dry run (--dry-run): nothing was built, launched or switched" in shown.stdout and node.current() == node.live
    )
    bad = node.tmp / "bad.toml"
    bad.write_text(spec.read_text().replace("[python]\n", "[python]\nverison = 1\n"))
    for args, message in (
        ((), "stackgate: --to NEW_SPEC is required"),
        (
            ("--to", str(spec), "--switch", "maybe"),
            "stackgate: --switch must be one of if-better, if-passes, never, not 'maybe'",
        ),
        (("--to", str(bad)), "python.verison: unknown key"),
    ):
        refused = _program(node, *args)
        assert (
            refused.returncode == ExitCode.USAGE and message in refused.stderr and "Traceback" not in refused.stderr
        ), (args, refused.stderr[-2000:])
    assert node.current() == node.live and len(list((node.root / "generations").iterdir())) == 1
