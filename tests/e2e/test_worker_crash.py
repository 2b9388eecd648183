"""A worker killed mid-request loses nothing: its claimed requests are reclaimed and answered,
and the model still scales back to zero afterwards."""

from __future__ import annotations

import concurrent.futures
import signal
import threading

import numpy as np
import redis
import tritonclient.http as httpclient
from naiad_harness import wait_for

from naiad import keys


def digits_request(x: np.ndarray) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return [tensor]


def expected_labels(digits_onnx, x: np.ndarray) -> np.ndarray:
    return digits_onnx.run(["label"], {"input": x})[0]


def test_request_claimed_by_a_dead_worker_is_answered(redis_url, naiad_server, digits_holdout, digits_onnx):
    """Deterministic: freeze the worker while it blocks in XREADGROUP, so Redis hands it the
    request, then kill it; a new worker must reclaim the request and answer it."""
    server = naiad_server(redis_url=redis_url, idle_timeout_s=3)
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
    assert "reclaimed 1 requests" in server.log()


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
