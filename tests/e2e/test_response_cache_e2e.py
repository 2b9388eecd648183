"""The response cache end to end: real ``naiad serve`` / ``naiad gateway`` processes, real
workers, NVIDIA's tritonclient. The repository is a copy of the example's with ``cached`` and
``versioned`` (the digits model with ``response_cache { enable: true }``) beside the plain
``digits``. Each test uses inputs of its own, so the tests do not depend on their order."""

from __future__ import annotations

import asyncio
import itertools
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import redis
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from naiad_harness import run_server, start_server, wait_for
from tritonclient.utils import InferenceServerException

from naiad import keys
from naiad.redis_server import EmbeddedRedis

IDLE_S = 2
CAP_BYTES = 4096
POLL = ["--model-control-mode", "poll", "--repository-poll-secs", "0.5"]
_SEEDS = itertools.count(1000)


def cached_copy(repository: Path, name: str) -> None:
    """The example ``digits`` copied as model ``name`` with the response cache enabled."""
    shutil.copytree(repository / "digits", repository / name)
    config = repository / name / "config.pbtxt"
    text = config.read_text().replace('name: "digits"', f'name: "{name}"')
    config.write_text(text + "response_cache { enable: true }\n")


@pytest.fixture(scope="module")
def repository(example_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = Path(shutil.copytree(example_repository, tmp_path_factory.mktemp("rc") / "models"))
    shutil.rmtree(root / "silero_vad")
    cached_copy(root, "cached")
    cached_copy(root, "versioned")
    return root


@pytest.fixture(scope="module")
def shared_redis():
    with EmbeddedRedis() as server:
        yield server.url


@pytest.fixture(scope="module")
def serve(repository, tmp_path_factory, shared_redis):
    args = [*POLL, f"--cache-config=redis,max_bytes={CAP_BYTES}"]
    with run_server(repository, tmp_path_factory.mktemp("rc-serve"), redis_url=shared_redis,
                    idle_timeout_s=IDLE_S, extra_args=args) as server:  # fmt: skip
        yield server


@pytest.fixture(scope="module")
def http(serve):
    client = httpclient.InferenceServerClient(serve.url, network_timeout=60)
    yield client
    client.close()


def fresh_input(rows: int = 1) -> np.ndarray:
    """A digits input no other test sends."""
    return np.random.default_rng(next(_SEEDS)).integers(0, 17, (rows, 64)).astype(np.float32)


def infer(client, model: str, x: np.ndarray, binary: bool = True, **kwargs):
    tensor = httpclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    return client.infer(model, [tensor], **kwargs)


def stat(client, model: str, version: str = "1") -> dict:
    (found,) = client.get_inference_statistics(model, version)["model_stats"]
    return found


def counts(before: dict, after: dict) -> tuple[int, int, int]:
    """(cache hits, cache misses, executions) between two statistics snapshots."""
    def grown(kind: str) -> int:
        return after["inference_stats"][kind]["count"] - before["inference_stats"][kind]["count"]

    return grown("cache_hit"), grown("cache_miss"), after["execution_count"] - before["execution_count"]


def test_a_json_request_then_a_binary_one_with_the_same_tensor_hit(http):
    x = fresh_input()
    before = stat(http, "cached")
    first = infer(http, "cached", x, binary=False, request_id="json")
    second = infer(http, "cached", x, binary=True, request_id="binary")
    assert second.get_response()["id"] == "binary" and first.get_response()["id"] == "json"
    np.testing.assert_array_equal(first.as_numpy("probabilities"), second.as_numpy("probabilities"))
    assert counts(before, stat(http, "cached")) == (1, 1, 1)


def test_a_model_without_response_cache_is_never_cached(http):
    x = fresh_input()
    before = stat(http, "digits")
    for _ in range(3):
        infer(http, "digits", x)
    assert counts(before, stat(http, "digits")) == (0, 0, 3)


def test_hits_are_answered_at_zero_workers(serve, http):
    x = fresh_input(2)
    expected = infer(http, "cached", x).as_numpy("label")  # a cold start, then stored
    wait_for(lambda: serve.workers("cached") == 0, 20, "the worker's idle exit")
    wait_for(lambda: not serve.worker_processes("cached"), 20, "the worker process to end")
    before = stat(http, "cached")
    grpc = grpcclient.InferenceServerClient(serve.grpc_url)
    try:
        tensor = grpcclient.InferInput("input", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        via_grpc = grpc.infer("cached", [tensor], request_id="g", client_timeout=10)
    finally:
        grpc.close()
    np.testing.assert_array_equal(via_grpc.as_numpy("label"), expected)
    assert via_grpc.get_response().id == "g"
    np.testing.assert_array_equal(infer(http, "cached", x).as_numpy("label"), expected)
    assert serve.worker_processes("cached") == [] and serve.workers("cached") == 0
    assert counts(before, stat(http, "cached")) == (2, 0, 0)
    series = r'^nv_cache_num_hits_per_model\{model="cached",version="1"\} (\S+)$'
    hits = re.search(series, serve.metrics(), re.M)
    assert hits and float(hits.group(1)) >= 2


async def _burst(url: str, x: np.ndarray, k: int) -> list[np.ndarray]:
    client = aiohttpclient.InferenceServerClient(url, conn_limit=k)
    tensor = aiohttpclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    try:
        results = await asyncio.gather(*[client.infer("cached", [tensor]) for _ in range(k)])
        return [r.as_numpy("label") for r in results]
    finally:
        await client.close()


def test_identical_concurrent_requests_execute_once(serve, http):
    k, x = 16, fresh_input(3)
    before = stat(http, "cached")
    labels = asyncio.run(asyncio.wait_for(_burst(serve.url, x, k), 60))
    assert all(np.array_equal(label, labels[0]) for label in labels)
    hits, misses, executions = counts(before, stat(http, "cached"))
    assert (hits, misses, executions) == (k - 1, 1, 1)


def test_the_size_cap_holds(serve, http, shared_redis):
    xs = [fresh_input() for _ in range(60)]  # ~110 bytes each: far more than the cap holds
    for x in xs:
        infer(http, "cached", x)
    client = redis.Redis.from_url(shared_redis)
    try:
        assert 0 < int(client.get(keys.RESPONSE_CACHE_BYTES)) <= CAP_BYTES
        entry = re.compile(rb"naiad:\{[^}]*\}:cache:[0-9a-f]{64}")  # not the in-flight keys
        entries = [k for k in client.scan_iter("naiad:*:cache:*") if entry.fullmatch(k)]
        assert sum(client.strlen(e) for e in entries) <= CAP_BYTES
    finally:
        client.close()
    before = stat(http, "cached")
    infer(http, "cached", xs[0])  # the oldest: evicted, so it runs again
    infer(http, "cached", xs[-1])  # the newest: still there
    assert counts(before, stat(http, "cached")) == (1, 1, 1)


def test_a_new_version_never_serves_the_old_versions_entry(serve, http, repository):
    x = fresh_input()
    assert infer(http, "versioned", x).get_response()["model_version"] == "1"
    staging = repository / "versioned" / ".2"
    shutil.copytree(repository / "versioned" / "1", staging)
    staging.rename(repository / "versioned" / "2")
    wait_for(lambda: http.get_model_metadata("versioned")["versions"] == ["2"], 20, "version 2 to be served")
    # The version-1 worker drains on its next heartbeat; until then it would answer 404.
    wait_for(lambda: not serve.worker_processes("versioned"), 20, "the version-1 worker to exit")
    result = infer(http, "versioned", x)
    assert result.get_response()["model_version"] == "2"
    v2 = stat(http, "versioned", "2")
    assert v2["execution_count"] == 1 and v2["inference_stats"]["cache_hit"]["count"] == 0
    assert v2["inference_stats"]["cache_miss"]["count"] == 1


async def _aio_infer(client, x: np.ndarray, **kwargs) -> np.ndarray:
    tensor = aiohttpclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return (await client.infer("cached", [tensor], **kwargs)).as_numpy("label")


async def _failing_leader(gateway, repository: Path, redis_url: str, workdir: Path) -> None:
    x = fresh_input()
    client = aiohttpclient.InferenceServerClient(gateway.url)
    try:
        leader = asyncio.create_task(_aio_infer(client, x, timeout=1_000_000))  # µs
        await asyncio.sleep(0.3)
        followers = [asyncio.create_task(_aio_infer(client, x)) for _ in range(3)]
        with pytest.raises(InferenceServerException, match="timed out"):
            await leader
        await asyncio.sleep(0.5)
        assert not any(f.done() for f in followers)  # a new leader among them, waiting
        server = await asyncio.to_thread(start_server, repository, workdir, redis_url=redis_url)
        try:
            labels = await asyncio.wait_for(asyncio.gather(*followers), 60)
            assert all(np.array_equal(label, labels[0]) for label in labels)
            (found,) = (await client.get_inference_statistics("cached", "1"))["model_stats"]
            assert found["execution_count"] == 1  # the expired leader's entry never ran
        finally:
            await asyncio.to_thread(server.stop)
    finally:
        await client.close()


def test_followers_of_a_failing_leader_get_an_answer(repository, tmp_path):
    """A gateway with no scaler: the leader's 1 s timeout passes (no worker can start), its
    followers elect a new leader among themselves; once a scaler arrives (a ``naiad serve``
    on the same Redis) that one run answers them all."""
    with EmbeddedRedis() as private, run_server(repository, tmp_path / "gw", redis_url=private.url,
                                                command="gateway") as gateway:  # fmt: skip
        asyncio.run(_failing_leader(gateway, repository, private.url, tmp_path / "serve"))
