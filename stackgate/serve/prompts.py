"""The sweep's prompts: seeded random prompts that exercise prefill, or a local ShareGPT-style dataset.

Random prompts are words from a fixed vocabulary of common English words (most tokenizers give each
one token, so a length in words is close to a length in tokens; the throughput figures use the
token counts the server reports). Lengths are drawn uniformly from the spec's ranges with the
spec's seed, so every batch (a rate, a repeat) asks for the same sequence of lengths, while the
words differ: no two prompts start with the same four words, so a prefix cache can reuse at most
three words of any prompt, unless ``shared_prefix_tokens`` asks every prompt to start with the
same seeded words (the shared-prefix case).

A dataset is a JSON array of ShareGPT records, ``{"conversations": [{"from": "human", "value":
...}, {"from": "gpt", "value": ...}, ...]}``: the first turn is the prompt, the second turn's
length in words the output asked (as SGLang's bench_serving reads it; records of fewer than two
turns are skipped there and here). Records are shuffled with the seed and taken in turn; a sweep
that needs more requests than the dataset holds starts over, and says so. Nothing is fetched.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from stackgate.models.exitcodes import UsageError
from stackgate.models.inputfile import read_capped
from stackgate.models.spec.sweep import Sweep

__all__ = ["MAX_DATASET_BYTES", "Prompt", "PromptMaker", "load_dataset", "prompt_maker"]

#: ShareGPT_V3_unfiltered_cleaned_split.json, the file SGLang's bench_serving reads, is 642 MiB.
MAX_DATASET_BYTES = 768 << 20
#: The words of the unique head that no two random prompts share.
HEAD_WORDS = 4
_VOCABULARY = tuple(
    """the of and to in is was for on that with as by at from his her an be have this which or had
    not are but one were they all their there been has when who will more no if out so said what up
    its about into than them can only other new some time could these two may then do first any my
    now such like our over man me even most made after also did many before must through back years
    where much your way well down should because each just those people how too little state good
    very make world still own see men work long get here between both life being under never day
    same another know while last might us great old year off come since against go came right used
    take three house light water sea ship keeper lamp night storm tower harbour stone wind rain""".split()
)


@dataclass(frozen=True)
class Prompt:
    text: str
    output_tokens: int  #: tokens asked (ignore_eos)
    words: int  #: the prompt's length in words


@dataclass
class PromptMaker:
    """Prompts for each batch of the sweep; no two random prompts of one maker share their first four words."""

    sweep: Sweep
    dataset: tuple[tuple[str, int], ...] = ()  #: (prompt, output tokens) records, shuffled
    taken: int = 0  #: dataset records handed out
    heads: set[tuple[str, ...]] | None = None

    @property
    def wrapped(self) -> bool:
        """The dataset had fewer records than the sweep sent: some prompts were sent twice."""
        return bool(self.dataset) and self.taken > len(self.dataset)

    def batch(self, index: int, count: int) -> list[Prompt]:
        """``count`` prompts for batch ``index`` (a rate or a repeat of one)."""
        if self.dataset:
            rows = [self.dataset[(self.taken + i) % len(self.dataset)] for i in range(count)]
            self.taken += count
            return [Prompt(text, tokens, len(text.split())) for text, tokens in rows]
        lengths = random.Random(self.sweep.seed)
        words = random.Random(f"{self.sweep.seed}:{index}")
        shared = _words(random.Random(f"{self.sweep.seed}:shared"), self.sweep.shared_prefix_tokens)
        prompts = []
        for _ in range(count):
            size = lengths.randint(*self.sweep.input_tokens)
            tokens = lengths.randint(*self.sweep.output_tokens)
            head = self._head(words)
            body = _words(words, max(0, size - len(shared) - len(head)))
            text = " ".join([*shared, *head, *body])
            prompts.append(Prompt(text, tokens, len(shared) + len(head) + len(body)))
        return prompts

    def _head(self, words: random.Random) -> list[str]:
        """Four words no earlier prompt of this maker started with (its unique part starts here)."""
        used = self.heads if self.heads is not None else set()
        self.heads = used
        while True:
            head = tuple(_words(words, HEAD_WORDS))
            if head not in used:
                used.add(head)
                return list(head)


def _words(source: random.Random, count: int) -> list[str]:
    return [source.choice(_VOCABULARY) for _ in range(count)]


def prompt_maker(sweep: Sweep, spec_path: Path) -> PromptMaker:
    """The sweep's prompt maker, its dataset read (relative to the spec's folder) and checked now.

    Raises :class:`UsageError` naming ``smoke.sweep.dataset``, the file and the record's key path.
    """
    if sweep.dataset is None:
        return PromptMaker(sweep)
    path = spec_path.parent / Path(sweep.dataset).expanduser()
    rows = list(load_dataset(path))
    random.Random(sweep.seed).shuffle(rows)
    return PromptMaker(sweep, tuple(rows))


def load_dataset(path: Path) -> Sequence[tuple[str, int]]:
    """The (prompt, output tokens) records of a ShareGPT-style JSON file."""
    where = f"smoke.sweep.dataset: {path}"
    try:
        raw = read_capped(path, MAX_DATASET_BYTES)
    except OSError as exc:
        raise UsageError(f"{where}: cannot be read: {exc.strerror or exc}") from exc
    try:
        document = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise UsageError(f"{where}: is not UTF-8 text (byte {exc.start})") from exc
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where}: is not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from exc
    if not isinstance(document, list):
        raise UsageError(f"{where}: must be a JSON array of ShareGPT records, not {_kind(document)}")
    rows = [row for i, record in enumerate(document) if (row := _record(where, i, record)) is not None]
    if not rows:
        raise UsageError(f"{where}: has no record with two turns (a prompt and a reply) to send")
    return rows


def _record(where: str, index: int, record: Any) -> tuple[str, int] | None:
    at = f"[{index}]"
    if not isinstance(record, dict):
        raise UsageError(f"{where}: {at}: must be an object with conversations, not {_kind(record)}")
    turns = record.get("conversations")
    if not isinstance(turns, list):
        raise UsageError(f"{where}: {at}.conversations: must be an array of turns, not {_kind(turns)}")
    values = []
    for j, turn in enumerate(turns[:2]):
        if not isinstance(turn, dict):
            raise UsageError(f"{where}: {at}.conversations[{j}]: must be an object, not {_kind(turn)}")
        value = turn.get("value")
        if not isinstance(value, str):
            raise UsageError(f"{where}: {at}.conversations[{j}].value: must be a string, not {_kind(value)}")
        values.append(value)
    if len(values) < 2 or not values[0].strip():
        return None
    return values[0], max(1, len(values[1].split()))


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "true or false", type(None): "null"}
    return names.get(type(value), "a number")
