"""The peers report's reference bounds (bench/scenarios.py: bounds, cost_bounds): what Naiad's
c32 points could reach at their measured costs, one gateway loop or every core busy."""

import os
from types import SimpleNamespace

import pytest

from bench import scenarios


def _point(rps: float, client_cpu: float, **cpu_us: float) -> dict:
    costs = {"cpu_us_per_request": cpu_us} if cpu_us else {}
    return {"concurrency": 32, "requests": int(rps * 5), "throughput_rps": rps, "client_cpu": client_cpu,
            "latency_ms": {"p50": 3.0}, "costs": costs}  # fmt: skip


def _run(series: dict[str, dict]) -> SimpleNamespace:
    listed = [{"label": label, "points": [p]} for label, p in series.items()]
    return SimpleNamespace(get=lambda label: next((s for s in listed if s["label"] == label), None))


def test_one_loop_and_all_cores_from_the_measured_costs():
    # 4,000 req/s with the load generator at 0.2 cores: 50 µs of client CPU a request.
    naiad = _point(4000, 0.2, server=125.0, **{"redis-server": 10.0, "worker": 65.0})
    loop, cores = scenarios.cost_bounds(naiad)
    assert loop["throughput_rps"] == pytest.approx(1e6 / 125.0)
    assert cores["throughput_rps"] == pytest.approx((os.cpu_count() or 1) * 1e6 / (125 + 10 + 65 + 50))


def test_bounds_are_reference_lines_over_tritons_throughput():
    naiad = _point(4000, 0.0, server=100.0, worker=100.0)
    run = _run({"naiad onnx json": naiad, "triton python json": _point(12500, 0.1)})
    lines = {t["name"]: t for t in scenarios.bounds(run)}
    loop = lines["reference: c32 naiad onnx json, one gateway loop's bound / triton"]
    assert loop["value"] == pytest.approx(10_000 / 12_500)
    cores = lines["reference: c32 naiad onnx json, all cores' bound / triton"]
    assert cores["value"] == pytest.approx((os.cpu_count() or 1) * 1e6 / 200 / 12_500)
    assert all(name.startswith("reference: ") for name in lines)


def test_a_point_without_costs_has_no_bound():
    assert scenarios.cost_bounds(_point(4000, 0.1)) == (None, None)
    assert scenarios.cost_bounds(None) == (None, None)
    run = _run({"triton python json": _point(12500, 0.1)})
    assert all(t["value"] is None and t["met"] is None for t in scenarios.bounds(run))
