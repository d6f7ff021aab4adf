"""A stand-in for vLLM 0.33.0's OpenAI-compatible server, started as the wheel's `vllm` script runs it:
``python -m vllm.entrypoints.cli.main serve MODEL ...``.

What it speaks was read from the vllm-0.33.0 wheel (the spellings stackgate uses are described in
stackgate/models/engines/vllm.py):
- the command line: ``serve`` then the model as a positional word, --tensor-parallel-size/-tp,
  --host, --port, --attention-backend (an AttentionBackendEnum name, any case), --gpu-memory-utilization,
  --api-key, --load-format, --hf-overrides, --speculative-config, --compilation-config/-cc, and the
  dotted form ``--compilation-config.pass_config.fuse_allreduce_rms=true`` that FlexibleArgumentParser
  folds into the JSON; an unknown option fails as argparse fails (exit 2);
- the log in vLLM's format, ``(<process> pid=<pid>) LEVEL MM-DD HH:MM:SS [file.py:line] message``,
  at VLLM_LOGGING_LEVEL (INFO by default), with the start-up lines of the engine core, the worker
  and the API server, then uvicorn's ``Application startup complete.``;
- the fusion pass as config/vllm.py and compilation/passes/fusion/allreduce_rms_fusion.py decide it:
  fuse_allreduce_rms defaults to on only for TP > 1 on capability 90 or the 100 family; asked for on
  another GPU, AllReduceFusionPass finds no size in its table (keyed by 90 and 100) and logs the
  WARNING "Flashinfer allreduce fusion is not supported for world size N or max size is not provided";
  where it runs, "fusion pass matches: {'AllReduceFusionPass': N}" is written at DEBUG only;
- /health (200 once up), /v1/models, and POST /v1/completions with ``stream: true``: ``data: {json}``
  chunks with ``choices[0].text`` and, with ``stream_options.continuous_usage_stats``, ``usage`` on
  each, a last usage chunk with no choices, then ``data: [DONE]``; with --api-key, paths under /v1
  need ``Authorization: Bearer KEY`` or get 401 ``{"error": "Unauthorized"}`` (serve/middleware/authenticate.py);
- an engine-core worker in its process group; SIGTERM ends it and the server.

Behaviour is set per test by the JSON file named in $STACKGATE_FAKE_VLLM, the same behaviour file as
the SGLang stand-in's (its "events", "gpu_state", "gpu_bytes", "rate"), plus "capability" (the GPU's,
as 90 or 120; default 90).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

VERSION = "0.33.0"
DEFAULTS: dict[str, Any] = {
    "events": None,
    "gpu_state": None,
    "gpu_bytes": 2 * 2**30,
    "rate": 2000.0,
    "capability": 90,
    "load_s": 0.2,
}
_LEVELS = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40}
_BACKENDS = ("FLASH_ATTN", "TRITON_ATTN", "FLASHINFER", "FLEX_ATTENTION", "TREE_ATTN", "FLASHMLA", "CUTLASS_MLA")
_STATE: dict[str, Any] = {"up": False}
_CHILDREN: list[subprocess.Popen[bytes]] = []
_WORKER = """
import ctypes, signal, time
ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)
while True:
    time.sleep(3600)
"""


def main(argv: list[str]) -> None:
    if not argv or argv[0] != "serve":
        sys.stderr.write("usage: vllm [-h] {serve} ...\n")
        sys.exit(2)
    args = parser().parse_args(fold_dotted(argv[1:]))
    b = behaviour()
    event(b, "started", pid=os.getpid(), pgid=os.getpgid(0))
    signal.signal(signal.SIGTERM, lambda *_: shutdown(b))
    fused = fusion_on(args, b)
    log("APIServer", "INFO", "utils.py:300", f"non-default args: {{'model': {args.model!r}}}")
    worker = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.DEVNULL)
    _CHILDREN.append(worker)
    event(b, "workers", pids=[worker.pid])
    if b["gpu_state"]:
        with open(b["gpu_state"], "a") as out:
            out.write(json.dumps({"pid": worker.pid, "gpu": 0, "bytes": b["gpu_bytes"]}) + "\n")
    load(args, b, fused)
    serve(args, b)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm serve")
    p.add_argument("model")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--attention-backend", type=backend, default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--api-key", nargs="+", default=None)
    p.add_argument("--load-format", default="auto")
    p.add_argument("--hf-overrides", type=json.loads, default=None)
    p.add_argument("--speculative-config", "-sc", type=json.loads, default=None)
    p.add_argument("--compilation-config", "-cc", type=json.loads, default=None)
    p.add_argument("--max-model-len", type=int, default=4096)
    return p


def backend(text: str) -> str:
    """AttentionConfig.validate_backend_before: the enum's name in any case, "auto" for none."""
    if text.lower() == "auto":
        return "auto"
    if text.upper() not in _BACKENDS:
        raise argparse.ArgumentTypeError(f"invalid AttentionBackendEnum: {text!r}")
    return text.upper()


def fold_dotted(words: list[str]) -> list[str]:
    """FlexibleArgumentParser's dotted options (``--compilation-config.pass_config.x=true``) as JSON."""
    out, nested = [], {}  # type: ignore[var-annotated]
    skip = False
    for i, word in enumerate(words):
        if skip:
            skip = False
            continue
        if word.startswith("-") and "." in word.split("=", 1)[0]:
            key, eq, value = word.partition("=")
            if not eq:
                value, skip = words[i + 1], True
            head, *path = key.split(".")
            node = nested.setdefault(head, {})
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = json.loads(value) if value[:1] in "tf{[0123456789" else value
            continue
        out.append(word)
    for head, value in nested.items():
        out += [head, json.dumps(value)]
    return out


def behaviour() -> dict[str, Any]:
    chosen = dict(DEFAULTS)
    path = os.environ.get("STACKGATE_FAKE_VLLM")
    if path:
        chosen.update({k: v for k, v in json.loads(Path(path).read_text()).items() if k in DEFAULTS or k == "rate"})
    return chosen


def fusion_on(args: argparse.Namespace, b: dict[str, Any]) -> bool:
    """PassConfig.fuse_allreduce_rms as resolved: the flag, else the -O2 default (TP > 1 on SM90/SM100)."""
    asked = ((args.compilation_config or {}).get("pass_config") or {}).get("fuse_allreduce_rms")
    if asked is not None:
        return bool(asked)
    return args.tensor_parallel_size > 1 and (b["capability"] == 90 or b["capability"] // 10 == 10)


def log(process: str, level: str, where: str, message: str) -> None:
    if _LEVELS[level] < _LEVELS[os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper()]:
        return
    stamp = time.strftime("%m-%d %H:%M:%S")
    sys.stderr.write(f"({process} pid={os.getpid()}) {level} {stamp} [{where}] {message}\n")
    sys.stderr.flush()


def event(b: dict[str, Any], name: str, **data: Any) -> None:
    if b.get("events"):
        with open(b["events"], "a") as out:
            out.write(json.dumps({"event": name, "t": time.time(), **data}) + "\n")


def load(args: argparse.Namespace, b: dict[str, Any], fused: bool) -> None:
    core, tp = "EngineCore", args.tensor_parallel_size
    passes = f"{{'pass_config': {{'fuse_allreduce_rms': {fused}}}}}"
    config = f"model={args.model!r}, tensor_parallel_size={tp}, compilation_config={passes}"
    log(core, "INFO", "core.py:140", f"Initializing a V1 LLM engine (v{VERSION}) with config: {config}")
    for rank in range(tp):
        log(
            core,
            "INFO",
            "parallel_state.py:1846",
            f"world_size={tp} rank={rank} local_rank={rank} distributed_init_method=tcp://127.0.0.1:29500 backend=nccl",
        )
    log(core, "INFO", "gpu_model_runner.py:4979", f"Starting to load model {args.model}...")
    time.sleep(b["load_s"])
    log(core, "INFO", "default_loader.py:507", "Loading weights took 0.10 seconds")
    log(core, "INFO", "gpu_model_runner.py:5089", "Model loading took 2.0 GiB memory and 0.200000 seconds")
    if fused:
        fusion_pass(tp, b)
    log(core, "INFO", "monitor.py:20", "torch.compile took 1.00 s in total")
    log(core, "INFO", "gpu_worker.py:773", "Available KV cache memory: 100.00 GiB")
    log(core, "INFO", "gpu_model_runner.py:6517", "Graph capturing finished in 1 secs, took 0.50 GiB")
    log(core, "INFO", "core.py:413", "init engine (profile, create kv cache, warmup model) took 2.00 s")


def fusion_pass(tp: int, b: dict[str, Any]) -> None:
    """AllReduceFusionPass.__init__ and its matches, as allreduce_rms_fusion.py logs them."""
    where = "allreduce_rms_fusion.py"
    if tp <= 1:
        log("EngineCore", "WARNING", f"{where}:990", "AllReduce fusion pass is disabled for tp_size <= 1.")
        return
    if b["capability"] not in (90, 100, 103):
        log(
            "EngineCore",
            "WARNING",
            f"{where}:1016",
            f"Flashinfer allreduce fusion is not supported for world size {tp} or max size is not provided",
        )
        return
    log(
        "EngineCore",
        "DEBUG",
        f"{where}:1029",
        "Flashinfer max size: 64 MB,Maximal number of tokens used by Flashinfer Allreduce Fusion: 8192",
    )
    log("EngineCore", "DEBUG", "vllm_inductor_pass.py:121", "fusion pass matches: {'AllReduceFusionPass': 64}")


def serve(args: argparse.Namespace, b: dict[str, Any]) -> None:
    host = args.host or "0.0.0.0"
    Handler.args, Handler.b = args, b
    httpd = ThreadingHTTPServer((host, args.port), Handler)
    httpd.daemon_threads = True
    log("APIServer", "INFO", "entry.py:139", f"Starting vLLM server on http://{host}:{args.port}")
    for line in (
        f"Started server process [{os.getpid()}]",
        "Waiting for application startup.",
        "Application startup complete.",
    ):
        sys.stderr.write(f"(APIServer pid={os.getpid()}) INFO:     {line}\n")
    sys.stderr.flush()
    _STATE["up"] = True
    event(b, "ready")
    httpd.serve_forever(poll_interval=0.05)


def shutdown(b: dict[str, Any]) -> None:
    log("APIServer", "INFO", "serve.py:266", "Shutting down.")
    event(b, "sigterm")
    for child in _CHILDREN:
        child.kill()
        child.wait()
    os._exit(0)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    args: argparse.Namespace
    b: dict[str, Any] = {}

    def log_message(self, format: str, *values: Any) -> None:
        pass

    def reply(self, status: int, body: Any = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def allowed(self) -> bool:
        keys = self.args.api_key
        if not keys or not self.path.startswith(("/v1", "/v2", "/inference", "/cohere")):
            return True
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() == "bearer" and token in keys:
            return True
        self.reply(401, {"error": "Unauthorized"})
        return False

    def do_GET(self) -> None:
        if not self.allowed():
            return
        if self.path == "/health":
            self.reply(200 if _STATE["up"] else 503)
        elif self.path == "/v1/models":
            model = {
                "id": self.args.model,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "vllm",
                "root": self.args.model,
                "parent": None,
                "max_model_len": self.args.max_model_len,
            }
            self.reply(200, {"object": "list", "data": [model]})
        else:
            self.reply(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        request = json.loads(self.rfile.read(length) or b"{}")
        if not self.allowed():
            return
        if self.path != "/v1/completions":
            self.reply(404, {"detail": "Not Found"})
            return
        if not request.get("stream"):
            self.reply(400, {"error": {"message": "the stand-in streams only", "type": "BadRequestError"}})
            return
        self.stream(request)

    def stream(self, request: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        tokens = int(request.get("max_tokens") or 16)
        options = request.get("stream_options") or {}
        prompt_tokens = len(str(request.get("prompt", "")).split())
        head = {
            "id": "cmpl-standin",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.args.model,
        }
        for k in range(1, tokens + 1):
            time.sleep(1.0 / float(self.b["rate"]))
            choice = {
                "index": 0,
                "text": f" t{k}",
                "logprobs": None,
                "finish_reason": "length" if k == tokens else None,
                "stop_reason": None,
            }
            chunk: dict[str, Any] = {**head, "choices": [choice]}
            if options.get("include_usage") and options.get("continuous_usage_stats"):
                chunk["usage"] = usage(prompt_tokens, k)
            self.chunk(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        if options.get("include_usage"):
            self.chunk(
                b"data: "
                + json.dumps({**head, "choices": [], "usage": usage(prompt_tokens, tokens)}).encode()
                + b"\n\n"
            )
        self.chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
