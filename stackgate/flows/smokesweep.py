"""Smoke's request-rate sweep stage: which rates, the prompts (read before anything launches), the run, the results.

The rates are ``smoke --rates`` or, with --benchmark, [smoke.sweep] rates; the SLO's rate is
always among them. Only the spec's configuration at full weights earns repeats of the SLO's rate
and a goodput verdict; --compare's baseline and fast mode are measured, not judged.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from stackgate.models.result import Result
from stackgate.models.spec import Spec
from stackgate.serve import sweep
from stackgate.serve.bench import Streams
from stackgate.serve.launch import Config
from stackgate.serve.prompts import PromptMaker, prompt_maker

__all__ = ["prompts", "rates", "results", "run"]


def rates(spec: Spec, asked: tuple[float, ...], measures: bool) -> tuple[float, ...]:
    """The rates to sweep: those asked on the command line, else the spec's when the run measures."""
    if asked:
        return asked
    return spec.smoke.sweep.rates if measures else ()


def prompts(spec: Spec, wanted: tuple[float, ...]) -> PromptMaker | None:
    """The sweep's prompt maker, its dataset checked now: raises a UsageError before any launch."""
    return prompt_maker(spec.smoke.sweep, spec.path) if wanted else None


def run(
    config: Config,
    spec: Spec,
    wanted: tuple[float, ...],
    maker: PromptMaker,
    *,
    judged: bool,
    streams: Streams,
    api_key: str | None,
    show: Callable[[str], None],
    stop: Callable[[], bool],
) -> sweep.SweepRun:
    """The sweep against one launched configuration, with prompts of its own (the same for every configuration)."""
    return sweep.run_sweep(
        config.base_url,
        spec.smoke.sweep,
        wanted,
        dataclasses.replace(maker, taken=0, heads=None),
        streams=streams,
        api_key=api_key,
        idle_s=spec.benchmark.stream_idle_s,
        api=config.engine.api,
        show=show,
        stop=stop,
        judge=judged,
    )


def results(done: sweep.SweepRun, label: str | None, *, judged: bool, strict: bool) -> list[tuple[str, Result]]:
    """The sweep's table and the goodput verdict, by check name."""
    return [
        ("sweep", sweep.sweep_result(done, label)),
        ("goodput", sweep.goodput_result(done, judged=judged, strict=strict)),
    ]
