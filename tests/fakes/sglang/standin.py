"""A stand-in for SGLang 0.5.9's server, started exactly like it: ``python -m sglang.launch_server ...``.

It speaks what the real server speaks (read from the 0.5.9 wheel):
- its command line is parsed with the 0.5.9 argument table (server_args.json, generated from the
  wheel's server_args.py): an unknown flag or a bad choice fails as argparse fails there;
- the port opens only after "loading" (connections are refused before), /health answers 503
  while starting and until the warm-up request has run, then 200 after a one-second generation;
- /server_info and the deprecated /get_server_info return every server argument as resolved,
  plus scheduler info, internal_states and the version;
- /generate streams ``data: {json}`` events over chunked HTTP/1.1, with cumulative ``text`` and
  ``output_ids`` and ``meta_info.completion_tokens``, ending with ``data: [DONE]``;
- the log goes to stderr in SGLang's default format (``[time TPn] message``) with its real
  messages at their real levels, the HTTP access lines to stdout; ``--log-level warning`` (or
  higher) hides the INFO ones, as logging.basicConfig(level=...) does there;
- with ``--api-key KEY`` every request but /health*, /metrics* and OPTIONS needs
  ``Authorization: Bearer KEY`` (scheme case-insensitive, the key compared in constant time) or is
  answered 401 ``{"error": "Unauthorized"}``, as sglang/srt/utils/auth.py decides; its own
  warm-up request sends the key, as the real one does;
- it has worker processes (schedulers, detokenizer) in its process group; on SIGTERM (once up)
  it drains, polling every 5 s, then kills its own tree with SIGKILL, as SGLang does; a fatal
  error also ends in SIGKILL of the tree.

- with --enable-metrics, /metrics answers the Prometheus text format prometheus_client writes
  there: ``sglang:*`` families with HELP and TYPE, every series labelled model_name, engine_type,
  tp_rank and pp_rank (srt/observability/metrics_collector.py): request and token counters, the
  running-request gauge, and with speculative decoding ``sglang:spec_accept_length`` and
  ``sglang:spec_accept_rate``; without the flag it answers 404;
- with speculative decoding on, each decode event is one verify step that carries that step's
  accepted tokens ("accept_lengths", cycled), and meta_info carries ``spec_verify_ct``,
  ``spec_accept_length`` (completion_tokens / spec_verify_ct) and ``spec_accept_rate``
  (tokenizer_manager.py);
- /v1/chat/completions (OpenAI-compatible, serving_chat.py) applies a chat template to the
  messages and streams ``chat.completion.chunk`` objects (a first chunk with the assistant role,
  ``usage`` on every chunk with ``stream_options.continuous_usage_stats``, a usage-only chunk with
  ``include_usage``, then ``[DONE]``), or answers one ``chat.completion``;
- a prompt of stackgate's shipped accuracy set is answered with its expected answer, stopped
  before the newline as ``stop: ["\n"]`` does, except for the share "wrong_answer_rate" of the
  set's prompts (chosen by a hash of the prompt, so greedy answers stay deterministic).

Behaviour is set per test by a JSON file named in $STACKGATE_FAKE_SGLANG (see DEFAULTS), with
"profiles" applying overrides when the command line matches (e.g. speculative decoding on).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

TABLE = json.loads((Path(__file__).with_name("server_args.json")).read_text())
VERSION = TABLE["sglang_version"]

DEFAULTS: dict[str, Any] = {
    "load_s": 0.4,  # from launch to the port opening (connection refused meanwhile)
    "warmup_s": 0.2,  # from the port opening to the warm-up request (503 meanwhile)
    "health_s": 1.0,  # /health runs a 1-token generation and checks after a 1 s sleep
    "rate": 200.0,  # decode tokens per second per stream
    # a machine that drifts: each launch decodes this much slower than the one before (launches counted in "events")
    "slowdown_per_launch": 0.0,
    "rate_by_streams": None,  # {"10": 80.0}: per-stream rate from that many active streams on
    "rate_cycle": None,  # [120.0, 80.0]: the rate of each streamed request in turn (a noisy machine)
    "ttft_s": 0.02,  # time to the first token (prefill)
    "burst": 1,  # tokens per event (speculative decoding streams in bursts)
    "default_backend": "flashinfer",  # chosen when --attention-backend is absent
    "ignore_backend_flag": False,  # behave as if --attention-backend had not been given
    "evidence": True,  # log "FlashInfer workspace initialized" when fusion is on and TP > 1
    # the release whose fusion evidence line is spoken: "0.5.9" (flashinfer_comm_fusion.py:73 of its wheel, per
    # rank) or "0.5.23" (flashinfer_comm_fusion.py:580-583 of sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl,
    # once per process, backend trtllm on SM90 single-node as _resolve_backend picks)
    "release": "0.5.9",
    "resolve": {},  # server_info values that differ from what was asked
    "server_info_404": False,  # an older server: only /get_server_info
    "crash_at_start": None,  # {"phase": "load", "lines": [...]}: die (SIGKILL of the tree)
    "fatal_line": None,  # {"phase": "load", "line": "..."}: log it, then hang
    "hang": False,  # never open the port
    "load_until": None,  # a file: loading ends (the port is bound) only once it exists
    "die_mid_stream": None,  # {"after_tokens": K, "lines": [...]}
    "fatal_mid_stream": None,  # {"after_tokens": K, "line": "..."}: log it, keep streaming
    "short_by": 0,  # streams stop this many tokens early (finish_reason "abort")
    "diverge_from": None,  # every second streamed request differs from this token on
    "shift_from": None,  # every request differs from the default ids from this token on
    "cut_mid_stream": None,  # {"after_tokens": K}: drop the stream's connection, stay up
    "drain_poll_s": 5.0,
    "ignore_sigterm": False,
    "orphan_workers": False,  # workers do not follow their parent's death (no PR_SET_PDEATHSIG)
    "escape": False,  # one worker moves to a session of its own (and ignores SIGTERM)
    "leak": False,  # a detached process (new session, parent gone) that holds GPU memory
    "gpu_bytes": 0,  # GPU memory each scheduler holds, recorded for the fake NVML
    "gpu_state": None,  # the fake NVML's holders file
    "events": None,  # append JSON lines of what happened, with time.time()
    "profiles": [],  # [{"when": {"speculative_algorithm": "EAGLE3"}, "set": {...}}]
    # Load (the request-rate sweep's stand-in): requests beyond max_running wait, first come first served, before
    # their prefill; a prompt's prefill costs prefill_s_per_token for each word not in the prefix cache (every
    # prefix of every prompt seen is cached); each inter-token gap is the rate's gap times a factor uniform in
    # itl_spread ([low, high], seeded per stream): a known ITL distribution. With "timing", stream_done records
    # the stand-in's own clock: when the request arrived, every event sent, the words cached and the queue wait.
    "max_running": None,
    "prefill_s_per_token": 0.0,
    "itl_spread": None,
    "itl_seed": 0,
    "timing": False,
    "accept_lengths": [3],  # with speculative decoding: the tokens each verify step accepts, in turn
    "num_draft_tokens": 4,  # proposed per verify step (the accept rate's denominator, plus the bonus token)
    "wrong_answer_rate": 0.0,  # the share of the accuracy set's prompts answered wrongly
    "metrics_body": None,  # /metrics answers this text instead (a hostile exporter)
    "metrics_404": False,  # /metrics is not found even with --enable-metrics (a proxy in front)
}
#: stackgate's shipped accuracy set: the prompts this "model" knows the answers to.
ACCURACY = {
    item["prompt"]: item["answer"]
    for item in json.loads(
        (Path(__file__).resolve().parents[3] / "stackgate" / "serve" / "accuracy.json").read_text(encoding="utf-8")
    )["items"]
}
#: What the server counted, for /metrics.
_COUNTS = {"requests": 0, "prompt_tokens": 0, "generation_tokens": 0, "verify": 0, "spec_tokens": 0}
_WORDS = (
    "the",
    "keeper",
    "lit",
    "lamp",
    "over",
    "grey",
    "sea",
    "and",
    "waited",
    "for",
    "ships",
    "that",
    "never",
    "came",
    "home",
    "again",
)
_STATE: dict[str, Any] = {"status": "starting", "draining": False, "requests": 0, "active": 0, "streams": 0}
_LOCK = threading.Lock()
_CHILDREN: list[subprocess.Popen[bytes]] = []
_CACHE: set[int] = set()  # the prefix cache: the hash of every prefix (in words) of every prompt prefilled
_RUNNING: dict[str, threading.Semaphore] = {}
_ACCEPTED: dict[Any, float] = {}  # a new connection's accept time, until its first request takes it
_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
_SHOWN = {"log": 20, "http": 20}  # the lowest level written: --log-level, --log-level-http


def main(argv: list[str]) -> None:
    args = server_args(parser().parse_args(argv))
    _SHOWN["log"] = _LEVELS[str(args["log_level"]).lower()]
    _SHOWN["http"] = _LEVELS[str(args["log_level_http"] or args["log_level"]).lower()]
    b = behaviour(args)
    event(b, "started", pid=os.getpid(), pgid=os.getpgid(0))
    if args["attention_backend"] is None or b["ignore_backend_flag"]:
        args["attention_backend"] = b["default_backend"]
        log(f"Attention backend not specified. Use {args['attention_backend']} backend by default.")
    args.update(b["resolve"])
    log(f"server_args=ServerArgs({', '.join(f'{k}={v!r}' for k, v in args.items() if k in TABLE['fields'])})")
    if b["ignore_sigterm"]:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    spawn_workers(args, b)
    if b["leak"]:
        leak(b)
    load(args, b)
    serve(args, b)


# --- the command line -------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    """SGLang 0.5.9's parser, rebuilt from its argument table."""
    parser = argparse.ArgumentParser()
    types = {"int": int, "float": float, "str": str, "json": json.loads}
    for arg in TABLE["arguments"]:
        kwargs: dict[str, Any] = {"dest": arg["dest"], "default": arg["default"]}
        if arg["action"] == "store_true":
            kwargs["action"] = "store_true"
            kwargs["default"] = bool(arg["default"])
        elif arg["action"] == "DeprecatedAction":
            kwargs.update(action="store_const", const=None)
        else:
            kwargs.update(type=types[arg["type"]], required=arg["required"])
            if arg["nargs"] is not None and arg["nargs"] != "nargs":
                kwargs["nargs"] = arg["nargs"]
            if arg["choices"]:
                kwargs["choices"] = arg["choices"]
        parser.add_argument(*arg["flags"], **kwargs)
    return parser


def server_args(ns: argparse.Namespace) -> dict[str, Any]:
    values = vars(ns)
    for field, source in TABLE["renamed"].items():
        values[field] = values.get(source)
    args = dict(TABLE["fields"])
    args.update({k: v for k, v in values.items() if k in args})
    args["tokenizer_path"] = args.get("tokenizer_path") or args["model_path"]
    args["served_model_name"] = args.get("served_model_name") or args["model_path"]  # as ServerArgs.__post_init__
    return args


def behaviour(args: dict[str, Any]) -> dict[str, Any]:
    path = os.environ.get("STACKGATE_FAKE_SGLANG")
    chosen = dict(DEFAULTS)
    if path:
        chosen.update(json.loads(Path(path).read_text()))
    for profile in chosen["profiles"]:
        if all(args.get(k) == v for k, v in profile["when"].items()):
            chosen.update(profile["set"])
    if chosen["slowdown_per_launch"] and chosen["events"] and Path(chosen["events"]).exists():
        launches = sum(1 for line in Path(chosen["events"]).read_text().splitlines() if '"event": "started"' in line)
        chosen["rate"] = chosen["rate"] - chosen["slowdown_per_launch"] * launches
    return chosen


# --- output -----------------------------------------------------------------------------------


def log(message: str, tp: int | None = None, tp_size: int = 1, level: str = "info") -> None:
    if _LEVELS[level] < _SHOWN["log"]:
        return
    prefix = f" TP{tp}" if tp is not None and tp_size > 1 else ""
    sys.stderr.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}{prefix}] {message}\n")
    sys.stderr.flush()


def uvicorn(level: str, message: str, stream: Any = None) -> None:
    if _LEVELS[level.lower()] < _SHOWN["http"]:
        return
    stream = stream or sys.stderr
    stream.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {level + ':':<9} {message}\n")
    stream.flush()


def event(b: dict[str, Any], name: str, **data: Any) -> None:
    if b.get("events"):
        with open(b["events"], "a") as out:
            out.write(json.dumps({"event": name, "t": time.time(), **data}) + "\n")


# --- workers and loading ----------------------------------------------------------------------

_WORKER = """
import ctypes, os, signal, sys, time
if sys.argv[2] == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if sys.argv[3] == "1":
    os.setsid()
elif sys.argv[2] != "1" and sys.argv[4] != "1":
    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG, like SGLang's workers
while True:
    time.sleep(3600)
"""


def spawn_workers(args: dict[str, Any], b: dict[str, Any]) -> None:
    names = [f"sglang::scheduler_TP{i}" if args["tp_size"] > 1 else "sglang::scheduler" for i in range(args["tp_size"])]
    for i, name in enumerate([*names, "sglang::detokenizer"]):
        escape = b["escape"] and i == 0
        ignore = b["ignore_sigterm"] or escape
        flags = ["1" if ignore else "0", "1" if escape else "0", "1" if b["orphan_workers"] else "0"]
        child = subprocess.Popen([sys.executable, "-c", _WORKER, name, *flags], stdin=subprocess.DEVNULL)
        _CHILDREN.append(child)
        if b["gpu_state"] and i < len(names):
            with open(b["gpu_state"], "a") as out:
                out.write(json.dumps({"pid": child.pid, "gpu": i, "bytes": b["gpu_bytes"]}) + "\n")
    event(b, "workers", pids=[c.pid for c in _CHILDREN])


def leak(b: dict[str, Any]) -> None:
    """A process that escapes every tree at once (double fork into a new session) and holds GPU memory."""
    first = os.fork()
    if first == 0:
        os.setsid()
        second = os.fork()
        if second:
            event(b, "leaked", pid=second)
            if b["gpu_state"]:
                with open(b["gpu_state"], "a") as out:
                    out.write(json.dumps({"pid": second, "gpu": 0, "bytes": b["gpu_bytes"]}) + "\n")
            os._exit(0)
        os.execvp("sleep", ["sleep", "600"])
    os.waitpid(first, 0)


def die(b: dict[str, Any], lines: list[str]) -> None:
    """SGLang on a fatal error: log, then kill its process tree with SIGKILL, itself last."""
    for line in lines:
        log(line, level="error")
    event(b, "dying")
    for child in _CHILDREN:
        try:
            child.kill()
        except ProcessLookupError:
            pass
    os.kill(os.getpid(), signal.SIGKILL)


def load(args: dict[str, Any], b: dict[str, Any]) -> None:
    tp = args["tp_size"]
    fusion = args["enable_flashinfer_allreduce_fusion"] and tp > 1 and b["evidence"]
    steps = [
        (
            "distributed",
            ["Init torch distributed begin."],
            "Init torch distributed ends. elapsed=0.41 s, mem usage=0.27 GB",
        ),
        (
            "load",
            ["Load weight begin. avail mem=93.52 GB"],
            (
                "Load weight end. elapsed=0.52 s, type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=78.10 GB, mem "
                "usage=15.42 "
                "GB."
            ),
        ),
        (
            "memory",
            ["KV Cache is allocated. #tokens: 512000, K size: 29.30 GB, V size: 29.30 GB"],
            "Memory pool end. avail mem=18.60 GB",
        ),
        (
            "graphs",
            ["Capture cuda graph begin. This can take up to several minutes. avail mem=18.40 GB"],
            "Capture cuda graph end. Time elapsed: 1.20 s. mem usage=0.60 GB. avail mem=17.80 GB.",
        ),
    ]
    pause = b["load_s"] / (len(steps) + 1)
    for phase, begin, end in steps:
        for rank in range(tp):
            for line in begin:
                log(line, rank, tp)
        if phase == "load":
            progress(pause)
        else:
            time.sleep(pause)
        inject(b, phase)
        if phase == "graphs" and fusion:
            for rank in range(tp):
                log(fusion_evidence(b["release"], rank, tp), rank, tp)
        for rank in range(tp):
            log(end, rank, tp)
    log(
        (
            "max_total_num_tokens=512000, chunked_prefill_size=8192, max_prefill_tokens=16384, "
            "max_running_requests=2048, "
            "context_len=131072, available_gpu_mem=17.80 GB"
        ),
        0,
        tp,
    )
    inject(b, "serve")
    while b["hang"]:
        time.sleep(3600)
    while b["load_until"] and not Path(b["load_until"]).exists():
        time.sleep(0.02)
    time.sleep(pause)


def progress(seconds: float) -> None:
    """tqdm's shard bar, redrawn with carriage returns as the real one is."""
    for done in range(5):
        sys.stderr.write(
            (
                f"\rLoading safetensors checkpoint shards: {done * 25:3d}% Completed | {done}/4 [00:0{done}<00:00,  "
                "1.00it/s]"
            )
        )
        sys.stderr.flush()
        time.sleep(seconds / 5)
    sys.stderr.write("\n")


def fusion_evidence(release: str, rank: int, tp: int) -> str:
    """The line by which ``release`` says that its fused all-reduce's workspace exists."""
    if release == "0.5.23":
        return (
            f"FlashInfer AllReduce Fusion enabled and workspace initialized: backend=trtllm, rank={rank}, "
            f"world_size={tp}, max_token_num=2048, hidden_dim=4096"
        )
    return f"FlashInfer workspace initialized for rank {rank}, world_size {tp}"


def inject(b: dict[str, Any], phase: str) -> None:
    crash = b["crash_at_start"]
    if crash and crash.get("phase", "load") == phase:
        die(b, [*crash["lines"], "Received sigquit from a child process. It usually means the child failed."])
    fatal = b["fatal_line"]
    if fatal and fatal.get("phase", "load") == phase:
        log(fatal["line"], level="error")
        event(b, "fatal_line")
        while True:
            time.sleep(3600)


# --- HTTP -------------------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    """Stamps each connection when it is accepted, before its handler's thread starts: a request's arrival on the
    stand-in's own clock (as uvicorn's event loop sees it), whatever the machine's load does to the thread's start."""

    def process_request(self, request: Any, client_address: Any) -> None:
        _ACCEPTED[client_address] = time.perf_counter()
        super().process_request(request, client_address)


def serve(args: dict[str, Any], b: dict[str, Any]) -> None:
    Handler.args, Handler.b = args, b
    try:
        httpd = _Server((args["host"], args["port"]), Handler)
    except OSError as exc:
        uvicorn(
            "ERROR",
            (
                f"[Errno {exc.errno}] error while attempting to bind on address {(args['host'], args['port'])!r}: "
                f"{exc.strerror.lower()}"
            ),
        )
        for child in _CHILDREN:
            child.kill()
        sys.exit(1)
    httpd.daemon_threads = True
    uvicorn("INFO", f"Started server process [{os.getpid()}]")
    uvicorn("INFO", "Waiting for application startup.")
    uvicorn("INFO", "Application startup complete.")
    uvicorn("INFO", f"Uvicorn running on http://{args['host']}:{args['port']} (Press CTRL+C to quit)")
    event(b, "port_open")
    if not b["ignore_sigterm"]:
        signal.signal(signal.SIGTERM, lambda *_: on_sigterm(b))
    threading.Thread(target=warmup, args=(args, b), daemon=True).start()
    threading.Thread(target=drain_watchdog, args=(b,), daemon=True).start()
    httpd.serve_forever(poll_interval=0.05)


def warmup(args: dict[str, Any], b: dict[str, Any]) -> None:
    """The real server's own warm-up: GET /model_info, then an 8-token /generate, over HTTP."""
    time.sleep(b["warmup_s"])
    base = f"http://{args['host']}:{args['port']}"
    key = {"Authorization": f"Bearer {args['api_key']}"} if args["api_key"] else {}
    urllib.request.urlopen(urllib.request.Request(base + "/model_info", headers=key), timeout=30).read()
    body = json.dumps(
        {"sampling_params": {"temperature": 0, "max_new_tokens": 8}, "text": "The capital city of France is"}
    ).encode()
    urllib.request.urlopen(
        urllib.request.Request(base + "/generate", body, {"Content-Type": "application/json", **key}), timeout=30
    ).read()
    _STATE["status"] = "up"
    log("The server is fired up and ready to roll!")
    event(b, "ready")


def on_sigterm(b: dict[str, Any]) -> None:
    log(
        f"SIGTERM received. signum={signal.Signals.SIGTERM!r} frame=None. Draining requests and shutting down...",
        level="warning",
    )
    event(b, "sigterm")
    _STATE["draining"] = True


def drain_watchdog(b: dict[str, Any]) -> None:
    while not _STATE["draining"]:
        time.sleep(b["drain_poll_s"])
    while True:
        log(
            (
                f"Gracefully exiting... Remaining number of requests {_STATE['active']}. Remaining requests "
                "remaining_rids=[]."
            )
        )
        if _STATE["active"] == 0:
            break
        time.sleep(b["drain_poll_s"])
    die(b, [])


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    args: dict[str, Any] = {}
    b: dict[str, Any] = {}

    def log_message(self, format: str, *values: Any) -> None:
        pass  # access lines are written when a response starts, as uvicorn does

    def access(self, status: int) -> None:
        host, port = self.client_address[:2]
        uvicorn("INFO", f'{host}:{port} - "{self.command} {self.path} HTTP/1.1" {status}', sys.stdout)

    def reply(self, status: int, body: Any = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.access(status)
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def allowed(self) -> bool:
        """sglang/srt/utils/auth.py's decision for a normal endpoint; False after answering 401."""
        key = self.args.get("api_key")
        path = self.path.split("?", 1)[0]
        if not key or self.command == "OPTIONS" or path.startswith(("/health", "/metrics")):
            return True
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() == "bearer" and secrets.compare_digest(token, key):
            return True
        self.reply(401, {"error": "Unauthorized"})
        return False

    def do_GET(self) -> None:
        if not self.allowed():
            return
        if self.path in ("/health", "/health_generate"):
            self.health()
        elif self.path == "/metrics" and self.args.get("enable_metrics") and not self.b["metrics_404"]:
            self.metrics()
        elif self.path == "/model_info":
            self.reply(200, model_info(self.args))
        elif self.path == "/server_info" and not self.b["server_info_404"]:
            self.reply(200, server_info(self.args, self.b))
        elif self.path == "/get_server_info":
            log(
                (
                    "Endpoint '/get_server_info' is deprecated and will be removed in a future version. Please use "
                    "'/server_info' "
                    "instead."
                ),
                level="warning",
            )
            self.reply(200, server_info(self.args, self.b))
        else:
            self.reply(404, {"detail": "Not Found"})

    def metrics(self) -> None:
        body = self.b["metrics_body"]
        data = (body if body is not None else exposition(self.args)).encode()
        self.access(200)
        self.send_response(200)
        self.send_header("content-type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def health(self) -> None:
        if _STATE["draining"]:
            log("Health check request received during shutdown. Returning 503.")
            self.reply(503)
        elif _STATE["status"] != "up":
            self.reply(503)
        else:
            time.sleep(self.b["health_s"])
            self.reply(200)

    def do_POST(self) -> None:
        self.received = _ACCEPTED.pop(self.client_address, None) or time.perf_counter()
        length = int(self.headers.get("content-length") or 0)
        request = json.loads(self.rfile.read(length) or b"{}")
        if not self.allowed():
            return
        if self.path not in ("/generate", "/v1/chat/completions"):
            self.reply(404, {"detail": "Not Found"})
            return
        if self.path == "/v1/chat/completions":
            request = chat_request(request)
        with _LOCK:
            _STATE["requests"] += 1
            _STATE["active"] += 1
        try:
            if request.get("stream") and "chat" in request:
                self.stream(request, chat_chunks)
            elif request.get("stream"):
                self.stream(request)
            elif "chat" in request:
                self.reply(200, chat_whole(generate_whole(request, self.args, self.b), request))
            else:
                self.reply(200, generate_whole(request, self.args, self.b))
        finally:
            with _LOCK:
                _STATE["active"] -= 1

    def stream(self, request: dict[str, Any], shape: Any = None) -> None:
        self.access(200)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        with _LOCK:
            _STATE["streams"] += 1
            number = _STATE["streams"]
        event(self.b, "stream", number=number)
        sent: list[
            float
        ] = []  # time.perf_counter() (CLOCK_MONOTONIC, the client's clock too) just before each event is written
        load: dict[str, Any] = {}
        events = token_events(request, self.args, self.b, number, load)
        for payload in shape(events, request) if shape is not None else events:
            if self.cut(payload):
                return
            sent.append(time.perf_counter())
            self.chunk(b"data: " + payload + b"\n\n")
        self.chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        event(
            self.b,
            "stream_done",
            number=number,
            first_sent=sent[0] if sent else None,
            last_sent=sent[-1] if sent else None,
            events=len(sent),
            **({"received": self.received, "sent": sent, **load} if self.b["timing"] else {}),
        )

    def cut(self, payload: bytes) -> bool:
        """Drop the connection mid-stream while the server stays up (a proxy's reset, a bug)."""
        cutting = self.b["cut_mid_stream"]
        if not cutting or completion_tokens(payload) < cutting["after_tokens"]:
            return False
        event(self.b, "cut")
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)
        return True

    def chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


# --- generation -------------------------------------------------------------------------------


def token_ids(prompt: str, count: int, b: dict[str, Any], number: int) -> list[int]:
    seed = zlib.crc32(prompt.encode())
    ids = [(seed + i * 7919) % 32000 for i in range(count)]
    changes = [b["shift_from"]] if b["shift_from"] is not None else []
    if b["diverge_from"] is not None and number % 2 == 0:
        changes.append(b["diverge_from"])
    for start in changes:
        ids[start:] = [(x + 1) % 32000 for x in ids[start:]]
    return ids


def meta(
    rid: str, count: int, prompt_tokens: int, finished: Any, started: float, verify: int = 0, drafts: int = 4
) -> dict[str, Any]:
    info: dict[str, Any] = {
        "id": rid,
        "finish_reason": finished,
        "prompt_tokens": prompt_tokens,
        "weight_version": "default",
        "total_retractions": 0,
        "completion_tokens": count,
        "cached_tokens": 0,
    }
    if verify:  # tokenizer_manager.py's speculative fields: accept length counts the bonus token
        proposed = verify * (drafts - 1)
        info.update(
            spec_accept_rate=(count - verify) / proposed,
            spec_accept_length=count / verify,
            spec_num_correct_drafts=count - verify,
            spec_num_proposed_drafts=proposed,
            spec_verify_ct=verify,
        )
    if finished is not None:
        info["e2e_latency"] = time.time() - started
    return info


def count_request(prompt_tokens: int, tokens: int, verify: int) -> None:
    with _LOCK:
        _COUNTS["requests"] += 1
        _COUNTS["prompt_tokens"] += prompt_tokens
        _COUNTS["generation_tokens"] += tokens
        _COUNTS["verify"] += verify
        _COUNTS["spec_tokens"] += tokens if verify else 0


def rate_now(b: dict[str, Any], number: int) -> float:
    table = b["rate_by_streams"] or {}
    chosen = b["rate_cycle"][(number - 1) % len(b["rate_cycle"])] if b["rate_cycle"] else b["rate"]
    for streams, rate in sorted(((int(k), v) for k, v in table.items())):
        if _STATE["active"] >= streams:
            chosen = rate
    return float(chosen)


def token_events(
    request: dict[str, Any], args: dict[str, Any], b: dict[str, Any], number: int, load: dict[str, Any] | None = None
) -> Any:
    """The SSE payloads of one streamed generation, paced at the behaviour's rate (after its turn and prefill)."""
    running = _running(b)
    waited = time.perf_counter()
    if running is not None:
        running.acquire()
    try:
        yield from _decode(request, args, b, number, time.perf_counter() - waited, {} if load is None else load)
    finally:
        if running is not None:
            running.release()


def _running(b: dict[str, Any]) -> threading.Semaphore | None:
    if not b["max_running"]:
        return None
    with _LOCK:
        return _RUNNING.setdefault("slots", threading.Semaphore(int(b["max_running"])))


def cached_words(words: list[str]) -> int:
    """The prompt's longest prefix (in words) that the prefix cache holds; then every prefix of it is cached."""
    hashes, h = [], 0
    for word in words:
        h = hash((h, word))
        hashes.append(h)
    with _LOCK:
        hit = next((i + 1 for i in range(len(hashes) - 1, -1, -1) if hashes[i] in _CACHE), 0)
        _CACHE.update(hashes)
    return hit


def _decode(
    request: dict[str, Any], args: dict[str, Any], b: dict[str, Any], number: int, queued_s: float, load: dict[str, Any]
) -> Any:
    params = request.get("sampling_params") or {}
    asked = int(params.get("max_new_tokens") or 16)
    total = max(0, asked - b["short_by"])
    prompt = request.get("text") or ""
    ids = token_ids(prompt, total, b, number)
    rid, started = f"{number:032x}", time.time()
    words = prompt.split()
    cached = cached_words(words) if b["prefill_s_per_token"] or b["timing"] else 0
    prefill = b["ttft_s"] + b["prefill_s_per_token"] * (len(words) - cached)
    load.update(prompt_crc=zlib.crc32(prompt.encode()), cached=cached, queued_s=queued_s)
    spread = b["itl_spread"]
    factor = random.Random(f"{b['itl_seed']}:{number}") if spread else None
    burst, count, due = max(1, int(b["burst"])), 0, time.perf_counter() + prefill
    speculating, verify = bool(args.get("speculative_algorithm")), 0
    while count < total:
        if speculating:  # one event per verify step, carrying the tokens that step accepted
            burst = int(b["accept_lengths"][verify % len(b["accept_lengths"])])
            verify += 1
        step = min(burst, total - count)
        wait = due - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        count += step
        mid_stream(b, count)
        finished = (
            ({"type": "length", "length": asked} if total == asked else {"type": "abort", "message": "aborted"})
            if count == total
            else None
        )
        text = "".join(_WORDS[i % len(_WORDS)] + " " for i in ids[:count])
        yield json.dumps(
            {
                "text": text,
                "output_ids": ids[:count],
                "meta_info": meta(
                    rid, count, len(prompt.split()), finished, started, verify, int(b["num_draft_tokens"])
                ),
            },
            separators=(",", ":"),
        ).encode()
        due += step / rate_now(b, number) * (factor.uniform(*spread) if factor is not None else 1.0)
    count_request(len(prompt.split()), count, verify)


def mid_stream(b: dict[str, Any], count: int) -> None:
    dying = b["die_mid_stream"]
    if dying and count >= dying["after_tokens"]:
        die(b, [*dying["lines"], "SIGQUIT received. signum=None, frame=None. It usually means one child failed."])
    fatal = b["fatal_mid_stream"]
    if fatal and count == fatal["after_tokens"]:
        log(fatal["line"], level="error")
        event(b, "fatal_line")


def generate_whole(request: dict[str, Any], args: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    params = request.get("sampling_params") or {}
    asked = int(params.get("max_new_tokens") or 16)
    prompt = request.get("text") or ""
    ids = token_ids(prompt, asked, b, 0)
    answer = accuracy_answer(request.get("content", prompt), b)
    if answer is not None:
        ids = token_ids(answer, min(asked, len(answer.split()) + 1), b, 0)
    log(
        (
            f"Prefill batch, #new-seq: 1, #new-token: {len(prompt.split())}, #cached-token: 0, token usage: 0.00, "
            "#running-req: "
            "0, #queue-req: 0, input throughput (token/s): 0.00, cuda graph: False"
        ),
        0,
        args["tp_size"],
    )
    time.sleep(b["ttft_s"] + len(ids) / b["rate"])
    text = "".join(_WORDS[i % len(_WORDS)] + " " for i in ids)
    finished: dict[str, Any] = {"type": "length", "length": asked}
    if answer is not None:
        text, finished = answer, {"type": "stop", "matched": "\n"}
        if "\n" not in (params.get("stop") or ()):
            text += "\n\nThat is the answer."
    count_request(len(prompt.split()), len(ids), 0)
    return {
        "text": text,
        "output_ids": ids,
        "meta_info": meta("0" * 32, len(ids), len(prompt.split()), finished, time.time()),
    }


def accuracy_answer(prompt: str, b: dict[str, Any]) -> str | None:
    """The "model's" greedy answer to a prompt of the shipped accuracy set; None for any other prompt."""
    if prompt not in ACCURACY:
        return None
    wrong = zlib.crc32(prompt.encode()) % 10000 < float(b["wrong_answer_rate"]) * 10000
    return " I am not sure" if wrong else f" {ACCURACY[prompt]}"


# --- the OpenAI-compatible chat endpoint ------------------------------------------------------


def chat_request(request: dict[str, Any]) -> dict[str, Any]:
    """A chat request as the native generation it becomes: the messages through the chat template."""
    messages = request.get("messages") or []
    text = "".join(f"<|im_start|>{m.get('role')}\n{m.get('content')}<|im_end|>\n" for m in messages)
    params = {
        "max_new_tokens": request.get("max_completion_tokens") or request.get("max_tokens") or 16,
        "temperature": request.get("temperature", 1.0),
        "ignore_eos": bool(request.get("ignore_eos")),
        "stop": request.get("stop"),
    }
    return {
        "chat": True,
        "text": text + "<|im_start|>assistant\n",
        "content": messages[-1].get("content") if messages else "",
        "model": request.get("model") or "default",
        "sampling_params": params,
        "stream": bool(request.get("stream")),
        "stream_options": request.get("stream_options") or {},
    }


def completion_tokens(payload: bytes) -> int:
    found = re.findall(rb'"completion_tokens":\s*(\d+)', payload)
    return int(found[-1]) if found else 0


def chat_chunks(events: Any, request: dict[str, Any]) -> Any:
    """Native events re-shaped into ``chat.completion.chunk`` objects, as serving_chat.py streams them."""
    options = request["stream_options"]
    continuous, include = bool(options.get("continuous_usage_stats")), bool(options.get("include_usage"))
    base = {"id": f"{secrets.token_hex(16)}", "object": "chat.completion.chunk", "created": int(time.time())}
    base["model"] = request["model"]
    prompt_tokens, sent, usage = len(request["text"].split()), 0, None

    def chunk(delta: dict[str, Any], reason: Any, completion: int) -> bytes:
        nonlocal usage
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion}
        usage["total_tokens"] = prompt_tokens + completion
        body = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]}
        if continuous:
            body["usage"] = usage
        return json.dumps(body, separators=(",", ":")).encode()

    yield chunk({"role": "assistant", "content": ""}, None, 0)
    for payload in events:
        event = json.loads(payload)
        info = event["meta_info"]
        finished = info["finish_reason"]
        reason = None if finished is None else finished["type"]
        yield chunk({"content": event["text"][sent:]}, reason, info["completion_tokens"])
        sent = len(event["text"])
    if include and usage is not None:
        yield json.dumps({**base, "choices": [], "usage": usage}, separators=(",", ":")).encode()


def chat_whole(native: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """A native answer as one ``chat.completion``."""
    info = native["meta_info"]
    prompt_tokens = len(request["text"].split())
    return {
        "id": secrets.token_hex(16),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request["model"],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": native["text"], "reasoning_content": None},
                "logprobs": None,
                "finish_reason": info["finish_reason"]["type"],
                "matched_stop": info["finish_reason"].get("matched"),
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": info["completion_tokens"],
            "total_tokens": prompt_tokens + info["completion_tokens"],
        },
    }


# --- /metrics ---------------------------------------------------------------------------------


def exposition(args: dict[str, Any]) -> str:
    """The Prometheus text format as prometheus_client writes SGLang's families (multiprocess mode)."""
    model = str(args["served_model_name"]).replace("\\", "\\\\").replace('"', '\\"')
    tokenizer = f'engine_type="unified",model_name="{model}"'
    ranks = [f'engine_type="unified",model_name="{model}",pp_rank="0",tp_rank="{r}"' for r in range(args["tp_size"])]
    with _LOCK:
        counts = dict(_COUNTS)
    one = f"{{{tokenizer}}}"
    running = [f"{{{r}}} {float(_STATE['active'])}" for r in ranks]
    families: list[tuple[str, str, str, list[str]]] = [
        ("sglang:num_requests", "counter", "Number of requests processed.", [f"{one} {counts['requests']}.0"]),
        ("sglang:prompt_tokens", "counter", "Number of prefill tokens.", [f"{one} {counts['prompt_tokens']}.0"]),
        ("sglang:generation_tokens", "counter", "Generated tokens.", [f"{one} {counts['generation_tokens']}.0"]),
        ("sglang:num_running_reqs", "gauge", "The number of running requests.", running),
    ]
    if args.get("speculative_algorithm"):
        length = (counts["spec_tokens"] / counts["verify"]) if counts["verify"] else 0.0
        doc = "Mean acceptance length of speculative decoding."
        families.append(("sglang:spec_accept_length", "gauge", doc, [f"{{{r}}} {length}" for r in ranks]))
    lines = []
    for name, kind, doc, samples in families:
        full = f"{name}_total" if kind == "counter" else name  # prometheus_client names a counter's family so
        lines += [f"# HELP {full} {doc}", f"# TYPE {full} {kind}", *(f"{full}{sample}" for sample in samples)]
    return "\n".join(lines) + "\n"


def model_info(args: dict[str, Any]) -> dict[str, Any]:
    config = json.loads((Path(args["model_path"]) / "config.json").read_text())
    return {
        "model_path": args["model_path"],
        "tokenizer_path": args["tokenizer_path"],
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": config.get("model_type"),
        "architectures": config.get("architectures"),
    }


def server_info(args: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    scheduler = {"status": "ready", "max_total_num_tokens": 512000, "max_req_input_len": 131066}
    # Each scheduler's state starts from its own copy of the server arguments (Scheduler.get_internal_state).
    states = [
        {
            **args,
            "last_gen_throughput": b["rate"],
            "memory_usage": {"weight": 15.42, "kvcache": 58.6, "token_capacity": 512000, "graph": 0.6},
        }
    ]
    return {**args, **scheduler, "internal_states": states, "version": VERSION}
