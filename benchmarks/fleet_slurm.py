"""`stackgate fleet --engine slurm` and `stackgate slurm-health` on a real local Slurm, in one run.

    python benchmarks/fleet_slurm.py [--repeat N]

Starts the test suite's cluster (tests/slurm_cluster.py: munged, slurmctld, four slurmd on
loopback ports; root and slurm-wlm needed) with the test fleet's nodes (fake NVML of one H200,
the stand-in SGLang server decoding at 400 tok/s, each node on its own port), then times:

  - one node's own `stackgate gate` (the reference), and `fleet gate --engine slurm --nodes 4`
    (allocation, sbcast, one srun step, four gates at once, release): the ratio of the two;
  - srun's own step overhead: `srun -N4 true` inside an allocation (median of N), and `sbcast`
    of a spec to four nodes;
  - `stackgate slurm-health` as slurmd runs it (a bare environment): nothing changed (the
    median of N, cache hit), a node that just broke (GPU gone: verify fails, the node is
    drained), the node fixed (resumed), and a changed stack (a distribution added: cache miss);
    beside them `stackgate --version`, the program's own start.

The machine's cores are shared by every gate: on a 2-core host four gates at once take longer
than one by their CPU, not by Slurm.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import slurm_cluster  # noqa: E402
from fakes.fake_nvml import machine  # noqa: E402
from fleet_support import VERIFIABLE, nvml_file  # noqa: E402
from test_fleet_slurm import SlurmFleet  # noqa: E402


def wall(argv: list[str], env: dict[str, str], repeat: int = 1) -> tuple[float, int]:
    """Median wall time of ``repeat`` runs, and the last exit status."""
    times, code = [], 0
    for _ in range(repeat):
        started = time.perf_counter()
        code = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
        times.append(time.perf_counter() - started)
    return statistics.median(times), code


def health_env(node_env: dict[str, str], node: str) -> dict[str, str]:
    """What slurmd gives a HealthCheckProgram (SLURMD_NODENAME, no PATH), plus the node's fakes."""
    keep = {k: v for k, v in node_env.items() if k.startswith(("STACKGATE_", "PYTHON"))}
    return {"SLURMD_NODENAME": node, **keep, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    why = slurm_cluster.why_no_slurm()
    if why:
        print(f"cannot run: {why}")
        return 2
    cluster = slurm_cluster.start(4)
    try:
        with tempfile.TemporaryDirectory(prefix="stackgate-fleet-slurm-") as tmp:
            return measure(cluster, Path(tmp), args.repeat)
    finally:
        cluster.stop()


def measure(cluster: slurm_cluster.Cluster, home: Path, repeat: int) -> int:
    fleet = SlurmFleet(cluster, home)
    envs = {n: fleet.node(n) for n in cluster.nodes}
    controller = {
        **cluster.env,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}",
        "NO_COLOR": "1",
        "STACKGATE_HISTORY_DIR": str(home / "runs"),
    }
    controller.pop("STACKGATE_LOCK", None)
    node = {**controller, **envs["n1"]}
    wall(
        [str(fleet.program), "gate", "--lock", str(fleet.spec), "--json", str(home / "warm.json")], node
    )  # compiles the modules
    one, one_code = wall(
        [str(fleet.program), "gate", "--lock", str(fleet.spec), "--json", str(home / "one.json")], node, repeat=1
    )
    slurm_args = [
        "--engine",
        "slurm",
        "--stackgate",
        str(fleet.program),
        "--node-dir",
        str(slurm_cluster.NODE_LOCAL),
        "--lock",
        str(fleet.spec),
    ]
    four, four_code = wall(
        [
            sys.executable,
            "-m",
            "stackgate",
            "fleet",
            "gate",
            *slurm_args,
            "--nodes",
            "4",
            "--json",
            str(home / "f.json"),
        ],
        controller,
    )
    phases = json.loads((home / "f.json").read_text())
    slowest = max(n["duration_s"] for n in phases["nodes"])
    step, sbcast = srun_overhead(cluster, home, repeat)
    print(
        f"Slurm {cluster.run('sinfo', '--version').stdout.strip()}, 4 nodes on {os.cpu_count()} cores;"
        f" median of {repeat} where repeated"
    )
    print(f"  one node's own gate                        {one:7.2f} s  (exit {one_code})")
    print(
        f"  fleet gate --engine slurm --nodes 4        {four:7.2f} s"
        f"  (exit {four_code}; slowest node's own run {slowest:.2f} s)"
    )
    print(f"  fleet over 4 / one node's gate             {four / one:7.2f} x")
    print(f"  engine's own share (fleet - slowest node)  {four - slowest:7.2f} s")
    print(f"  srun -N4 true in an allocation (a step)    {step:7.3f} s")
    print(f"  sbcast of the spec to 4 nodes              {sbcast:7.3f} s")
    health(fleet, envs["n1"], home, repeat)
    return 0


def srun_overhead(cluster: slurm_cluster.Cluster, home: Path, repeat: int) -> tuple[float, float]:
    granted = cluster.run("salloc", "--no-shell", "-N4", "--job-name=bench")
    job = granted.stderr.split()[-1]
    try:
        env = cluster.env
        step, _ = wall(["srun", f"--jobid={job}", "-N4", "--ntasks-per-node=1", "--overlap", "true"], env, repeat)
        (home / "spec.toml").write_bytes(os.urandom(4096))
        sbcast, _ = wall(
            ["sbcast", "-f", f"--jobid={job}", str(home / "spec.toml"), f"{slurm_cluster.NODE_LOCAL}/bench.toml"],
            env,
            repeat,
        )
    finally:
        cluster.run("scancel", job, check=False)
    return step, sbcast


def cache_hit(prom: Path) -> bool:
    """Whether the last verify --cached reused its static results (its textfile says so)."""
    for line in prom.read_text().splitlines():
        if line.startswith("stackgate_verify_cache_hit{"):
            return line.split()[-1] == "1"
    return False


def health(fleet: SlurmFleet, node_env: dict[str, str], home: Path, repeat: int) -> None:
    cluster = fleet.cluster
    nvml = Path(node_env["STACKGATE_FAKE_NVML"])
    config = home / "health.toml"
    config.write_text(
        f'[slurm-health]\nlock = "{fleet.spec}"\nprom = "{home / "verify.prom"}"\ntimeout_s = 60\n'
        f"checks = {json.dumps(list(VERIFIABLE))}\n"
        f'slurm_bin = "/usr/bin"\nslurm_conf = "{cluster.conf}"\nnode = "n1"\nstate_dir = "{home / "state"}"\n'
    )
    env = {**health_env(node_env, "n1"), "XDG_CACHE_HOME": str(home / "cache")}
    check = [sys.executable, "-m", "stackgate", "slurm-health", "--config", str(config)]
    start, _ = wall([sys.executable, "-m", "stackgate", "--version"], env, repeat)
    wall(check, env)  # fills the cache
    same, same_code = wall(check, env, repeat)
    same_hit = cache_hit(home / "verify.prom")
    prolog, prolog_code = wall([*check, "--role", "prolog"], env, repeat)
    epilog, epilog_code = wall([*check, "--role", "epilog"], {**env, "SLURM_JOB_ID": "999999"}, repeat)
    broke_times, fixed_times, changed_times, states = [], [], [], set()
    site = next((fleet.python.parent.parent / "lib").glob("python3*/site-packages"))
    for round_ in range(repeat):
        nvml.write_text(json.dumps(machine([])))
        broke_times.append(wall(check, env))
        states.add(("broke", cluster.states()["n1"]))
        nvml_file(nvml)
        fixed_times.append(wall(check, env))
        states.add(("fixed", cluster.states()["n1"].rstrip("*")))
        info = site / f"extra_dist_{round_}-1.0.dist-info"  # a distribution added: the static checks run again
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: extra-dist-{round_}\nVersion: 1.0\n")
        changed_times.append(wall(check, env))
    changed_hit = cache_hit(home / "verify.prom")
    broke, broke_code = statistics.median(t for t, _ in broke_times), broke_times[-1][1]
    fixed, fixed_code = statistics.median(t for t, _ in fixed_times), fixed_times[-1][1]
    changed, changed_code = statistics.median(t for t, _ in changed_times), changed_times[-1][1]
    drained = ",".join(sorted(state for when, state in states if when == "broke"))
    resumed = ",".join(sorted(state for when, state in states if when == "fixed"))
    print(f"  stackgate --version (the program's start)  {start:7.3f} s")
    print(f"  slurm-health, nothing changed              {same:7.3f} s  (exit {same_code}; cache hit: {same_hit})")
    print(f"  slurm-health --role prolog, nothing changed {prolog:6.3f} s  (exit {prolog_code})")
    print(f"  slurm-health --role epilog, nothing left   {epilog:7.3f} s  (exit {epilog_code}; /proc read)")
    print(f"  slurm-health, GPU gone: drains             {broke:7.3f} s  (exit {broke_code}; sinfo: {drained})")
    print(f"  slurm-health, fixed: resumes               {fixed:7.3f} s  (exit {fixed_code}; sinfo: {resumed})")
    print(
        f"  slurm-health, a distribution added         {changed:7.3f} s"
        f"  (exit {changed_code}; cache hit: {changed_hit})"
    )
    print(f"  changed / unchanged                        {changed / same:7.2f} x")
    print(f"  unchanged / the program's start            {same / start:7.2f} x")


if __name__ == "__main__":
    sys.exit(main())
