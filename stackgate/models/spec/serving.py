"""How a spec serves and measures: [smoke] (the engine, model, flags and evidence, [smoke.speculative],
[smoke.compare]) and [benchmark].
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from stackgate.models import engines
from stackgate.models.spec.hardware import Hardware
from stackgate.models.spec.reader import Table
from stackgate.models.spec.rules import (
    strings_table,
)
from stackgate.models.spec.sweep import Sweep

__all__ = [
    "DEFAULT_EVIDENCE",
    "MANAGED_FLAGS",
    "SPECULATIVE_ALGORITHMS",
    "STREAM_IDLE_GAPS",
    "Benchmark",
    "Compare",
    "Smoke",
    "Speculative",
]

#: Speculative algorithms SGLang 0.5.9 accepts (--speculative-algorithm choices).
SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
#: Algorithms whose draft is a separate model that --speculative-draft-model-path names.
_DRAFT_MODEL_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE")
#: Options smoke sets itself from [smoke] and the CLI (SGLang's spellings; each engine's own are
#: :meth:`stackgate.models.engines.Engine.managed_flags`); a flag list must not repeat them.
MANAGED_FLAGS = {
    "--model-path": "smoke.model",
    "--model": "smoke.model",
    "--tp-size": "smoke.tp",
    "--tp": "smoke.tp",
    "--tensor-parallel-size": "smoke.tp",
    "--host": "smoke.host",
    "--port": "smoke.port",
    "--attention-backend": "smoke.attention_backend",
    "--load-format": "fast mode (--fast)",
    "--json-model-override-args": "fast mode (--fast)",
}
#: The log line that proves a flag's path ran, for the flags whose acceptance proves nothing: a
#: flag listed here carries its evidence whatever the spec says; [smoke] evidence may replace the
#: pattern, never drop it. Each engine names its fusion flag and evidence (models/engines).
DEFAULT_EVIDENCE = MappingProxyType(
    {e.fusion_flag: e.fusion_evidence for e in engines.ENGINES.values() if e.fusion_flag and e.fusion_evidence}
)


@dataclass(frozen=True)
class Speculative:
    """[smoke.speculative]: speculative decoding, turned into SGLang's --speculative-* flags."""

    algorithm: str
    draft_model: str = ""  #: the draft model's path (EAGLE, EAGLE3, STANDALONE)
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None
    min_accept_length: float | None = None  #: the lowest mean acceptance length that passes (tokens per verify)

    @property
    def flags(self) -> tuple[str, ...]:
        """The launch flags, in the form SGLang 0.5.9's server_args.py spells them.

        >>> Speculative("EAGLE3", "/m/draft", num_steps=3).flags  # doctest: +NORMALIZE_WHITESPACE
        ('--speculative-algorithm', 'EAGLE3', '--speculative-draft-model-path', '/m/draft',
         '--speculative-num-steps', '3')
        """
        words = ["--speculative-algorithm", self.algorithm]
        if self.draft_model:
            words += ["--speculative-draft-model-path", self.draft_model]
        for option, value in (
            ("--speculative-num-steps", self.num_steps),
            ("--speculative-eagle-topk", self.eagle_topk),
            ("--speculative-num-draft-tokens", self.num_draft_tokens),
        ):
            if value is not None:
                words += [option, str(value)]
        return tuple(words)

    @classmethod
    def _from_table(cls, t: Table) -> Speculative | None:
        algorithm = t.get("algorithm", str)
        if algorithm is not None:
            t.choice("algorithm", algorithm, SPECULATIVE_ALGORITHMS)
        draft = t.get("draft_model", str, "") or ""
        if algorithm in _DRAFT_MODEL_ALGORITHMS and not draft:
            t.error("draft_model", f"{algorithm} needs the draft model's path")
        speculative = cls(
            algorithm=algorithm or "",
            draft_model=draft,
            num_steps=t.positive("num_steps", int, None),
            eagle_topk=t.positive("eagle_topk", int, None),
            num_draft_tokens=t.positive("num_draft_tokens", int, None),
            min_accept_length=t.positive("min_accept_length", float, None),
        )
        t.finish()
        return speculative if algorithm else None


@dataclass(frozen=True)
class Compare:
    """[smoke.compare]: the baseline configuration that `smoke --compare` launches beside the lock's.

    Unset fields follow the lock's [smoke]; ``flags`` unset means the lock's flags without the
    allreduce-fusion flags.
    """

    name: str = "baseline"
    flags: tuple[str, ...] | None = None
    attention_backend: str | None = None
    speculative: bool = True  #: keep the lock's speculative decoding in the baseline
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def _from_table(cls, t: Table) -> Compare:
        name = t.get("name", str, "baseline") or "baseline"
        if not re.fullmatch(r"[a-z][a-z0-9_-]*", name):
            t.error("name", f"{name!r} must be lowercase letters, digits, '_' or '-' (it names the baseline's checks)")
        flags = t.strings("flags") if "flags" in t.data else None
        if flags is not None:
            _check_flags(t, "flags", flags)
        compare = cls(
            name=name,
            flags=flags,
            attention_backend=t.get("attention_backend", str, None),
            speculative=bool(t.get("speculative", bool, True)),
            env=MappingProxyType(strings_table(t.sub("env"))),
        )
        t.finish()
        return compare


@dataclass(frozen=True)
class Smoke:
    engine: str = "sglang"
    model: str = ""  #: the user's model path; smoke refuses to start without one
    tp: int = 1
    host: str = "127.0.0.1"
    port: int = 30000
    attention_backend: str = "flashinfer"
    flags: tuple[str, ...] = ()
    evidence: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    ready_timeout_s: float = 1200.0
    silence_s: float | None = None  #: the longest silent log while loading; None: a quarter of ready_timeout_s
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    speculative: Speculative | None = None
    compare: Compare | None = None
    fast_layers: int = 4  #: layers that fast mode keeps of the model's own architecture
    stop_grace_s: float = 15.0  #: SIGTERM to SIGKILL; longer than SGLang's 5 s drain poll
    sweep: Sweep = field(default_factory=Sweep)  #: [smoke.sweep] (models/spec/sweep.py)

    @property
    def load_silence_s(self) -> float:
        """How long the log may stay silent while the server loads: ``silence_s``, or a quarter of
        ``ready_timeout_s`` (300 s at the default 1200 s); compiling phases get twice that.

        >>> Smoke().load_silence_s, Smoke(ready_timeout_s=60, silence_s=2).load_silence_s
        (300.0, 2)
        """
        return self.silence_s if self.silence_s is not None else self.ready_timeout_s / 4

    @property
    def serving(self) -> engines.Engine:
        """The registered engine this section names (checked when the spec loaded)."""
        return engines.get(self.engine)

    @classmethod
    def _from_table(cls, t: Table, hardware: Hardware) -> Smoke:
        name = t.get("engine", str, "sglang") or "sglang"
        if name not in engines.ENGINES:
            t.error("engine", engines.unknown(name))
            name = "sglang"
        engine = engines.get(name)
        port = t.get("port", int, engine.default_port)
        if port is not None and not 0 < port < 65536:
            t.error("port", f"must be a TCP port (1-65535), not {port}")
        evidence = t.sub("evidence")
        pairs = {flag: evidence.get(flag, str) for flag in list(evidence.data)}
        flags = t.strings("flags")
        _check_flags(t, "flags", flags, engine)
        for flag, pattern in pairs.items():
            if flag not in flags:
                evidence.error(flag, "is not one of smoke.flags: evidence is asked only of a flag that is passed")
            if pattern is not None:
                _check_evidence(evidence, flag, pattern)
        asked = {word.split("=", 1)[0] for word in flags}
        fused = engine.fusion_evidence and engine.fusion_flag in asked
        defaults = {engine.fusion_flag: engine.fusion_evidence} if fused else {}
        smoke = cls(
            engine=name,
            model=t.get("model", str, "") or "",
            tp=t.positive("tp", int, hardware.gpu_count or 1) or 1,
            host=t.get("host", str, "127.0.0.1") or "127.0.0.1",
            port=port or engine.default_port,
            attention_backend=t.get("attention_backend", str, "flashinfer") or "flashinfer",
            flags=flags,
            evidence=MappingProxyType({**defaults, **{k: v for k, v in pairs.items() if v is not None}}),
            ready_timeout_s=t.positive("ready_timeout_s", float, 1200.0) or 1200.0,
            silence_s=t.positive("silence_s", float, None),
            env=MappingProxyType(strings_table(t.sub("env"))),
            speculative=Speculative._from_table(t.sub("speculative")) if "speculative" in t.data else None,
            compare=Compare._from_table(t.sub("compare")) if "compare" in t.data else None,
            fast_layers=t.positive("fast_layers", int, 4) or 4,
            stop_grace_s=t.positive("stop_grace_s", float, 15.0) or 15.0,
            sweep=Sweep._from_table(t.sub("sweep")),
        )
        t.finish()
        return smoke


def _check_flags(t: Table, name: str, flags: tuple[str, ...], engine: engines.Engine | None = None) -> None:
    """Flags are extra launch words; the ones smoke sets itself, or from a table, are refused."""
    managed = {**MANAGED_FLAGS, **(engine.managed_flags() if engine is not None else {})}
    for i, word in enumerate(flags):
        option = word.split("=", 1)[0]
        if option in managed:
            t.error(f"{name}[{i}]", f"{option} is set by smoke from {managed[option]}; do not repeat it in flags")
        elif option.startswith("--speculative-"):
            t.error(f"{name}[{i}]", f"{option}: describe speculative decoding in [smoke.speculative], not in flags")


def _check_evidence(t: Table, flag: str, pattern: str) -> None:
    """An evidence pattern is a regular expression that can fail: one that matches an empty line
    matches every log, and would drop the proof without a word."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        t.error(flag, f"invalid regular expression {pattern!r}: {exc}")
        return
    if compiled.search("") is not None:
        t.error(
            flag,
            f"{pattern!r} matches an empty line, so every log would prove the flag: give the line that shows its "
            "path ran",
        )


#: [benchmark] api: the engine's own streaming API, or the OpenAI-compatible chat endpoint.
BENCHMARK_APIS = ("native", "chat")
#: A stream silent for this many expected inter-token gaps has stopped (see Benchmark.stream_idle_s).
STREAM_IDLE_GAPS = 100


@dataclass(frozen=True)
class Benchmark:
    output_tokens: int = 2048
    runs: int = 5
    warmup: int = 2
    baseline_tok_s: float | None = None
    max_regression: float = 0.03
    prompt: str = "Write a long story about a lighthouse keeper."
    stream_idle_floor_s: float = 15.0  #: the shortest silence inside a stream that ends it
    max_runs: int | None = None  #: the cap on runs while the 95% interval spans the floor (default: twice runs)
    api: str = "native"  #: "native": the engine's own streaming API; "chat": /v1/chat/completions

    @property
    def floor_tok_s(self) -> float | None:
        """The lowest decode rate that passes: baseline_tok_s less max_regression."""
        return self.baseline_tok_s * (1 - self.max_regression) if self.baseline_tok_s else None

    @property
    def run_cap(self) -> int:
        return self.max_runs or 2 * self.runs

    @property
    def stream_idle_s(self) -> float:
        """The longest silence accepted inside a stream: STREAM_IDLE_GAPS expected inter-token
        gaps at baseline_tok_s, never less than stream_idle_floor_s.

        >>> Benchmark(baseline_tok_s=92.6).stream_idle_s, Benchmark(baseline_tok_s=2.0).stream_idle_s
        (15.0, 50.0)
        """
        expected = STREAM_IDLE_GAPS / self.baseline_tok_s if self.baseline_tok_s else 0.0
        return max(self.stream_idle_floor_s, expected)

    @classmethod
    def _from_table(cls, t: Table) -> Benchmark:
        regression = t.get("max_regression", (int, float), 0.03)
        if regression is not None and not 0 <= regression < 1:
            t.error("max_regression", f"must be a fraction in [0, 1), not {regression}")
        warmup = t.get("warmup", int, 2)
        if warmup is not None and warmup < 0:
            t.error("warmup", f"must be 0 or more, not {warmup}")
        runs = t.positive("runs", int, 5) or 5
        max_runs = t.get("max_runs", int, None)
        if max_runs is not None and max_runs < runs:
            t.error("max_runs", f"must be at least runs ({runs}), not {max_runs}")
        benchmark = cls(
            output_tokens=t.positive("output_tokens", int, 2048) or 2048,
            runs=runs,
            warmup=warmup if warmup is not None else 2,
            baseline_tok_s=t.positive("baseline_tok_s", float, None),
            max_regression=float(regression if regression is not None else 0.03),
            prompt=t.get("prompt", str, cls.prompt) or cls.prompt,
            stream_idle_floor_s=t.positive("stream_idle_floor_s", float, None) or cls.stream_idle_floor_s,
            max_runs=max_runs if max_runs is not None and max_runs >= runs else None,
            api=t.get("api", str, "native") or "native",
        )
        t.choice("api", benchmark.api, BENCHMARK_APIS)
        t.finish()
        return benchmark
