"""What to do about a finding: the fix a result or a knowledge-base match carries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Fix"]


@dataclass(frozen=True)
class Fix:
    """What to do about a finding: a sentence and the commands to paste."""

    text: str
    commands: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "commands": list(self.commands)}
