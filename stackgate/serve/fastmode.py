"""Fast mode: the same launch with random weights and only a few of the model's own layers.

SGLang 0.5.9 takes ``--load-format dummy`` (weights initialised at random, nothing read from the
checkpoint) and ``--json-model-override-args JSON``, which it applies with ``config.update(...)``
on the model's top-level Hugging Face config after loading config.json. So the layer count can be
shrunk only where it is a top-level key; a model whose layers are counted in a nested config
(``text_config`` of a multimodal wrapper such as Kimi-K2.5) cannot be shrunk this way, and fast
mode says so instead of launching the full depth with random weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

__all__ = ["LAYER_KEYS", "FastModeError", "Shrink", "launch_flags", "shrink"]

#: Config keys that hold the layer count, by model family (Llama/Qwen/DeepSeek..., ChatGLM and
#: EXAONE, DBRX, GPT-2 style). Checked in this order; the first present at top level is used.
LAYER_KEYS = ("num_hidden_layers", "num_layers", "n_layers", "n_layer")
_NESTED = ("text_config", "language_config", "llm_config", "thinker_config")


class FastModeError(Exception):
    """Fast mode cannot shrink this model, with the reason."""


@dataclass(frozen=True)
class Shrink:
    key: str  #: the config key that counts layers
    layers: int  #: kept
    total: int  #: the model's own
    override: Mapping[str, Any]  #: what --json-model-override-args carries
    architecture: str

    @property
    def label(self) -> str:
        return f"fast mode: random weights, {self.layers} of {self.total} layers of {self.architecture}"


def shrink(model: Path, layers: int) -> Shrink:
    """The override that keeps ``layers`` layers of the model in ``model``/config.json."""
    config = _config(model)
    key = next((k for k in LAYER_KEYS if isinstance(config.get(k), int)), None)
    if key is None:
        nested = [n for n in _NESTED if isinstance(config.get(n), dict) and any(k in config[n] for k in LAYER_KEYS)]
        if nested:
            raise FastModeError(
                f"{model}/config.json counts its layers in {nested[0]}, and --json-model-override-args "
                "only sets top-level keys (SGLang applies it with config.update): fast mode cannot shrink this model"
            )
        raise FastModeError(f"{model}/config.json has none of {', '.join(LAYER_KEYS)}: fast mode cannot tell its depth")
    total = int(config[key])
    keep = layers
    # DeepSeek-style MoE models make the first k layers dense: keep one MoE layer so the expert
    # path (and its all-to-all/allreduce) is part of what fast mode proves.
    dense = config.get("first_k_dense_replace")
    if isinstance(dense, int) and keep <= dense:
        keep = dense + 1
    keep = min(keep, total)
    architecture = ", ".join(config.get("architectures") or []) or config.get("model_type", "unknown architecture")
    return Shrink(key, keep, total, {key: keep}, architecture)


def launch_flags(plan: Shrink) -> tuple[str, ...]:
    """The two SGLang flags, in the exact form 0.5.9's server_args.py defines.

    >>> launch_flags(Shrink("num_hidden_layers", 4, 32, {"num_hidden_layers": 4}, "LlamaForCausalLM"))
    ('--load-format', 'dummy', '--json-model-override-args', '{"num_hidden_layers": 4}')
    """
    return ("--load-format", "dummy", "--json-model-override-args", json.dumps(dict(plan.override)))


def _config(model: Path) -> dict[str, Any]:
    path = model / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise FastModeError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise FastModeError(f"{path} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise FastModeError(f"{path} is not a JSON object")
    return data
