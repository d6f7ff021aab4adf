"""vLLM 0.33.0, as its released wheel defines it.

Read from the vllm-0.33.0 wheel: entrypoints/cli/main.py and cli/serve.py (``vllm serve MODEL``),
engine/arg_utils.py (the flag spellings), entrypoints/common/cli_args.py (--api-key),
entrypoints/serve/instrumentator/health.py (/health: 200 once the engine client is up),
entrypoints/openai/models/api_router.py (/v1/models), entrypoints/openai/completion/serving.py
(the /v1/completions stream: ``data: {json}`` chunks, ``usage`` on each chunk with
``stream_options.continuous_usage_stats``, ``data: [DONE]``), the start-up lines of v1/engine/core.py,
distributed/parallel_state.py, v1/worker/gpu_model_runner.py, v1/worker/gpu_worker.py and
launchers/api_server/entry.py, and the fusion pass:

- ``PassConfig.fuse_allreduce_rms`` (config/compilation.py) is on by default at -O2/-O3 only where
  ``enable_allreduce_rms_fusion`` (config/vllm.py) finds TP > 1, CUDA, flashinfer and a GPU of
  capability family 100 or capability 90: on SM120 it stays off without a word.
- Asked for explicitly (``--compilation-config.pass_config.fuse_allreduce_rms=true``), the pass
  ``AllReduceFusionPass`` (compilation/passes/fusion/allreduce_rms_fusion.py) sizes its workspace
  from ``FI_ALLREDUCE_FUSION_MAX_SIZE_MB``, a table keyed by capability 90 and 100 only: on SM120
  ``PassConfig.flashinfer_max_size`` finds no size and the pass declines with a WARNING.
- That the pass fused anything is written only at DEBUG (``fusion pass matches: {...}`` from
  compilation/passes/vllm_inductor_pass.py), so smoke runs a fused vLLM with VLLM_LOGGING_LEVEL=DEBUG.
"""

from __future__ import annotations

from types import MappingProxyType

from stackgate.models.engines.base import OPENAI_COMPLETIONS, Decline, Engine, Phase

__all__ = ["ENGINE"]

_PASS = "vLLM's AllReduceFusionPass (vllm/compilation/passes/fusion/allreduce_rms_fusion.py)"

ENGINE = Engine(
    name="vllm",
    title="vLLM",
    version="0.33.0",
    source="vllm-0.33.0 wheel: entrypoints/cli/serve.py, engine/arg_utils.py, config/compilation.py, "
    "compilation/passes/fusion/allreduce_rms_fusion.py",
    launch=("-m", "vllm.entrypoints.cli.main", "serve"),
    model_flag="",
    tp_flag="--tensor-parallel-size",
    attention_flag="--attention-backend",
    memory_flag="--gpu-memory-utilization",
    default_port=8000,
    phases=(
        Phase(r"Initializing a V1 LLM engine \(v[^)]*\) with config", "starting", "starting"),
        Phase(r"world_size=\d+ rank=\d+ local_rank=\d+ distributed_init_method", "distributed", "initialising NCCL"),
        Phase(r"Starting to load model ", "weights", "loading weights"),
        Phase(r"Loading safetensors checkpoint shards:\s*(?P<pct>\d+)%", "weights", "loading weights ({pct}%)"),
        Phase(r"Model loading took ", "loaded", "weights loaded"),
        Phase(r"torch\.compile took ", "compiled", "torch.compile done"),
        Phase(r"Available KV cache memory: ", "kv_cache", "allocating the KV cache"),
        Phase(r"Capturing CUDA graphs", "graphs", "capturing CUDA graphs"),
        Phase(r"Graph capturing finished in ", "graphs_done", "CUDA graphs captured"),
        Phase(r"Starting vLLM server on ", "listening", "HTTP up, starting the app"),
        Phase(r"Application startup complete\.", "ready", "ready"),
    ),
    ready_line="Application startup complete.",
    info_endpoints=("/v1/models",),
    info_fields=MappingProxyType({"model": "root", "max_model_len": "max_model_len"}),
    api=OPENAI_COMPLETIONS,
    generate_path="/v1/completions",
    override_flag="--hf-overrides",
    speculative_config_flag="--speculative-config",
    fusion_flag="--compilation-config.pass_config.fuse_allreduce_rms",
    fusion_evidence=r"fusion pass matches: .*'AllReduceFusionPass': [1-9]",
    fusion_env=MappingProxyType({"VLLM_LOGGING_LEVEL": "DEBUG"}),
    declines=(
        Decline(
            r"Flashinfer allreduce fusion is not supported for world size \d+ or max size is not provided",
            _PASS,
            "FI_ALLREDUCE_FUSION_MAX_SIZE_MB has sizes for compute capability 90 and 100 only",
        ),
        Decline(r"AllReduce fusion pass is disabled for tp_size <= 1", _PASS, "the fused all-reduce needs TP > 1"),
        Decline(
            r"Flashinfer is not installed or comm module not found, skipping allreduce fusion pass",
            _PASS,
            "flashinfer.comm cannot be imported in the stack",
        ),
        Decline(
            r"Failed to initialize Flashinfer allreduce workspace\. Flashinfer allreduce-norm fusion will be disabled",
            _PASS,
            "flashinfer could not allocate the fused all-reduce's workspace",
        ),
    ),
)
