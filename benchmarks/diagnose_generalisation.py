"""How well `stackgate diagnose` recognises failures it was not written from (the held-out half).

tests/data/diagnose/manifest.toml lists excerpts of real public failure reports, each with the
cause a right diagnosis names first and its half (learn / held-out), fixed by the source URL's
hash before any entry was written. For each case of the chosen half this runs the diagnose
command's own scan (never silent, no lock: what a user gets from `stackgate diagnose FILE`) and
counts it right when the first cause listed (a recognised finding that is not a consequence of
another) is one the manifest names; any other finding, or only an `unrecognized-failure`, is a
miss. Then it reads the healthy logs of SGLang, pip and uv under tests/data and counts every
warning, error and unrecognized failure found there as a false alarm (info findings, like the
expected "custom all-reduce is off on PCIe", are not alarms).

    python benchmarks/diagnose_generalisation.py [--half held-out|learn|all] [-v]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stackgate.flows import diagnose as command  # noqa: E402

DATA = ROOT / "tests" / "data"
HEALTHY = ("sglang-0.5.9-tp8-healthy.log", "pip-install-healthy.log", "uv-install-healthy.log")


def scan(path: Path) -> command.Diagnosis:
    return command.diagnose([(str(path), lambda: open(path, "rb"))], never_silent=True)


def first_cause(done: command.Diagnosis) -> str | None:
    causes = [f.id for f in done.findings if not f.consequence] or [f.id for f in done.findings]
    return causes[0] if causes else None


def score(half: str, verbose: bool) -> tuple[int, int]:
    manifest = tomllib.loads((DATA / "diagnose" / "manifest.toml").read_text(encoding="utf-8"))
    cases = [c for c in manifest["case"] if half == "all" or c["split"] == half]
    right = 0
    for case in cases:
        done = scan(DATA / "diagnose" / case["file"])
        cause = first_cause(done)
        right += cause in case["expect"]
        if verbose or cause not in case["expect"]:
            mark = "ok  " if cause in case["expect"] else "MISS"
            print(
                f"  {mark} {case['file']}: expected {'/'.join(case['expect'])}, got {cause or 'nothing recognised'}"
                + (f" (+{len(done.unrecognized)} unrecognized)" if done.unrecognized else "")
            )
    return right, len(cases)


def alarms() -> int:
    total = 0
    for name in HEALTHY:
        done = scan(DATA / name)
        found = [f for f in done.findings if f.severity != "info"] + list(done.unrecognized)
        print(
            f"  healthy {name}: {done.inputs[0].lines} lines, {len(found)} false alarm(s)"
            + "".join(f"\n    {f.id}: {f.title}" for f in found)
        )
        total += len(found)
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--half", default="held-out", choices=["held-out", "learn", "all"])
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    right, total = score(args.half, args.verbose)
    false = alarms()
    print(
        (
            f"{args.half}: {right}/{total} recognised with the right cause ({100 * right / max(total, 1):.1f}%); goal "
            ">= "
            "90%"
        )
    )
    print(f"healthy logs: {false} false alarm(s); goal 0")
    return 0 if right >= 0.9 * total and false == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
