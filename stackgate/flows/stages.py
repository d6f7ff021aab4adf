"""A flow's stages as data: a tuple of named stages, run in order by one small loop."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generic, Sequence, TypeVar

__all__ = ["Stage", "run_stages"]

S = TypeVar("S")


@dataclass(frozen=True)
class Stage(Generic[S]):
    """One named step of a flow: ``run`` reads and fills the flow's state ``S``."""

    name: str
    run: Callable[[S], None]


def run_stages(stages: Sequence[Stage[S]], state: S) -> S:
    """Run each stage on ``state`` in order (an exception stops the flow) and return the state."""
    for stage in stages:
        stage.run(state)
    return state
