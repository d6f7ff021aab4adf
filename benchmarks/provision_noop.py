"""Wall time of `invoke provision` when there is nothing to do, and proof that it makes no
network request.

The stack is the test stack (tests/pkgindex.py) served from 127.0.0.1. After one real build, the
index is shut down and every proxy variable points at a dead port, so a no-op that needed the
network would fail; and one no-op run is traced with `strace -f -e trace=connect` (every process
provision starts, not only Python ones), counting IPv4/IPv6 connects. The build run is traced the
same way as a control: it must show connects, or the tracing proves nothing.

    python benchmarks/provision_noop.py [--runs 10]
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _stack import ROOT, environ, provision, serve_stack, write_stack_lock

GOAL_S = 1.0
DEAD = "http://127.0.0.1:9"
_INET = re.compile(r"connect\(\d+, \{sa_family=AF_INET6?,")


def traced(spec: Path, env: dict[str, str], trace: Path) -> tuple[int, int]:
    """(exit code, IPv4/IPv6 connect() calls) of one provision under strace."""
    run = provision(spec, env, "strace", "-f", "-qq", "-e", "trace=connect", "-e", "signal=none", "-o", str(trace))
    return run.returncode, sum(1 for line in trace.read_text().splitlines() if _INET.search(line))


def reference_s(env: dict[str, str]) -> float:
    """The floor: starting the interpreter and invoke, listing the tasks."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "invoke", "--list"], cwd=ROOT, env=env, capture_output=True, check=True)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    strace = shutil.which("strace")
    with tempfile.TemporaryDirectory(prefix="stackgate-noop-") as tmp:
        base = Path(tmp)
        server = serve_stack(base / "index")
        env = environ(base / "caches")
        spec = write_stack_lock(
            base / "lock.toml", server, base / "root", resolve_with=env
        )  # its pylock, before any trace
        if strace:
            code, build_connects = traced(spec, env, base / "build.trace")
        else:
            code, build_connects = provision(spec, env).returncode, -1
        if code != 0:
            print(f"the first provision (the build) failed with exit {code}", file=sys.stderr)
            return 1
        server.close()  # the index is gone from here on
        dead_env = {
            **env,
            **{k: DEAD for k in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")},
        }
        runs = [provision(spec, dead_env) for _ in range(args.runs)]
        bad = [r for r in runs if r.returncode != 0 or not r.stdout.startswith("nothing to do")]
        if bad:
            print(f"a no-op provision did something or failed:\n{bad[0].stdout}\n{bad[0].stderr}", file=sys.stderr)
            return 1
        noop_connects = traced(spec, dead_env, base / "noop.trace")[1] if strace else -1
        floor = statistics.median(reference_s(dead_env) for _ in range(5))
    walls = sorted(r.wall_s for r in runs)
    median = statistics.median(walls)
    print(f"no-op provision, {len(walls)} runs (index shut down, proxies -> {DEAD}):")
    print(
        (
            f"  wall: median {median:.3f} s, min {walls[0]:.3f} s, max {walls[-1]:.3f} s (goal <= {GOAL_S:.1f} s: "
            f"{'met' if median <= GOAL_S else 'MISSED'})"
        )
    )
    print(
        (
            f"  reference, `python -m invoke --list` in the same run: median {floor:.3f} s; no-op / reference = "
            f"{median / floor:.2f}x"
        )
    )
    if strace:
        print(f"  IPv4/IPv6 connect() calls under strace -f: build {build_connects} (control), no-op {noop_connects}")
    else:
        print("  strace not found: the connect count was not measured (the dead index and proxies still held)")
    return 0 if median <= GOAL_S and noop_connects <= 0 else 1


if __name__ == "__main__":
    sys.exit(main())
