"""Cold starts from zero, from a warm-pool process and from a bare process: both answer and
both are recorded in the metrics (how fast is for ``bench/cold_start.py``, not for tests)."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from naiad_harness import wait_for
from prom_text import parse


def infer_grpc(server, x: np.ndarray) -> np.ndarray:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput("input", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        return client.infer("digits", [tensor], client_timeout=60).as_numpy("label")
    finally:
        client.close()


@pytest.mark.parametrize("pool_size", [1, 0], ids=["warm-pool", "bare-process"])
def test_cold_starts_answer_and_are_recorded(naiad_server, digits_holdout, digits_onnx, pool_size):
    server = naiad_server(idle_timeout_s=1.5, extra_args=["--warm-pool-size", str(pool_size)])
    if pool_size:
        wait_for(server.pool_processes, 30, "the warm pool to fill")
    x = np.ascontiguousarray(digits_holdout[0][:7])
    expected = digits_onnx.run(["label"], {"input": x})[0]

    for cold_starts in (1, 2):  # the second one after the first worker went idle
        np.testing.assert_array_equal(infer_grpc(server, x), expected)
        found = parse(server.metrics())
        assert found.value("naiad_cold_starts_total", model="digits") == cold_starts
        assert found.value("naiad_cold_start_seconds_count", model="digits") == cold_starts
        assert found.value("naiad_warm_pool_claims_total", model="digits") == cold_starts * pool_size
        assert found.value("naiad_model_loads_total", model="digits") == cold_starts
        assert found.value("naiad_model_load_seconds_total", model="digits") > 0
        assert found.value("naiad_cold_start_seconds_sum", model="digits") > 0
        assert found.value("naiad_cold_starts_total", model="silero_vad") == 0
        wait_for(lambda: server.workers("digits") == 0, 30, "scale to zero")
        if pool_size:  # the next cold start finds a refilled pool
            wait_for(server.pool_processes, 30, "the warm pool to refill")
    origin = "the claim" if pool_size else "the process started"
    assert server.log().count(f"after {origin}") == 2
