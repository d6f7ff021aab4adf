"""The quality guard: greedy decoding of a fixed prompt must give the same tokens every time.

A speed-up that changes the output is not a speed-up. With temperature 0 the benchmark's runs
are greedy generations of the same prompt, so their token ids must agree run after run; with
--compare, the two configurations must agree too. A difference is a warning (a failure with
--strict): some kernels are not bitwise deterministic, and only a person can judge how much
divergence is acceptable, but nobody should have to discover it by accident.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from stackgate.models.finding import Fix
from stackgate.models.result import Result, passed, skipped, warned
from stackgate.serve.bench import Sample

__all__ = ["Agreement", "agreement", "check_agreement", "check_repeatable"]

_FIX = Fix(
    "Greedy outputs should not change between runs or configurations. Check for non-deterministic "
    "kernels, and compare the outputs' quality (e.g. a small eval) before trusting the faster configuration."
)


@dataclass(frozen=True)
class Agreement:
    prefix: int  #: tokens identical from the start
    matching: int  #: positions with the same token
    total: int  #: the longer sequence's length

    @property
    def identical(self) -> bool:
        return self.prefix == self.total

    def text(self) -> str:
        if self.identical:
            return f"all {self.total} tokens identical"
        share = self.matching / self.total if self.total else 0.0
        return f"first {self.prefix} of {self.total} tokens identical, then diverge ({share:.1%} of positions agree)"


def agreement(a: Sequence[int], b: Sequence[int]) -> Agreement:
    """How far two token sequences agree.

    >>> agreement([1, 2, 3, 4], [1, 2, 9, 4])
    Agreement(prefix=2, matching=3, total=4)
    """
    prefix = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    matching = sum(1 for x, y in zip(a, b, strict=False) if x == y)
    return Agreement(prefix, matching, max(len(a), len(b)))


def check_repeatable(samples: Sequence[Sample]) -> Result:
    """Every complete run gave the first run's tokens."""
    runs = [s for s in samples if s.good and s.output_ids]
    if len(runs) < 2:
        return skipped("fewer than two complete runs with token ids: nothing to compare")
    reference = runs[0].output_ids
    differing = [
        (i + 2, agreement(reference, s.output_ids)) for i, s in enumerate(runs[1:]) if s.output_ids != reference
    ]
    data = {"runs": len(runs), "tokens": len(reference), "differing_runs": [i for i, _ in differing]}
    if differing:
        lines = [f"run {i} vs run 1: {a.text()}" for i, a in differing]
        return warned(
            f"greedy runs of the same prompt gave different tokens in {len(differing)} of {len(runs) - 1} repeats",
            lines,
            fix=_FIX,
            data=data,
        )
    return passed(f"all {len(runs)} greedy runs gave the same {len(reference)} tokens", data=data)


def check_agreement(a: Sample | None, b: Sample | None, names: tuple[str, str]) -> Result:
    """The two configurations' first complete runs gave the same tokens."""
    if a is None or b is None or not a.output_ids or not b.output_ids:
        return skipped(f"no complete run with token ids from both {names[0]} and {names[1]}")
    found = agreement(a.output_ids, b.output_ids)
    data = {"prefix": found.prefix, "matching": found.matching, "total": found.total}
    if not found.identical:
        return warned(f"{names[0]} and {names[1]} give different greedy outputs: {found.text()}", fix=_FIX, data=data)
    return passed(f"{names[0]} and {names[1]} agree: {found.text()}", data=data)
