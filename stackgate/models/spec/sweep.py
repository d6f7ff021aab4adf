"""[smoke.sweep] and [smoke.sweep.slo]: the request-rate sweep and the goodput it is judged on.

The sweep sends requests at each rate (requests per second) with Poisson or fixed-interval
arrivals, each request a seeded random prompt (or one from a local ShareGPT-style dataset), and
reports latency percentiles per rate; the SLO table names the objectives a request must meet to
count as good, the rate judged and the lowest share of good requests that passes.
"""

from __future__ import annotations

from dataclasses import dataclass

from stackgate.models.spec.reader import Table

__all__ = ["ARRIVALS", "Slo", "Sweep"]

#: How arrivals are spaced: exponential gaps (a Poisson process, as SGLang's bench_serving) or equal gaps.
ARRIVALS = ("poisson", "fixed")


@dataclass(frozen=True)
class Slo:
    """[smoke.sweep.slo]: a request is good when it completes within every objective given."""

    rate: float  #: the rate judged: one of the sweep's rates
    min_goodput: float = 0.9  #: the lowest share of requests sent that must be good
    ttft_ms: float | None = None  #: time to first token
    itl_ms: float | None = None  #: the request's mean inter-token latency (SGLang's TPOT)
    e2e_ms: float | None = None  #: end-to-end latency
    max_repeats: int = 3  #: the rate judged is run this many times at most while the interval spans the floor

    @property
    def objectives(self) -> dict[str, float]:
        """The objectives given, by name (milliseconds)."""
        named = {"ttft_ms": self.ttft_ms, "itl_ms": self.itl_ms, "e2e_ms": self.e2e_ms}
        return {k: v for k, v in named.items() if v is not None}

    @classmethod
    def _from_table(cls, t: Table, rates: tuple[float, ...]) -> Slo | None:
        rate = t.positive("rate", float)
        floor = t.get("min_goodput", (int, float), 0.9)
        if floor is not None and not 0 < floor <= 1:
            t.error("min_goodput", f"must be a fraction in (0, 1], not {floor}")
        if rate is not None and rates and rate not in rates:
            t.error("rate", f"{rate:g} is not one of smoke.sweep.rates ({', '.join(f'{r:g}' for r in rates)})")
        slo = cls(
            rate=rate or 1.0,
            min_goodput=float(floor if floor is not None else 0.9),
            ttft_ms=t.positive("ttft_ms", float, None),
            itl_ms=t.positive("itl_ms", float, None),
            e2e_ms=t.positive("e2e_ms", float, None),
            max_repeats=t.positive("max_repeats", int, 3) or 3,
        )
        if not slo.objectives and not t.errors:
            t.error("", "names no objective: give ttft_ms, itl_ms or e2e_ms")
        t.finish()
        return slo


@dataclass(frozen=True)
class Sweep:
    """[smoke.sweep]: the rates, the arrivals and the prompts of the request-rate sweep."""

    rates: tuple[float, ...] = ()  #: requests per second; `smoke --rates` replaces them
    arrival: str = "poisson"
    seed: int = 1
    requests: int = 64  #: requests sent at each rate
    seconds: float | None = None  #: stop sending at a rate after this long, whatever requests says
    input_tokens: tuple[int, int] = (128, 512)  #: prompt length in words, uniform over [low, high]
    output_tokens: tuple[int, int] = (64, 256)  #: tokens asked of each request, uniform over [low, high]
    shared_prefix_tokens: int = 0  #: words every prompt starts with (a shared-prefix case); 0: none shared
    dataset: str | None = None  #: a local ShareGPT-style JSON file, relative to the spec's folder
    knee_ratio: float = 1.5  #: latency has turned up where the median E2E exceeds the first rate's by this factor
    slo: Slo | None = None

    @classmethod
    def _from_table(cls, t: Table) -> Sweep:
        rates = _rates(t)
        arrival = t.get("arrival", str, "poisson") or "poisson"
        t.choice("arrival", arrival, ARRIVALS)
        knee = t.get("knee_ratio", (int, float), 1.5)
        if knee is not None and knee <= 1:
            t.error("knee_ratio", f"must be greater than 1, not {knee}")
        shared = t.get("shared_prefix_tokens", int, 0)
        if shared is not None and shared < 0:
            t.error("shared_prefix_tokens", f"must be 0 or more, not {shared}")
        sweep = cls(
            rates=rates,
            arrival=arrival,
            seed=t.get("seed", int, 1) or 0,
            requests=t.positive("requests", int, 64) or 64,
            seconds=t.positive("seconds", float, None),
            input_tokens=_length(t, "input_tokens", (128, 512)),
            output_tokens=_length(t, "output_tokens", (64, 256)),
            shared_prefix_tokens=shared or 0,
            dataset=t.get("dataset", str, None),
            knee_ratio=float(knee) if knee is not None and knee > 1 else 1.5,
            slo=Slo._from_table(t.sub("slo"), rates) if "slo" in t.data else None,
        )
        t.finish()
        return sweep


def _rates(t: Table) -> tuple[float, ...]:
    items = t.get("rates", list, [])
    rates = []
    for i, item in enumerate(items or []):
        if isinstance(item, bool) or not isinstance(item, (int, float)) or not item > 0:
            t.error(f"rates[{i}]", f"must be a number of requests per second greater than 0, not {item!r}")
        else:
            rates.append(float(item))
    return tuple(rates)


def _length(t: Table, name: str, default: tuple[int, int]) -> tuple[int, int]:
    """A length: one whole number, or [low, high] (a uniform range, both ends included)."""
    value = t.get(name, (int, list), list(default))
    if isinstance(value, int) and value > 0:
        return value, value
    if (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        and 0 < value[0] <= value[1]
    ):
        return value[0], value[1]
    if value is not None:
        t.error(name, f"must be a whole number above 0 or [low, high] with 0 < low <= high, not {value!r}")
    return default
