"""What changed between two kept runs: the stack, component by component, next to the speed.

A gate run carries its whole fingerprint; a smoke run carries what its server reported (and
the lock), so two runs are compared on the sections both have, and the comparison says which.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from stackgate.runs import fingerprint
from stackgate.runs.history import Run
from stackgate.serve import bench

__all__ = [
    "Comparison",
    "FigureChange",
    "SpeedChange",
    "StatusChange",
    "compare",
    "components",
    "figures_of",
    "summary_of",
]


@dataclass(frozen=True)
class SpeedChange:
    """One benchmark figure in both runs; ``difference`` when both have enough runs for it."""

    name: str  #: decode_tok_s | tok_s
    old: float | None
    new: float | None
    difference: bench.Difference | None = None

    def text(self) -> str:
        label = "decode tok/s" if self.name == "decode_tok_s" else "tok/s"
        if self.old is None or self.new is None:
            return f"{label}: {_figure(self.old)} -> {_figure(self.new)}"
        change = (
            self.difference.text()
            if self.difference
            else f"{self.new - self.old:+.2f} tok/s ({self.new / self.old - 1:+.1%})"
        )
        return f"{label}: {self.old:.2f} -> {self.new:.2f}: {change}"


def _figure(value: float | None) -> str:
    return "(none)" if value is None else f"{value:.2f}"


@dataclass(frozen=True)
class FigureChange:
    """A kernel figure of a deep check (attention GB/s, the fusion's speedup) in both runs."""

    check: str
    name: str
    old: float | None
    new: float | None

    def text(self) -> str:
        """``deep.flashinfer_attention decode GB/s: 1280 -> 1250 (-2.3%)``.

        >>> FigureChange("deep.allreduce_fusion", "fused speedup at 1 tokens", 5.3, None).text()
        'deep.allreduce_fusion fused speedup at 1 tokens: 5.3 -> (none)'
        """
        head = f"{self.check} {self.name}: {_rate(self.old)} -> {_rate(self.new)}"
        return head + (f" ({self.new / self.old - 1:+.1%})" if self.old and self.new is not None else "")


def _rate(value: float | None) -> str:
    return "(none)" if value is None else f"{value:.4g}"


@dataclass(frozen=True)
class StatusChange:
    stage: str
    check: str
    old: str | None
    new: str | None
    summary: str  #: the newer run's summary (or the older one's when the check is gone)

    def __str__(self) -> str:
        return f"{self.stage} {self.check}: {self.old or '(absent)'} -> {self.new or '(absent)'}: {self.summary}"


@dataclass(frozen=True)
class Comparison:
    old: Run
    new: Run
    sections: tuple[str, ...]  #: the fingerprint sections both runs have, and so were compared
    changes: tuple[fingerprint.Change, ...]
    speed: tuple[SpeedChange, ...]
    statuses: tuple[StatusChange, ...]
    figures: tuple[FigureChange, ...] = ()  #: the deep checks' kernel figures, where either run has them

    @property
    def same_stack(self) -> bool:
        return not self.changes


def components(run: Run) -> dict[str, dict[str, str]]:
    """A run's fingerprint components (a smoke run: its lock and its server's arguments)."""
    finger = run.fingerprint
    if finger is not None:
        return {
            str(k): {str(n): str(v) for n, v in dict(section).items()}
            for k, section in finger["components"].items()
            if isinstance(section, Mapping)
        }
    found: dict[str, dict[str, str]] = {}
    spec = run.doc.get("lock")
    if isinstance(spec, Mapping) and spec.get("sha256"):
        found["lock"] = {"name": str(spec.get("name")), "sha256": str(spec.get("sha256"))}
    info = _server_info(run)
    if info is not None:
        found["server"] = fingerprint.server_section(info)
    return found


def _server_info(run: Run) -> Mapping[str, Any] | None:
    sessions = (run.doc.get("smoke") or {}).get("sessions") if isinstance(run.doc.get("smoke"), Mapping) else None
    if not isinstance(sessions, list) or not sessions or not isinstance(sessions[-1], Mapping):
        return None
    info = sessions[-1].get("server_info")
    return info if isinstance(info, Mapping) else None


def compare(old: Run, new: Run) -> Comparison:
    """Everything that differs between two runs, oldest first as given."""
    a, b = components(old), components(new)
    shared = tuple(s for s in fingerprint.SECTIONS if s in a and s in b) + tuple(
        sorted((set(a) & set(b)) - set(fingerprint.SECTIONS))
    )
    changes = fingerprint.changes({s: a[s] for s in shared}, {s: b[s] for s in shared})
    speed = tuple(_speed(old, new, name) for name in ("decode_tok_s", "tok_s"))
    return Comparison(old, new, shared, tuple(changes), speed, tuple(_statuses(old, new)), tuple(_figures(old, new)))


def figures_of(run: Run) -> dict[tuple[str, str], float]:
    """(check, figure) -> value: every number a result put under ``data["figures"]``."""
    found = {}
    for result in run.results:
        data = result.get("data")
        figures = data.get("figures") if isinstance(data, Mapping) else None
        for name, value in figures.items() if isinstance(figures, Mapping) else ():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                found[(str(result.get("check")), str(name))] = float(value)
    return found


def _figures(old: Run, new: Run) -> list[FigureChange]:
    a, b = figures_of(old), figures_of(new)
    return [
        FigureChange(check, name, a.get((check, name)), b.get((check, name)))
        for check, name in [*a, *(k for k in b if k not in a)]
    ]


def _speed(old: Run, new: Run, name: str) -> SpeedChange:
    a, b = summary_of(old, name), summary_of(new, name)
    change = SpeedChange(name, old.figure(name), new.figure(name))
    if a is not None and b is not None and a.n > 1 and b.n > 1 and a.mean > 0:
        change = dataclasses.replace(change, difference=bench.difference(a, b))
    return change


def summary_of(run: Run, name: str) -> bench.Summary | None:
    """A benchmark figure's summary as stored (None when absent or malformed)."""
    raw = (run.benchmark or {}).get(name)
    if not isinstance(raw, Mapping):
        return None
    try:
        fields = {f.name: raw[f.name] for f in dataclasses.fields(bench.Summary) if f.name not in ("n", "values")}
        return bench.Summary(
            int(raw["n"]),
            **{k: float(v) for k, v in fields.items()},
            values=tuple(float(v) for v in raw.get("values", ())),
        )
    except (KeyError, TypeError, ValueError):
        return None


def _statuses(old: Run, new: Run) -> list[StatusChange]:
    def by_check(run: Run) -> dict[tuple[str, str], Mapping[str, Any]]:
        return {(str(r.get("stage", run.command)), str(r.get("check"))): r for r in run.results}

    a, b = by_check(old), by_check(new)
    found = []
    for key in [*a, *(k for k in b if k not in a)]:
        before, after = a.get(key), b.get(key)
        old_status, new_status = (before or {}).get("status"), (after or {}).get("status")
        if old_status != new_status:
            found.append(
                StatusChange(key[0], key[1], old_status, new_status, str((after or before or {}).get("summary", "")))
            )
    return found
