"""What the gate costs on top of the work it gates: its wall time against the two smokes alone.

Against the stand-in SGLang server (tests/fakes) and the fake NVML, with the lock pointing at
this interpreter, it runs in the same process and the same rig, alternately: ``smoke --fast``
then ``smoke --benchmark`` (the reference), and the whole gate (lock, environment, verify with
the checks a machine without GPUs can pass, both smokes, the fingerprint, the four reports and
the history). It prints each one's median wall time, the gate's stage times and the overhead.
On a real stack the model load dominates both; this shows what the gate itself adds.

    python benchmarks/gate_overhead.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from smoke_support import Rig, free_port  # noqa: E402

from stackgate.commands import gate  # noqa: E402
from stackgate.flows.gate import GateRequest  # noqa: E402
from stackgate.render.ui import UI  # noqa: E402

VERIFIABLE = ("gpu.*", "python.interpreter", "python.pins", "python.frozen", "python.consistency")


def smokes(rig: Rig, spec: Path) -> float:
    started = time.monotonic()
    for fast in (True, False):
        done = rig.run(spec, fast=fast, benchmark=not fast)
        if not done.verdict.passed:
            raise SystemExit(f"the reference smoke failed: {done.verdict.reason}")
    return time.monotonic() - started


def whole_gate(spec: Path, out: Path) -> tuple[float, dict[str, float]]:
    request = GateRequest(
        spec_path=spec,
        verify_checks=VERIFIABLE,
        json_path=out / "g.json",
        junit_path=out / "g.xml",
        markdown_path=out / "g.md",
        prom_path=out / "g.prom",
    )
    started = time.monotonic()
    code = gate.run(request, UI(stream=io.StringIO(), force_plain=True))
    seconds = time.monotonic() - started
    if code != 0:
        raise SystemExit(f"the gate failed (exit {code}): see {out / 'g.md'}")
    doc = json.loads((out / "g.json").read_text())
    return seconds, {s["name"]: s["duration_s"] for s in doc["gate"]["stages"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stackgate-gate-bench-") as tmp:
        rig = Rig(Path(tmp), free_port())
        os.environ.update(
            STACKGATE_NVML_MODULE="fakes.fake_nvml",
            STACKGATE_FAKE_NVML=str(rig.nvml_path),
            STACKGATE_HISTORY_DIR=str(Path(tmp) / "history"),
            STACKGATE_LOG_DIR=str(Path(tmp) / "logs"),
        )
        spec = rig.spec(
            benchmark={"output_tokens": 200, "runs": 2, "warmup": 1, "baseline_tok_s": 190.0, "max_regression": 0.05}
        )
        reference, gated, stages = [], [], []
        for _ in range(args.repeats):
            reference.append(smokes(rig, spec))
            seconds, per_stage = whole_gate(spec, Path(tmp))
            gated.append(seconds)
            stages.append(per_stage)
    ref, total = statistics.median(reference), statistics.median(gated)
    print(
        (
            f"smoke --fast + smoke --benchmark alone: median {ref:.2f} s over {args.repeats} runs "
            f"({', '.join(f'{s:.2f}' for s in reference)})"
        )
    )
    print(
        f"invoke gate (all stages, 4 reports, history): median {total:.2f} s ({', '.join(f'{s:.2f}' for s in gated)})"
    )
    for name in stages[0]:
        print(f"  {name:<12} median {statistics.median(s[name] for s in stages):.2f} s")
    print(f"the gate's own overhead: {total - ref:+.2f} s ({total / ref:.2f}x the smokes alone)")


if __name__ == "__main__":
    main()
