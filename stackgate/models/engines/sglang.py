"""SGLang 0.5.9, as its released wheel defines it (sglang/srt/server_args.py, entrypoints/http_server.py,
layers/flashinfer_comm_fusion.py, utils/auth.py)."""

from __future__ import annotations

from types import MappingProxyType

from stackgate.models.engines.base import NATIVE_GENERATE, Engine, Phase, Release

__all__ = ["ENGINE"]

ENGINE = Engine(
    name="sglang",
    title="SGLang",
    version="0.5.9",
    source="sglang-0.5.9 wheel: srt/server_args.py, srt/entrypoints/http_server.py, "
    "srt/layers/flashinfer_comm_fusion.py",
    launch=("-m", "sglang.launch_server"),
    model_flag="--model-path",
    tp_flag="--tp-size",
    attention_flag="--attention-backend",
    memory_flag="--mem-fraction-static",
    default_port=30000,
    phases=(
        Phase(r"server_args=ServerArgs\(", "starting", "starting"),
        Phase(r"Init torch distributed begin", "distributed", "initialising torch.distributed"),
        Phase(r"Load weight begin", "weights", "loading weights"),
        Phase(r"Loading \w+ checkpoint shards:\s*(?P<pct>\d+)%", "weights", "loading weights ({pct}%)"),
        Phase(r"Load weight end", "loaded", "weights loaded"),
        Phase(r"KV Cache is allocated|Memory pool end", "kv_cache", "allocating the KV cache"),
        Phase(r"Capture (?:cuda|cpu|npu) graph begin|Capturing batches", "graphs", "capturing CUDA graphs"),
        Phase(r"Capture (?:cuda|cpu|npu) graph end", "graphs_done", "CUDA graphs captured"),
        Phase(r"Uvicorn running on", "listening", "HTTP up, warming up"),
        Phase(r"The server is fired up and ready to roll!", "ready", "ready"),
    ),
    ready_line="The server is fired up and ready to roll!",
    info_endpoints=("/server_info", "/get_server_info"),
    info_fields=MappingProxyType(
        {
            "model": "model_path",
            "port": "port",
            "version": "version",
            "tp": "tp_size",
            "attention_backend": "attention_backend",
        }
    ),
    api=NATIVE_GENERATE,
    generate_path="/generate",
    override_flag="--json-model-override-args",
    secret_options=("--api-key", "--admin-api-key"),
    fusion_flag="--enable-flashinfer-allreduce-fusion",
    # layers/flashinfer_comm_fusion.py logs it at INFO once the fused all-reduce's workspace exists, per rank.
    fusion_evidence="FlashInfer workspace initialized for rank",
    backend_finding="sglang-attention-backend-default",
    releases=(
        Release(
            "0.5.23",
            "sglang-0.5.23 wheel: srt/layers/flashinfer_comm_fusion.py",
            # logged at INFO once per process, when the fused all-reduce's workspace exists (line 580)
            fusion_evidence="FlashInfer AllReduce Fusion enabled and workspace initialized: ",
        ),
    ),
    # srt/entrypoints/http_server.py mounts /metrics only when --enable-metrics is given.
    metrics_flag="--enable-metrics",
)
