"""A request that comes while an idle worker is leaving (scale to zero) is served at once by a
successor, not after the leaving worker's exit: that worker runs its Python model's
``finalize()``, which may take long, and meanwhile must neither heartbeat (a request would
find it live and wake no scaler, and the scaler would see it live) nor count as starting (the
scaler would wait for it). Before, such a gRPC call waited for the whole ``finalize()`` and
failed DEADLINE_EXCEEDED under a shorter client deadline."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from naiad_harness import wait_for

#: Seconds the model's ``finalize()`` takes: longer than the clients' deadline.
FINALIZE_S = 6.0
#: The clients' deadline (seconds): a cold start of a successor fits well within it.
DEADLINE_S = 4.0
#: What a worker logs when it leaves idle (workers.lifecycle).
LEAVING = "exiting (scale to zero)"

CONFIG = """name: "slow_finalize"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU } ]
parameters { key: "marks" value { string_value: "@MARKS@" } }
"""

MODEL = f"""
import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.marks = json.loads(args["model_config"])["parameters"]["marks"]["string_value"]

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * 2)]) for r in requests]

    def finalize(self):
        with open(os.path.join(self.marks, f"finalizing-{{os.getpid()}}"), "w"):
            pass
        time.sleep({FINALIZE_S})
        os.rename(os.path.join(self.marks, f"finalizing-{{os.getpid()}}"),
                  os.path.join(self.marks, f"finalized-{{os.getpid()}}"))
"""


def repository(tmp_path: Path) -> tuple[Path, Path]:
    marks = tmp_path / "marks"
    marks.mkdir()
    folder = tmp_path / "repository" / "slow_finalize"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(CONFIG.replace("@MARKS@", str(marks)))
    (folder / "1" / "model.py").write_text(MODEL)
    return folder.parent, marks


def grpc_call(server, x: np.ndarray) -> np.ndarray:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput("INPUT0", [4], "FP32")
        tensor.set_data_from_numpy(x)
        return client.infer("slow_finalize", [tensor], client_timeout=DEADLINE_S).as_numpy("OUTPUT0")
    finally:
        client.close()


def http_call(server, x: np.ndarray) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.url, network_timeout=DEADLINE_S)
    try:
        tensor = httpclient.InferInput("INPUT0", [4], "FP32")
        tensor.set_data_from_numpy(x)
        return client.infer("slow_finalize", [tensor], timeout=int(DEADLINE_S * 1e6)).as_numpy("OUTPUT0")
    finally:
        client.close()


def test_request_during_an_idle_exit_gets_a_successor_at_once(naiad_server, tmp_path):
    folder, marks = repository(tmp_path)
    server = naiad_server(repository=folder, idle_timeout_s=1)
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(grpc_call(server, x), 2 * x)  # the first worker's cold start
    for call in (grpc_call, http_call):  # each: right after the worker it reached left idle
        seen = {path.name.split("-")[1] for path in marks.iterdir()}
        wait_for(
            lambda seen=seen: finalizing(marks) - seen, 20, "the idle worker to leave and run its finalize()"
        )
        [pid] = finalizing(marks) - seen
        started = time.monotonic()
        np.testing.assert_array_equal(call(server, x), 2 * x)  # DEADLINE_EXCEEDED before the fix
        took = time.monotonic() - started
        assert pid in finalizing(marks), "answered only after the leaving worker's finalize()"
        assert took < DEADLINE_S, took
    assert server.log().count(LEAVING) >= 2, server.log()
    wait_for(lambda: not finalizing(marks), FINALIZE_S + 10, "the leaving workers' finalize() to end")
    assert len(list(marks.glob("finalized-*"))) >= 2  # each leaving worker ran its finalize() whole


def finalizing(marks: Path) -> set[str]:
    """Pids of the workers running their model's finalize() now."""
    return {path.name.split("-")[1] for path in marks.glob("finalizing-*")}
