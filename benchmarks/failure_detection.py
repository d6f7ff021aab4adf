"""How fast smoke knows that a server failed: from its death, or a fatal log line, to the verdict.

The stand-in SGLang server (tests/fakes) records, with time.time(), the moment it kills its own
process tree (as SGLang does on a fatal error), writes a fatal line, or drops a stream's
connection while it stays up; smoke records when it knew (the readiness wait's or the benchmark
monitor's verdict, or, for a failed request, the moment it had asked the watcher why). Five
cases, while loading and in the middle of a stream. Also shown: the time until smoke returned,
teardown included (for the server that stays up, its drain on SIGTERM, polled every 0.2 s here,
is part of it). Goal: verdict < 1 s.

    python benchmarks/failure_detection.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from smoke_support import Rig, free_port  # noqa: E402

NCCL = (
    "torch.distributed.DistBackendError: NCCL error in: "
    "../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, "
    "unhandled cuda error"
)
OOM = [
    "Scheduler hit an exception: Traceback (most recent call last):",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
]
CASES = {
    "death while loading": ({"crash_at_start": {"phase": "graphs", "lines": OOM}}, "dying", False),
    "fatal line while loading": ({"fatal_line": {"phase": "graphs", "line": NCCL}}, "fatal_line", False),
    "death mid-stream": ({"die_mid_stream": {"after_tokens": 100, "lines": OOM}}, "dying", True),
    "fatal line mid-stream": ({"fatal_mid_stream": {"after_tokens": 100, "line": NCCL}}, "fatal_line", True),
    "stream cut, server up": ({"cut_mid_stream": {"after_tokens": 100}}, "cut", True),
}


def once(tmp: Path, behaviour: dict, event: str, benchmark: bool) -> tuple[float, float]:
    rig = Rig(tmp, free_port())
    os.environ["STACKGATE_FAKE_NVML"] = str(rig.nvml_path)
    rig.behave(**behaviour)
    spec = rig.spec(benchmark={"output_tokens": 2000, "runs": 1, "warmup": 0})
    done = rig.run(spec, benchmark=benchmark)
    returned = time.time()
    session = done.sessions[0]
    seen = session.failure_seen_at
    happened = rig.events(event)[0]["t"]
    if seen is None:
        raise SystemExit(f"smoke did not see the failure: {[r.summary for r in done.results]}")
    return seen - happened, returned - happened


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    print(f"failure detection, {repeats} repeats each (goal: verdict < 1000 ms after the event)")
    print(f"{'case':<26} {'verdict median':>14} {'verdict max':>11} {'returned median':>15}")
    for name, (behaviour, event, benchmark) in CASES.items():
        seen, returned = [], []
        for _ in range(repeats):
            with tempfile.TemporaryDirectory(prefix="stackgate-detect-") as tmp:
                a, b = once(Path(tmp), behaviour, event, benchmark)
            seen.append(a)
            returned.append(b)
        print(
            (
                f"{name:<26} {1000 * statistics.median(seen):>11.0f} ms {1000 * max(seen):>8.0f} ms "
                f"{1000 * statistics.median(returned):>12.0f} "
                "ms"
            )
        )


if __name__ == "__main__":
    main()
