"""The accuracy check: a shipped set of prompts with exact answers, asked greedily, scored by exact match.

A faster stack that answers differently is not the same deployment: a kernel that computes
attention wrongly still streams tokens at full speed. The set (``accuracy.json`` beside this
module) holds short arithmetic and factual completions whose answer is one word or number. Each
is asked once with temperature 0 and at most ``[accuracy] max_tokens`` tokens, through the API the
benchmark speaks (SGLang's /generate, the OpenAI /v1/completions, or /v1/chat/completions with the
model's chat template). The answer compared is the reply's first non-empty line, stripped of
surrounding white space and of one trailing full stop; it must equal the expected text exactly
(case included). The score is the share of exact answers; ``[accuracy] floor`` judges it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stackgate.edges import httpclient
from stackgate.models.engines import OPENAI_CHAT, OPENAI_COMPLETIONS
from stackgate.models.printable import printable

__all__ = ["SET_PATH", "AccuracyError", "Answer", "Item", "Score", "ask", "load_set", "normalise", "run_accuracy"]

#: The shipped set.
SET_PATH = Path(__file__).with_name("accuracy.json")


class AccuracyError(RuntimeError):
    """The server's answer to an accuracy prompt could not be read."""


@dataclass(frozen=True)
class Item:
    prompt: str
    answer: str


@dataclass(frozen=True)
class Answer:
    item: Item
    got: str  #: the normalised reply

    @property
    def right(self) -> bool:
        return self.got == self.item.answer

    def to_dict(self) -> dict[str, Any]:
        return {"prompt": self.item.prompt, "expected": self.item.answer, "got": self.got, "right": self.right}


@dataclass(frozen=True)
class Score:
    set_name: str
    answers: tuple[Answer, ...]

    @property
    def right(self) -> int:
        return sum(1 for a in self.answers if a.right)

    @property
    def share(self) -> float:
        return self.right / len(self.answers) if self.answers else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "set": self.set_name,
            "right": self.right,
            "asked": len(self.answers),
            "share": round(self.share, 4),
            "answers": [a.to_dict() for a in self.answers],
        }


def load_set(path: Path = SET_PATH) -> tuple[str, tuple[Item, ...]]:
    """The set's name and items."""
    document = json.loads(path.read_text(encoding="utf-8"))
    return document["name"], tuple(Item(i["prompt"], i["answer"]) for i in document["items"])


def normalise(text: str) -> str:
    """The reply as compared: its first non-empty line, stripped, without one trailing full stop.

    >>> normalise(" Paris.\\n\\nIt is"), normalise("\\n42"), normalise("")
    ('Paris', '42', '')
    """
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return line[:-1].rstrip() if line.endswith(".") else line


def _request(api: str, prompt: str, tokens: int) -> tuple[str, dict[str, Any], tuple[str | int, ...]]:
    """The path, the greedy body and where the reply's text is in the answer."""
    if api == OPENAI_CHAT:
        messages = [{"role": "user", "content": prompt}]
        body = {"messages": messages, "max_tokens": tokens, "temperature": 0}
        return "/v1/chat/completions", body, ("choices", 0, "message", "content")
    if api == OPENAI_COMPLETIONS:
        body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "stop": ["\n"]}
        return "/v1/completions", body, ("choices", 0, "text")
    params = {"max_new_tokens": tokens, "temperature": 0, "stop": ["\n"]}
    return "/generate", {"text": prompt, "sampling_params": params}, ("text",)


def ask(base_url: str, api: str, item: Item, tokens: int, *, api_key: str | None = None) -> Answer:
    """One greedy answer; raises :class:`AccuracyError` naming what could not be read."""
    path, body, where = _request(api, item.prompt, tokens)
    url = f"{base_url}{path}"
    try:
        answer = httpclient.request("POST", url, body=body, timeout_s=60.0, headers=httpclient.bearer(api_key))
    except httpclient.HttpError as exc:
        raise AccuracyError(str(exc)) from None
    if answer.status != 200:
        raise AccuracyError(f"{url}: HTTP {answer.status}: {printable(answer.body[:200].decode('utf-8', 'replace'))}")
    try:
        value: Any = answer.json()
    except httpclient.HttpError as exc:
        raise AccuracyError(f"{url}: {exc}") from None
    for step in where:
        ok = isinstance(value, dict) and step in value if isinstance(step, str) else isinstance(value, list) and value
        if not ok:
            break
        value = value[step]
    if not isinstance(value, str):
        shown = "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in where).lstrip(".")
        raise AccuracyError(f"{url}: the answer has no text at {shown}")
    return Answer(item, normalise(value))


def run_accuracy(base_url: str, api: str, tokens: int, *, api_key: str | None = None) -> Score:
    """Every item of the shipped set, asked in turn."""
    name, items = load_set()
    return Score(name, tuple(ask(base_url, api, item, tokens, api_key=api_key) for item in items))
