"""`stackgate verify --deep` on a GPU machine, warm, against a plain `stackgate verify`, in one run.

    python benchmarks/verify_deep.py [--lock L] [--python PY] [--repeat N]

Times, each in its own `stackgate` process, on this machine's real GPUs (NVML, the stack's torch):
  - `stackgate verify --lock L` (the static checks: the reference),
  - `stackgate verify --deep --lock L` once to warm flashinfer's JIT cache (not counted), then N
    times warm with each deep run started ahead of its check (the default) and N times with
    STACKGATE_DEEP_AHEAD=off (each run started with its check), alternating,
and prints the medians, the ratios deep / static and off / on, each phase of the last deep run of
each kind (from its JSON report: the prerequisites, each deep check, the static checks judged beside
them) and the deep run against its goal (<= 15 s warm on one GPU). Needs a GPU: there is nothing to
measure without one.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

import verify_speed  # noqa: E402  (beside this script: its timer and its lock retargeting)

GOAL_S = 15.0


def main() -> int:
    args = verify_speed.arguments(__doc__, "the stack's interpreter (default: the lock's)")
    with tempfile.TemporaryDirectory(prefix="stackgate-verify-deep-") as tmp:
        folder = Path(tmp)
        env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(ROOT)}
        env.pop("STACKGATE_LOCK", None)
        spec_path = verify_speed.retarget(args.lock, args.python, folder) if args.python else args.lock
        spec = ["--lock", str(spec_path)]
        program = [sys.executable, "-m", "stackgate", "verify", *spec]
        verify_speed.timed([*program, "--list"], env, 1)  # compiles the modules verify imports
        static, static_code = verify_speed.timed(program, env, args.repeat)
        cold, _ = verify_speed.timed([*program, "--deep"], env, 1)
        kinds = {"on": {**env, "STACKGATE_DEEP_AHEAD": "on"}, "off": {**env, "STACKGATE_DEEP_AHEAD": "off"}}
        times: dict[str, list[float]] = {kind: [] for kind in kinds}
        codes: dict[str, int] = {}
        for _ in range(args.repeat):
            for kind, kind_env in kinds.items():
                report = folder / f"deep-{kind}.json"
                seconds, codes[kind] = verify_speed.timed([*program, "--deep", "--json", str(report)], kind_env, 1)
                times[kind].append(seconds)
        docs = {kind: json.loads((folder / f"deep-{kind}.json").read_text()) for kind in kinds}
    on, off = (statistics.median(times[kind]) for kind in ("on", "off"))
    print(f"lock: {spec_path.name}; median of {args.repeat} runs each")
    print(f"  stackgate verify                          {static:7.2f} s  (exit {static_code})")
    print(f"  stackgate verify --deep                   {cold:7.2f} s  (the first: warms flashinfer's JIT cache)")
    print(f"  stackgate verify --deep, runs ahead       {on:7.2f} s  (exit {codes['on']}, warm)")
    print(f"  stackgate verify --deep, STACKGATE_DEEP_AHEAD=off {off:7.2f} s  (exit {codes['off']}, warm)")
    for kind, doc in docs.items():
        phases = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in doc.get("phases_s", {}).items())
        print(f"  phases, ahead {kind}: {phases}; runs started ahead/taken: {doc.get('deep_ahead')}")
    for result in docs["on"]["results"]:
        if result["check"].startswith("deep."):
            print(f"  {result['status']:5} {result['check']}: {result['summary'][:160]}")
    print(
        f"deep / static = {on / static:.2f}x; ahead off / on = {off / on:.2f}x; deep warm {on:.1f} s against the "
        f"goal of {GOAL_S:g} s: {'met' if on <= GOAL_S else 'NOT met'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
