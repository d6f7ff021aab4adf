"""`stackgate report` and `report A B` as the history grows: the run index against the old scan.

    python benchmarks/history_scale.py [--sizes 1000,10000,100000] [--scan-max 10000] [--repeat 3] [--keep DIR]

For each size, writes that many realistic gate documents (a gate's own document with a full
fingerprint: 169 distributions, ~60 check results, deep figures; ~20 KB each, 64 hosts, 3 locks)
into a temporary runs directory, then times, each in its own `stackgate` process:
  - `report --reindex` (the index rebuilt from every document),
  - `report` (the newest 20 runs and a trend per lock) and `report -2 -1`, through the index
    (the median of --repeat runs),
  - the same two with `STACKGATE_HISTORY_INDEX=off`: every document read, as before the index
    (up to --scan-max runs: at 100,000 documents the scan needs ~10 GB of memory),
  - `stackgate --version`: the program's own start, the floor under every figure.
Prints wall time and peak RSS of each, and the ratio scan / index.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from history_support import gate_doc  # noqa: E402

from stackgate.models.result import Result, Status  # noqa: E402
from stackgate.runs import fingerprint as fp  # noqa: E402

TIME = shutil.which("time", path="/usr/bin:/bin") or "/usr/bin/time"  # GNU time (Debian: apt-get install -y time)
HOSTS = [f"gpu-node-{i:03d}" for i in range(64)]
LOCKS = ["blackwell-sm120-cu130", "hopper-sm90-cu130", "blackwell-sm120-cu128"]


def template() -> str:
    """One gate document as JSON, with @@...@@ where each run differs."""
    doc = gate_doc(decode=92.0)
    finger = doc["gate"]["fingerprint"]["components"]
    finger["distributions"] = {f"package-{i:03d}": f"{i % 7}.{i % 13}.{i % 5}" for i in range(169)}
    finger["toolkits"] = {"/usr/local/cuda-13.0": "13.0 (V13.0.88)", "/usr/local/cuda-12.8": "12.8 (V12.8.93)"}
    finger["gpu"] = {
        "driver": "580.82.07",
        "count": "8",
        **{f"gpu{i}": "NVIDIA RTX PRO 6000 Blackwell, compute capability 12.0" for i in range(8)},
    }
    doc["gate"]["fingerprint"] = {**fp.Fingerprint(finger).to_dict(), "digest": "@@DIGEST@@", "short": "@@SHORT@@"}
    data = {"names": [f"n{j}" for j in range(5)]}
    extra = [
        Result(
            f"area{i % 8}.check{i}",
            Status.PASS,
            f"check {i}: everything as locked, {i} item(s) compared",
            (f"detail line {i}",),
            data={"value": i, **data},
        )
        for i in range(56)
    ]
    doc["results"] += [{**r.to_dict(), "stage": "verify"} for r in extra]
    doc["results"].append(
        {
            **Result("deep.collective", Status.PASS, "busbw", data={"peak_busbw_gbs": "@@BUSBW@@"}).to_dict(),
            "stage": "verify",
        }
    )
    gpus = [
        {"index": i, "bfloat16": {"n": 8192, "ms": 2.0, "tflops": "@@TFLOPS@@", "rel_err": 0.001}} for i in range(8)
    ]
    doc["results"].append(
        {**Result("deep.gpu_work", Status.PASS, "work", data={"gpus": gpus}).to_dict(), "stage": "verify"}
    )
    doc.update(run_id="@@RUNID@@", started="@@STARTED@@", verdict="@@VERDICT@@")
    doc["host"]["hostname"] = "@@HOST@@"
    doc["lock"]["name"] = "@@LOCK@@"
    doc["gate"]["benchmark"]["decode_tok_s"]["mean"] = "@@DECODE@@"
    return json.dumps(doc, indent=2)


def generate(folder: Path, count: int, text: str, seed: int = 1) -> int:
    """``count`` documents a minute apart, each with its own host, lock, figures and verdict."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    start = 1_700_000_000
    size = 0
    for i in range(count):
        when = time.gmtime(start + 60 * i)
        run_id = time.strftime("%Y%m%dT%H%M%SZ", when) + f"-gate-{i:06x}"
        digest = f"{rng.randrange(4):064x}"
        values = {
            '"@@RUNID@@"': json.dumps(run_id),
            '"@@STARTED@@"': json.dumps(time.strftime("%Y-%m-%dT%H:%M:%S+00:00", when)),
            '"@@VERDICT@@"': '"failed"' if rng.random() < 0.05 else '"passed"',
            '"@@HOST@@"': json.dumps(HOSTS[i % len(HOSTS)]),
            '"@@LOCK@@"': json.dumps(LOCKS[i % len(LOCKS)]),
            '"@@DECODE@@"': f"{rng.gauss(92.0, 1.5):.3f}",
            '"@@DIGEST@@"': json.dumps(digest),
            '"@@SHORT@@"': json.dumps(digest[:12]),
            '"@@BUSBW@@"': f"{rng.gauss(40.0, 1.0):.2f}",
            '"@@TFLOPS@@"': f"{rng.gauss(400.0, 5.0):.1f}",
        }
        body = text
        for key, value in values.items():
            body = body.replace(key, value)
        (folder / f"{run_id}.json").write_text(body)
        size += len(body)
    return size // count


def measure(args: list[str], env: dict[str, str], *, quiet: bool = False) -> tuple[float, float, int]:
    """(wall seconds, peak RSS in MiB, exit status) of one `stackgate` process.

    The peak RSS is GNU time's (``%M``): a child spawned straight from this process would count
    this process's own memory too (Linux carries the parent's peak across a vfork and exec).
    """
    with tempfile.NamedTemporaryFile("r", prefix="stackgate-rss-") as rss:
        argv = [sys.executable, "-m", "stackgate", *args]
        started = time.perf_counter()
        done = subprocess.run(
            [TIME, "-f", "%M", "-o", rss.name, *argv],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        wall = time.perf_counter() - started
        peak_kb = float(rss.read().split()[-1])
    if done.returncode and not quiet:
        print(f"    ({' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-300:]})")
    return wall, peak_kb / 1024, done.returncode


def row(label: str, figures: tuple[float, float, int]) -> str:
    return f"  {label:<34} {figures[0]:8.3f} s  {figures[1]:8.1f} MiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--scan-max", type=int, default=10000, help="time the scan only up to this many runs")
    parser.add_argument(
        "--repeat", type=int, default=3, help="indexed commands: the median of this many runs (the scan runs once)"
    )
    parser.add_argument(
        "--keep", type=Path, help="write the runs here and keep them (default: a temporary folder, removed)"
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    base = {
        **os.environ,
        "NO_COLOR": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]),
    }
    base.pop("STACKGATE_LOCK", None)
    text = template()
    work = args.keep or Path(tempfile.mkdtemp(prefix="stackgate-history-"))
    # As installed: compiled modules kept (here, out of the checkout), not compiled at every start.
    base.pop("PYTHONDONTWRITEBYTECODE", None)
    base["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    try:
        measure(["report", "--runs-dir", str(work / "none"), "-1"], base, quiet=True)  # compiles what report imports
        measure(["report", "--runs-dir", str(work / "none")], base, quiet=True)
        start = measure(["--version"], base)
        print(f"stackgate --version (the program's start): {start[0]:.3f} s, {start[1]:.1f} MiB")
        for size in sizes:
            run_size(work / str(size), size, text, base, args.scan_max, args.repeat)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def median_of(repeat: int, argv: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """The run of median wall time among ``repeat`` (this machine is shared: one run can be unlucky)."""
    runs = sorted((measure(argv, env) for _ in range(repeat)), key=lambda r: r[0])
    return runs[len(runs) // 2]


def run_size(folder: Path, size: int, text: str, base: dict[str, str], scan_max: int, repeat: int) -> None:
    clock = time.perf_counter()
    if folder.is_dir() and sum(1 for _ in folder.glob("*.json")) == size:
        print(f"\n{size} runs (kept from an earlier run) in {folder}")
    else:
        each = generate(folder, size, text)
        print(f"\n{size} runs ({each / 1024:.1f} KB each, written in {time.perf_counter() - clock:.1f} s) in {folder}")
    env = {**base, "STACKGATE_HISTORY_DIR": str(folder)}
    print(row("report --reindex", measure(["report", "--reindex"], env)))
    indexed = {
        name: median_of(repeat, argv, env)
        for name, argv in (("report", ["report"]), ("report -2 -1", ["report", "-2", "-1"]))
    }
    for name, figures in indexed.items():
        print(row(f"{name} (index)", figures))
    if size > scan_max:
        print(f"  (scan not timed above --scan-max {scan_max})")
        return
    scan_env = {**env, "STACKGATE_HISTORY_INDEX": "off"}
    for name, argv in (("report", ["report"]), ("report -2 -1", ["report", "-2", "-1"])):
        figures = measure(argv, scan_env)
        print(row(f"{name} (scan, no index)", figures))
        wall, rss = figures[0] / indexed[name][0], figures[1] / indexed[name][1]
        print(f"  {name}: scan / index = {wall:.1f}x wall time, {rss:.1f}x peak RSS")


if __name__ == "__main__":
    sys.exit(main())
