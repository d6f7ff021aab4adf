"""How exactly the request-rate sweep measures, where it finds the knee, and what the client costs.

The stand-in SGLang server (tests/fakes) serves at most MAX_RUNNING requests at once (the rest queue,
first come first served), prefills at PREFILL_S per prompt word not in its prefix cache, and spaces
each stream's tokens by 1/RATE times a factor uniform in SPREAD (seeded): a known ITL distribution.
It records, on its own clock (CLOCK_MONOTONIC, the client's too), when each request arrived and
when it sent each event. For every rate the script prints the sweep's TTFT and ITL percentiles
over the stand-in's own (ratios; 1.000 is exact), the median E2E, the client's lag behind the
arrival schedule and its CPU time per request, then the knee the sweep found beside the rate where
the stand-in saturates (MAX_RUNNING over the mean service time it was configured with).

    python benchmarks/sweep_accuracy.py [--requests 60] [--rates 2,4,8,16,32]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from smoke_support import FAKES, free_port  # noqa: E402

from stackgate.models.spec.sweep import Sweep  # noqa: E402
from stackgate.serve import launch, sweep  # noqa: E402
from stackgate.serve.bench import Streams, percentile  # noqa: E402
from stackgate.serve.prompts import PromptMaker  # noqa: E402

MAX_RUNNING = 4
RATE = 200.0  #: tokens per second per stream
TTFT_S = 0.02
PREFILL_S = 0.0002  #: per prompt word not cached
SPREAD = (0.5, 1.5)  #: each gap is 1/RATE times a factor uniform over this range
INPUT = (100, 300)
OUTPUT = (40, 80)


def service_s() -> float:
    """The mean time one request holds a slot: first token, prefill of a mean prompt, mean decode."""
    mean_gap = statistics.fmean(SPREAD) / RATE
    return TTFT_S + PREFILL_S * statistics.fmean(INPUT) + (statistics.fmean(OUTPUT) - 1) * mean_gap


def start(tmp: Path) -> tuple[launch.Server, str, Path]:
    events = tmp / "events.jsonl"
    behaviour = {
        "rate": RATE,
        "ttft_s": TTFT_S,
        "max_running": MAX_RUNNING,
        "prefill_s_per_token": PREFILL_S,
        "itl_spread": list(SPREAD),
        "itl_seed": 7,
        "timing": True,
        "events": str(events),
        "drain_poll_s": 0.2,
    }
    (tmp / "behaviour.json").write_text(json.dumps(behaviour))
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32}))
    port = free_port()
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), "--port", str(port)]
    env = {**os.environ, "PYTHONPATH": str(FAKES), "STACKGATE_FAKE_SGLANG": str(tmp / "behaviour.json")}
    server = launch.start(argv, env, tmp / "server.log")
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
                if answer.status == 200:
                    return server, url, events
        except OSError:
            time.sleep(0.2)
    raise SystemExit("the stand-in did not become ready in 60 s")


def own(events: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in events.read_text().splitlines() if '"stream_done"' in line]
    return {row["prompt_crc"]: row for row in rows if "prompt_crc" in row}


def ratios(mine: list[float], theirs: list[float]) -> str:
    out = []
    for p in (50, 90, 99):
        a, b = percentile(mine, p), percentile(theirs, p)
        out.append(f"{a / b:.3f}" if a is not None and b else "-")
    return "/".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--rates", default="2,4,8,16,32")
    args = parser.parse_args()
    rates = tuple(float(r) for r in args.rates.split(","))
    chosen = Sweep(
        rates=rates, arrival="poisson", seed=3, requests=args.requests, input_tokens=INPUT, output_tokens=OUTPUT
    )
    saturation = MAX_RUNNING / service_s()
    print(
        f"stand-in: {MAX_RUNNING} requests at once, mean service {service_s() * 1000:.0f} ms, so it saturates at "
        f"{saturation:.1f} req/s; Poisson arrivals, {args.requests} requests per rate"
    )
    print(
        f"{'req/s':>6} {'done':>5} {'TTFT ratio p50/p90/p99':>23} {'ITL ratio p50/p90/p99':>22} {'E2E p50 ms':>10} "
        f"{'late p99 ms':>11} {'client CPU ms/req':>17}"
    )
    with tempfile.TemporaryDirectory(prefix="stackgate-sweep-") as folder:
        server, url, events = start(Path(folder))
        try:
            run = sweep.run_sweep(url, chosen, rates, PromptMaker(chosen), streams=Streams())
        finally:
            launch.stop(server, 3.0)
        served = own(events)
    for rate in run.rates:
        theirs_ttft, theirs_itl = [], []
        for sent in rate.completed:
            row = served[zlib.crc32(sent.prompt.text.encode())]
            theirs_ttft.append((row["sent"][0] - row["received"]) * 1000)
            theirs_itl += [(b - a) * 1000 for a, b in zip(row["sent"], row["sent"][1:], strict=False)]
        doc = rate.to_dict()
        print(
            f"{rate.rate:>6g} {len(rate.completed):>5} {ratios(rate.values('ttft_ms'), theirs_ttft):>23} "
            f"{ratios(rate.values('itl_ms'), theirs_itl):>22} {doc['e2e_ms']['p50']:>10.1f} "
            f"{doc['client']['late_ms_p99']:>11.2f} {doc['client']['cpu_ms_per_request']:>17.2f}"
        )
    above = [r for r in rates if r > saturation]
    print(
        f"knee found: {run.knee} req/s; the first rate measured above saturation ({saturation:.1f} req/s): "
        f"{min(above) if above else None}"
    )


if __name__ == "__main__":
    main()
