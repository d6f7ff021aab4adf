"""What changes between two stacks: the live generation's and a new spec's.

An upgrade's plan shows it before anything runs, and its report puts it beside the tok/s change:
the CUDA toolkits, every distribution that moves (read from the two pylocks: the live
generation's own copy, the new spec's), the spec's other inputs (overrides, frozen packages,
indexes), the patches, ``[env]`` and what smoke launches with (backend, flags, speculative
decoding, ``[smoke.env]``). Pure: two locks and two pylocks in, changes out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from stackgate.facts.compare import spec_changes
from stackgate.models import pylock
from stackgate.models.spec import Spec

__all__ = ["AREAS", "Change", "changes", "distributions"]

#: The areas in the order a plan shows them.
AREAS = ("toolkit", "distribution", "spec", "patch", "env", "smoke")
#: Spec keys the distributions (pylock) or nothing a person reads already say.
_SPEC_SHOWN_ELSEWHERE = ("packages.", "pylock")


@dataclass(frozen=True)
class Change:
    """One thing that differs: ``old`` None when it is new, ``new`` None when it goes."""

    area: str
    name: str
    old: str | None
    new: str | None

    @property
    def kind(self) -> str:
        return "added" if self.old is None else "removed" if self.new is None else "changed"

    def text(self) -> str:
        """
        >>> Change("distribution", "flashinfer-python", "0.6.3", "0.6.4").text()
        'flashinfer-python: 0.6.3 -> 0.6.4'
        >>> Change("patch", "sglang x.patch", None, "sglang 0.5.9").text()
        'sglang x.patch: (none) -> sglang 0.5.9'
        """
        old = self.old if self.old is not None else "(none)"
        new = self.new if self.new is not None else "(none)"
        return f"{self.name}: {old} -> {new}"

    def to_dict(self) -> dict[str, Any]:
        return {"area": self.area, "name": self.name, "old": self.old, "new": self.new, "kind": self.kind}


def changes(
    old: Spec,
    old_spec: Mapping[str, Any] | None,
    old_pylock: pylock.Resolution | None,
    new: Spec,
    new_spec: Mapping[str, Any],
    new_pylock: pylock.Resolution | None,
) -> list[Change]:
    """Every difference, area by area (:data:`AREAS`). ``old_spec`` is the environment spec the
    live generation's marker records (what it was really built from), else the live lock's."""
    found = _mapped("toolkit", _toolkits(old), _toolkits(new))
    found += _mapped("distribution", distributions(old, old_pylock), distributions(new, new_pylock))
    spec = [line for line in spec_changes(old_spec or {}, new_spec) if not line.startswith(_SPEC_SHOWN_ELSEWHERE)]
    found += [_spec_change(line) for line in spec]
    found += _mapped("patch", _patches(old), _patches(new))
    found += _mapped("env", dict(old.env), dict(new.env))
    found += _mapped("smoke", _smoke(old), _smoke(new))
    return found


def distributions(spec: Spec, resolution: pylock.Resolution | None) -> dict[str, str]:
    """name -> version: every locked distribution, or the spec's pins where there is no pylock."""
    if resolution is not None:
        return {name: package.version for name, package in resolution.packages.items()}
    return {package.name: str(package.specifier) for package in spec.python.packages}


def _mapped(area: str, old: Mapping[str, str], new: Mapping[str, str]) -> list[Change]:
    return [
        Change(area, key, old.get(key), new.get(key))
        for key in sorted(old.keys() | new.keys())
        if old.get(key) != new.get(key)
    ]


def _spec_change(line: str) -> Change:
    """``key: old -> new`` (spec_changes' form) as a Change; '(none)' is no value."""
    key, _, rest = line.partition(": ")
    old, _, new = rest.partition(" -> ")
    return Change("spec", key, None if old == "(none)" else old, None if new == "(none)" else new)


def _toolkits(spec: Spec) -> dict[str, str]:
    found = {}
    for toolkit in spec.toolkits:
        roles = [role for role, on in (("default", toolkit.default), ("kept", toolkit.keep)) if on]
        found[f"CUDA {toolkit.version}"] = (
            f"{toolkit.prefix}"
            + (f" ({', '.join(roles)})" if roles else "")
            + (f" from {toolkit.source}" if toolkit.source else "")
        )
    return found


def _patches(spec: Spec) -> dict[str, str]:
    return {
        patch.file.name: f"{patch.package} {patch.version}" + (f", sha256 {patch.sha256[:12]}" if patch.sha256 else "")
        for patch in spec.patches
    }


def _smoke(spec: Spec) -> dict[str, str]:
    smoke = spec.smoke
    found = {
        "attention_backend": smoke.attention_backend,
        "flags": " ".join(smoke.flags) or "(none)",
        "tp": str(smoke.tp),
    }
    if smoke.speculative is not None:
        found["speculative"] = smoke.speculative.algorithm
    found.update({f"env.{k}": v for k, v in smoke.env.items()})
    return found
