"""The same stack provisioned with uv and with pip, from the local index, cold caches.

Each run is a whole `invoke provision` into a fresh root with empty installer caches; the
installers alternate so that neither always runs on a warmer machine. The test wheels are tiny, so
this measures resolving and installing, not download bandwidth. Besides the totals it prints the
install steps alone (torch family, stack, pip's override step) and environment creation, read from
provision's own progress lines.

    python benchmarks/install_speed.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from _stack import Run, environ, provision, serve_stack, write_stack_lock

INSTALLERS = ("uv", "pip")


def seconds(run: Run, *prefixes: str) -> float:
    return sum(s for what, s in run.steps if what.startswith(prefixes))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[Run]] = {name: [] for name in INSTALLERS}
    with tempfile.TemporaryDirectory(prefix="stackgate-install-") as tmp:
        base = Path(tmp)
        server = serve_stack(base / "index")
        for repeat in range(args.repeats):
            for name in INSTALLERS if repeat % 2 == 0 else reversed(INSTALLERS):
                run_dir = base / f"{name}-{repeat}"
                lock = write_stack_lock(run_dir.with_suffix(".toml"), server, run_dir / "root", installer=name)
                run = provision(lock, environ(run_dir / "caches"))
                if run.returncode != 0:
                    print(f"{name} provision failed (exit {run.returncode}):\n{run.stderr[-3000:]}", file=sys.stderr)
                    return 1
                results[name].append(run)
        server.close()
    rows = {}
    for name, runs in results.items():
        rows[name] = (
            statistics.median(r.wall_s for r in runs),
            statistics.median(seconds(r, "install ") for r in runs),
            statistics.median(seconds(r, "create generation") for r in runs),
        )
    print(f"the test stack (8 locked pins, the torch family from its own index), cold caches, median of {args.repeats}:")
    print(f"  {'installer':<9} {'provision':>10} {'installs':>9} {'create env':>11}")
    for name, (total, installs, create) in rows.items():
        print(f"  {name:<9} {total:>9.2f}s {installs:>8.2f}s {create:>10.2f}s")
    (uv_total, uv_installs, uv_create), (pip_total, pip_installs, pip_create) = rows["uv"], rows["pip"]
    print(f"  pip / uv: provision {pip_total / uv_total:.2f}x, install steps {pip_installs / uv_installs:.2f}x, environment creation {pip_create / uv_create:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
