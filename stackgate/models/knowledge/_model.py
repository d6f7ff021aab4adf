"""The signature model: TOML entries -> validated, frozen :class:`Signature` objects.

Loading checks every entry (fields, stages, severities, patterns, the ``{names}`` its texts
quote) so that a broken entry fails at load with its file and id, not later in a scan.
"""

from __future__ import annotations

import functools
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from stackgate.models.finding import SEVERITIES

__all__ = [
    "COMPONENTS",
    "CONTEXT_KEYS",
    "SEVERITIES",
    "STAGES",
    "Signature",
    "SignatureError",
    "context_defaults",
    "load",
    "spec_context",
    "read_folder",
]

STAGES = ("provision", "verify", "smoke")
COMPONENTS = (
    "sglang", "sgl-kernel", "flashinfer", "torch", "triton", "nccl", "cuda toolkit", "driver", "resolver",
    "installer", "python", "container runtime", "kubernetes", "slurm", "ray", "vllm", "tensorrt-llm", "jax", "host",
)  # fmt: skip # a table: the names, wrapped

#: The stack's context a signature's texts may quote as ``{name}``: name -> (where it comes from
#: in the lock, what is said when no lock was given). Defined here once; :func:`lock_context`
#: fills them from a lock and the data files use them. A fallback stands where the lock's value
#: would, so it reads as that value does: the default profile's value, said to be the default
#: profile's in prose (``flashinfer in the default profile``), bare where a command or a
#: sentence needs the value itself (a driver version, a URL, a placeholder path in ``<>``).
CONTEXT_KEYS: Mapping[str, tuple[str, str]] = {
    "lock_name": ("stack.name", "the stack"),
    "lock_flag": ("' --lock PATH' when a lock was given", ""),
    "lock_backend": ("smoke.attention_backend", "flashinfer in the default profile"),
    "lock_torch": ("python.packages.torch", "torch==2.9.1+cu130 in the default profile"),
    #: the lock's torch as a fix quotes it beside the log's own words; empty without a lock, so that a
    #: log of another project is never told this stack's pin
    "locked_torch": ("' (the lock pins ' python.packages.torch ')' when a lock was given", ""),
    "locked_pins": ("'; the lock freezes ' python.guard.frozen when a lock was given", ""),
    "lock_pins": (
        "python.guard.frozen, as requirements",
        "torch, torchaudio, triton and nvidia-nccl-cu13 in the default profile",
    ),
    "torch_cuda": ("python.torch_cuda", "13.0 in the default profile"),
    "torch_index": ("python.index serving torch", "https://download.pytorch.org/whl/cu130"),
    "cuda_home": ("toolkit.default prefix", "<toolkit prefix, e.g. /usr/local/cuda-13.0>"),
    "ptxas": ("env.TRITON_PTXAS_PATH", "<toolkit prefix>/bin/ptxas"),
    "min_driver": ("hardware.min_driver", "580"),
    "gpu_arch": ("hardware.arch", "sm_120a in the default profile"),
    "lock_tp": ("smoke.tp", "the TP size"),
    "lock_port": ("smoke.port", "30000"),
    "log_file": ("the log being read: smoke fills in its server log's path", "server.log"),
}

_FIELDS = (
    "id",
    "title",
    "component",
    "stages",
    "severity",
    "patterns",
    "cause",
    "fix",
    "commands",
    "source",
    "references",
    "examples",
    "counterexamples",
    "anchor",
    "window",
    "after",
    "at_end",
    "followed_only_by",
    "not_followed_by",
    "preceded_by",
    "consequence",
    "supersedes",
    "extract",
    "without_errors",
)
_REQUIRED = ("id", "title", "component", "stages", "severity", "patterns", "cause", "fix", "source", "examples")


class SignatureError(Exception):
    """A signature file that does not follow the format."""


@dataclass(frozen=True)
class Signature:
    """One known failure: how it reads in a log, what causes it, how to fix it, where it was learned."""

    id: str
    component: str
    stages: tuple[str, ...]
    severity: str
    patterns: tuple[re.Pattern[str], ...]
    cause: str
    fix: str
    commands: tuple[str, ...] = ()
    source: str = ""  #: the URL (or released wheel file) it was learned from
    examples: tuple[str, ...] = ()  #: real text from the source; the tests feed it back
    title: str = ""
    references: tuple[str, ...] = ()  #: further reports and fixes of the same failure
    counterexamples: tuple[str, ...] = ()  #: healthy text that must not match
    anchors: tuple[
        str, ...
    ] = ()  #: declared prefilter literals, one per pattern (``anchor``), when not read off the patterns
    keys: tuple[str, ...] = ()  #: per pattern, a literal every match contains (the prefilter): filled by stackgate.scan
    window: int = 1  #: lines of an event ending on the key's line (a traceback), 1 = one line
    after: int = 0  #: lines after the key's line that belong to the event (resolver reports)
    at_end: bool = False  #: only counts when the log ends with it (a hang)
    followed_only_by: tuple[re.Pattern[str], ...] = ()  #: the only lines that may follow an ``at_end`` match
    not_followed_by: tuple[re.Pattern[str], ...] = ()  #: lines that must not follow an ``at_end`` match
    #: an ``at_end`` signature that says the log holds no error: not reported beside an error finding
    without_errors: bool = False
    preceded_by: tuple[re.Pattern[str], ...] = ()  #: an ``at_end`` match counts only after a line matching one
    consequence: bool = False  #: a symptom that follows another failure: listed after the causes
    supersedes: tuple[str, ...] = ()  #: generic ids this more specific one replaces on the same line
    extract: str | None = None  #: an extractor of :mod:`stackgate.scan.extract`, by name
    file: str = field(default="", compare=False)

    def search(self, text: str) -> re.Match[str] | None:
        for pattern in self.patterns:
            found = pattern.search(text)
            if found:
                return found
        return None

    @property
    def group_names(self) -> frozenset[str]:
        return frozenset(name for p in self.patterns for name in p.groupindex)


_FOLDER = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=None)
def load(folder: Path = _FOLDER) -> tuple[Signature, ...]:
    """Every signature in the folder's TOML files, ids unique; raises :class:`SignatureError`."""
    return read_folder(folder)


def read_folder(folder: Path) -> tuple[Signature, ...]:
    """Every signature in the folder's TOML files, ids unique."""
    signatures: list[Signature] = []
    for path in sorted(folder.glob("*.toml")):
        signatures.extend(_read(path))
    ids = [s.id for s in signatures]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise SignatureError(f"duplicate signature ids: {', '.join(duplicates)}")
    known = set(ids)
    for signature in signatures:
        unknown = set(signature.supersedes) - known
        if unknown:
            raise SignatureError(f"{signature.file}: {signature.id}: supersedes unknown ids {sorted(unknown)}")
    return tuple(signatures)


def _read(path: Path) -> list[Signature]:
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SignatureError(f"{path.name}: {exc}") from exc
    return [_signature(path.name, i, raw) for i, raw in enumerate(document.get("signature", []))]


def _signature(file: str, index: int, raw: Mapping[str, Any]) -> Signature:
    where = f"{file}: signature[{index}] ({raw.get('id', '?')})"
    missing = [name for name in _REQUIRED if name not in raw]
    unknown = sorted(set(raw) - set(_FIELDS))
    if missing or unknown:
        raise SignatureError(
            f"{where}: "
            + "; ".join([*(f"missing {m!r}" for m in missing), *([f"unknown keys {unknown}"] if unknown else [])])
        )
    try:
        signature = _build(file, raw)
    except re.error as exc:
        raise SignatureError(f"{where}: bad pattern: {exc}") from exc
    except (TypeError, ValueError) as exc:
        raise SignatureError(f"{where}: {exc}") from exc
    problems = _problems(signature)
    if problems:
        raise SignatureError(f"{where}: {'; '.join(problems)}")
    return signature


def _build(file: str, raw: Mapping[str, Any]) -> Signature:
    patterns = tuple(re.compile(p, re.MULTILINE) for p in _strings(raw["patterns"], "patterns"))
    anchors = _strings(raw.get("anchor", []), "anchor")
    if anchors and len(anchors) != len(patterns):
        raise ValueError("anchor needs one literal per pattern")
    return Signature(
        id=raw["id"],
        title=str(raw["title"]).strip(),
        component=raw["component"],
        stages=_strings(raw["stages"], "stages"),
        severity=raw["severity"],
        patterns=patterns,
        cause=str(raw["cause"]).strip(),
        fix=str(raw["fix"]).strip(),
        commands=_strings(raw.get("commands", []), "commands"),
        source=str(raw["source"]).strip(),
        references=_strings(raw.get("references", []), "references"),
        examples=_strings(raw["examples"], "examples"),
        counterexamples=_strings(raw.get("counterexamples", []), "counterexamples"),
        anchors=anchors,
        window=int(raw.get("window", 1)),
        after=int(raw.get("after", 0)),
        at_end=bool(raw.get("at_end", False)),
        followed_only_by=tuple(re.compile(p) for p in _strings(raw.get("followed_only_by", []), "followed_only_by")),
        not_followed_by=tuple(re.compile(p) for p in _strings(raw.get("not_followed_by", []), "not_followed_by")),
        without_errors=bool(raw.get("without_errors", False)),
        preceded_by=tuple(re.compile(p) for p in _strings(raw.get("preceded_by", []), "preceded_by")),
        consequence=bool(raw.get("consequence", False)),
        supersedes=_strings(raw.get("supersedes", []), "supersedes"),
        extract=raw.get("extract"),
        file=file,
    )


def _strings(value: Any, name: str) -> tuple[str, ...]:
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{name} must be a list of strings")
    return tuple(value)


def _problems(signature: Signature) -> list[str]:
    problems = []
    if signature.severity not in SEVERITIES:
        problems.append(f"severity must be one of {SEVERITIES}")
    if not signature.stages or not set(signature.stages) <= set(STAGES):
        problems.append(f"stages must be among {STAGES}")
    if signature.component not in COMPONENTS:
        problems.append(f"component must be one of {COMPONENTS}")
    if not signature.patterns:
        problems.append("needs at least one pattern")
    if not signature.source or not signature.examples:
        problems.append("needs a source and real examples from it")
    if any(p.flags & re.IGNORECASE for p in signature.patterns):
        problems.append("patterns must be case-sensitive (the prefilter keys are)")
    if signature.window < 1 or signature.after < 0 or (signature.window > 1 and signature.after):
        problems.append("window >= 1 and after >= 0, not both")
    return problems


def _driver(version: Any) -> str:
    """NVIDIA writes driver versions with a two-digit micro: 580.82.07, not 580.82.7."""
    parts = list(version.release)
    return ".".join([*map(str, parts[:2]), *(f"{p:02d}" for p in parts[2:])])


def context_defaults() -> dict[str, str]:
    """What a finding says for each context key when no lock was given."""
    return {name: default for name, (_, default) in CONTEXT_KEYS.items()}


def spec_context(spec: Any) -> dict[str, str]:
    """The context keys filled from a loaded lock (:class:`stackgate.models.spec.Spec`)."""
    toolkit = spec.default_toolkit
    torch = spec.python.package("torch")
    frozen = [spec.python.package(name) for name in spec.python.frozen]
    index = next((i.url for i in spec.python.indexes if "torch" in i.packages), None)
    values = {
        "lock_name": spec.name,
        "lock_flag": f" --lock {shlex.quote(str(spec.path))}",
        "lock_backend": spec.smoke.attention_backend,
        "lock_torch": torch.requirement if torch else None,
        "locked_torch": f" (the lock pins {torch.requirement})" if torch else None,
        "locked_pins": "; the lock freezes " + " ".join(p.requirement for p in frozen if p is not None)
        if frozen
        else None,
        "lock_pins": " ".join(p.requirement for p in frozen if p is not None),
        "torch_cuda": spec.python.torch_cuda,
        "torch_index": index,
        "cuda_home": str(toolkit.prefix) if toolkit else None,
        "ptxas": spec.env.get("TRITON_PTXAS_PATH") or (f"{toolkit.prefix}/bin/ptxas" if toolkit else None),
        "min_driver": _driver(spec.hardware.min_driver),
        "gpu_arch": spec.hardware.arch,
        "lock_tp": str(spec.smoke.tp),
        "lock_port": str(spec.smoke.port),
    }
    return {k: v for k, v in values.items() if v}
