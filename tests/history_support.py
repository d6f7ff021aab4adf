"""Kept runs for the history and report tests: real gate documents (GateRun.document() of a gate
whose stage functions are injected), with the benchmark figures summarised by smoke's own
statistics and a fingerprint built by the fingerprint module."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from stackgate.flows import gate
from stackgate.models.finding import Fix
from stackgate.models.result import Result, Status
from stackgate.render.ui import UI
from stackgate.runs import fingerprint as fp
from stackgate.runs import history
from stackgate.scan import Scanner
from stackgate.serve import bench, benchstats

SERVER = {"attention_backend": "flashinfer", "tp_size": "8", "model_path": "/models/m", "version": "0.5.9"}


def figures(decode: float, *, baseline: float = 190.0, max_regression: float = 0.05) -> dict[str, Any]:
    """A benchmark of two runs around ``decode`` tok/s, as the gate's document holds it."""
    rates = [decode - 0.2, decode + 0.2]
    tok = [r * 0.985 for r in rates]
    rows = [
        {
            "tokens": 200,
            "asked": 200,
            "seconds": round(200 / t, 4),
            "tok_s": round(t, 3),
            "ttft_s": 0.021,
            "decode_tok_s": round(r, 3),
            "events": 200,
            "finish_reason": {"type": "length"},
            "error": None,
            "client_cpu_s": 0.01,
        }
        for r, t in zip(rates, tok, strict=True)
    ]
    floor = baseline * (1 - max_regression)
    mean = sum(tok) / 2
    status = "PASS" if mean >= floor else "FAIL"
    return {
        "warmups": [],
        "runs": rows,
        "tok_s": benchstats.summarize(tok).to_dict(),
        "decode_tok_s": benchstats.summarize(rates).to_dict(),
        "ttft_s": benchstats.summarize([0.021, 0.021]).to_dict(),
        "short_runs": [],
        "stopped": None,
        "baseline_tok_s": baseline,
        "max_regression": max_regression,
        "floor_tok_s": round(floor, 3),
        "status": status,
        "summary": f"{mean:.2f} tok/s ({status})",
    }


def gate_doc(
    *,
    decode: float | None = 200.0,
    backend: str = "flashinfer",
    torch: str = "2.9.1+cu130",
    summary: str = "all good",
    status: Status = Status.PASS,
    spec: str = "standin",
) -> dict[str, Any]:
    """A gate's document: four stages as given, the benchmark (``decode`` None: not run)."""
    fix = Fix("Do the thing.", ("echo fix",)) if status >= Status.WARN else None
    stages = [
        gate.Stage(
            name,
            name,
            (),
            (
                lambda n: (
                    lambda ctx: [
                        Result(
                            f"{n}.check",
                            status if n == "verify" else Status.PASS,
                            summary if n == "verify" else f"{n} ok",
                            fix=fix if n == "verify" else None,
                        )
                    ]
                )
            )(name),
        )
        for name in ("lock", "environment", "verify", "fast_smoke")
    ]
    done = gate.run_gate(gate.GateRequest(), UI(stream=io.StringIO(), force_plain=True), stages=stages)
    doc = done.document()
    doc["lock"] = {"name": spec, "path": f"/locks/{spec}.toml", "sha256": "a" * 64}
    components = {
        "lock": {"name": spec, "sha256": "a" * 64},
        "gpu": {"driver": "580.82.07", "gpu0": "NVIDIA H200, compute capability 9.0"},
        "distributions": {"torch": torch, "sglang": "0.5.9"},
        "server": {**SERVER, "attention_backend": backend},
    }
    doc["gate"]["fingerprint"] = fp.Fingerprint(components).to_dict()
    doc["gate"]["benchmark"] = figures(decode) if decode is not None else None
    return doc


def keep(folder: Path, doc: dict[str, Any], started: str) -> history.Run:
    """Store a document as run of ``started`` (ISO time) and read it back."""
    doc = {
        **doc,
        "started": started,
        "run_id": f"{started.replace('-', '').replace(':', '')[:15]}Z-"
        f"{doc['command']}-{abs(hash(started)) % 0xFFFFFF:06x}",
    }
    return history.read(history.store(doc, folder))


def smoke_doc(
    tmp: Path,
    *,
    decode: float | None = 200.0,
    backend: str = "flashinfer",
    fast: bool = False,
    status: Status = Status.PASS,
    log: str = "",
) -> dict[str, Any]:
    """A smoke's document, written by smoke's own SmokeRun.document(): the stand-in's lock, one
    session whose server reported ``backend``, and (``decode`` not None) a benchmark of two runs;
    the findings of the knowledge base's scan of ``log``, as the server's log at /logs/server.log."""
    from smoke_support import Rig

    from stackgate.flows import smokerun
    from stackgate.models.spec import load_spec
    from stackgate.models.verdict import judge
    from stackgate.serve import fastmode, launch

    tmp.mkdir(parents=True, exist_ok=True)
    spec = load_spec(Rig(tmp, 30000).spec())
    session = smokerun.Session(
        launch.configs(spec, fast=fast)[0],
        server_info={**SERVER, "attention_backend": backend, "port": 30000, "random_seed": 7},
    )
    session.shrink = (
        fastmode.Shrink("num_hidden_layers", 2, 32, {"num_hidden_layers": 2}, "LlamaForCausalLM") if fast else None
    )
    session.log_path = Path("/logs/server.log")
    scanner = Scanner(stage="smoke", source=str(session.log_path))
    scanner.feed_text(log)
    scanner.finish()
    session.findings = scanner.findings
    if decode is not None:
        samples = [
            bench.Sample(200, 200, 0.0, 200 / (rate * 0.985), 0.021, 1, 200) for rate in (decode - 0.2, decode + 0.2)
        ]
        tok, rates = [s.tok_s for s in samples], [decode - 0.2, decode + 0.2]
        session.figures = bench.BenchFigures(
            (),
            tuple(samples),
            benchstats.summarize(tok),
            benchstats.summarize(rates),
            benchstats.summarize([0.021, 0.021]),
            None,
        )
    results = [Result("smoke.benchmark", status, f"{decode} tok/s")]
    return smokerun.SmokeRun(
        spec,
        smokerun.SmokeRequest(benchmark=decode is not None),
        (session,),
        results,
        judge(results),
        1735725600.0,
        9.5,
    ).document()
