"""How exactly smoke's benchmark client measures a stream, and what it costs the client.

Against the stand-in SGLang server (tests/fakes) streaming at 50, 200 and 1000 tok/s, the client
measures each run's decode rate (tokens after the first event over the time after it), which
should equal the stand-in's true rate, its whole-run rate, which should equal
tokens / (TTFT + (tokens - 1) / rate), and the median inter-token latency, which should equal
1 / rate. (The test suite asserts only bounds that hold under any load: these closeness figures
are measured here.) It also reports the client's CPU time per token, beside a
reference client measured in the same run: the same stream, with every event parsed as JSON
(SGLang streams cumulative text and ids, so that reference costs time quadratic in the length).

    python benchmarks/client_accuracy.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from smoke_support import FAKES, free_port  # noqa: E402

from stackgate.edges import httpclient  # noqa: E402
from stackgate.facts import serverlog  # noqa: E402
from stackgate.serve import bench, launch, ready  # noqa: E402

CASES = ((50.0, 200), (200.0, 800), (1000.0, 2048))  # (tok/s, tokens): 2-4 s a run
TTFT_S = 0.02
PROMPT = "Write a long story about a lighthouse keeper."


def start(rate: float, tmp: Path) -> tuple[launch.Server, str]:
    behaviour = tmp / f"behaviour-{rate:g}.json"
    behaviour.write_text(json.dumps({"rate": rate, "ttft_s": TTFT_S, "drain_poll_s": 0.2}))
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32}))
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model),
        "--tp-size",
        "1",
        "--port",
        str(port),
        "--attention-backend",
        "flashinfer",
    ]
    env = {**os.environ, "PYTHONPATH": str(FAKES), "STACKGATE_FAKE_SGLANG": str(behaviour)}
    server = launch.start(argv, env, tmp / f"server-{rate:g}.log")
    config = launch.Config("", str(model), 1, "127.0.0.1", port, "flashinfer", (), None, {}, {})
    readiness = ready.wait_ready(server, serverlog.LogWatcher(server.log_path), config, 60.0)
    if not readiness.ready:
        raise SystemExit(f"the stand-in did not start: {readiness}")
    return server, config.base_url


def reference(url: str, tokens: int) -> tuple[int, float]:
    """The obvious client: json.loads on every event. Returns (tokens, CPU seconds)."""
    body = {
        "text": PROMPT,
        "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True, "temperature": 0},
        "stream": True,
    }
    cpu = time.thread_time()
    count = 0
    for _, data in httpclient.EventStream(f"{url}/generate", body).events():
        if data == b"[DONE]":
            break
        count = json.loads(data)["meta_info"]["completion_tokens"]
    return count, time.thread_time() - cpu


def measure(rate: float, tokens: int, runs: int, tmp: Path) -> dict[str, float]:
    server, url = start(rate, tmp)
    try:
        samples = [bench.generate(url, PROMPT, tokens) for _ in range(runs)]
        references = [reference(url, tokens) for _ in range(runs)]
    finally:
        launch.stop(server, 3.0)
    assert all(s.good for s in samples), [s.error for s in samples]
    decode = [s.decode_tok_s for s in samples]
    whole = [s.tok_s for s in samples]
    expected_whole = tokens / (TTFT_S + (tokens - 1) / rate)
    itl = bench.percentile([g for s in samples for g in s.gaps], 50) or 0.0
    cpu = statistics.fmean(s.cpu_s / s.tokens for s in samples)
    ref_cpu = statistics.fmean(c / n for n, c in references)
    return {
        "rate": rate,
        "tokens": tokens,
        "decode_mean": statistics.fmean(decode),
        "decode_err_pct": 100 * max(abs(d / rate - 1) for d in decode),
        "whole_err_pct": 100 * max(abs(w / expected_whole - 1) for w in whole),
        "itl_err_pct": 100 * abs(itl * rate - 1),
        "cpu_us_per_token": 1e6 * cpu,
        "ref_cpu_us_per_token": 1e6 * ref_cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    runs = parser.parse_args().runs
    print(f"client accuracy and cost, {runs} runs per rate (worst run's error shown)")
    print(
        f"{'true tok/s':>10} {'tokens':>6} {'decode tok/s':>12} {'decode err':>10} {'whole-run err':>13} "
        f"{'ITL p50 err':>11} {'CPU us/token':>12} {'reference':>10} {'ratio':>6}"
    )
    with tempfile.TemporaryDirectory(prefix="stackgate-bench-") as tmp:
        for rate, tokens in CASES:
            row = measure(rate, tokens, runs, Path(tmp))
            ratio = row["ref_cpu_us_per_token"] / row["cpu_us_per_token"]
            print(
                f"{rate:>10.0f} {tokens:>6} {row['decode_mean']:>12.2f} {row['decode_err_pct']:>9.3f}% "
                f"{row['whole_err_pct']:>12.3f}% {row['itl_err_pct']:>10.3f}% "
                f"{row['cpu_us_per_token']:>12.1f} {row['ref_cpu_us_per_token']:>10.1f} {ratio:>5.1f}x"
            )


if __name__ == "__main__":
    main()
