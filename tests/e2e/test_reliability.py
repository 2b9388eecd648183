"""Faults with real processes: a frozen worker's duplicate, clients that go away, full
queues and an overloaded gateway, a Redis that stops and comes back empty, an object store
that goes away. Each test runs ``naiad serve`` and real workers against a private Redis."""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import aiohttp
import numpy as np
import psutil
import pytest
import redis
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from naiad_harness import ROOT, answers_http, free_port, upload_tree, wait_for

from naiad import keys
from naiad.redis_server import EmbeddedRedis

STREAM = keys.request_stream("digits")


def http_inputs(x: np.ndarray) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return [tensor]


def grpc_inputs(x: np.ndarray) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return [tensor]


def json_body(x: np.ndarray) -> dict:
    return {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                        "data": x.flatten().tolist()}]}  # fmt: skip


def model_stats(server, model: str = "digits") -> dict:
    body = requests.get(f"{server.http}/v2/models/{model}/stats", timeout=5).json()
    return body["model_stats"][0]


def failures(server, reason: str) -> float:
    match = re.search(rf'^nv_inference_request_failure\{{[^}}]*reason="{reason}"[^}}]*\}} (\S+)$',
                      server.metrics(), re.M)  # fmt: skip
    return float(match.group(1)) if match else 0.0


def frozen_worker(server, client, x):
    """Warm the model, then SIGSTOP its one worker right after it answered (so it is frozen
    while blocked in XREADGROUP: Redis still hands it the next entry)."""
    client.infer("digits", http_inputs(x))
    (worker,) = server.worker_processes("digits")
    worker.send_signal(signal.SIGSTOP)
    return worker


#: For tests of what the stream's claims do with a frozen worker: with direct hand-off
#: (naiad.reply_channel) the idle worker's next request would reach it outside the stream
#: (that path: tests/e2e/test_direct_hand_off.py).
STREAM_ONLY = {"NAIAD_DIRECT_REQUESTS": "0"}


def pending_for(r: redis.Redis) -> int:
    return r.xpending(STREAM, keys.WORKER_GROUP)["pending"]


def test_a_frozen_workers_duplicate_never_reaches_the_client(
    redis_url, naiad_server, digits_holdout, digits_onnx, example_repository, tmp_path
):
    """Worker A is frozen holding a request; worker B reclaims and answers it; A resumes.
    The client gets one, right answer; A never runs the entry (it is no longer pending for A:
    :meth:`QueueReader.still_ours`), so the statistics count one execution and one success."""
    server = naiad_server(redis_url=redis_url, idle_timeout_s=30, extra_env=STREAM_ONLY)
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    x = digits_holdout[0][:3]
    a = frozen_worker(server, client, x)
    before = model_stats(server)
    r = redis.Redis.from_url(redis_url)
    answers: list = []

    def call() -> None:
        try:
            own = httpclient.InferenceServerClient(server.url, network_timeout=60)  # gevent: per thread
            answers.append(own.infer("digits", http_inputs(x)))
        except Exception as exc:  # shown by the assertion below
            answers.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    b, b_log = None, tmp_path / "b.log"
    try:
        wait_for(lambda: pending_for(r) == 1, 10, "the frozen worker's claim")
        with b_log.open("wb") as log:
            b = subprocess.Popen(
                [sys.executable, "-m", "naiad_cli", "worker", "--model", "digits", "--redis-url", redis_url,
                 "--model-repository", str(example_repository), "--idle-timeout", "30",
                 "--cache-dir", str(tmp_path / "b-cache")],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        caller.join(timeout=40)
        assert not caller.is_alive(), f"the request was not answered; worker B:\n{b_log.read_text()}"
    finally:
        a.send_signal(signal.SIGCONT)
    try:
        assert not isinstance(answers[0], Exception), answers[0]
        expected = digits_onnx.run(["label"], {"input": x})[0]
        np.testing.assert_array_equal(answers[0].as_numpy("label"), expected)
    finally:
        b.terminate()  # drains and exits
        assert b.wait(30) == 0
    # A serves on. It meets its stale claim before this request (one stream, read in order),
    # finds the entry taken and runs nothing: only B's batch and this one were executed.
    again = client.infer("digits", http_inputs(x)).as_numpy("label")
    np.testing.assert_array_equal(again, answers[0].as_numpy("label"))
    after = model_stats(server)
    assert after["execution_count"] == before["execution_count"] + 2
    assert after["inference_count"] == before["inference_count"] + 2 * len(x)
    assert after["inference_stats"]["success"]["count"] == before["inference_stats"]["success"]["count"] + 2
    assert r.xlen(STREAM) == 0 and pending_for(r) == 0
    assert len(answers) == 1


@pytest.mark.parametrize("handed", [True, False], ids=["handed", "stream"])
def test_a_client_that_goes_away_cancels_its_queued_work(redis_url, naiad_server, digits_holdout, handed):
    """An HTTP client that disconnects and a cancelled gRPC call while the worker is frozen:
    withdrawn from the stream (``NAIAD_DIRECT_REQUESTS=0``), or, both handed to the idle
    worker (its offer is a batch), by its socket; the worker, resumed, runs neither
    (execution_count unchanged)."""
    server = naiad_server(redis_url=redis_url, idle_timeout_s=30, extra_env=None if handed else STREAM_ONLY)
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    x = digits_holdout[0][:2]
    worker = frozen_worker(server, client, x)
    r = redis.Redis.from_url(redis_url)
    before = model_stats(server)
    added = r.info("commandstats").get("cmdstat_xadd", {}).get("calls", 0)
    try:
        with pytest.raises(requests.Timeout):
            requests.post(f"{server.http}/v2/models/digits/infer", json=json_body(x), timeout=1.0)
        wait_for(lambda: r.xlen(STREAM) == 0 and pending_for(r) == 0, 5, "the HTTP request withdrawn")
        xadds = r.info("commandstats").get("cmdstat_xadd", {}).get("calls", 0) - added
        assert xadds == (0 if handed else 1)  # handed: never in the stream
        grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
        call = grpc_client.async_infer("digits", grpc_inputs(x), callback=lambda result, error: None)
        if handed:
            time.sleep(0.5)  # handed too (the offer is a batch): in no Redis structure to wait for
            assert r.xlen(STREAM) == 0
        else:
            wait_for(lambda: r.xlen(STREAM) == 1, 5, "the gRPC request queued")
        call.cancel()
        wait_for(lambda: r.xlen(STREAM) == 0 and pending_for(r) == 0, 5, "the gRPC request withdrawn")
        wait_for(lambda: failures(server, "CANCELED") == 2, 5, "two CANCELED failures")
    finally:
        worker.send_signal(signal.SIGCONT)
    # The resumed worker meets what it was handed or claimed before the next request, and
    # skips it: only the next request's rows are executed (a withdrawn one run with it would
    # add its rows).
    client.infer("digits", http_inputs(x))
    after = model_stats(server)
    assert after["execution_count"] == before["execution_count"] + 1
    assert after["inference_count"] == before["inference_count"] + len(x)


def test_a_full_queue_answers_503_with_retry_after_at_once(
    redis_url, naiad_server, example_repository, tmp_path, digits_holdout
):
    """Triton's per-model ``default_queue_policy { max_queue_size }`` (2) over the server's
    ``--max-queue-size`` (100), counting waiting requests only (the frozen worker's claimed
    one executes): with two waiting the next is refused at once, 503 + Retry-After over
    HTTP, UNAVAILABLE over gRPC; the queued ones are answered later."""
    repository = tmp_path / "repo"
    shutil.copytree(example_repository / "digits", repository / "digits")
    config = repository / "digits" / "config.pbtxt"
    config.write_text(config.read_text().replace(
        "max_queue_delay_microseconds: 2000",
        "max_queue_delay_microseconds: 2000\n  default_queue_policy { max_queue_size: 2 }",
    ))  # fmt: skip
    server = naiad_server(repository=repository, redis_url=redis_url, idle_timeout_s=30,
                          extra_args=["--max-queue-size", "100"], extra_env=STREAM_ONLY)  # fmt: skip
    client = httpclient.InferenceServerClient(server.url, network_timeout=60, concurrency=4)
    x = digits_holdout[0][:1]
    worker = frozen_worker(server, client, x)
    r = redis.Redis.from_url(redis_url)
    workers = keys.workers("digits")  # the frozen worker stays live however slow this runs
    r.zadd(workers, dict.fromkeys(r.zrange(workers, 0, -1), time.time() + 60))
    try:
        queued = [client.async_infer("digits", http_inputs(x)) for _ in range(3)]
        wait_for(lambda: r.xlen(STREAM) == 3 and pending_for(r) == 1, 5, "one claimed and two queued")
        # Answered while the worker is frozen: refused at once, not queued behind it.
        refused = requests.post(f"{server.http}/v2/models/digits/infer", json=json_body(x), timeout=5)
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
        assert "full" in refused.json()["error"]
        with pytest.raises(Exception, match="StatusCode.UNAVAILABLE"):
            grpcclient.InferenceServerClient(server.grpc_url).infer("digits", grpc_inputs(x))
        assert r.xlen(STREAM) == 3
    finally:
        worker.send_signal(signal.SIGCONT)
    for result in queued:
        assert result.get_result().as_numpy("label").shape == (1, 1)


def test_an_overloaded_gateway_refuses_past_its_inflight_bound(redis_url, naiad_server, digits_holdout):
    """A burst of 1000 concurrent requests (~21 KB of JSON each) at a gateway carrying at most 32:
    968 are refused at once (503 + Retry-After), and its memory hardly moves."""
    server = naiad_server(redis_url=redis_url, idle_timeout_s=30, request_timeout_s=30,
                          # one worker, the frozen one: a second would drain the admitted requests
                          extra_args=["--max-inflight", "32", "--max-queue-size", "100000",
                                      "--max-workers", "1"])  # fmt: skip
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    x = np.ascontiguousarray(digits_holdout[0][:64])
    worker = frozen_worker(server, client, x[:1])
    gateway = psutil.Process(server.process.pid)
    rss_before = gateway.memory_info().rss
    body = json_body(x)

    async def burst() -> tuple[list[int], float]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

            async def one() -> int:
                async with session.post(f"{server.http}/v2/models/digits/infer", json=body) as response:
                    await response.read()
                    return response.status

            tasks = [asyncio.create_task(one()) for _ in range(1000)]
            # The 968 refusals come back while the worker is frozen; on a loaded machine that
            # can take a while. Resume it only then, or admitted requests would free slots
            # for late arrivals and the count would depend on timing.
            deadline = time.monotonic() + 60
            while sum(task.done() for task in tasks) < 968 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            peak = gateway.memory_info().rss
            worker.send_signal(signal.SIGCONT)
            return list(await asyncio.gather(*tasks)), peak

    try:
        statuses, rss_peak = asyncio.run(burst())
    finally:
        worker.send_signal(signal.SIGCONT)
    assert statuses.count(503) == 968 and statuses.count(200) == 32
    growth_mib = (rss_peak - rss_before) / 2**20
    print(f"gateway RSS {rss_before / 2**20:.1f} MiB -> {rss_peak / 2**20:.1f} MiB under the burst")
    assert growth_mib < 64


def test_redis_stops_and_comes_back_empty(tmp_path, naiad_server, digits_holdout, digits_onnx):
    """Redis stops: 503 within a second, not ready; it comes back empty at the same address:
    the gateway re-indexes the registry, the worker (the same process) re-creates its group,
    and requests succeed again without restarting anything. (The first request may have been
    handed to the idle worker directly before it saw the outage, naiad.reply_channel, and be
    answered, rightly; a worker that sees Redis fail closes its connections to the gateway,
    which then refuses.)"""
    store = EmbeddedRedis(socket_path=tmp_path / "redis" / "redis.sock")
    (tmp_path / "redis").mkdir()
    store.start()
    try:
        server = naiad_server(redis_url=store.url, idle_timeout_s=60)
        client = httpclient.InferenceServerClient(server.url, network_timeout=60)
        x = digits_holdout[0][:4]
        expected = digits_onnx.run(["label"], {"input": x})[0]
        np.testing.assert_array_equal(client.infer("digits", http_inputs(x)).as_numpy("label"), expected)
        (worker,) = server.worker_processes("digits")
        store.kill()
        # Refused, not held until the request's own timeout (60 s): the client's 5 s would end first.
        statuses = []
        for _ in range(3):
            response = requests.post(f"{server.http}/v2/models/digits/infer", json=json_body(x), timeout=5)
            assert response.status_code in (200, 503), response.text
            if response.status_code == 200:  # handed to the worker directly: the right answer
                labels = [o for o in response.json()["outputs"] if o["name"] == "label"][0]["data"]
                assert labels == expected.ravel().tolist()
            statuses.append(response.status_code)
        assert statuses[1:] == [503, 503], statuses
        assert requests.get(f"{server.http}/v2/health/ready", timeout=5).status_code != 200
        time.sleep(3)  # the worker, scaler and reply reader see the outage for a while
        store.start()
        wait_for(lambda: requests.get(f"{server.http}/v2/health/ready", timeout=5).status_code == 200,
                 10, "ready again")  # fmt: skip
        got = client.infer("digits", http_inputs(x)).as_numpy("label")
        np.testing.assert_array_equal(got, expected)
        assert worker.is_running() and worker in server.worker_processes("digits")
        assert server.process.poll() is None
        assert "indexing again" in server.log()
    finally:
        store.stop()


def test_cached_models_serve_while_the_object_store_is_down(
    tmp_path, naiad_server, example_repository, digits_holdout, digits_onnx, monkeypatch
):
    """Its own moto server: ``digits`` is pulled once, then the store stops. A fresh worker
    serves ``digits`` from the local cache; ``digits_copy`` (never pulled) fails after the
    retries with a 503 that says why."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    port = free_port()
    moto = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: answers_http(endpoint), 60, "moto")
        import boto3

        s3 = boto3.client("s3", endpoint_url=endpoint)
        s3.create_bucket(Bucket="models")
        upload_tree(endpoint, "models", example_repository / "digits", "repo/digits")
        upload_tree(endpoint, "models", example_repository / "digits", "repo/digits_copy")
        config = (example_repository / "digits" / "config.pbtxt").read_text()
        s3.put_object(Bucket="models", Key="repo/digits_copy/config.pbtxt",
                      Body=config.replace('name: "digits"', 'name: "digits_copy"').encode())  # fmt: skip
        retries = {"NAIAD_PULL_ATTEMPTS": "3", "NAIAD_PULL_BACKOFF_S": "0.2"}
        server = naiad_server(repository=f"s3://127.0.0.1:{port}/models/repo", idle_timeout_s=2,
                              extra_env=retries)  # fmt: skip
        client = httpclient.InferenceServerClient(server.url, network_timeout=60)
        x = digits_holdout[0][:5]
        expected = digits_onnx.run(["label"], {"input": x})[0]
        np.testing.assert_array_equal(client.infer("digits", http_inputs(x)).as_numpy("label"), expected)
        wait_for(lambda: not server.worker_processes("digits"), 20, "scale to zero")
        moto.terminate()
        moto.wait(10)
        assert requests.get(f"{server.http}/v2/health/ready", timeout=10).status_code != 200
        np.testing.assert_array_equal(client.infer("digits", http_inputs(x)).as_numpy("label"), expected)
        assert "using the cached digits/1" in server.log()
        response = requests.post(f"{server.http}/v2/models/digits_copy/infer", json=json_body(x), timeout=60)
        assert response.status_code == 503, response.text
        assert "could not be pulled" in response.json()["error"] and "3 attempts" in response.json()["error"]
        assert "attempt 2 of 3" in server.log()
        # transient, not a fault of the model: it stays READY (workers/load_failure.py)
        assert requests.get(f"{server.http}/v2/models/digits_copy/ready", timeout=10).status_code == 200
    finally:
        moto.terminate()
        moto.wait(10)


SLOW_PY = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        time.sleep(1.0)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                .as_numpy())]) for r in requests]
"""


def test_a_slow_models_own_claims_are_not_reclaimed_as_a_dead_workers(tmp_path, naiad_server):
    """A 1 s model, no batching, requests queued behind it, heartbeats every 0.5 s: what the
    worker claimed with its replies while a request ran (idle past the reclaim's threshold) is
    its own, not a dead worker's: no request counts a lost delivery, each runs once."""
    model = tmp_path / "models" / "slow"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(SLOW_PY)
    tensors = ['input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]',
               'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]']  # fmt: skip
    (model / "config.pbtxt").write_text("\n".join(['backend: "python"', "max_batch_size: 0", *tensors]))
    server = naiad_server(repository=tmp_path / "models", extra_env={"NAIAD_HEARTBEAT_S": "0.5"})
    body = lambda i: {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [i]}]}  # noqa: E731
    url = f"{server.http}/v2/models/slow/infer"
    assert requests.post(url, json=body(0), timeout=60).status_code == 200  # a warm worker
    answers: dict[int, object] = {}

    def call(i: int) -> None:
        answers[i] = requests.post(url, json=body(i), timeout=60)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(1, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert {i: a.json()["outputs"][0]["data"] for i, a in answers.items()} == {i: [i] for i in range(1, 5)}
    assert "reclaimed a request left by a dead worker" not in server.log()
    assert model_stats(server, "slow")["execution_count"] == 5
