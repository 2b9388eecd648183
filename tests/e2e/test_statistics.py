"""Triton's statistics extension end to end: a ``naiad serve`` and a second ``naiad gateway`` on
the same Redis, driven by NVIDIA's tritonclient (http and grpc). Every check compares a
snapshot before and after its own requests, so the tests do not depend on their order."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from naiad_harness import run_server
from tritonclient.utils import InferenceServerException

from naiad.redis_server import EmbeddedRedis
from naiad.stats import DURATIONS, PHASES


@pytest.fixture(scope="module")
def shared_redis():
    with EmbeddedRedis() as server:
        yield server.url


@pytest.fixture(scope="module")
def serve(example_repository, tmp_path_factory, shared_redis):
    with run_server(example_repository, tmp_path_factory.mktemp("stats-a"), redis_url=shared_redis) as server:
        yield server


@pytest.fixture(scope="module")
def second_gateway(example_repository, tmp_path_factory, shared_redis, serve):
    """A gateway alone (no scaler) on the same Redis: ``serve``'s scaler starts the workers."""
    workdir = tmp_path_factory.mktemp("stats-b")
    with run_server(example_repository, workdir, redis_url=shared_redis, command="gateway") as server:
        yield server


@pytest.fixture(scope="module")
def http(serve):
    client = httpclient.InferenceServerClient(serve.url, network_timeout=60)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(serve):
    client = grpcclient.InferenceServerClient(serve.grpc_url)
    yield client
    client.close()


def infer(client, rows: int, **kwargs):
    x = np.random.default_rng(rows).uniform(0, 16, (rows, 64)).astype(np.float32)
    tensor = httpclient.InferInput("input", [rows, 64], "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer("digits", [tensor], **kwargs)


def digits(client) -> dict:
    (stat,) = client.get_inference_statistics("digits", "1")["model_stats"]
    return stat


def from_message(response) -> list[dict]:
    """A ``ModelStatisticsResponse`` in the HTTP JSON shape, field by field."""

    def duration(message) -> dict:
        return {"count": message.count, "ns": message.ns}

    return [
        {
            "name": s.name,
            "version": s.version,
            "last_inference": s.last_inference,
            "inference_count": s.inference_count,
            "execution_count": s.execution_count,
            "inference_stats": {k: duration(getattr(s.inference_stats, k)) for k in DURATIONS},
            "batch_stats": [
                {"batch_size": b.batch_size, **{p: duration(getattr(b, p)) for p in PHASES}}
                for b in s.batch_stats
            ],
            "response_stats": dict(s.response_stats),
            "memory_usage": list(s.memory_usage),
        }
        for s in response.model_stats
    ]


def delta(before: dict, after: dict, kind: str, field: str = "count") -> int:
    return after["inference_stats"][kind][field] - before["inference_stats"][kind][field]


def batch_counts(stat: dict) -> dict[int, int]:
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stat["batch_stats"]}


def test_sequential_requests_count_exactly(http):
    infer(http, 1)  # the cold start happens here, outside the measured window
    before, started_ms = digits(http), time.time() * 1000
    sizes = [1, 3, 3, 8]
    for rows in sizes:
        infer(http, rows)
    after = digits(http)
    assert after["inference_count"] - before["inference_count"] == sum(sizes)
    assert after["execution_count"] - before["execution_count"] == len(sizes)
    for kind in ("success", "queue", *PHASES):
        assert delta(before, after, kind) == len(sizes), kind
        assert delta(before, after, kind, "ns") > 0, kind
    assert delta(before, after, "fail") == 0
    assert after["inference_stats"]["cache_hit"] == {"count": 0, "ns": 0}
    grown = {size: n - batch_counts(before).get(size, 0) for size, n in batch_counts(after).items()}
    assert {size: n for size, n in grown.items() if n} == {1: 1, 3: 2, 8: 1}
    by_size = {b["batch_size"]: b for b in after["batch_stats"]}
    assert all(by_size[8][p]["ns"] > 0 for p in PHASES)
    assert started_ms - 1000 <= after["last_inference"] <= time.time() * 1000 + 1000


async def _burst(url: str, count: int) -> None:
    """``count`` single-row requests at once (tritonclient.http.aio), so they can batch."""
    client = aiohttpclient.InferenceServerClient(url)
    tensor = aiohttpclient.InferInput("input", [1, 64], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 64), np.float32))
    try:
        await asyncio.gather(*[client.infer("digits", [tensor]) for _ in range(count)])
    finally:
        await client.close()


def test_concurrent_burst_batches_at_most_once_per_request(http, serve):
    infer(http, 1)
    before = digits(http)
    asyncio.run(asyncio.wait_for(_burst(serve.url, 32), 60))
    after = digits(http)
    inferred = after["inference_count"] - before["inference_count"]
    executed = after["execution_count"] - before["execution_count"]
    assert inferred == 32 and delta(before, after, "success") == 32
    assert 1 <= executed <= inferred
    # Rows of the new batches, by size, add up to the rows inferred.
    rows = sum(size * (n - batch_counts(before).get(size, 0)) for size, n in batch_counts(after).items())
    assert rows == inferred


def test_failures_count_only_requests_that_reached_the_model(http):
    infer(http, 1)
    before = digits(http)
    with pytest.raises(InferenceServerException):
        infer(http, 2, timeout=1)  # 1 µs: the gateway gives up before any reply can come
    bad = httpclient.InferInput("nope", [1, 64], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 64), np.float32))
    with pytest.raises(InferenceServerException):
        http.infer("digits", [bad])  # rejected by validation: never reached the model
    after = digits(http)
    assert delta(before, after, "fail") == 1 and delta(before, after, "fail", "ns") > 0
    assert delta(before, after, "success") == 0
    assert after["execution_count"] == before["execution_count"]


def test_http_grpc_and_a_second_gateway_report_the_same(http, grpc, second_gateway):
    other_http = httpclient.InferenceServerClient(second_gateway.url, network_timeout=60)
    other_grpc = grpcclient.InferenceServerClient(second_gateway.grpc_url)
    try:
        before = digits(http)
        for rows in (2, 5):
            infer(other_http, rows)  # through the other gateway; the same counters
        # The answering gateway first: its statistics call waits for its own pending writes
        # (they go out just after each answer), so every gateway sees them afterwards.
        views = [
            other_http.get_inference_statistics()["model_stats"],
            http.get_inference_statistics()["model_stats"],
            from_message(grpc.get_inference_statistics()),
            from_message(other_grpc.get_inference_statistics()),
        ]
        assert all(view == views[0] for view in views[1:])
        assert {(s["name"], s["version"]) for s in views[0]} == {("digits", "1"), ("silero_vad", "1")}
        after = digits(http)
        assert after["inference_count"] - before["inference_count"] == 7
        assert delta(before, after, "success") == 2
        assert from_message(grpc.get_inference_statistics("digits", "1")) == [after]
    finally:
        other_http.close()
        other_grpc.close()


def test_routes_and_errors(serve, grpc):
    base = f"{serve.http}/v2/models"
    everything = requests.get(f"{base}/stats", timeout=10).json()["model_stats"]
    per_model = requests.get(f"{base}/digits/stats", timeout=10).json()["model_stats"]
    assert [s["version"] for s in per_model] == ["1"]
    assert per_model[0]["name"] == "digits" and per_model[0] in everything
    for path in ("digits/versions/9/stats", "nope/stats", "nope/versions/1/stats"):
        response = requests.get(f"{base}/{path}", timeout=10)
        assert response.status_code == 404 and "error" in response.json(), path
    with pytest.raises(InferenceServerException) as info:
        grpc.get_inference_statistics("nope")
    assert info.value.status() == "StatusCode.NOT_FOUND"
    assert "statistics" in requests.get(f"{serve.http}/v2", timeout=10).json()["extensions"]
