"""Cumulative histograms kept as Redis hash counters, and quantiles estimated from them.

Each observation increments one bucket field ``<prefix><le>`` (the first upper bound that
holds it, ``+Inf`` past the last), so any reader can rebuild a Prometheus histogram.
Quantiles follow Prometheus's ``histogram_quantile``: linear interpolation inside the bucket
that holds the rank, the highest finite bound when the rank falls in ``+Inf``
(https://prometheus.io/docs/prometheus/latest/querying/functions/#histogram_quantile).
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Histogram:
    """``buckets``: (upper bound, observations <= bound), cumulative, the last bound ``inf``;
    ``sum`` of the observations (same unit as the bounds)."""

    buckets: list[tuple[float, int]]
    sum: float

    @property
    def count(self) -> int:
        return self.buckets[-1][1]

    def quantile(self, q: float) -> float | None:
        """The ``q``-quantile (0..1) estimate, or None without observations."""
        if not self.count:
            return None
        rank, lower, below = q * self.count, 0.0, 0
        for bound, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(bound):
                    return lower
                inside = cumulative - below
                return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
            lower, below = bound, cumulative
        return lower


def field(prefix: str, bounds: Sequence[float], value: float) -> str:
    """The bucket field of ``value``: ``<prefix><le>``, ``le`` formatted as Prometheus does
    (``bounds`` ascending; NaN goes to ``+Inf``, as no bound holds it)."""
    at = bisect.bisect_left(bounds, value) if value == value else len(bounds)
    return label(prefix, bounds[at] if at < len(bounds) else math.inf)


@functools.lru_cache(maxsize=1024)
def label(prefix: str, bound: float) -> str:
    """``<prefix><le>`` of one bucket: ``le`` formatted as Prometheus does (``+Inf``, ``0.005``)."""
    return f"{prefix}{'+Inf' if math.isinf(bound) else format(bound, 'g')}"


def read(counters: Mapping[str, int], prefix: str, bounds: Sequence[float], total: float) -> Histogram:
    """The histogram stored under ``prefix`` in decoded hash ``counters``; ``total`` its sum."""
    running, buckets = 0, []
    for bound in [*bounds, math.inf]:
        running += counters.get(field(prefix, bounds, bound), 0)
        buckets.append((bound, running))
    return Histogram(buckets, total)


def merge(histograms: Sequence[Histogram]) -> Histogram:
    """The sum of histograms with the same bounds (e.g. one per model version)."""
    if not histograms:
        raise ValueError("nothing to merge")
    bounds = [bound for bound, _ in histograms[0].buckets]
    counts = [sum(h.buckets[i][1] for h in histograms) for i in range(len(bounds))]
    return Histogram(list(zip(bounds, counts, strict=True)), sum(h.sum for h in histograms))
