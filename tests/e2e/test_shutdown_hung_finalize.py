"""``naiad serve`` stopped while several workers hang in ``finalize()``: their SIGTERMs share
one deadline (``naiad.procs.stop_all``), so three hung workers hold the shutdown for that
deadline, not three times it, and none is left behind. Real server, real Python model."""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
from naiad_harness import wait_for

#: Direct hand-off off: the scaler sees the backlog and starts a worker per instance.
ENV = {"NAIAD_WARM_POOL_SIZE": "0", "NAIAD_DIRECT_REQUESTS": "false"}

MODEL = '''
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.3)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(
            r, "x").as_numpy())]) for r in requests]

    def finalize(self):
        time.sleep(120)  # hung
'''


def write_model(repository: Path) -> None:
    folder = repository / "stubborn"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(MODEL)
    (folder / "config.pbtxt").write_text(
        'name: "stubborn"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'instance_group [ { kind: KIND_CPU count: 3 } ]\n'
        'parameters { key: "naiad.target_inflight" value: { string_value: "1" } }\n'
    )


def infer(server) -> float:
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        tensor = httpclient.InferInput("x", [1], "FP32")
        tensor.set_data_from_numpy(np.ones(1, np.float32))
        return float(client.infer("stubborn", [tensor]).as_numpy("y")[0])
    finally:
        client.close()


def test_workers_hung_in_finalize_share_one_stop_deadline(naiad_server, tmp_path):
    repository = tmp_path / "models"
    write_model(repository)
    server = naiad_server(repository, extra_env=ENV, extra_args=["--max-workers", "3"])
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        most = 0
        for _ in range(10):  # rounds of 6 calls until the scaler has started all three
            assert list(pool.map(lambda _: infer(server), range(6))) == [1.0] * 6
            most = max(most, len(server.worker_processes("stubborn")))
            if most == 3:
                break
    assert most == 3, f"expected three workers, saw {most}"
    wait_for(lambda: len(server.worker_processes("stubborn")) == 3, 20, "three workers up")
    started = time.monotonic()
    server.stop()  # asserts a clean exit and nothing left behind
    took = time.monotonic() - started
    # each hung worker is killed 10 s after its SIGTERM; waited one after another: 30 s or more
    assert took < 22, f"naiad serve took {took:.1f} s to stop"
    print(f"stopped in {took:.1f} s with three workers hung in finalize()")
