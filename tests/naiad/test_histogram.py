"""Histograms kept as hash counters, and Prometheus-style quantile estimates from them."""

from __future__ import annotations

import math

import pytest

from naiad import histogram

BOUNDS = (0.01, 0.1, 1.0)


def build(values: list[float]) -> histogram.Histogram:
    counters: dict[str, int] = {}
    for value in values:
        name = histogram.field("b:", BOUNDS, value)
        counters[name] = counters.get(name, 0) + 1
    return histogram.read(counters, "b:", BOUNDS, sum(values))


def test_fields_name_the_first_bound_that_holds_the_value():
    assert histogram.field("b:", BOUNDS, 0.01) == "b:0.01"
    assert histogram.field("b:", BOUNDS, 0.011) == "b:0.1"
    assert histogram.field("b:", BOUNDS, 7.0) == "b:+Inf"


def test_buckets_are_cumulative_and_sum_is_kept():
    h = build([0.005, 0.05, 0.05, 0.5, 5.0])
    assert h.buckets == [(0.01, 1), (0.1, 3), (1.0, 4), (math.inf, 5)]
    assert h.count == 5 and h.sum == pytest.approx(5.605)


def test_quantiles_interpolate_inside_the_bucket_as_prometheus_does():
    h = build([0.05] * 10)  # all in (0.01, 0.1]
    assert h.quantile(0.5) == pytest.approx(0.01 + 0.09 * 0.5)
    assert h.quantile(1.0) == pytest.approx(0.1)


def test_quantile_in_the_inf_bucket_is_the_highest_finite_bound():
    assert build([5.0, 6.0]).quantile(0.99) == 1.0


def test_no_observation_has_no_quantile():
    assert build([]).quantile(0.5) is None


def test_merge_adds_versions():
    merged = histogram.merge([build([0.005]), build([0.5, 0.5])])
    assert merged.buckets == [(0.01, 1), (0.1, 1), (1.0, 3), (math.inf, 3)]
    assert merged.sum == pytest.approx(1.005)
