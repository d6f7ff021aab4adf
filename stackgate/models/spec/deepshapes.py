"""What the deep checks run: [deep.attention] (deep.flashinfer_attention's shapes) and [deep.fusion]
(deep.allreduce_fusion's), with their limits.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from stackgate.models.spec.reader import Table

__all__ = [
    "FUSION_SEVERITIES",
    "MAX_FUSION_TOKENS",
    "MAX_JIT_TIMEOUT_S",
    "PREFILL_BACKENDS",
    "Deep",
    "DeepAttention",
    "DeepFusion",
]

#: What the allreduce-fusion check reports when this machine's GPUs cannot run the fused path.
FUSION_SEVERITIES = ("fail", "warn")
#: The longest JIT timeout a lock may ask for: the deep checks' own time limits are set from it.
MAX_JIT_TIMEOUT_S = 3600.0
#: The most tokens SGLang 0.5.9 sends through the fused path (FUSE_ALLREDUCE_MAX_BATCH_SIZE).
MAX_FUSION_TOKENS = 2048


#: The causal prefill's flashinfer backends [deep.attention] prefill_backend may name.
PREFILL_BACKENDS = ("fa2", "auto")


@dataclass(frozen=True)
class DeepAttention:
    """[deep.attention]: the shapes deep.flashinfer_attention runs, per GPU (one TP rank's share).

    The defaults are the reference deployment's model family where it has the number (64 query
    heads, as Kimi K2.5 / DeepSeek-V3-style models at TP 1) and the common grouped-query layout
    where it has none (8 KV heads of 128: that family uses MLA, which these GQA kernels are not).
    """

    q_heads: int = 64
    kv_heads: int = 8
    head_dim: int = 128
    kv_len: int = 16384  #: KV tokens per request (decode, prefill and each paged request)
    prefill_len: int = 2048  #: query tokens of the causal prefill, the last ones of kv_len
    page_size: int = 16  #: KV tokens per page of the paged decode (SGLang's --page-size defaults to 1)
    batch: int = 8  #: requests in the paged batch decode
    jit_timeout_s: float = 600.0  #: the cold build of the attention modules took 24.6 s on a 16-core H200 host
    #: The bandwidth-bound decode: the paged decode at this batch and KV length, 4 GiB of bf16 KV at the default
    #: heads, far beyond any L2, so reading the KV cache dominates its time.
    bandwidth_batch: int = 64
    bandwidth_kv_len: int = 16384
    #: The floor of that decode's KV rate as a fraction of the GPU's read bandwidth (see checks/deep.py).
    min_read_fraction: float = 0.6
    #: flashinfer's backend for the causal single prefill: fa2, or auto (flashinfer's choice: fa3 on sm90a, whose
    #: module, which SGLang does not load, took 74-80 s per kernel file to compile on a 16-core H200 host).
    prefill_backend: str = "fa2"

    @classmethod
    def _from_table(cls, t: Table) -> DeepAttention:
        # The shapes are the whole-number fields: each a positive count under its own name.
        given = {f.name: t.positive(f.name, int, getattr(cls, f.name)) for f in fields(cls) if f.type in ("int", int)}
        fraction = t.positive("min_read_fraction", float, cls.min_read_fraction)
        if fraction is not None and fraction > 1:
            t.error("min_read_fraction", f"must be a fraction of the read bandwidth, at most 1, not {fraction:g}")
            fraction = None
        backend = t.get("prefill_backend", str, cls.prefill_backend)
        if backend is not None:
            t.choice("prefill_backend", backend, PREFILL_BACKENDS)
        shapes = cls(
            **{k: v or getattr(cls, k) for k, v in given.items()},
            jit_timeout_s=_jit_timeout(t, cls.jit_timeout_s),
            min_read_fraction=fraction or cls.min_read_fraction,
            prefill_backend=backend if backend in PREFILL_BACKENDS else cls.prefill_backend,
        )
        if shapes.q_heads % shapes.kv_heads:
            t.error(
                "q_heads",
                f"{shapes.q_heads} query heads do not group over {shapes.kv_heads} KV heads "
                "(q_heads must be a multiple of kv_heads)",
            )
        if shapes.kv_len % shapes.page_size:
            t.error(
                "kv_len",
                f"{shapes.kv_len} KV tokens do not fill whole pages of {shapes.page_size} "
                "(kv_len must be a multiple of page_size)",
            )
        if shapes.bandwidth_kv_len % shapes.page_size:
            t.error(
                "bandwidth_kv_len",
                f"{shapes.bandwidth_kv_len} KV tokens do not fill whole pages of {shapes.page_size} "
                "(bandwidth_kv_len must be a multiple of page_size)",
            )
        if shapes.prefill_len > shapes.kv_len:
            t.error(
                "prefill_len", f"{shapes.prefill_len} query tokens exceed the {shapes.kv_len} KV tokens they attend to"
            )
        t.finish()
        return shapes


@dataclass(frozen=True)
class DeepFusion:
    """[deep.fusion]: what deep.allreduce_fusion runs when [smoke] flags enable the fusion."""

    hidden: int = 7168  #: the hidden size of the reference deployment's model (Kimi K2.5, DeepSeek-V3)
    tokens: tuple[int, ...] = (1, 4, 16, 64, 128, 256, 512)  #: decode batches up to a small prefill
    unsupported: str = "fail"  #: fail | warn when the GPUs' arch cannot run the fused path
    jit_timeout_s: float = 600.0  #: the comm module's cold JIT took 94-137 s on 2x H200

    @classmethod
    def _from_table(cls, t: Table) -> DeepFusion:
        tokens = t.get("tokens", list, list(cls.tokens)) or []
        bad = [
            i
            for i, n in enumerate(tokens)
            if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= MAX_FUSION_TOKENS
        ]
        for i in bad:
            t.error(
                f"tokens[{i}]",
                f"must be a token count from 1 to {MAX_FUSION_TOKENS} (SGLang's largest fused batch), "
                f"not {tokens[i]!r}",
            )
        if not bad and (not tokens or sorted(set(tokens)) != tokens):
            t.error("tokens", f"must be distinct token counts in increasing order, not {tokens}")
        unsupported = t.get("unsupported", str, cls.unsupported)
        if unsupported is not None:
            t.choice("unsupported", unsupported, FUSION_SEVERITIES)
        fusion = cls(
            hidden=t.positive("hidden", int, cls.hidden) or cls.hidden,
            tokens=tuple(tokens) if not bad else cls.tokens,
            unsupported=unsupported or cls.unsupported,
            jit_timeout_s=_jit_timeout(t, cls.jit_timeout_s),
        )
        t.finish()
        return fusion


def _jit_timeout(t: Table, default: float) -> float:
    """A JIT timeout: seconds, at most :data:`MAX_JIT_TIMEOUT_S` (the deep checks' own limit)."""
    value = t.positive("jit_timeout_s", float, default)
    if value is not None and value > MAX_JIT_TIMEOUT_S:
        t.error("jit_timeout_s", f"must be at most {MAX_JIT_TIMEOUT_S:g} s, not {value:g}")
        return default
    return value or default


@dataclass(frozen=True)
class Deep:
    attention: DeepAttention = field(default_factory=DeepAttention)
    fusion: DeepFusion = field(default_factory=DeepFusion)

    @classmethod
    def _from_table(cls, t: Table) -> Deep:
        deep = cls(DeepAttention._from_table(t.sub("attention")), DeepFusion._from_table(t.sub("fusion")))
        t.finish()
        return deep
