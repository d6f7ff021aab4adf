"""[accuracy]: the exact-match check of greedy answers, and its floor.

The prompts are the shipped set (:mod:`stackgate.serve.accuracy`); the spec gives the share of
them that must come back exactly right under greedy decoding, and how many tokens an answer may
take. Without ``floor`` the check is not run.
"""

from __future__ import annotations

from dataclasses import dataclass

from stackgate.models.spec.reader import Table

__all__ = ["Accuracy"]


@dataclass(frozen=True)
class Accuracy:
    floor: float | None = None  #: the lowest share of exact answers that passes (0-1); None: not checked
    max_tokens: int = 16  #: the longest answer asked for

    @classmethod
    def _from_table(cls, t: Table) -> Accuracy:
        floor = t.get("floor", (int, float), None)
        if floor is not None and not 0 < floor <= 1:
            t.error("floor", f"must be a fraction in (0, 1], not {floor}")
            floor = None
        accuracy = cls(
            floor=float(floor) if floor is not None else None,
            max_tokens=t.positive("max_tokens", int, 16) or 16,
        )
        t.finish()
        return accuracy
