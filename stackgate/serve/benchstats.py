"""The benchmark's statistics: a summary of runs with its 95% confidence interval (Student's t),
the difference of two sets of runs with Welch's interval, percentiles, and figures for JSON.

A figure that does not exist (the confidence interval of one run) is written as JSON ``null`` with
a note, never as ``Infinity``, which strict JSON parsers refuse.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import Any, Sequence

__all__ = ["Difference", "Summary", "difference", "finite", "percentile", "summarize", "t95"]

# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom.
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip # a table: ten degrees of freedom a line


def t95(df: int) -> float:
    """Two-sided 95% Student's t quantile (conservative for non-integer df: rounded down).

    >>> t95(4), t95(1000)
    (2.776, 1.96)
    """
    if df < 1:
        return math.inf
    if df <= len(_T95):
        return _T95[df - 1]
    return 2.021 if df < 60 else 2.0 if df < 120 else 1.98 if df < 1000 else 1.96


def finite(value: float, digits: int = 4) -> float | None:
    """A figure for JSON: rounded, or None where it does not exist (inf, nan).

    >>> finite(1.23456), finite(math.inf), finite(-math.inf)
    (1.2346, None, None)
    """
    return round(value, digits) if math.isfinite(value) else None


def percentile(values: Sequence[float], p: float) -> float | None:
    """The ``p``-th percentile, interpolated between the closest ranks (numpy's default).

    >>> percentile([4.0, 1.0, 3.0, 2.0], 50), percentile([1.0, 2.0, 3.0, 4.0], 90), percentile([], 50)
    (2.5, 3.7, None)
    """
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    median: float
    stdev: float  #: sample standard deviation (0 for one value)
    cv: float  #: stdev / mean
    min: float
    max: float
    ci_low: float  #: 95% confidence interval of the mean
    ci_high: float
    values: tuple[float, ...] = ()

    @property
    def has_interval(self) -> bool:
        """One value has no spread to estimate, so no confidence interval."""
        return math.isfinite(self.ci_low) and math.isfinite(self.ci_high)

    def to_dict(self) -> dict[str, Any]:
        raw = dataclasses.asdict(self)
        raw["values"] = [round(v, 4) for v in self.values]
        out = {k: (finite(v) if isinstance(v, float) else v) for k, v in raw.items()}
        if not self.has_interval:
            out["ci_note"] = f"no confidence interval from {self.n} value(s): ci_low and ci_high are null"
        return out

    def interval(self) -> str:
        return f"{self.ci_low:.2f}-{self.ci_high:.2f}" if self.has_interval else f"n/a (n={self.n})"

    def text(self, unit: str = "tok/s") -> str:
        return (
            f"{self.mean:.2f} {unit} (median {self.median:.2f}, CV {self.cv:.1%}, 95% CI {self.interval()}, n={self.n})"
        )


def summarize(values: Sequence[float]) -> Summary | None:
    """Mean, median, stdev, CV, min, max and a 95% confidence interval of the mean.

    >>> s = summarize([90.0, 92.0, 94.0])
    >>> (s.mean, s.median, s.stdev, round(s.cv, 4), round(s.ci_low, 3), round(s.ci_high, 3))
    (92.0, 92.0, 2.0, 0.0217, 87.031, 96.969)
    """
    if not values:
        return None
    n = len(values)
    mean = statistics.fmean(values)
    stdev = statistics.stdev(values) if n > 1 else 0.0
    half = t95(n - 1) * stdev / math.sqrt(n) if n > 1 else math.inf
    return Summary(
        n,
        mean,
        statistics.median(values),
        stdev,
        stdev / mean if mean else 0.0,
        min(values),
        max(values),
        mean - half,
        mean + half,
        tuple(values),
    )


@dataclass(frozen=True)
class Difference:
    """``b - a`` of two sets of runs, with a 95% (Welch) interval."""

    delta: float
    ci_low: float
    ci_high: float
    relative: float  #: delta / mean of a

    @property
    def significant(self) -> bool:
        return self.ci_low > 0 or self.ci_high < 0

    def text(self) -> str:
        if not (math.isfinite(self.ci_low) and math.isfinite(self.ci_high)):
            return f"{self.delta:+.2f} tok/s ({self.relative:+.1%}; no 95% CI: a side has one run)"
        return f"{self.delta:+.2f} tok/s ({self.relative:+.1%}; 95% CI {self.ci_low:+.2f} to {self.ci_high:+.2f})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "delta": round(self.delta, 4),
            "ci": [finite(self.ci_low), finite(self.ci_high)],
            "relative": round(self.relative, 4),
            "significant": self.significant,
        }


def difference(a: Summary, b: Summary) -> Difference:
    """Welch's interval for the difference of two means.

    >>> d = difference(summarize([90.0, 91.0, 92.0]), summarize([95.0, 96.0, 97.0]))
    >>> (d.delta, round(d.ci_low, 2), round(d.ci_high, 2), d.significant)
    (5.0, 2.73, 7.27, True)
    >>> difference(summarize([90.0]), summarize([95.0, 96.0])).significant  # one run: no spread known
    False
    """
    if a.n < 2 or b.n < 2:
        return Difference(b.mean - a.mean, -math.inf, math.inf, (b.mean - a.mean) / a.mean)
    va, vb = a.stdev**2 / a.n, b.stdev**2 / b.n
    se = math.sqrt(va + vb)
    if se == 0:
        return Difference(b.mean - a.mean, b.mean - a.mean, b.mean - a.mean, (b.mean - a.mean) / a.mean)
    df = (va + vb) ** 2 / (va**2 / (a.n - 1) + vb**2 / (b.n - 1) or 1e-12)
    half = t95(int(df)) * se
    delta = b.mean - a.mean
    return Difference(delta, delta - half, delta + half, delta / a.mean)
