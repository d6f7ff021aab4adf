"""What `stackgate upgrade` costs on top of the work it automates: its wall time against the same
steps done by hand, in the same run.

Against the test package index on 127.0.0.1 (real uv), the stand-in SGLang server and the fake
NVML (the tests' rig: spec A with flashinfer 0.6.3 and triton, spec B with the 0.6.4 override and
flashinfer), each repeat takes two fresh copies of a root where spec A is live and, alternately:

- by hand (the reference): `provision --yes` of spec B (build, checks, switch), then four smokes
  with `--benchmark`, live, new, new, live, each with its own lock;
- `upgrade --to B` (plan, build beside, verify with the checks a machine without GPUs passes,
  the same four legs, the decision, the switch, the JSON, Markdown and HTML reports).

It prints each one's median wall time and the ratio. On a real stack the model loads dominate
both; this shows what the upgrade itself adds.

    python benchmarks/upgrade_overhead.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import io
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import test_upgrade as rig_of  # noqa: E402
from fakes import fake_nvml  # noqa: E402
from pkgindex import serve_stack  # noqa: E402

from stackgate.commands import provision, upgrade  # noqa: E402
from stackgate.flows import smoke  # noqa: E402
from stackgate.flows.upgrade import UpgradeRequest, upgrade_node  # noqa: E402
from stackgate.models.spec import load_spec  # noqa: E402
from stackgate.render.ui import UI  # noqa: E402
from stackgate.runs import abtest  # noqa: E402
from stackgate.stack import generations  # noqa: E402


def _isolated_environ(**extra: str) -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("tests_support", ROOT / "tests" / "support.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.isolated_environ(**extra)


def by_hand(node: rig_of.Node, b: Path) -> float:
    started = time.monotonic()
    live = generations.read(node.root).current
    assert live is not None
    if (
        provision.run(
            provision.ProvisionRequest(spec_path=b, yes=True, environ=node.environ),
            UI(stream=io.StringIO(), force_plain=True),
        )
        != 0
    ):
        raise SystemExit("the reference provision failed")
    new = generations.read(node.root).current
    assert new is not None
    for position, side in enumerate(abtest.order(2), 1):
        path, generation = (node.a, live) if side == abtest.LIVE else (b, new)
        spec = load_spec(path)
        spec = dataclasses.replace(spec, python=dataclasses.replace(spec.python, interpreter=generation.python))
        request = smoke.SmokeRequest(spec_path=path, benchmark=True, run_dir=node.tmp / "by-hand" / str(position))
        done = smoke.run_smoke(
            spec, request, UI(stream=io.StringIO(), force_plain=True), environ=node.environ, nvml_lib=fake_nvml
        )
        if not done.verdict.passed:
            raise SystemExit(f"the reference smoke failed: {done.verdict.reason}")
    return time.monotonic() - started


def whole_upgrade(node: rig_of.Node, b: Path) -> float:
    out = node.tmp / "reports"
    out.mkdir(exist_ok=True)
    request = UpgradeRequest(
        to=b,
        spec_path=node.a,
        verify_checks=rig_of.VERIFY,
        environ=node.environ,
        run_dir=node.tmp / "servers",
        json_path=out / "u.json",
        markdown_path=out / "u.md",
        html_path=out / "u.html",
    )
    started = time.monotonic()
    done = upgrade_node(request, UI(stream=io.StringIO(), force_plain=True), nvml_lib=fake_nvml)
    upgrade.write_reports(done.document(), request)
    seconds = time.monotonic() - started
    if not done.won:
        raise SystemExit(f"the upgrade did not switch: {done.document()['reason']}")
    return seconds


class _Env:
    """What the tests' Node expects of pytest's monkeypatch: setenv."""

    def setenv(self, key: str, value: str) -> None:
        os.environ[key] = value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        server = serve_stack(base / "index")
        environ = _isolated_environ(
            UV_CACHE_DIR=str(base / "uv"),
            STACKGATE_BASE_PYTHON=os.path.realpath(getattr(sys, "_base_executable", sys.executable)),
        )
        os.environ["STACKGATE_HISTORY_DIR"] = str(base / "runs")
        (base / "seed").mkdir()
        seed = rig_of.Rig(base / "seed", rig_of.free_port())
        a = rig_of._spec(
            base / "seed" / "a.toml",
            server,
            base / "seed" / "root",
            environ,
            seed,
            flashinfer="0.6.3",
            backend="triton",
        )
        if (
            provision.run(
                provision.ProvisionRequest(spec_path=a, yes=True, environ=environ),
                UI(stream=io.StringIO(), force_plain=True),
            )
            != 0
        ):
            raise SystemExit("provisioning spec A failed")
        hand, auto = [], []
        for i in range(args.repeats):
            for kind, measure, into in (("by-hand", by_hand, hand), ("upgrade", whole_upgrade, auto)):
                folder = base / f"{kind}-{i}"
                folder.mkdir()
                node = rig_of.Node(base / "seed" / "root", folder, server, environ, _Env())  # type: ignore[arg-type]
                into.append(measure(node, node.spec_b()))
                rig_of.kill_leftovers(node.rig)
                shutil.rmtree(folder / "root", ignore_errors=True)
            print(f"repeat {i + 1}: by hand {hand[-1]:.2f} s, upgrade {auto[-1]:.2f} s", flush=True)
        server.close()
    reference, measured = statistics.median(hand), statistics.median(auto)
    print(f"by hand (provision B, 4 benchmark smokes): median {reference:.2f} s over {len(hand)}")
    print(
        (
            f"stackgate upgrade (plan, build, verify, 4 legs, decide, switch, 3 reports): median {measured:.2f} s over "
            f"{len(auto)}"
        )
    )
    print(f"upgrade / by hand: {measured / reference:.2f}x ({measured - reference:+.2f} s)")


if __name__ == "__main__":
    main()
