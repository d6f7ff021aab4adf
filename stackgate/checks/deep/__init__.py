"""Deep checks: judge real work on every GPU and an all-reduce sweep, run by the stack's interpreter.

The measuring (launching :mod:`stackgate.edges.deepwork` under the lock's target interpreter and
reading the figures it leaves behind) is :mod:`stackgate.facts.deepruns`; this package judges them.
Measuring and judging stay apart, so the judgement (tolerances, slow peers, bus bandwidth,
#wrong) is tested with plain numbers.

The deep checks run only after the static checks that they stand on have passed; see
:data:`PREREQUISITES` and :func:`not_run`, which ``verify --deep`` applies.

One module per check, and what they share below them:

- ``common.py``: :data:`PREREQUISITES`, :func:`not_run`, :func:`launch` (what each check starts ahead),
  the world size, the limits, and what the two flashinfer checks share (the fusion flag, tolerances,
  the JIT context, known failures);
- ``gpuwork.py``: deep.gpu_work (every GPU's matmuls and copy, against its peers and its model);
- ``sweep.py``: deep.collective (the NCCL all-reduce sweep);
- ``attention.py``: deep.flashinfer_attention (flashinfer's attention kernels);
- ``fusion.py``: deep.allreduce_fusion (flashinfer's fused all-reduce + RMSNorm and its arch gate).

The checks register in that order (the order verify --deep runs them) as this package imports them.
"""

from __future__ import annotations

# The checks register as their modules are imported: this order is the order verify --deep runs them.
# isort: off
from stackgate.checks.deep.common import (
    _recognised,  # noqa: F401  (tests read the knowledge base's entries through it)
    ATTENTION_ATOL,
    FUSION_FLAG,
    PEER_FLOOR,
    PREREQUISITES,
    TOLERANCE,
    JitContext,
    Known,
    close_enough,
    fusion_atol,
    launch,
    not_run,
    world_size,
    RATES,
    SKIP_PASSES,
    TUNING,
)
from stackgate.checks.deep.gpuwork import (
    MODEL_RATES,
    MODEL_RATES_HOW,
    activity_lines,
    gpu_work,
    judge_gpu_work,
    model_row,
    row_named,
    slow_peers,
    within_tolerance,
)
from stackgate.checks.deep.sweep import (
    collective,
    judge_collective,
)
from stackgate.checks.deep.attention import (
    ReadFraction,
    flashinfer_attention,
    judge_attention,
    read_fractions,
    signal_name,
    ATTENTION_FIGURES,
    DISK_FULL,
    JIT_BUILD_BYTES,
)
from stackgate.checks.deep.fusion import (
    allreduce_fusion,
    fusion_arch_problem,
    judge_fusion,
    judge_fusion_gate,
)
# isort: on

__all__ = [
    "activity_lines",
    "allreduce_fusion",
    "ATTENTION_ATOL",
    "ATTENTION_FIGURES",
    "DISK_FULL",
    "close_enough",
    "collective",
    "flashinfer_attention",
    "fusion_arch_problem",
    "fusion_atol",
    "FUSION_FLAG",
    "gpu_work",
    "JIT_BUILD_BYTES",
    "JitContext",
    "judge_attention",
    "judge_collective",
    "judge_fusion",
    "judge_fusion_gate",
    "judge_gpu_work",
    "Known",
    "launch",
    "MODEL_RATES",
    "MODEL_RATES_HOW",
    "model_row",
    "not_run",
    "PEER_FLOOR",
    "PREREQUISITES",
    "RATES",
    "read_fractions",
    "ReadFraction",
    "row_named",
    "signal_name",
    "SKIP_PASSES",
    "slow_peers",
    "TOLERANCE",
    "TUNING",
    "within_tolerance",
    "world_size",
]
