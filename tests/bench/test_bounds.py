"""The peers report's reference lines (bench/scenarios.py: bounds, cost_bounds, reference):
what Naiad's c32 points could reach at their measured costs, the gateway loops or every core
busy, over Triton's throughput; never a target met or missed."""

from types import SimpleNamespace

import pytest

from bench import scenarios
from bench.perf import loadgen
from gateway.siblings import AUTO_MOST
from naiad.host import usable_cpus


def _point(rps: float, client_cpu: float, **cpu_us: float) -> dict:
    costs = {"cpu_us_per_request": cpu_us} if cpu_us else {}
    return {"concurrency": 32, "requests": int(rps * 5), "throughput_rps": rps, "client_cpu": client_cpu,
            "latency_ms": {"p50": 3.0}, "costs": costs}  # fmt: skip


def _run(series: dict[str, dict], args: dict[str, list[str]] | None = None) -> SimpleNamespace:
    listed = [{"label": label, "points": [p], "server": {"args": (args or {}).get(label, ["serve"])}}
              for label, p in series.items()]  # fmt: skip
    return SimpleNamespace(get=lambda label: next((s for s in listed if s["label"] == label), None))


def test_gateway_loops_and_all_cores_from_the_measured_costs():
    # 4,000 req/s with the load generator at 0.2 cores: 50 µs of client CPU a request.
    naiad = _point(4000, 0.2, server=125.0, **{"redis-server": 10.0, "worker": 65.0})
    loops, cores = scenarios.cost_bounds(naiad, cores=2)
    assert loops["throughput_rps"] == pytest.approx(1e6 / 125.0)
    assert cores["throughput_rps"] == pytest.approx(2 * 1e6 / (125 + 10 + 65 + 50))
    on_four, _ = scenarios.cost_bounds(naiad, cores=4, processes=3)  # three loops, three cores
    assert on_four["throughput_rps"] == pytest.approx(3 * 1e6 / 125.0)
    on_two, _ = scenarios.cost_bounds(naiad, cores=2, processes=3)  # three loops share two cores
    assert on_two["throughput_rps"] == pytest.approx(2 * 1e6 / 125.0)


def test_bounds_are_reference_lines_over_tritons_throughput():
    naiad = _point(4000, 0.0, server=100.0, worker=100.0)
    series = {"naiad onnx json": naiad, "naiad python json": naiad, "triton python json": _point(12500, 0.1)}
    run = _run(series, args={"naiad onnx json": ["serve", "--gateway-processes", "1"],
                             "naiad python json": ["serve", "--gateway-processes", "2"]})
    lines = {t["name"]: t for t in scenarios.bounds(run, cores=2)}
    loop = lines["reference: c32 naiad onnx json, gateway loops' bound / triton"]
    assert loop["value"] == pytest.approx(10_000 / 12_500)
    cores = lines["reference: c32 naiad onnx json, all cores' bound / triton"]
    assert cores["value"] == pytest.approx(2 * 1e6 / 200 / 12_500)
    two = lines["reference: c32 naiad python json, gateway loops' bound / triton"]
    assert two["value"] == pytest.approx(20_000 / 12_500)
    assert all(name.startswith("reference: ") for name in lines)
    assert all(t["met"] is None and t["goal"] == "—" for t in lines.values())


def test_gateway_processes_read_from_the_servers_arguments():
    assert scenarios.gateway_processes({"server": {"args": ["serve", "--gateway-processes=3"]}}) == 3
    assert scenarios.gateway_processes({"server": {"args": ["serve", "--gateway-processes", "2", "-v"]}}) == 2
    auto = min(usable_cpus(), AUTO_MOST)  # the default: one a CPU, at most AUTO_MOST
    assert scenarios.gateway_processes({"server": {"args": ["serve", "--http-port", "8000"]}}) == auto
    assert scenarios.gateway_processes({"server": {"args": ["serve", "--gateway-processes=0"]}}) == auto
    assert scenarios.gateway_processes(None) == auto


def test_a_point_without_costs_has_no_bound():
    assert scenarios.cost_bounds(_point(4000, 0.1), cores=2) == (None, None)
    assert scenarios.cost_bounds(None, cores=2) == (None, None)
    run = _run({"triton python json": _point(12500, 0.1)})
    assert all(t["value"] is None and t["met"] is None for t in scenarios.bounds(run, cores=2))


def test_a_reference_line_reads_throughput_or_p50_and_is_never_a_target():
    fast, slow = _point(8000, 0.1), {**_point(4000, 0.1), "latency_ms": {"p50": 6.0}}
    assert scenarios.reference("r", slow, fast)["value"] == pytest.approx(0.5)
    assert scenarios.reference("r", slow, fast, key="p50")["value"] == pytest.approx(2.0)
    assert scenarios.reference("r", None, fast) == {"name": "r", "value": None, "goal": "—", "met": None}


def test_cores_are_the_affinity_mask():
    assert 1 <= loadgen.cores() == loadgen.machine()["nproc"]
