"""The Prometheus endpoint end to end: real ``naiad serve`` / ``naiad gateway`` processes,
real workers, NVIDIA's tritonclient as the client, and the text each scrape returns.

Names, types and labels are Triton's (docs/user_guide/metrics.md; failure reasons and the
pending-request gauge as Triton's core exports them), ``naiad_*`` for the rest."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from naiad_harness import wait_for
from prom_text import Scrape, parse
from tritonclient.utils import InferenceServerException

from naiad.host import GpuReader

V1 = {"model": "digits", "version": "1"}
TRITON_COUNTERS = [
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
]
DURATIONS = [name for name in TRITON_COUNTERS if name.endswith("_us")]
REASONS = ["REJECTED", "CANCELED", "BACKEND", "OTHER"]


def scrape(server) -> Scrape:
    return parse(server.metrics())


def infer(server, rows: int, **kwargs):
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        x = np.random.default_rng(rows).uniform(0, 16, (rows, 64)).astype(np.float32)
        tensor = httpclient.InferInput("input", [rows, 64], "FP32")
        tensor.set_data_from_numpy(x)
        return client.infer("digits", [tensor], **kwargs)
    finally:
        client.close()


def model_bytes(repository) -> int:
    return sum(p.stat().st_size for p in (repository / "digits" / "1").rglob("*") if p.is_file())


def test_cold_starts_downloads_and_scaler_decisions(naiad_server, example_repository):
    server = naiad_server(idle_timeout_s=2, extra_args=["--warm-pool-size", "0"])  # bare processes
    before = scrape(server)
    assert before.value("naiad_model_workers", model="digits") == 0
    assert before.value("naiad_cold_starts_total", model="digits") == 0
    assert before.value("naiad_cold_start_seconds_count", model="digits") == 0
    assert before.value("naiad_model_download_bytes_total", model="digits") == 0
    assert "naiad_scaler_decisions_total" not in before.samples  # no decision yet

    infer(server, 3)  # the first cold start
    first = scrape(server)
    assert first.value("naiad_model_workers", model="digits") == 1
    assert first.value("naiad_cold_starts_total", model="digits") == 1
    assert first.value("naiad_cold_start_seconds_count", model="digits") == 1
    assert first.value("naiad_cold_start_seconds_bucket", model="digits", le="+Inf") == 1
    assert first.value("naiad_cold_start_seconds_bucket", model="digits", le="0.1") == 0  # a process start
    assert 0 < first.value("naiad_cold_start_seconds_sum", model="digits") < 30
    downloaded = first.value("naiad_model_download_bytes_total", model="digits")
    assert downloaded == model_bytes(example_repository)
    assert first.value("naiad_model_download_seconds_total", model="digits") > 0
    assert first.value("naiad_scaler_decisions_total", model="digits", action="start") == 1
    assert first.value("naiad_cold_starts_total", model="silero_vad") == 0

    wait_for(lambda: scrape(server).value("naiad_model_workers", model="digits") == 0, 20, "idle exit")
    infer(server, 1)  # the second cold start, the version served from the local cache
    second = scrape(server)
    assert second.value("naiad_cold_starts_total", model="digits") == 2
    assert second.value("naiad_cold_start_seconds_count", model="digits") == 2
    assert second.value("naiad_cold_start_seconds_sum", model="digits") > first.value(
        "naiad_cold_start_seconds_sum", model="digits"
    )
    assert second.value("naiad_model_download_bytes_total", model="digits") == downloaded
    assert second.value("naiad_scaler_decisions_total", model="digits", action="start") == 2
    assert second.value("nv_inference_request_success", **V1) == 2
    assert second.value("nv_inference_count", **V1) == 4


def test_counts_durations_and_failures_are_exact(naiad_server):
    server = naiad_server(request_timeout_s=30)
    infer(server, 1)  # cold start outside the measured window
    before = scrape(server)
    sizes = [1, 3, 8]
    for rows in sizes:
        infer(server, rows)
    with pytest.raises(InferenceServerException):
        infer(server, 2, timeout=1)  # 1 µs: expires before any answer: REJECTED
    bad = httpclient.InferInput("nope", [1, 64], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 64), np.float32))
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException):
        client.infer("digits", [bad])  # invalid: never reached the model, not counted
    client.close()
    after = scrape(server)

    def grown(name: str, **labels: str) -> float:
        return after.value(name, **labels) - before.value(name, **labels)

    assert grown("nv_inference_request_success", **V1) == 3
    assert grown("nv_inference_count", **V1) == 12  # rows
    assert grown("nv_inference_exec_count", **V1) == 3  # one batch per sequential request
    for name in DURATIONS:
        assert grown(name, **V1) > 0, name
    assert grown("nv_inference_request_failure", **V1, reason="REJECTED") == 1
    for reason in ("CANCELED", "BACKEND", "OTHER"):
        assert grown("nv_inference_request_failure", **V1, reason=reason) == 0
    # The statistics extension reads the same counters: the same numbers, no second count.
    url = f"{server.http}/v2/models/digits/versions/1/stats"
    (stat,) = requests.get(url, timeout=10).json()["model_stats"]
    assert stat["inference_stats"]["success"]["count"] == after.value("nv_inference_request_success", **V1)
    failed = sum(after.value("nv_inference_request_failure", **V1, reason=r) for r in REASONS)
    assert stat["inference_stats"]["fail"]["count"] == failed
    assert stat["inference_count"] == after.value("nv_inference_count", **V1)
    assert stat["execution_count"] == after.value("nv_inference_exec_count", **V1)
    queue_us = after.value("nv_inference_queue_duration_us", **V1)
    assert stat["inference_stats"]["queue"]["ns"] // 1000 == queue_us
    # The expired request stays in the stream until the worker reads it and answers it.
    pending = lambda: scrape(server).value("nv_inference_pending_request_count", **V1)  # noqa: E731
    wait_for(lambda: pending() == 0, 10, "no request pending")


def test_names_types_and_labels_are_tritons(naiad_server):
    server = naiad_server()
    infer(server, 2)
    found = scrape(server)
    for name in TRITON_COUNTERS:
        assert found.types.get(name) == "counter", name
        assert found.helps.get(name), name
        expected = {"model", "version", "reason"} if name.endswith("_failure") else {"model", "version"}
        assert found.label_names(name) == {frozenset(expected)}, name
    assert {dict(k)["reason"] for k in found.samples["nv_inference_request_failure"]} == set(REASONS)
    assert found.types["nv_inference_pending_request_count"] == "gauge"
    assert found.label_names("nv_inference_pending_request_count") == {frozenset({"model", "version"})}
    for name in ("nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes"):
        assert found.types[name] == "gauge" and found.label_names(name) == {frozenset()}, name
    assert 0 <= found.value("nv_cpu_utilization") <= 1
    assert 0 < found.value("nv_cpu_memory_used_bytes") < found.value("nv_cpu_memory_total_bytes")
    naiad = {
        "naiad_model_workers": "gauge",
        "naiad_queue_depth": "gauge",
        "naiad_cold_starts_total": "counter",
        "naiad_cold_start_seconds": "histogram",
        "naiad_model_download_bytes_total": "counter",
        "naiad_model_download_seconds_total": "counter",
        "naiad_model_loads_total": "counter",
        "naiad_model_load_seconds_total": "counter",
        "naiad_warm_pool_claims_total": "counter",
        "naiad_scaler_decisions_total": "counter",
    }
    for name, kind in naiad.items():
        assert found.types.get(name) == kind, name
    assert found.label_names("naiad_scaler_decisions_total") == {frozenset({"model", "action"})}
    assert not [name for name in found.types if name.startswith("nv_") and name.endswith("_total")]
    if not GpuReader()():  # this machine: no GPU (or no NVML): no GPU series, no error
        assert not [name for name in found.types if name.startswith("nv_gpu_")]


def _timed_out_requests(server, count: int) -> list[threading.Thread]:
    def send() -> None:
        with pytest.raises(InferenceServerException):
            infer(server, 1)

    threads = [threading.Thread(target=send) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads


def test_pending_requests_and_two_gateways_agree(redis_url, naiad_server):
    lone = naiad_server(redis_url=redis_url, command="gateway", request_timeout_s=3)  # no scaler
    threads = _timed_out_requests(lone, 3)
    wait_for(lambda: scrape(lone).get("nv_inference_pending_request_count", **V1) == 3, 10, "3 pending")
    queued = scrape(lone)
    assert queued.value("naiad_queue_depth", model="digits") == 3
    assert queued.value("naiad_model_workers", model="digits") == 0
    for thread in threads:
        thread.join(30)
    assert scrape(lone).value("nv_inference_request_failure", **V1, reason="REJECTED") == 3

    serve = naiad_server(redis_url=redis_url)  # its scaler starts a worker for the backlog
    wait_for(lambda: scrape(serve).get("nv_inference_pending_request_count", -1, **V1) == 0, 30, "drained")
    infer(serve, 2)
    infer(lone, 5)
    scrape(serve)  # each gateway writes what it holds before it answers a scrape (for up to
    scrape(lone)  # LINGER_S): a scrape of one alone may come first (5 requests take ~5 ms)
    views = [scrape(lone), scrape(serve)]
    shared = [n for n in views[0].samples if n.startswith(("nv_inference", "naiad_"))]
    assert shared and all(views[0].samples[n] == views[1].samples[n] for n in shared)
    assert views[0].value("nv_inference_request_success", **V1) == 2
    assert views[0].value("nv_inference_count", **V1) == 7
    assert views[0].value("naiad_cold_starts_total", model="digits") == 1
