"""A worker killed mid-request loses nothing: its claimed requests are reclaimed and answered,
and the model still scales back to zero afterwards."""

from __future__ import annotations

import concurrent.futures
import re
import signal
import threading
import time
from pathlib import Path

import numpy as np
import redis
import tritonclient.http as httpclient
from naiad_harness import wait_for
from tritonclient.utils import InferenceServerException

from naiad import keys


def digits_request(x: np.ndarray) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return [tensor]


def expected_labels(digits_onnx, x: np.ndarray) -> np.ndarray:
    return digits_onnx.run(["label"], {"input": x})[0]


def test_request_claimed_by_a_dead_worker_is_answered(redis_url, naiad_server, digits_holdout, digits_onnx):
    """Deterministic: freeze the worker while it blocks in XREADGROUP, so Redis hands it the
    request, then kill it; a new worker must reclaim the request and answer it. (Without
    direct hand-off, which would give the idle worker the request outside the stream: that
    path's kill is tests/e2e/test_direct_hand_off.py.)"""
    server = naiad_server(redis_url=redis_url, idle_timeout_s=3, extra_env={"NAIAD_DIRECT_REQUESTS": "0"})
    x = digits_holdout[0][:3]
    httpclient.InferenceServerClient(server.url).infer("digits", digits_request(x))
    (worker,) = server.worker_processes("digits")
    worker.send_signal(signal.SIGSTOP)
    answers: list = []

    def call() -> None:
        client = httpclient.InferenceServerClient(server.url, network_timeout=60)
        answers.append(client.infer("digits", digits_request(x)))

    caller = threading.Thread(target=call)
    caller.start()
    r = redis.Redis.from_url(redis_url)
    stream = keys.request_stream("digits")
    wait_for(lambda: r.xpending(stream, keys.WORKER_GROUP)["pending"] == 1, 10, "the frozen worker's claim")
    worker.kill()
    caller.join(timeout=40)
    assert not caller.is_alive(), "the request was lost"
    np.testing.assert_array_equal(answers[0].as_numpy("label"), expected_labels(digits_onnx, x))
    wait_for(lambda: server.workers("digits") == 0 and r.xlen(stream) == 0, 30, "scale to zero")
    assert "reclaimed a request left by a dead worker (1 lost deliveries)" in server.log()


def test_sigkill_under_traffic_loses_no_request(naiad_server, digits_holdout, digits_onnx):
    server = naiad_server(idle_timeout_s=3)
    x_all = digits_holdout[0]
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    client.infer("digits", digits_request(x_all[:1]))
    (worker,) = server.worker_processes("digits")
    stop = threading.Event()

    def loop(offset: int) -> int:
        own = httpclient.InferenceServerClient(server.url, network_timeout=60)
        done = 0
        while not stop.is_set() and done < 400:
            x = x_all[(offset + done) % 300 :][:2]
            got = own.infer("digits", digits_request(x)).as_numpy("label")
            np.testing.assert_array_equal(got, expected_labels(digits_onnx, x))
            done += 1
        return done

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(loop, 50 * i) for i in range(4)]
        wait_for(lambda: len(server.log()) > 0, 5, "traffic")
        threading.Event().wait(0.5)
        worker.kill()
        threading.Event().wait(1.0)
        stop.set()
        counts = [f.result(timeout=60) for f in futures]  # raises if any request failed
    assert all(count > 0 for count in counts)
    wait_for(lambda: server.workers("digits") == 0, 30, "scale to zero after the crash")


POISON_REPOSITORY = Path(__file__).parent / "crash_models"


def int_request(value: int) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("INPUT0", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return [tensor]


def test_a_request_that_kills_its_worker_fails_alone(naiad_server):
    """``poison`` exits its process on input 99. One such request batched with four good
    ones, those of the first write handed to the idle worker directly, the rest queued: the
    handed ones go back through the stream when it dies, are claimed and (mostly) batched by
    the next, which dies too; reclaimed, the four run
    alone (``REQUESTS`` 1), answered right, and the poison one crashes one more worker,
    running alone, then is answered with a clear 500 (:data:`workers.reclaim.MAX_CRASHES`
    losses of its stream entry) long before its timeout; the model serves on, and the
    statistics count it as a BACKEND failure."""
    server = naiad_server(repository=POISON_REPOSITORY, idle_timeout_s=30, request_timeout_s=60)
    client = httpclient.InferenceServerClient(server.url, network_timeout=90, concurrency=8)
    assert client.infer("poison", int_request(1)).as_numpy("OUTPUT0").tolist() == [[2]]  # warm
    values = [5, 6, 99, 7, 8]
    started = time.monotonic()
    calls = {v: client.async_infer("poison", int_request(v)) for v in values}  # one batch (0.5 s delay)
    outcomes: dict[int, object] = {}
    for value, call in calls.items():
        try:
            outcomes[value] = call.get_result()
        except InferenceServerException as exc:
            outcomes[value] = exc
    elapsed_s = time.monotonic() - started
    for value in (5, 6, 7, 8):
        result = outcomes[value]
        assert not isinstance(result, Exception), result
        assert result.as_numpy("OUTPUT0").tolist() == [[value * 2]]
        assert result.as_numpy("REQUESTS").tolist() == [[1]]  # reclaimed: run alone
    error = outcomes[99]
    assert isinstance(error, InferenceServerException), error
    assert error.status() == "500", error
    assert "model 'poison'" in error.message() and "exited unexpectedly 2 times" in error.message()
    assert elapsed_s < 30, f"answered after {elapsed_s:.1f} s (timeout 60 s)"
    assert client.infer("poison", int_request(4)).as_numpy("OUTPUT0").tolist() == [[8]]  # serves on
    log = server.log()
    # 3 when the next worker claims the five together and batches them again, 2 when it
    # claims the poison one apart from the rest: either way at most MAX_CRASHES + 1
    assert log.count("exited unexpectedly (code 3)") in (2, 3) and "2 times; not retried" in log
    assert re.search(r"went away holding [1-5] requests handed to it", log)
    stats = client.get_inference_statistics("poison")["model_stats"][0]["inference_stats"]
    assert stats["fail"]["count"] == 1 and stats["success"]["count"] == 6
    failed = r'^nv_inference_request_failure\{[^}]*reason="BACKEND"[^}]*\} (\S+)$'
    backend = re.search(failed, server.metrics(), re.M)
    assert backend and float(backend.group(1)) == 1
    client.close()
