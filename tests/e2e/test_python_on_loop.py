"""A Python model run on its worker's event loop (workers.model_thread, ``--python-on-loop``):
where it runs, and that a long ``execute`` there (the loop stalled past the worker's Redis
socket timeout and its heartbeat's deadline) runs each request once, on a healthy worker."""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from naiad_harness import wait_for

#: A Python model answering ``IN`` after ``sleep_s`` (a request parameter) seconds, with where
#: ``execute`` ran: 1 on the process's main thread (the worker's loop), and whether a running
#: event loop was set there (none may be: the model may run a loop of its own).
WHERE_PY = """
import asyncio, json, threading, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.thread = threading.get_ident()

    def execute(self, requests):
        responses = []
        for request in requests:
            parameters = json.loads(request.parameters())
            time.sleep(float(parameters.get("sleep_s", 0)))
            if parameters.get("own_uvloop_s"):  # a loop of its own, uvloop's, on this thread
                import uvloop
                uvloop.run(asyncio.sleep(float(parameters["own_uvloop_s"])))
            if parameters.get("raise_cancelled"):  # a BaseException, not an Exception
                raise asyncio.CancelledError("the model's own")
            if parameters.get("big"):
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.zeros(
                    int(parameters["big"]), np.int32)), pb_utils.Tensor("WHERE", np.zeros(4, np.int32))]))
                continue
            try:
                asyncio.get_running_loop()
                running = 1
            except RuntimeError:
                running = 0
            where = [threading.current_thread() is threading.main_thread(), running,
                     threading.get_ident() == self.thread, asyncio.run(asyncio.sleep(0, 7))]
            outputs = [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()),
                       pb_utils.Tensor("WHERE", np.array(where, dtype=np.int32))]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""

CONFIG = "\n".join([
    'backend: "python"', "max_batch_size: 0",
    'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]',
    'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] },',
    '         { name: "WHERE" data_type: TYPE_INT32 dims: [ 4 ] } ]',
])  # fmt: skip

#: What a worker logs when its Redis failed it, and a gateway or a worker when a request was
#: taken for a dead worker's (its heartbeat lapsed).
TROUBLE = ("redis failed", "reply not sent", "Timeout reading", "reclaimed a request", "without a heartbeat")


@pytest.fixture
def where_repository(tmp_path):
    model = tmp_path / "models" / "where"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(WHERE_PY)
    (model / "config.pbtxt").write_text(CONFIG)
    return tmp_path / "models"


def infer(server, value: int, sleep_s: float = 0.0, status: int = 200, **parameters) -> dict:
    body = {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [value]}],
            "parameters": {"sleep_s": sleep_s, **parameters}}  # fmt: skip
    answer = requests.post(f"{server.http}/v2/models/where/infer", json=body, timeout=60)
    assert answer.status_code == status, answer.text
    return {o["name"]: o["data"] for o in answer.json()["outputs"]} if status == 200 else answer.json()


def executions(server) -> int:
    body = requests.get(f"{server.http}/v2/models/where/stats", timeout=5).json()
    return body["model_stats"][0]["execution_count"]


@pytest.mark.parametrize(("on_loop", "where"), [("true", [1, 0, 1, 7]), ("false", [0, 0, 1, 7])])
def test_a_python_model_runs_on_the_loops_thread_unless_told_not_to(where_repository, naiad_server,
                                                                    on_loop, where):  # fmt: skip
    """On the loop: the main thread, no running loop visible to the model (its own
    ``asyncio.run`` works), ``execute`` on ``initialize``'s thread; with ``--python-on-loop
    false`` a thread of its own, as before."""
    server = naiad_server(repository=where_repository, extra_env={"NAIAD_PYTHON_ON_LOOP": on_loop})
    for value in range(3):
        assert infer(server, value) == {"OUT": [value], "WHERE": where}


def test_a_long_execute_on_the_loop_runs_each_request_once_on_a_healthy_worker(where_repository,
                                                                               naiad_server):  # fmt: skip
    """Heartbeats every 0.5 s (a deadline of 1.5 s) and three requests of 3.5 s each, sent at
    once: the worker's loop is stalled past its Redis socket timeout (3 s) and its heartbeat's
    deadline while each runs, with the next claim and the other requests waiting on it. Each
    request runs once (no reclaim as a dead worker's, no second worker), and the worker's
    Redis connections never time out."""
    server = naiad_server(repository=where_repository, extra_env={"NAIAD_HEARTBEAT_S": "0.5"})
    assert infer(server, 0)["OUT"] == [0]  # a warm worker
    answers: dict[int, dict] = {}

    def call(value: int) -> None:
        answers[value] = infer(server, value, sleep_s=3.5)

    threads = [threading.Thread(target=call, args=(value,)) for value in (1, 2, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert {value: answer["OUT"] for value, answer in answers.items()} == {1: [1], 2: [2], 3: [3]}
    assert executions(server) == 4
    log = server.log()
    assert not [line for line in log.splitlines() if any(t in line for t in TROUBLE)], log[-3000:]
    assert len(server.worker_processes("where")) == 1


def test_a_signal_during_the_models_own_uvloop_loop_still_drains_the_worker(where_repository, naiad_server):
    """A model running uvloop's loop on the main thread (the worker's, stalled) takes the
    process's signal wake-up file while it runs: a SIGTERM then must still reach the worker
    (drain: the request answered, then the worker exits)."""
    server = naiad_server(repository=where_repository)
    assert infer(server, 0)["OUT"] == [0]
    (worker,) = server.worker_processes("where")
    answers: list[dict] = []
    caller = threading.Thread(target=lambda: answers.append(infer(server, 5, own_uvloop_s=2.0)))
    caller.start()
    time.sleep(1.0)  # inside the model's own loop
    worker.send_signal(signal.SIGTERM)
    caller.join(30)
    assert answers and answers[0]["OUT"] == [5]
    wait_for(lambda: not worker.is_running() or worker.status() == "zombie", 15, "the worker to exit")


def test_a_model_raising_a_base_exception_fails_its_request_not_the_worker(where_repository, naiad_server):
    """``asyncio.CancelledError`` out of ``execute`` (a BaseException, and on the loop's thread
    the very class that cancels a task): that request fails (500), the same worker serves on."""
    server = naiad_server(repository=where_repository)
    assert infer(server, 0)["OUT"] == [0]
    (worker,) = server.worker_processes("where")
    assert "CancelledError" in infer(server, 1, status=500, raise_cancelled=True)["error"]
    assert infer(server, 2)["OUT"] == [2]
    assert server.worker_processes("where") == [worker]


def test_a_large_answer_goes_out_while_the_next_request_runs(where_repository, naiad_server):
    """A 4 MB answer, larger than the worker's socket to its gateway takes at once, then a 3 s
    request: the first answer is written out before the loop stalls in the second, not after."""
    server = naiad_server(repository=where_repository)
    assert infer(server, 0)["OUT"] == [0]
    client = httpclient.InferenceServerClient(server.url)
    tensor = httpclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
    took: list[float] = []

    def big() -> None:
        started = time.monotonic()
        answer = client.infer("where", [tensor], parameters={"sleep_s": 0.2, "big": 1_000_000},
                              outputs=[httpclient.InferRequestedOutput("OUT", binary_data=True)])  # fmt: skip
        assert answer.as_numpy("OUT").shape == (1_000_000,)
        took.append(time.monotonic() - started)

    caller = threading.Thread(target=big)
    caller.start()
    time.sleep(0.1)
    try:
        assert infer(server, 2, sleep_s=3.0)["OUT"] == [2]
        caller.join(30)
    finally:
        client.close()
    assert took and took[0] < 2.0, took
