"""How long fingerprinting a kept toolkit takes, against a bare walk of the same tree.

provision fingerprints every keep = true toolkit before and after it runs, so this cost is
paid twice per provision. The reference, measured in the same run, is a plain os.walk with an
lstat of every entry: the least any change detection must do.

    python benchmarks/toolkit_fingerprint.py [PREFIX ...]      (default: /usr/local/cuda-13.0)
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stackgate.stack.toolkit import take_fingerprint  # noqa: E402

RUNS = 5


def bare_walk(prefix: Path) -> int:
    count = 0
    for folder, dirs, files in os.walk(prefix):
        for name in dirs + files:
            os.lstat(os.path.join(folder, name))
            count += 1
    return count


def best(function, *args) -> tuple[float, object]:
    times, result = [], None
    for _ in range(RUNS):
        started = time.perf_counter()
        result = function(*args)
        times.append(time.perf_counter() - started)
    return min(times), result


def main(prefixes: list[Path]) -> None:
    for prefix in prefixes:
        take_fingerprint(prefix)  # warm the page cache, as the second fingerprint of a provision finds it
        fingerprint_s, fingerprint = best(take_fingerprint, prefix)
        walk_s, entries = best(bare_walk, prefix.resolve())
        hashed = sum(e[4] for e in fingerprint.entries.values() if e[0] == "file" and e[6])
        print(f"{prefix}: {entries} entries, {hashed / 2**20:.0f} MiB hashed (bin/*, nvvm/bin/*)")
        print(
            (
                f"  fingerprint {fingerprint_s * 1000:.0f} ms, bare walk {walk_s * 1000:.0f} ms, ratio "
                f"{fingerprint_s / walk_s:.1f}x "
                f"(best of {RUNS})"
            )
        )


if __name__ == "__main__":
    main([Path(p) for p in sys.argv[1:]] or [Path("/usr/local/cuda-13.0")])
