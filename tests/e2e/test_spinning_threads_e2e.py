"""A ``model.py`` whose ONNX Runtime session spins (it asks to: without a word on it, a
worker's sessions do not spin, ``workers.ort_spinning``) served by ``naiad serve``: once batches
run, the worker's spinning pool thread is at SCHED_IDLE, its answers unchanged; with
``--demote-spinning-threads false`` it is left at the normal policy (``workers.spin_watch``)."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from naiad_harness import python_model

from workers import spin_watch

pytestmark = pytest.mark.skipif(spin_watch.watch(True) is None, reason="Linux's SCHED_IDLE and /proc")

WIDTH = 256

CONFIG = f"""name: "spinner"
backend: "python"
max_batch_size: 64
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]
dynamic_batching {{ }}
"""

MODEL = f'''
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper, save

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        weight = numpy_helper.from_array(np.ones(({WIDTH}, {WIDTH}), np.float32), "w")
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, {WIDTH}])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, {WIDTH}])], [weight])
        path = Path(args["model_repository"]) / "matmul.onnx"
        save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        options.add_session_config_entry("session.intra_op.allow_spinning", "1")  # asked: kept
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            y = self.session.run(None, {{"x": x}})[0]
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", y)]))
        return out
'''


def repository(folder):
    return python_model(folder, "spinner", CONFIG, MODEL)


def idle_threads(server) -> list[int]:
    (worker,) = server.worker_processes("spinner")
    found = []
    for name in os.listdir(f"/proc/{worker.pid}/task"):
        try:
            if os.sched_getscheduler(int(name)) == os.SCHED_IDLE:
                found.append(int(name))
        except OSError:
            continue
    return found


def serve_batches(server, rounds: int = 30) -> None:
    client = httpclient.InferenceServerClient(server.url)
    x = np.arange(64 * WIDTH, dtype=np.float32).reshape(64, WIDTH) % 7
    for _ in range(rounds):
        inp = httpclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        y = client.infer("spinner", [inp]).as_numpy("y")
        np.testing.assert_array_equal(y, x @ np.ones((WIDTH, WIDTH), np.float32))


@pytest.mark.parametrize("demote", [True, False])
def test_the_workers_spinning_pool_thread_runs_at_sched_idle(naiad_server, tmp_path, demote):
    extra = [] if demote else ["--demote-spinning-threads", "false"]
    server = naiad_server(repository(tmp_path / "repo"), extra_args=extra)
    serve_batches(server)
    deadline = time.monotonic() + 30  # a reading comes once a check period (1 s): batches until one has come
    while demote and not idle_threads(server) and time.monotonic() < deadline:
        serve_batches(server, rounds=5)
    if demote:
        assert idle_threads(server), "no thread of the worker was moved to SCHED_IDLE"
    else:
        assert idle_threads(server) == []
