"""The fleet controller's cost as the fleet grows, and a fleet gate over loopback SSH nodes.

Part 1 (``scale``): the controller over an in-process transport (tests/fleet_sim.py: simulated
nodes that answer its shell commands; the version check, shipping and hashing the spec, the
remote run, reading each report back, the groups, the outliers and every report format run
unchanged) at 10, 100 and 1,000 nodes. Printed per size: wall time, peak Python memory
(tracemalloc), and each as a ratio to the smallest fleet per node, so "linear" reads as a per-node
ratio near 1.0.

Part 2 (``ssh``): real sshd nodes on loopback (tests/fleet_support.py, the stand-in SGLang
server, the fake NVML): one node's own ``stackgate gate`` (no SSH) against ``stackgate fleet gate``
over 1 node and over 8 nodes, same spec. The goal in the issue is fleet(8) <= 1.3x single; on a
machine whose cores are fewer than the nodes (each node's gate is a few Python processes and a
server), the 8 gates share the CPU, so the 8-node figure measures the machine more than the
controller: the 1-node fleet against the single gate is the controller's own overhead.

    python3 benchmarks/fleet_scale.py [scale|ssh|all] [--sizes 10,100,1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from fleet_sim import SimNode, SimTransport  # noqa: E402

from stackgate.flows.fleet import document, run_fleet  # noqa: E402
from stackgate.flows.fleetrequest import FleetRequest, nodes_of  # noqa: E402
from stackgate.models.spec import load_spec  # noqa: E402
from stackgate.render import fleetreport  # noqa: E402
from stackgate.render.ui import UI  # noqa: E402

LOCK = ROOT / "lockfiles" / "blackwell-sm120-cu128.toml"


def simulated(size: int) -> tuple[float, int]:
    """One fleet gate over ``size`` simulated nodes (every report rendered): seconds, peak bytes."""
    sims = {f"n{i:04d}": SimNode(rate=92.6 + (i % 7) * 0.05) for i in range(size)}
    for slow in range(0, size, 97):
        sims[f"n{slow:04d}"] = SimNode(rate=61.0)
    request = FleetRequest(action="gate", hosts=",".join(sims), spec_path=LOCK, parallel=16)
    ui = UI(stream=io.StringIO(), force_plain=True)
    ui.info = lambda text: None  # type: ignore[method-assign]  # a line per node on stderr is not what is measured
    tracemalloc.start()
    begun = time.perf_counter()
    nodes = nodes_of(request)
    done = run_fleet(request, nodes, load_spec(LOCK), ui, SimTransport(sims))
    doc = document(done)
    fleetreport.render(doc, ui)
    for writer in (fleetreport.junit, fleetreport.markdown, fleetreport.prometheus, fleetreport.html_page):
        writer(doc)
    seconds = time.perf_counter() - begun
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(doc["nodes"]) == size and doc["outliers"], "the simulated fleet must find its slow nodes"
    return seconds, peak


def scale(sizes: list[int], repeat: int) -> None:
    print(
        (
            f"controller over an in-process transport, {repeat} run(s) per size, median; per-node ratios against "
            f"{sizes[0]} "
            "nodes"
        )
    )
    print(
        (
            f"{'nodes':>6} {'seconds':>9} {'ms/node':>8} {'time ratio/node':>16} {'peak MiB':>9} {'KiB/node':>9} "
            f"{'memory ratio/node':>18}"
        )
    )
    base: tuple[float, float] | None = None
    for size in sizes:
        runs = [simulated(size) for _ in range(repeat)]
        seconds = statistics.median(r[0] for r in runs)
        peak = statistics.median(r[1] for r in runs)
        per_node = (seconds / size, peak / size)
        base = base or per_node
        print(
            (
                f"{size:>6} {seconds:>9.3f} {per_node[0] * 1000:>8.2f} {per_node[0] / base[0]:>16.2f} "
                f"{peak / 2**20:>9.1f} "
                f"{per_node[1] / 1024:>9.1f} {per_node[1] / base[1]:>18.2f}"
            )
        )


def ssh(repeat: int) -> None:
    from fleet_support import why_no_sshd

    reason = why_no_sshd()
    if reason:
        print(f"ssh part skipped: {reason}")
        return
    from test_fleet import Fleet

    home = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    rig = Fleet(home)
    try:
        for index in range(8):
            rig.node(f"n{index}")
        one = rig.inventory()
        text = one.read_text()
        first = text.split("[[node]]")
        (home / "one.toml").write_text(first[0] + "[[node]]" + first[1])
        env = {
            **os.environ,
            "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}",
            "NO_COLOR": "1",
            "STACKGATE_HISTORY_DIR": str(home / "controller-runs"),
        }
        single_cmd = [
            str(home / "n0" / "stackgate"),
            "gate",
            "--lock",
            str(rig.spec),
            "--json",
            str(home / "single.json"),
        ]
        fleet_cmd = [
            sys.executable,
            "-m",
            "stackgate",
            "fleet",
            "gate",
            "--lock",
            str(rig.spec),
            "--parallel",
            "8",
            "--json",
            str(home / "fleet.json"),
        ]
        figures: dict[str, list[float]] = {"single": [], "fleet1": [], "fleet8": []}
        cpu: dict[str, list[float]] = {"single": [], "fleet1": [], "fleet8": []}
        busy: dict[str, list[float]] = {"single": [], "fleet1": [], "fleet8": []}
        nodes: dict[str, list[float]] = {"fleet8": []}
        for _ in range(repeat):
            for name, argv in (
                ("single", single_cmd),
                ("fleet1", [*fleet_cmd, "--inventory", str(home / "one.toml")]),
                ("fleet8", [*fleet_cmd, "--inventory", str(one)]),
            ):
                figures[name].append(_timed(argv, env))
                cpu[name].append(CPU[-1])
                busy[name].append(BUSY[-1])
                if name == "fleet8":
                    nodes[name].append(
                        statistics.median(
                            n["duration_s"] for n in json.loads((home / "fleet.json").read_text())["nodes"]
                        )
                    )
        cores = os.cpu_count()
        single = statistics.median(figures["single"])
        print(
            (
                f"gate of the same spec, loopback sshd nodes, {repeat} run(s) each, median; this machine has {cores} "
                "CPU(s), "
                "shared with other work"
            )
        )
        for name, label in (
            ("single", "one node's own gate (no SSH)"),
            ("fleet1", "fleet gate over 1 node"),
            ("fleet8", "fleet gate over 8 nodes"),
        ):
            value = statistics.median(figures[name])
            print(
                (
                    f"  {label:<32} {value:7.2f} s  {value / single:5.2f}x  (runs: "
                    f"{', '.join(f'{v:.2f}' for v in figures[name])}; "
                    "the machine's CPUs "
                    f"{statistics.median(busy[name]):.0%} "
                    "busy)"
                )
            )
        print(
            (
                f"  in the 8-node runs, each node's own run took {statistics.median(nodes['fleet8']):.2f} s (median "
                "over "
                "nodes, median over runs)"
            )
        )
        spent = ", ".join(
            f"{label} {statistics.median(cpu[name]):.1f} s"
            for name, label in (
                ("single", "single gate"),
                ("fleet1", "fleet controller, 1 node"),
                ("fleet8", "8 nodes"),
            )
        )
        print(
            (
                "  CPU seconds of the commands run here (a node's gate runs under its sshd, not counted for the "
                "fleet): "
                f"{spent}"
            )
        )
    finally:
        rig.stop()
        shutil.rmtree(home, ignore_errors=True)


CPU: list[float] = []  #: CPU seconds (user + system, the command and its children) of each timed run
BUSY: list[float] = []  #: the whole machine's busy share of its CPUs during each timed run (/proc/stat)


def _busy() -> tuple[int, int]:
    """(busy, total) jiffies of every CPU since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def _timed(argv: list[str], env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    machine = _busy()
    begun = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - begun
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    now = _busy()
    BUSY.append((now[0] - machine[0]) / max(now[1] - machine[1], 1))
    if done.returncode != 0:
        raise SystemExit(
            f"{' '.join(argv[:4])} ... exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", nargs="?", default="all", choices=("scale", "ssh", "all"))
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.part in ("scale", "all"):
        scale([int(s) for s in args.sizes.split(",")], args.repeat)
    if args.part in ("ssh", "all"):
        ssh(args.repeat)


if __name__ == "__main__":
    main()
