"""The fingerprint of a deployed stack: one stable hash over what defines it, with its parts.

The parts ("components") are grouped in sections: the lock (its name and the hash of its
bytes, taken with its secrets hidden, and the hash of its pylock), the GPUs (driver, the CUDA version it supports, each
GPU's model and compute capability), each CUDA toolkit's version, the stack's Python and every
installed distribution, the locked patches' state, what the deep flashinfer checks found the
kernels to be (where they come from, whether the fused all-reduce runs or is a no-op here: never a
timing), and the serving engine's effective arguments from ``/server_info``. What changes from
one launch of the same stack to the next is left out
(ports, the random seed, runtime state), and so is what fast mode sets (random weights, fewer
layers), so a fast smoke and a full one of the same stack have the same fingerprint. Two runs on
the same stack give the same digest; a change in any component changes it, and :func:`changes`
names it.
No secret is hashed or shown (:mod:`stackgate.models.redact`): a changed API key, token or password
leaves the digest as it was.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from stackgate.models import inputfile, pylock
from stackgate.models.redact import redact, redact_text, secrets_in
from stackgate.models.result import Result
from stackgate.models.spec import Spec

if TYPE_CHECKING:
    from typing_extensions import TypeIs

    from stackgate.edges.nvml import NvmlSnapshot
    from stackgate.facts import Facts, Missing, ProbeFacts, ToolkitFacts
    from stackgate.facts.patchstate import PatchStatus

__all__ = [
    "KERNEL_CHECKS",
    "PARTS",
    "SECTIONS",
    "Change",
    "Fingerprint",
    "changes",
    "digest",
    "from_facts",
    "gpu_section",
    "kernels_section",
    "spec_section",
    "measured",
    "server_section",
]

#: The fact parts a fingerprint is made from (the gate starts gathering them first).
PARTS = ("nvml", "toolkits", "dists", "patches")
#: Sections in the order reports list them.
SECTIONS = ("lock", "gpu", "toolkits", "python", "distributions", "patches", "kernels", "server")
#: The deep checks whose findings define the stack (their results' ``data["defines"]``).
KERNEL_CHECKS = ("deep.flashinfer_attention", "deep.allreduce_fusion")
#: /server_info fields that differ between two launches of the same stack, or are not server
#: arguments at all: SGLang picks a random seed when none is given (server_args.py), the ports
#: are the launcher's choice, ``internal_states`` is live throughput and memory, and the
#: scheduler's fields (status, token capacity) depend on the memory free at load time.
VOLATILE = frozenset(
    {"random_seed", "internal_states", "status", "max_total_num_tokens", "max_req_input_len", "dist_init_addr", "pid"}
)
_PORT = re.compile(r"(^|_)ports?$")
#: Fields that smoke's fast mode sets (--load-format dummy, --json-model-override-args).
FAST_MODE = frozenset({"load_format", "json_model_override_args"})
UNAVAILABLE = "unavailable"

Section = Mapping[str, str]


@dataclass(frozen=True)
class Change:
    """One component that differs between two fingerprints (None: absent on that side)."""

    section: str
    name: str
    old: str | None
    new: str | None

    def __str__(self) -> str:
        return f"{self.name}: {_shown(self.old)} -> {_shown(self.new)}"


def _shown(value: str | None) -> str:
    return "(none)" if value is None else value


@dataclass(frozen=True)
class Fingerprint:
    components: Mapping[str, Section]

    @property
    def digest(self) -> str:
        return digest(self.components)

    @property
    def short(self) -> str:
        return self.digest[:12]

    @property
    def size(self) -> int:
        return sum(len(section) for section in self.components.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "short": self.short,
            "components": {k: dict(v) for k, v in self.components.items()},
        }


def digest(components: Mapping[str, Section]) -> str:
    """sha256 of the components as canonical JSON (sorted keys, no spaces).

    >>> digest({"lock": {"name": "a"}}) == digest({"lock": {"name": "a"}}) != digest({"lock": {"name": "b"}})
    True
    """
    canonical = json.dumps(
        {k: dict(v) for k, v in components.items()}, sort_keys=True, separators=(",", ":"), ensure_ascii=True
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def from_facts(
    spec: Spec, facts: Facts, server_info: Mapping[str, Any] | None, results: Sequence[Result] = ()
) -> Fingerprint:
    """The fingerprint of the stack the facts describe, the kernels the deep checks among
    ``results`` found, and the server that ran on it."""
    return Fingerprint(
        {
            "lock": spec_section(spec),
            "gpu": gpu_section(facts.nvml),
            "toolkits": _toolkits(facts.toolkits),
            "python": _python(facts.dists),
            "distributions": _distributions(facts.dists),
            "patches": _patches(facts.patches),
            "kernels": kernels_section(results),
            "server": server_section(server_info)
            if server_info is not None
            else {UNAVAILABLE: "no smoke stage read /server_info"},
        }
    )


def spec_section(spec: Spec) -> dict[str, str]:
    """The lock's name and sha256, and its pylock's sha256 when it has one (every distribution's
    file: another resolution is another stack). A lockfile that holds secrets (an ``--api-key``
    in its flags, a token in its ``[smoke.env]``, a password in an index URL) is hashed with them
    hidden, so a rotated key is the same stack; a lockfile without any keeps the sha256 of its
    bytes that every report names."""
    section = {"name": spec.name, "sha256": _spec_sha256(spec)}
    try:
        locked = inputfile.read_capped(pylock.path_for(spec.path), inputfile.MAX_PYLOCK_BYTES)
        section["pylock"] = hashlib.sha256(locked).hexdigest()
    except OSError:
        pass  # no pylock beside the spec (an existing interpreter's profile, say), or none it may read
    return section


def _spec_sha256(spec: Spec) -> str:
    try:
        raw = inputfile.read_capped(spec.path, inputfile.MAX_SPEC_BYTES)
    except OSError:
        return spec.sha256
    if hashlib.sha256(raw).hexdigest() != spec.sha256:
        return spec.sha256  # changed since it was loaded: not this lock's text
    text = raw.decode("utf-8", "surrogateescape")
    smoke = spec.smoke
    hidden = redact_text(
        text, known=secrets_in([list(smoke.flags), dict(smoke.env), dict(spec.env), *_compare_parts(spec)])
    )
    return spec.sha256 if hidden == text else hashlib.sha256(hidden.encode("utf-8", "surrogateescape")).hexdigest()


def _compare_parts(spec: Spec) -> list[Any]:
    compare = spec.smoke.compare
    return [] if compare is None else [list(compare.flags or ()), dict(compare.env)]


def gpu_section(snapshot: NvmlSnapshot | Missing) -> dict[str, str]:
    """The driver, the CUDA version it supports, and each GPU's model and compute capability
    (never its UUID or bus id: a swapped card of the same model is the same stack)."""
    if _missing(snapshot):
        return {UNAVAILABLE: snapshot.reason}
    section = {"driver": snapshot.driver_version, "count": str(len(snapshot.gpus))}
    if snapshot.cuda_driver_version is not None:
        section["cuda_driver"] = "{}.{}".format(*snapshot.cuda_driver_version)
    for gpu in snapshot.gpus:
        capability = "{}.{}".format(*gpu.capability) if gpu.capability else "unknown"
        section[f"gpu{gpu.index}"] = f"{gpu.name}, compute capability {capability}"
    return section


def _missing(value: object) -> TypeIs[Missing]:
    """Whether a part of the facts is Missing. The facts' package (how every part is gathered) is
    loaded here, where a fingerprint is taken, and not by `report A B`, which compares kept ones."""
    from stackgate.facts import Missing

    return isinstance(value, Missing)


def _toolkits(found: Iterable[ToolkitFacts]) -> dict[str, str]:
    from stackgate.facts import ToolVersion

    section = {}
    for toolkit in found:
        tool = toolkit.detected
        section[str(toolkit.toolkit.prefix)] = (
            f"{tool.release} (V{tool.build})" if isinstance(tool, ToolVersion) else "absent"
        )
    return section


def _python(dists: ProbeFacts | Missing) -> dict[str, str]:
    if _missing(dists):
        return {UNAVAILABLE: dists.reason}
    return {"version": dists.python_version}


def _distributions(dists: ProbeFacts | Missing) -> dict[str, str]:
    if _missing(dists):
        return {UNAVAILABLE: dists.reason}
    return {name: dist.version for name, dist in sorted(dists.distributions.items())}


def _patches(found: Sequence[PatchStatus] | Missing) -> dict[str, str]:
    if _missing(found):
        return {UNAVAILABLE: found.reason}
    return {
        status.patch.file.name: status.problem or f"applied to {status.patch.package} {status.installed}"
        for status in found
    }


def kernels_section(results: Sequence[Result]) -> dict[str, str]:
    """What the deep flashinfer checks found that defines the stack: each one's ``defines`` (where
    the attention kernels come from; whether the fused all-reduce runs or is a no-op here), or its
    status and summary when it found none (not run, failed). Never a timing.

    >>> from stackgate.models.result import Status
    >>> defines = {"defines": {"allreduce_fusion": "no-op: major 12"}}
    >>> kernels_section([Result("deep.allreduce_fusion", Status.FAIL, "x", data=defines)])
    {'allreduce_fusion': 'no-op: major 12'}
    >>> kernels_section([])
    {'unavailable': 'no deep flashinfer check ran'}
    """
    section: dict[str, str] = {}
    for result in results:
        if result.check not in KERNEL_CHECKS:
            continue
        defines = result.data.get("defines")
        if isinstance(defines, Mapping):
            section.update({str(k): str(v) for k, v in defines.items()})
        else:
            section[result.check.split(".", 1)[1]] = f"{result.status.name}: {result.summary}"
    return section or {UNAVAILABLE: "no deep flashinfer check ran"}


def server_section(info: Mapping[str, Any]) -> dict[str, str]:
    """The engine's effective arguments, without volatile fields, fast-mode fields, unset ones
    and secrets.

    >>> server_section({"attention_backend": "triton", "port": 30000, "random_seed": 7, "cuda_graph_bs": [1, 2],
    ...                 "api_key": "sk", "lora_paths": None})
    {'api_key': '<redacted>', 'attention_backend': 'triton', 'cuda_graph_bs': '[1, 2]'}
    """
    section = {}
    for name, value in sorted(redact(dict(info)).items()):
        if value is None or name in VOLATILE or name in FAST_MODE or _PORT.search(name):
            continue
        section[name] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return section


def measured(section: Section) -> bool:
    """Whether a section holds what was found, not only why it could not be (``{"unavailable": why}``).

    >>> measured({"attention_backend": "flashinfer"}), measured({UNAVAILABLE: "no smoke stage read /server_info"})
    (True, False)
    """
    return set(section) != {UNAVAILABLE}


def changes(old: Mapping[str, Section], new: Mapping[str, Section]) -> list[Change]:
    """Every component that differs, section by section (in :data:`SECTIONS` order), by name.

    >>> old, new = {"server": {"attention_backend": "flashinfer"}}, {"server": {"attention_backend": "triton"}}
    >>> [str(c) for c in changes(old, new)]
    ['attention_backend: flashinfer -> triton']
    """
    found = []
    names = [s for s in SECTIONS if s in old or s in new] + sorted((set(old) | set(new)) - set(SECTIONS))
    for section in names:
        before, after = old.get(section) or {}, new.get(section) or {}
        for name in sorted(set(before) | set(after)):
            if before.get(name) != after.get(name):
                found.append(Change(section, name, before.get(name), after.get(name)))
    return found
