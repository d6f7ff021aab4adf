"""The diagnose corpus: real failure excerpts and healthy ones from public issues, read and scored.

tests/data/diagnose_corpus/corpus.jsonl holds one case a line: ``id``, ``project`` (the project
whose text it is: vllm, nccl, ray, the container toolkit ...), ``url`` (the public issue or pull
request it was copied from), ``healthy``, ``expected`` (the entries a right diagnosis names first;
empty where no entry should claim it: only never silent applies) and ``text`` (the excerpt as it
was pasted). Shared by tests/test_diagnose_corpus.py and benchmarks/diagnose_corpus.py.

Two splits: by source project (:data:`HELD_OUT_PROJECTS` are held out whole, so their wording
was never an entry's example) and the old way, by the URL's hash (even: learn, odd: held out).
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path

from stackgate.flows import diagnose

CORPUS = Path(__file__).resolve().parent / "data" / "diagnose_corpus" / "corpus.jsonl"
#: Projects held out whole: no entry learns from their cases (tests/test_diagnose_corpus.py checks it).
HELD_OUT_PROJECTS = (
    "vllm",
    "ray",
    "tensorrt-llm",
    "container-toolkit",
    "ollama",
    "slurm",
    "jax",
    "llama.cpp",
    "deepspeed",
    "tgi",
    "kubernetes",
)


@dataclass(frozen=True)
class Case:
    id: str
    project: str
    url: str
    healthy: bool
    expected: tuple[str, ...]
    text: str


@dataclass(frozen=True)
class Outcome:
    case: Case
    recognised: tuple[str, ...]  #: ids of the named entries found, first cause first
    unrecognized: int  #: unrecognized-failure findings

    @property
    def first(self) -> str | None:
        return self.recognised[0] if self.recognised else None

    @property
    def silent(self) -> bool:
        return not self.recognised and not self.unrecognized


@dataclass(frozen=True)
class Score:
    failures: int
    recognised: int  #: failures a named entry explains
    right_first: int  #: of those, the expected cause listed first
    never_silent: int  #: failures with at least one finding (named or unrecognized)
    healthy: int
    alarms: int  #: findings of any kind on the healthy excerpts

    def line(self, label: str) -> str:
        rate = self.recognised / self.failures if self.failures else 0.0
        right = self.right_first / self.recognised if self.recognised else 0.0
        return (
            f"{label:<28} failures {self.failures:>3}: recognised {self.recognised:>3} ({rate:6.1%}),"
            f" right cause first {self.right_first:>3} ({right:6.1%} of those), never silent {self.never_silent:>3};"
            f" healthy {self.healthy:>3}: findings {self.alarms}"
        )


def load(path: Path = CORPUS) -> list[Case]:
    cases = []
    for line in path.read_text(encoding="utf-8").splitlines():
        raw = json.loads(line)
        cases.append(Case(raw["id"], raw["project"], raw["url"], raw["healthy"], tuple(raw["expected"]), raw["text"]))
    return cases


def by_project(case: Case) -> str:
    return "held-out" if case.project in HELD_OUT_PROJECTS else "learn"


def by_url(case: Case) -> str:
    return "learn" if int(hashlib.sha256(case.url.encode()).hexdigest(), 16) % 2 == 0 else "held-out"


def run(case: Case) -> Outcome:
    """What `stackgate diagnose` says of the excerpt given as a log (never silent, no lock)."""
    data = case.text.encode("utf-8")
    done = diagnose.diagnose([(case.id, lambda: io.BytesIO(data))], never_silent=True, kernel=True)
    causes = [f.id for f in done.findings if not f.consequence] + [f.id for f in done.findings if f.consequence]
    return Outcome(case, tuple(causes), len(done.unrecognized))


def score(outcomes: list[Outcome]) -> Score:
    failures = [o for o in outcomes if not o.case.healthy]
    healthy = [o for o in outcomes if o.case.healthy]
    recognised = [o for o in failures if o.recognised]
    return Score(
        failures=len(failures),
        recognised=len(recognised),
        right_first=sum(o.first in o.case.expected for o in recognised),
        never_silent=sum(not o.silent for o in failures),
        healthy=len(healthy),
        alarms=sum(len(o.recognised) + o.unrecognized for o in healthy),
    )
