"""Scale from zero and back: cold start, idle exit, second cold start served from the cache."""

from __future__ import annotations

import numpy as np
import psutil
import tritonclient.http as httpclient
from naiad_harness import wait_for

IDLE_S = 2


def infer_label(server, x: np.ndarray) -> np.ndarray:
    triton = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        tensor = httpclient.InferInput("input", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        return triton.infer("digits", [tensor]).as_numpy("label")
    finally:
        triton.close()


def cached_model_file(server):
    files = list(server.cache_dir.glob("*/digits/1/model.onnx"))
    assert len(files) == 1, files
    return files[0]


def test_scale_from_zero_and_back(naiad_server, digits_onnx, digits_holdout):
    server = naiad_server(idle_timeout_s=IDLE_S)
    x = np.ascontiguousarray(digits_holdout[0][:4])
    expected = digits_onnx.run(["label"], {"input": x})[0]

    assert server.workers("digits") == 0
    assert server.worker_processes("digits") == []

    np.testing.assert_array_equal(infer_label(server, x), expected)  # cold start
    assert server.workers("digits") == 1
    [first] = server.worker_processes("digits")
    model_file = cached_model_file(server)
    stat = model_file.stat()

    wait_for(lambda: server.workers("digits") == 0, 20, "the metric to return to 0")
    wait_for(lambda: not server.worker_processes("digits"), 20, "the idle worker to exit")
    # An exiting process loses its command line before it is gone: wait for the pid itself.
    wait_for(lambda: not first.is_running() or first.status() == psutil.STATUS_ZOMBIE, 10, "exit")

    np.testing.assert_array_equal(infer_label(server, x), expected)  # second cold start
    [second] = server.worker_processes("digits")
    assert second.pid != first.pid
    assert server.workers("digits") == 1

    # The second worker loaded the version from the cache: no new download.
    again = cached_model_file(server).stat()
    assert (again.st_ino, again.st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)
    log = server.log()
    assert log.count("pulled digits/1") == 1, log
    assert log.count("model 'digits' version 1: pulled in") == 2, log
