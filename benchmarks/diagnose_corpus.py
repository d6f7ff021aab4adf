"""How well `stackgate diagnose` generalises: the corpus of real excerpts, split by source project.

Runs every case of tests/data/diagnose_corpus/corpus.jsonl through diagnose's own scan (never
silent, no lock: what `stackgate diagnose FILE` says of the pasted excerpt) and prints, for the
cross-project split (tests/diagnose_corpus.py: HELD_OUT_PROJECTS held out whole), the old split
by URL hash and the whole corpus: failures recognised by a named entry, the right cause first
among those, failures with at least one finding (never silent), and findings on healthy excerpts.
With --set1 PATH it also reads the shared real_failures_set1.jsonl (recognised and never silent;
it names causes in words, not entry ids). -v lists every miss.

    python benchmarks/diagnose_corpus.py [--set1 ../shared/diagnose/real_failures_set1.jsonl] [-v]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import diagnose_corpus as corpus  # noqa: E402


def report(outcomes: list[corpus.Outcome], verbose: bool) -> None:
    for split in (corpus.by_project, corpus.by_url):
        for half in ("held-out", "learn"):
            chosen = [o for o in outcomes if split(o.case) == half]
            print(corpus.score(chosen).line(f"{split.__name__} {half}"))
    print(corpus.score(outcomes).line("all"))
    if verbose:
        for o in outcomes:
            if o.case.healthy and (o.recognised or o.unrecognized):
                print(f"  ALARM {o.case.id}: {list(o.recognised)} +{o.unrecognized} unrecognized")
            elif not o.case.healthy and o.first not in o.case.expected:
                split = corpus.by_project(o.case)
                print(f"  MISS  {o.case.id} [{split}]: expected {list(o.case.expected)}, got {list(o.recognised)}")
                print(f"        +{o.unrecognized} unrecognized | {o.case.text.splitlines()[0][:100]}")


def set1(path: Path) -> None:
    cases = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    outcomes = [corpus.run(corpus.Case(c["id"], c["component"], c["source"], False, (), c["log"])) for c in cases]
    line = corpus.score(outcomes).line("set 1 (shared)").split(", right cause")[0]
    print(f"{line}, never silent {sum(not o.silent for o in outcomes)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set1", type=Path, default=None)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    report([corpus.run(case) for case in corpus.load()], args.verbose)
    if args.set1:
        set1(args.set1)


if __name__ == "__main__":
    main()
