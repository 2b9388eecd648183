"""``bench.scenarios.median_series``: the points of a peers run of several rounds."""

from __future__ import annotations

import pytest

from bench.scenarios import median_series, parse_args, round_order, rounds_note


def series(label: str, rnd: int, rps: dict[int, float]) -> dict:
    points = [{"concurrency": c, "throughput_rps": r, "requests": 10, "latency_ms": {"p50": 1000 / r}}
              for c, r in rps.items()]  # fmt: skip
    return {"label": label, "round": rnd, "points": points}


def test_each_point_is_its_median_round_with_every_rounds_throughput():
    runs = [series("triton json", 1, {1: 900, 32: 6000}), series("naiad json", 1, {1: 800, 32: 5000}),
            series("naiad json", 2, {1: 700, 32: 3000}), series("triton json", 2, {1: 1000, 32: 9000}),
            series("triton json", 3, {1: 950, 32: 4000}),
            series("naiad json", 3, {1: 750, 32: 5500})]  # fmt: skip
    merged = median_series(runs)
    assert [s["label"] for s in merged] == ["triton json", "naiad json"]
    triton, naiad = ({p["concurrency"]: p for p in s["points"]} for s in merged)
    assert triton[32]["throughput_rps"] == 6000 and triton[1]["throughput_rps"] == 950
    assert naiad[32]["throughput_rps"] == 5000 and naiad[1]["throughput_rps"] == 750
    assert naiad[32]["latency_ms"]["p50"] == 1000 / 5000  # the whole point of that round
    assert naiad[32]["round_rps"] == [5000, 3000, 5500]
    note = rounds_note(merged, 3)
    assert "median of 3 rounds" in note and "| naiad json | c32 | 5000 · 3000 · 5500 |" in note


def test_an_even_count_takes_the_lower_median():
    merged = median_series([series("x", 1, {32: 10}), series("x", 2, {32: 30})])
    assert merged[0]["points"][0]["throughput_rps"] == 10


def test_rounds_rotate_the_servers_past_their_count():
    orders = [round_order(["a", "b"], rnd)[0] for rnd in range(4)]
    assert orders == ["a", "b", "a", "b"]


def test_fewer_than_one_round_is_refused():
    with pytest.raises(SystemExit):
        parse_args(["peers", "--rounds", "0"])
    assert parse_args(["peers", "--rounds", "2"])[0].rounds == 2
