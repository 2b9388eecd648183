"""A Python model run on its worker's event loop (workers.model_thread, ``--python-on-loop``):
where it runs, and that a long ``execute`` there (the loop stalled past the worker's Redis
socket timeout and its heartbeat's deadline) runs each request once, on a healthy worker."""

from __future__ import annotations

import threading

import pytest
import requests

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
            time.sleep(float(json.loads(request.parameters()).get("sleep_s", 0)))
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
    'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },',
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


def infer(server, value: int, sleep_s: float = 0.0) -> dict:
    body = {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [value]}],
            "parameters": {"sleep_s": sleep_s}}  # fmt: skip
    answer = requests.post(f"{server.http}/v2/models/where/infer", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return {o["name"]: o["data"] for o in answer.json()["outputs"]}


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
