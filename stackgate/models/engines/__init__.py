"""The serving engines stackgate can launch, as data: one module per engine, one registry line each.

Adding an engine is a module that fills :class:`Engine` from the released wheel it names, and a
line in :data:`ENGINES`; `[smoke] engine` is checked against this registry when the spec loads.
"""

from __future__ import annotations

import difflib
from types import MappingProxyType

from stackgate.models.engines import sglang, vllm
from stackgate.models.engines.base import NATIVE_GENERATE, OPENAI_CHAT, OPENAI_COMPLETIONS, Decline, Engine, Phase

__all__ = [
    "ENGINES",
    "NATIVE_GENERATE",
    "OPENAI_CHAT",
    "OPENAI_COMPLETIONS",
    "Decline",
    "Engine",
    "Phase",
    "UnknownEngineError",
    "get",
    "secret_options",
    "unknown",
]

ENGINES = MappingProxyType({engine.name: engine for engine in (sglang.ENGINE, vllm.ENGINE)})


class UnknownEngineError(LookupError):
    """A name that no registered engine has."""


def unknown(name: str) -> str:
    """Why ``name`` names no engine: the known names, and the nearest one.

    >>> unknown("sglng")
    "unknown engine 'sglng': did you mean 'sglang'? (known: sglang, vllm)"
    >>> unknown("tgi")
    "unknown engine 'tgi' (known: sglang, vllm)"
    """
    near = difflib.get_close_matches(name.lower(), list(ENGINES), n=1, cutoff=0.6)
    hint = f": did you mean {near[0]!r}?" if near else ""
    return f"unknown engine {name!r}{hint} (known: {', '.join(ENGINES)})"


def get(name: str) -> Engine:
    """The engine called ``name``; raises :class:`UnknownEngineError` with a suggestion."""
    try:
        return ENGINES[name]
    except KeyError:
        raise UnknownEngineError(unknown(name)) from None


def secret_options() -> tuple[str, ...]:
    """Every engine's secret-bearing options, each once.

    >>> secret_options()
    ('--api-key', '--admin-api-key')
    """
    return tuple(dict.fromkeys(o for engine in ENGINES.values() for o in engine.secret_options))
