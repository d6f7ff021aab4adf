"""How fast `stackgate diagnose` reads a large server log, against `grep -E` with the same patterns.

Writes a server log of SGLang 0.5.9's own log lines (a TP8 start, then serving traffic: decode
and prefill batches, access lines) with a few failures planted at known lines, then times, in
the same run and on the same file:

* ``python -m stackgate diagnose --path LOG`` (the whole command: interpreter start, lock-free
  run, streaming scan, report), checking that it finds every planted failure at its line;
* ``grep -n -E -f PATTERNS LOG`` with LC_ALL=C (line numbers, as diagnose reports them), the
  knowledge base's patterns converted to ERE: named and non-capturing groups become plain
  groups, lazy quantifiers greedy, ``\\d`` becomes ``[0-9]``, a back-reference ``(?P=name)``
  becomes ``[^[:space:]]+``. grep reads one line at a
  time, so a multi-line signature (a traceback window, a resolver report) is given to grep as
  its prefilter key, the literal its key line must contain;
* the scanner alone, in this process (no interpreter start), for reference.

Each is run ``--repeat`` times; the best time counts. Prints MB/s and the ratio to grep; the
goal is diagnose within 2x of grep (issue 14; it was 2.4x, 0.7x since the scan searches translated blocks).

    python benchmarks/diagnose_speed.py [--size-mb 500] [--repeat 3] [--dir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stackgate import scan as signatures  # noqa: E402

STARTUP = ROOT / "tests" / "data" / "sglang-0.5.9-tp8-healthy.log"

#: The failures planted in the log: (signature id, the lines, which of them is the finding's line).
PLANTED = [
    (
        "sglang-attention-backend-default",
        ["[2026-02-03 09:00:18 TP0] Attention backend not specified. Use triton backend by default."],
        0,
    ),
    (
        "cuda-major-mismatch",
        ["ImportError: libcudart.so.12: cannot open shared object file: No such file or directory"],
        0,
    ),
    (
        "sglang-symm-mem-keyerror",
        [
            "[2026-02-03 11:00:19 TP0] Scheduler hit an exception: Traceback (most recent call last):",
            "  File "
            '"/opt/stackgate/current/lib/python3.12/site-packages/sglang/srt/distributed/'
            'device_communicators/torch_symm_mem.py", '
            "line 83, in __init__",
            "    not in TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES[self.device_capability]",
            "           ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~^^^^^^^^^^^^^^^^^^^^^^^^",
            "KeyError: 12",
        ],
        4,
    ),
    (
        "cuda-illegal-memory-access",
        ["[2026-02-03 12:10:00 TP3] RuntimeError: CUDA error: an illegal memory access was encountered"],
        0,
    ),
    (
        "nccl-watchdog-timeout",
        [
            "[rank5]:[E226 11:16:37.121617583 ProcessGroupNCCL.cpp:616] [Rank 5] Watchdog caught collective "
            "operation timeout: "
            "WorkNCCL(SeqNum=5653, OpType=ALLREDUCE, NumelIn=58720256, NumelOut=58720256, Timeout(ms)=600000) ran "
            "for 600028 milliseconds before timing out."
        ],
        0,
    ),
]


def traffic(rng: random.Random, size: int) -> str:
    """Serving traffic as SGLang 0.5.9 logs it: decode and prefill batches, access lines."""
    lines, total, second = [], 0, rng.randrange(86400)
    while total < size:
        second += rng.random() < 0.2
        stamp = f"2026-02-03 {second // 3600 % 24:02d}:{second // 60 % 60:02d}:{second % 60:02d}"
        kind = rng.random()
        if kind < 0.75:
            running = rng.randint(1, 64)
            line = (
                f"[{stamp} TP0] Decode batch, #running-req: {running}, #token: {rng.randint(100, 1431212)}, token "
                f"usage: {rng.random():.2f}, "
                f"cuda graph: True, gen throughput (token/s): {rng.uniform(80, 2600):.2f}, #queue-req: "
                f"{rng.randint(0, 9)}"
            )
        elif kind < 0.85:
            line = (
                f"[{stamp} TP0] Prefill batch, #new-seq: {rng.randint(1, 8)}, #new-token: {rng.randint(1, 8192)}, "
                f"#cached-token: {rng.randint(0, 4096)}, token usage: {rng.random():.2f}, "
                f"#running-req: {rng.randint(0, 64)}, #queue-req: {rng.randint(0, 9)}, input throughput (token/s): "
                f"{rng.uniform(0, 40000):.2f}, cuda graph: False"
            )
        else:
            path = rng.choice(
                [
                    '"POST /generate HTTP/1.1" 200 OK',
                    '"GET /health HTTP/1.1" 200 OK',
                    '"POST /v1/chat/completions HTTP/1.1" 200 OK',
                    '"GET /metrics HTTP/1.1" 200 OK',
                ]
            )
            line = f"[{stamp}] INFO:     127.0.0.1:{rng.randint(30000, 65000)} - {path}"
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines) + "\n"


def write_log(path: Path, size_mb: int, seed: int = 1) -> dict[str, int]:
    """Write the log; return each planted signature's expected finding line."""
    rng = random.Random(seed)
    blocks = [traffic(rng, 4 << 20) for _ in range(6)]  # 6 distinct blocks of 4 MiB, cycled
    target = size_mb * 1_000_000
    expected: dict[str, int] = {}
    plant_at = {int(target * (i + 1) / (len(PLANTED) + 1)): i for i in range(len(PLANTED))}
    written = lines = 0
    with open(path, "w", encoding="utf-8") as out:
        startup = STARTUP.read_text()
        out.write(startup)
        written, lines = len(startup), startup.count("\n")
        index = 0
        while written < target:
            due = [k for k in plant_at if k <= written]
            for key in sorted(due):
                signature_id, planted, which = PLANTED[plant_at.pop(key)]
                out.write("\n".join(planted) + "\n")
                expected[signature_id] = lines + which + 1
                written += sum(len(p) + 1 for p in planted)
                lines += len(planted)
            block = blocks[index % len(blocks)]
            out.write(block)
            written += len(block)
            lines += block.count("\n")
            index += 1
    return expected


def ere(pattern: str) -> str:
    """A Python regex as a POSIX ERE that GNU grep accepts, for single-line patterns.

    >>> ere(r"undefined symbol: (?P<symbol>[A-Za-z0-9_.$@]+)")
    'undefined symbol: ([A-Za-z0-9_.$@]+)'
    >>> ere(r"Tried to allocate (?P<size>[0-9.]+ [KMGT]iB)(?:x)*?\\d")
    'Tried to allocate ([0-9.]+ [KMGT]iB)(x)*[0-9]'
    """
    out = re.sub(r"\(\?P<\w+>", "(", pattern)
    out = out.replace("(?:", "(")
    out = re.sub(r"\(\?P=\w+\)", "[^[:space:]]+", out)
    out = re.sub(r"([*+?}])\?", r"\1", out)
    return out.replace(r"\d", "[0-9]")


def grep_patterns() -> list[str]:
    patterns = []
    for signature in signatures.load():
        multiline = signature.window > 1 or signature.after > 0
        for pattern, key in zip(signature.patterns, signature.keys, strict=False):
            if multiline or "(?s" in pattern.pattern or "\\n" in pattern.pattern or "(?=" in pattern.pattern:
                patterns.append(re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\1", key))
            else:
                patterns.append(ere(pattern.pattern))
    return patterns


def best(command: list[str], repeat: int, output: Path, env: dict[str, str] | None = None) -> tuple[float, int]:
    """The best wall time of ``repeat`` runs. Output goes to a file: GNU grep stops at the first
    match when its output is /dev/null, which would not be a measurement of reading the log."""
    times, code = [], 0
    for _ in range(repeat):
        with open(output, "wb") as out:
            start = time.perf_counter()
            code = subprocess.run(
                command, check=False, stdout=out, stderr=subprocess.DEVNULL, env=env, cwd=ROOT
            ).returncode
            times.append(time.perf_counter() - start)
    return min(times), code


def scanner_alone(log: Path, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        scanner = signatures.Scanner(source=str(log))
        with open(log, "rb") as stream:
            scanner.scan_stream(stream)
        times.append(time.perf_counter() - start)
    return min(times)


def check_findings(log: Path, expected: dict[str, int], folder: Path) -> None:
    report = folder / "diagnose.json"
    done = subprocess.run(
        [sys.executable, "-m", "stackgate", "diagnose", "--path", str(log), "--json", str(report)],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    found = {f["id"]: f["evidence"]["line"] for f in json.loads(report.read_text())["findings"]}
    wrong = {k: (v, found.get(k)) for k, v in expected.items() if found.get(k) != v}
    if done.returncode != 1 or wrong:
        raise SystemExit(
            f"diagnose did not find the planted failures where they are: exit {done.returncode}, (expected, found): "
            f"{wrong}"
        )
    print(
        f"diagnose found all {len(expected)} planted failures at their lines (and {len(found) - len(expected)} "
        f"other finding(s): {sorted(set(found) - set(expected))})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to write the log (default: a temporary directory)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the generated log")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="diagnose-speed-", dir=args.dir))
    try:
        log = folder / "server.log"
        started = time.perf_counter()
        expected = write_log(log, args.size_mb)
        size = log.stat().st_size
        print(
            f"log: {log} ({size / 1e6:.0f} MB, {len(expected)} planted failures), written in "
            f"{time.perf_counter() - started:.1f} s"
        )
        patterns = folder / "patterns.ere"
        patterns.write_text("\n".join(grep_patterns()) + "\n")
        check_findings(log, expected, folder)
        grep_env = {**os.environ, "LC_ALL": "C"}
        grep_s, grep_code = best(
            ["grep", "-n", "-E", "-f", str(patterns), str(log)], args.repeat, folder / "grep.out", grep_env
        )
        if grep_code != 0:
            raise SystemExit(f"grep failed (exit {grep_code}): a converted pattern is not valid ERE? see {patterns}")
        diagnose_s, code = best(
            [sys.executable, "-m", "stackgate", "diagnose", "--path", str(log)], args.repeat, folder / "diagnose.out"
        )
        alone_s = scanner_alone(log, args.repeat)
        mb = size / 1e6
        for label, seconds in (
            (f"grep -n -E -f ({len(grep_patterns())} patterns, LC_ALL=C):", grep_s),
            (f"stackgate diagnose (exit {code}):", diagnose_s),
            ("scanner alone, in process:", alone_s),
        ):
            print(f"{label:<42} {seconds:6.2f} s  {mb / seconds:7.1f} MB/s")
        ratio = diagnose_s / grep_s
        print(
            f"stackgate diagnose takes {ratio:.2f}x grep's time (goal: within 2x): {'met' if ratio <= 2 else 'NOT met'}"
        )
    finally:
        if args.keep:
            print(f"kept {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
