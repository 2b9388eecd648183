"""gateway.metrics rendering without a server: Triton's counter lines (no ``_total``), the
GPU gauges from injected readings, and nothing for GPUs where there is none."""

from __future__ import annotations

from prom_text import parse
from prometheus_client import CollectorRegistry

from gateway.metrics import SnapshotCollector, counter, render
from naiad.host import CpuReading, GpuReading
from naiad.telemetry import model_telemetry

CPU = CpuReading(0.25, 1000, 400)


def _render(gpus: list[GpuReading], models=()) -> str:
    registry = CollectorRegistry()
    collector = SnapshotCollector(read_gpus=lambda: gpus, read_cpu=lambda: CPU)
    collector.models = list(models)
    registry.register(collector)
    return render(registry).decode()


def test_gpu_gauges_carry_each_gpu_by_uuid():
    text = _render([GpuReading("GPU-a", 0.5, 10, 100, 70.25), GpuReading("GPU-b", 0.0, 0, 100, 20.0)])
    found = parse(text)
    assert found.value("nv_gpu_utilization", gpu_uuid="GPU-a") == 0.5
    assert found.value("nv_gpu_memory_used_bytes", gpu_uuid="GPU-a") == 10
    assert found.value("nv_gpu_memory_total_bytes", gpu_uuid="GPU-b") == 100
    assert found.value("nv_gpu_power_usage", gpu_uuid="GPU-a") == 70.25
    assert all(found.types[n] == "gauge" for n in found.types if n.startswith("nv_gpu_"))
    assert found.value("nv_cpu_utilization") == 0.25 and found.value("nv_cpu_memory_used_bytes") == 400


def test_no_gpu_no_gpu_families():
    assert "nv_gpu_" not in _render([])


def test_counters_keep_tritons_names():
    model = model_telemetry("m", [1], {"1:success_count": 4, "1:success_ns": 5_000_999}, {}, 0, 0)
    text = _render([], [model])
    assert "# TYPE nv_inference_request_success counter\n" in text
    assert 'nv_inference_request_success{model="m",version="1"} 4.0\n' in text
    assert 'nv_inference_request_duration_us{model="m",version="1"} 5000.0\n' in text
    assert "_success_total" not in text
    registry = CollectorRegistry()
    family = counter("x_total", "help")
    family.add_sample("x_total", {}, 1)
    registry.register(type("C", (), {"collect": lambda self: [family]})())
    assert render(registry) == b"# HELP x_total help\n# TYPE x_total counter\nx_total 1.0\n"
