"""What a serving engine is to stackgate: a description, read by launch, readiness, log scan and benchmark.

An engine is data, not a code path: the words that launch it, the spelling of every flag smoke
sets, how its readiness is told, its start-up log (phases, ready line), where it reports its own
configuration, its fused all-reduce switch with the log line that proves the fused path ran (and
the lines by which it declines), its default port and the streaming API the benchmark speaks.
Each engine module fills one :class:`Engine` from the released wheel it names in ``source``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from packaging.version import InvalidVersion, Version

__all__ = ["NATIVE_GENERATE", "OPENAI_CHAT", "OPENAI_COMPLETIONS", "Decline", "Engine", "Phase", "Release"]

#: SGLang's own ``POST /generate`` (``text``, ``sampling_params``), cumulative events with ``meta_info``.
NATIVE_GENERATE = "sglang-generate"
#: The OpenAI-compatible ``POST /v1/completions`` with ``stream: true``: SSE ``data:`` chunks, then ``[DONE]``.
OPENAI_COMPLETIONS = "openai-completions"
#: The OpenAI-compatible ``POST /v1/chat/completions``: the server applies the model's chat template.
OPENAI_CHAT = "openai-chat"


@dataclass(frozen=True)
class Phase:
    """One start-up phase as the log reveals it: the message pattern, its key and its label."""

    pattern: str
    key: str
    label: str


@dataclass(frozen=True)
class Decline:
    """A log line by which the engine turns a fused path off, and the component that writes it."""

    pattern: str
    component: str
    why: str


@dataclass(frozen=True)
class Release:
    """What a later release of an engine says differently, as its own wheel defines it: each field
    left "" keeps the engine's (or the previous release's) value."""

    version: str  #: the first release that speaks so
    source: str  #: where in that release's wheel it was read
    fusion_evidence: str = ""


def _empty() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclass(frozen=True)
class Engine:
    """One serving engine, as stackgate launches, watches, asks and measures it."""

    name: str  #: the `[smoke] engine` value
    title: str  #: how a person names it: "SGLang", "vLLM"
    version: str  #: the released wheel these spellings were read from
    source: str  #: where in that wheel they were read
    launch: tuple[str, ...]  #: the words after the interpreter, before any option
    model_flag: str  #: "" when the model is the first positional word after ``launch``
    tp_flag: str
    attention_flag: str
    memory_flag: str  #: the fraction of GPU memory the engine may take
    default_port: int
    phases: tuple[Phase, ...]
    ready_line: str  #: the log line written once the server serves
    info_endpoints: tuple[str, ...]  #: where the server reports its configuration, first answer wins
    info_fields: Mapping[str, str]  #: concept ("model", "tp", "attention_backend", "version", "port") -> field
    api: str  #: NATIVE_GENERATE or OPENAI_COMPLETIONS
    generate_path: str
    host_flag: str = "--host"
    port_flag: str = "--port"
    log_level_flag: str = "--log-level"
    load_format_flag: str = "--load-format"
    override_flag: str = ""  #: the flag that overrides the model's config.json (fast mode)
    speculative_config_flag: str = ""  #: one JSON flag for speculative decoding; "" means per-field flags
    secret_options: tuple[str, ...] = ("--api-key",)
    health_path: str = "/health"
    fusion_flag: str = ""  #: the launch words' option that asks for the fused all-reduce
    fusion_evidence: str = ""  #: the log line that proves the fused path ran
    fusion_env: Mapping[str, str] = field(default_factory=_empty)  #: what the server needs to write the evidence
    declines: tuple[Decline, ...] = ()
    backend_finding: str = ""  #: the knowledge base's finding for "no backend asked, the engine chose one"
    distribution: str = ""  #: the distribution that installs it ("": its name)
    releases: tuple[Release, ...] = ()  #: later releases' differences, oldest first

    def at(self, installed: str | None) -> Engine:
        """This engine as the ``installed`` release speaks: every release up to it applied in turn
        (None, or a version that does not parse: as described, from ``version``'s wheel).

        >>> e = Engine("x", "X", "1.0", "", (), "", "", "", "", 1, (), "", (), {}, "", "", fusion_evidence="old",
        ...            releases=(Release("1.2", "x-1.2 wheel", fusion_evidence="new"),))
        >>> [e.at(v).fusion_evidence for v in ("1.1", "1.2", "2.0", None)], e.at("1.2").version
        (['old', 'new', 'new', 'old'], '1.2')
        """
        try:
            have = Version(installed) if installed else None
        except InvalidVersion:
            have = None
        if have is None or have == Version(self.version):
            return self
        engine = dataclasses.replace(self, version=str(have))
        for release in self.releases:
            if Version(release.version) <= have:
                changed = {f.name: getattr(release, f.name) for f in dataclasses.fields(release) if f.name != "version"}
                engine = dataclasses.replace(engine, **{k: v for k, v in changed.items() if v})
        return engine

    metrics_path: str = "/metrics"  #: the Prometheus text exposition of the engine's own counters
    metrics_flag: str = ""  #: the option without which the engine serves no metrics ("" when always served)

    @property
    def label(self) -> str:
        """``SGLang 0.5.9``: the engine and the release its description was read from."""
        return f"{self.title} {self.version}"

    def managed_flags(self) -> dict[str, str]:
        """The options smoke sets itself, and the spec key (or mode) each comes from."""
        managed = {
            self.tp_flag: "smoke.tp",
            self.host_flag: "smoke.host",
            self.port_flag: "smoke.port",
            self.attention_flag: "smoke.attention_backend",
            self.load_format_flag: "fast mode (--fast)",
        }
        if self.model_flag:
            managed[self.model_flag] = "smoke.model"
        if self.override_flag:
            managed[self.override_flag] = "fast mode (--fast)"
        if self.speculative_config_flag:
            managed[self.speculative_config_flag] = "smoke.speculative"
        return managed

    def argv(self, python: str, model: str, tp: int, host: str, port: int, backend: str) -> list[str]:
        """The explicit words of a launch: interpreter, entry point, model, TP, host, port, backend."""
        model_words = [self.model_flag, model] if self.model_flag else [model]
        return [
            python,
            *self.launch,
            *model_words,
            self.tp_flag,
            str(tp),
            self.host_flag,
            host,
            self.port_flag,
            str(port),
            self.attention_flag,
            backend,
        ]

    def fast_flags(self, override: Mapping[str, int]) -> tuple[str, ...]:
        """Fast mode's words: random weights and the model's config shrunk by ``override``."""
        return (self.load_format_flag, "dummy", self.override_flag, json.dumps(dict(override)))

    def speculative_words(self, algorithm: str, draft: str, steps: int | None, tokens: int | None) -> tuple[str, ...]:
        """Speculative decoding as one JSON flag (``speculative_config_flag``); () where the engine
        spells it field by field (the spec's Speculative.flags)."""
        if not self.speculative_config_flag:
            return ()
        config: dict[str, object] = {"method": algorithm.lower()}
        if draft:
            config["model"] = draft
        if tokens or steps:
            config["num_speculative_tokens"] = tokens or steps
        return (self.speculative_config_flag, json.dumps(config))

    def fusion_asked(self, words: tuple[str, ...]) -> bool:
        """Whether the launch words ask for the fused all-reduce."""
        return bool(self.fusion_flag) and any(w.split("=", 1)[0] == self.fusion_flag for w in words)
