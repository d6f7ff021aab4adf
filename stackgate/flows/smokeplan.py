"""`smoke --dry-run`: what smoke would launch and check, said without launching anything.

For each configuration (the lock's, and with --compare the baseline first): the engine and the
release its description was read from, the exact server command (a secret option's literal value
hidden, a ``${VAR}`` reference shown as written), the variables stackgate sets in the server's
environment (secret-named ones hidden), and the checks the run would report.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from stackgate.models import envfile, secretargs
from stackgate.models.redact import redact
from stackgate.models.spec import Spec
from stackgate.serve import fastmode, launch
from stackgate.serve.launch import Config

__all__ = ["Planned", "plan_smoke"]


@dataclass(frozen=True)
class Planned:
    """One configuration as smoke would launch it."""

    title: str
    engine: str  #: "vLLM 0.33.0"
    command: tuple[str, ...]  #: as shown: secrets hidden
    environment: Mapping[str, str]  #: what stackgate sets in the server's environment, secrets hidden
    checks: tuple[str, ...]
    notes: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        """The plan as a person reads it, one fact a line."""
        env = [f"  {name}={shlex.quote(value)}" for name, value in sorted(self.environment.items())]
        return [
            f"[{self.title}] engine: {self.engine}",
            f"  command: {secretargs.command_line(self.command)}",
            "  environment set by stackgate:" + ("" if env else " (nothing)"),
            *[f"  {line}" for line in env],
            f"  checks: {', '.join(self.checks)}",
            *[f"  note: {note}" for note in self.notes],
        ]


def plan_smoke(
    spec: Spec,
    configs: list[Config],
    environ: Mapping[str, str],
    *,
    measures: bool,
    concurrency: bool,
    sweep: bool = False,
) -> list[Planned]:
    """What each configuration's launch and run would be (nothing is started, no port is bound)."""
    return [_plan(spec, config, environ, measures=measures, concurrency=concurrency, sweep=sweep) for config in configs]


def _plan(
    spec: Spec, config: Config, environ: Mapping[str, str], *, measures: bool, concurrency: bool, sweep: bool
) -> Planned:
    notes: list[str] = []
    try:
        _, set_by_stackgate = launch.server_env(spec, config, environ)
    except envfile.EnvFileError as exc:
        set_by_stackgate = dict(config.env)
        notes.append(f"the live environment file cannot be read ({exc}): smoke would refuse to launch")
    shrink = None
    if config.fast_layers is not None:
        try:
            shrink = fastmode.shrink(Path(config.model), config.fast_layers or 1)
        except fastmode.FastModeError as exc:
            notes.append(f"fast mode: {exc}; smoke would refuse to launch")
    words = config.argv(spec.python.target, shrink)
    try:
        secretargs.resolve(words, {**environ, **set_by_stackgate})
    except secretargs.SecretArgError as exc:
        notes.append(f"{exc}: smoke would refuse to launch")
    return Planned(
        title=config.title,
        engine=config.engine.label,
        command=tuple(secretargs.shown(words)),
        environment=redact(dict(set_by_stackgate), environ={}),
        checks=_checks(
            config, measures=measures, concurrency=concurrency, sweep=sweep, accuracy=spec.accuracy.floor is not None
        ),
        notes=tuple(notes),
    )


def _checks(
    config: Config, *, measures: bool, concurrency: bool, sweep: bool = False, accuracy: bool = False
) -> tuple[str, ...]:
    names = [
        "preflight.python",
        "preflight.model",
        "preflight.port",
        "preflight.gpus",
        "launch",
        "server_info",
        "attention_backend",
        "tp_size",
        "flags",
        *(f"evidence.{flag.lstrip('-')}" for flag in config.evidence),
        "log",
    ]
    if measures:
        names.append("benchmark")
    if sweep:
        names += ["sweep", "goodput"]
    if concurrency:
        names.append("concurrency")
    if measures or concurrency:
        names += [name for name, asked in _engine_reports(config, accuracy) if asked]
    names += ["teardown", "gpu_memory"]
    return tuple(config.check(name) for name in names)


def _engine_reports(config: Config, accuracy: bool) -> tuple[tuple[str, bool], ...]:
    """What smoke reads from the engine beside speed (flows/smokereports.py), and whether it is asked."""
    flag = config.engine.metrics_flag
    metrics = bool(flag) and any(word.split("=", 1)[0] == flag for word in config.flags)
    return (
        ("metrics", metrics),
        ("speculative.acceptance", config.speculative is not None),
        ("accuracy", accuracy and config.fast_layers is None),
    )
