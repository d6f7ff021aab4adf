"""`stackgate verify --cached` on an unchanged node against a full `stackgate verify`, in one run.

    python benchmarks/verify_cached.py [--lock L] [--python PY] [--real-nvml] [--repeat N]

Times, each in its own `stackgate` process, on the same node and environment:
  - `stackgate verify --lock L` (every static and live check: the reference),
  - `stackgate verify --cached --lock L`, once to fill the cache, then N times on the unchanged
    node (the live GPU checks run, the static ones' results come from the cache),
  - `stackgate --version` (the program's start through invoke; a cached verify of these flags takes
    the express lane, stackgate/express.py, which starts without it),
and prints the medians and the ratio full / cached (goal >= 10).
The node: L (default: the H200 profile) pointed at --python (default: this interpreter); NVML is
the test suite's fake of one H200 unless --real-nvml (on a GPU machine, with its own lock).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import verify_speed  # noqa: E402  (beside this script: its timer and its lock retargeting)
from verify_speed import retarget  # noqa: E402

from stackgate.models.spec import load_spec  # noqa: E402


def timed(argv: list[str], env: dict[str, str], repeat: int) -> tuple[float, int]:
    """Median wall time of ``repeat`` runs of the program, and the last exit status."""
    return verify_speed.timed([sys.executable, "-m", "stackgate", *argv], env, repeat)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lock", type=Path, default=ROOT / "lockfiles" / "hopper-sm90-cu130.toml")
    parser.add_argument(
        "--python", help="the stack's interpreter (default: this one, unless --real-nvml keeps the lock's)"
    )
    parser.add_argument("--real-nvml", action="store_true", help="use the machine's NVML and the lock as it is")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stackgate-verify-cached-") as tmp:
        folder = Path(tmp)
        env = {
            **os.environ,
            "NO_COLOR": "1",
            "XDG_CACHE_HOME": str(folder / "cache"),
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
        }
        env.pop("STACKGATE_LOCK", None)
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: compiled modules kept (here, out of the checkout)
        env["PYTHONPYCACHEPREFIX"] = str(folder / "pycache")
        spec_path = args.lock
        if not args.real_nvml:
            spec_path = retarget(args.lock, args.python or sys.executable, folder)
            h200 = {
                "name": "NVIDIA H200",
                "cc": [9, 0],
                "pcie": [5, 5, 5, 16, 16],
                "ecc": [0, 0],
                "memory": [141 * 2**30, 2**29],
                "processes": [],
                "unsupported": [],
            }
            machine = {"driver": "580.159.03", "cuda": 13000, "gpus": [h200]}
            (folder / "nvml.json").write_text(json.dumps(machine))
            env.update(STACKGATE_NVML_MODULE="fakes.fake_nvml", STACKGATE_FAKE_NVML=str(folder / "nvml.json"))
        elif args.python:
            spec_path = retarget(args.lock, args.python, folder)
        spec = ["--lock", str(spec_path)]
        timed(["verify", "--list"], env, 1)  # compiles the modules verify imports
        start, _ = timed(["--version"], env, args.repeat)
        full, full_code = timed(["verify", *spec], env, args.repeat)
        first, _ = timed(["verify", "--cached", *spec], env, 1)
        cached, cached_code = timed(
            ["verify", "--cached", *spec, "--prom", str(folder / "node.prom")], env, args.repeat
        )
        hit = (
            "stackgate_verify_cache_hit" in (text := (folder / "node.prom").read_text())
            and "cache_hit{" in text
            and text.split("stackgate_verify_cache_hit{")[1].split()[1] == "1"
        )
    interpreter = (
        load_spec(args.lock).python.target if args.real_nvml and not args.python else args.python or sys.executable
    )
    print(f"lock: {spec_path.name}  interpreter: {interpreter}")
    print(f"NVML: {'this machine' if args.real_nvml else 'the fake of one H200'}; median of {args.repeat} runs each")
    print(f"  stackgate --version            {start:7.3f} s  (the program's start)")
    print(f"  stackgate verify               {full:7.3f} s  (exit {full_code})")
    print(f"  stackgate verify --cached      {first:7.3f} s  (the first: fills the cache)")
    print(f"  stackgate verify --cached      {cached:7.3f} s  (exit {cached_code}, cache hit: {hit})")
    print(f"full / cached = {full / cached:.1f}x  (goal >= 10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
