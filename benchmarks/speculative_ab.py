"""Speculative decoding's A/B, its acceptance length and the accuracy check, measured against the stand-in.

The stand-in SGLang server (tests/fakes) is set up as the motivating case: the plain configuration
decodes 54.1 tok/s per stream and the EAGLE-3 one 96.1 tok/s, each verify step accepting 3 then 4
tokens (3.5 a step); from ``--knee`` concurrent streams on, the speculative one falls to 30 tok/s
per stream and the plain one to 45 (verification's extra work no longer hidden by batching). One
``smoke --compare --concurrency`` run (with --enable-metrics) measures both; this script prints
what smoke reports beside what the stand-in was set to: the decode rates, the acceptance length
(from meta_info and from the /metrics gauge through the chat endpoint), the level where
speculation stops paying, and the accuracy check's score at wrong-answer rates 0, 0.2 and 0.5.

    python benchmarks/speculative_ab.py [--knee 4] [--levels 1,2,4,8]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from fakes import fake_nvml  # noqa: E402
from smoke_support import Rig, free_port  # noqa: E402

from stackgate.flows import smoke  # noqa: E402
from stackgate.models.spec import load_spec  # noqa: E402
from stackgate.render.ui import UI  # noqa: E402
from stackgate.serve import accuracy  # noqa: E402

PLAIN, SPECULATIVE, ACCEPT = 54.1, 96.1, [3, 4]


def run(rig: Rig, spec: Path, **request: object) -> smoke.SmokeRun:
    chosen = smoke.SmokeRequest(spec_path=spec, run_dir=rig.runs, **request)  # type: ignore[arg-type]
    return smoke.run_smoke(load_spec(spec), chosen, UI(stream=io.StringIO(), force_plain=True), nvml_lib=fake_nvml)


def tables(rig: Rig) -> str:
    draft = rig.tmp / "draft"
    draft.mkdir(exist_ok=True)
    (draft / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    return (
        f'[smoke.speculative]\nalgorithm = "EAGLE3"\ndraft_model = "{draft}"\nnum_steps = 3\n'
        '\n[smoke.compare]\nname = "plain"\nspeculative = false\n'
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--knee", type=int, default=4, help="streams from which speculation stops paying")
    parser.add_argument("--levels", default="1,2,4,8", help="the concurrency levels measured")
    args = parser.parse_args()
    levels = tuple(int(x) for x in args.levels.split(","))
    with tempfile.TemporaryDirectory() as folder:
        rig = Rig(Path(folder), free_port())
        os.environ["STACKGATE_FAKE_NVML"] = str(rig.nvml_path)
        rig.behave(
            rate=PLAIN,
            ttft_s=0.02,
            rate_by_streams={str(args.knee): 45.0},
            profiles=[
                {
                    "when": {"speculative_algorithm": "EAGLE3"},
                    "set": {"rate": SPECULATIVE, "accept_lengths": ACCEPT, "rate_by_streams": {str(args.knee): 30.0}},
                }
            ],
        )
        bench = {"output_tokens": 400, "runs": 3, "warmup": 1}
        spec = rig.spec(flags=("--enable-metrics",), tables=tables(rig), benchmark=bench)
        done = run(rig, spec, compare=True, concurrency=levels)
        results = {r.check: r for r in done.results}
        plain, fast = (s.figures.decode_tok_s for s in done.sessions)  # type: ignore[union-attr]
        print(f"decode, plain:       {plain.mean:7.2f} tok/s (stand-in {PLAIN}; ratio {plain.mean / PLAIN:.4f})")
        print(
            f"decode, speculative: {fast.mean:7.2f} tok/s (stand-in {SPECULATIVE}; ratio {fast.mean / SPECULATIVE:.4f})"
        )
        print(f"smoke.compare: {results['smoke.compare'].summary}")
        print(f"smoke.compare.concurrency: {results['smoke.compare.concurrency'].summary} (stand-in: {args.knee})")
        for line in results["smoke.compare.concurrency"].details:
            print(f"  {line}")
        acceptance = results["smoke.speculative.acceptance"]
        print(f"smoke.speculative.acceptance: {acceptance.summary} (stand-in {sum(ACCEPT) / len(ACCEPT)})")
        for line in acceptance.details:
            print(f"  {line}")
        print(f"smoke.metrics: {results['smoke.metrics'].summary}")
        chat = rig.spec(
            flags=("--enable-metrics",),
            tables=tables(rig).split("\n[smoke.compare]")[0],
            benchmark={**bench, "api": "chat"},
        )
        done = run(rig, chat, benchmark=True)
        results = {r.check: r for r in done.results}
        print(f"through /v1/chat/completions: {results['smoke.benchmark'].summary}")
        print(f"  smoke.speculative.acceptance: {results['smoke.speculative.acceptance'].summary}")
        _, items = accuracy.load_set()
        for rate in (0.0, 0.2, 0.5):
            rig.behave(wrong_answer_rate=rate)
            spec = rig.spec(benchmark={"output_tokens": 20, "runs": 2, "warmup": 0}, tables="[accuracy]\nfloor = 0.9\n")
            found = {r.check: r for r in run(rig, spec, benchmark=True).results}["smoke.accuracy"]
            wrong = sum(zlib.crc32(i.prompt.encode()) % 10000 < rate * 10000 for i in items)
            print(
                f"accuracy at wrong-answer rate {rate}: {found.status.name} {found.summary} (stand-in: {wrong} wrong)"
            )


if __name__ == "__main__":
    main()
