"""A cold provision from the pylock, with uv and with pip, from the local index.

The test stack's spec is locked once (`invoke lock`'s code, not timed); then each run is a whole
`invoke provision` into a fresh root with empty installer caches, installing exactly that pylock;
the installers alternate so that neither always runs on a warmer machine. The test wheels are
tiny, so this measures environment creation and installing, not download bandwidth. Besides the
totals it prints environment creation and the install step alone, read from provision's own
progress lines, and, as the reference for environment creation, `python -m venv` (ensurepip) of
the same interpreter, measured in the same run.

    python benchmarks/install_speed.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _stack import Run, environ, provision, serve_stack, write_stack_lock

INSTALLERS = ("uv", "pip")
GOAL = 3.0  #: pip / uv for a whole cold provision


def seconds(run: Run, *prefixes: str) -> float:
    return sum(s for what, s in run.steps if what.startswith(prefixes))


def venv_s(python: str, home: Path) -> float:
    """`python -m venv` with ensurepip: how environments were made before uv made them."""
    started = time.perf_counter()
    subprocess.run([python, "-m", "venv", str(home)], check=True)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[Run]] = {name: [] for name in INSTALLERS}
    ensurepip: list[float] = []
    with tempfile.TemporaryDirectory(prefix="stackgate-install-") as tmp:
        base = Path(tmp)
        server = serve_stack(base / "index")
        locking = environ(base / "lock-caches")
        for repeat in range(args.repeats):
            for name in INSTALLERS if repeat % 2 == 0 else reversed(INSTALLERS):
                run_dir = base / f"{name}-{repeat}"
                run_dir.mkdir()
                spec = write_stack_lock(
                    run_dir / "stack.toml", server, run_dir / "root", installer=name, resolve_with=locking
                )
                run = provision(spec, environ(run_dir / "caches"))
                if run.returncode != 0:
                    print(f"{name} provision failed (exit {run.returncode}):\n{run.stderr[-3000:]}", file=sys.stderr)
                    return 1
                results[name].append(run)
            ensurepip.append(venv_s(locking["STACKGATE_BASE_PYTHON"], base / f"venv-{repeat}"))
        server.close()
    rows = {}
    for name, runs in results.items():
        rows[name] = (
            statistics.median(r.wall_s for r in runs),
            statistics.median(seconds(r, "install ") for r in runs),
            statistics.median(seconds(r, "create generation") for r in runs),
        )
    print(
        "the test stack's pylock (9 distributions, the torch family from its own index), cold installer caches, "
        f"median of {args.repeats}:"
    )
    print(f"  {'installer':<9} {'provision':>10} {'install':>8} {'create env':>11}")
    for name, (total, installs, create) in rows.items():
        print(f"  {name:<9} {total:>9.2f}s {installs:>7.2f}s {create:>10.2f}s")
    (uv_total, uv_installs, uv_create), (pip_total, pip_installs, pip_create) = rows["uv"], rows["pip"]
    reference = statistics.median(ensurepip)
    print(
        f"  reference: python -m venv (ensurepip) {reference:.2f}s; uv venv + the bundled pip wheel (pip's create "
        f"env) {pip_create:.2f}s: {reference / pip_create:.1f}x faster"
    )
    verdict = "met" if pip_total / uv_total >= GOAL else "not met"
    print(
        f"  pip / uv: provision {pip_total / uv_total:.2f}x (goal >= {GOAL:.0f}x: {verdict}), install step "
        f"{pip_installs / uv_installs:.2f}x, environment creation {pip_create / uv_create:.2f}x"
    )
    shared = statistics.median([uv_total - uv_installs - uv_create, pip_total - pip_installs - pip_create])
    print(
        "  the installers' part (create env + install): pip / uv "
        f"{(pip_installs + pip_create) / (uv_installs + uv_create):.2f}x; "
        f"the rest of a provision (stackgate starting, planning, checking, verifying: the same for both) {shared:.2f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
