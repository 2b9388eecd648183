"""Instance groups on a real ``naiad serve`` (no GPU here): a KIND_CPU count caps the model's
workers, and KIND_GPU falls back to the CPU with one warning per model, however many
workers start. The warm pool is off, so every worker is a ``naiad worker --model`` process."""

from __future__ import annotations

import concurrent.futures
import re
import time
from pathlib import Path

import numpy as np
import onnx
import psutil
import pytest
import tritonclient.http as httpclient
from naiad_harness import slow_onnx, wait_for

from naiad.host import GpuReader

ENV = {"NAIAD_WARM_POOL_SIZE": "0"}
SIDE = 512


def write_model(repository: Path, name: str, extra: str, matmuls: int) -> None:
    folder = repository / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n' + extra
    )
    onnx.save(slow_onnx(matmuls, side=SIDE), str(folder / "1" / "model.onnx"))


def infer(server, model: str) -> float:
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        tensor = httpclient.InferInput("x", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 1), np.float32))
        return float(client.infer(model, [tensor]).as_numpy("y")[0, 0])
    finally:
        client.close()


def test_a_kind_cpu_count_of_2_caps_the_workers_at_2(naiad_server, tmp_path):
    repository = tmp_path / "models"
    write_model(repository, "pair", 'instance_group [ { kind: KIND_CPU count: 2 } ]\n'
                'parameters { key: "naiad.target_inflight" value: { string_value: "1" } }\n', matmuls=48)
    # the server default would allow 6; the instance group says 2
    server = naiad_server(repository, extra_env=ENV, extra_args=["--max-workers", "6"])
    most = 0
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = [pool.submit(infer, server, "pair") for _ in range(8)]
        while not all(a.done() for a in answers):
            most = max(most, len(server.worker_processes("pair")))
            time.sleep(0.05)
        assert [a.result() for a in answers] == [0.0] * 8
    assert most == 2, f"expected 2 workers at most and at the peak, saw {most}"
    for worker in server.worker_processes("pair"):
        assert worker.environ()["NAIAD_DEVICE"] == "cpu"
    assert "for model 'pair' on cpu" in server.log()


def test_kind_gpu_without_a_gpu_runs_on_the_cpu_with_one_warning(naiad_server, tmp_path):
    if GpuReader().devices():
        pytest.skip("this machine has a GPU: KIND_GPU does not fall back")
    repository = tmp_path / "models"
    write_model(repository, "gpuish", 'instance_group [ { kind: KIND_GPU count: 1 } ]\n', matmuls=1)
    server = naiad_server(repository, idle_timeout_s=1, extra_env=ENV)
    for _ in range(2):  # two cold starts: the second after the first worker left idle
        assert infer(server, "gpuish") == 0.0
        [worker] = server.worker_processes("gpuish")
        assert worker.environ()["NAIAD_DEVICE"] == "cpu"
        psutil.wait_procs([worker], timeout=20)
        wait_for(lambda: not server.worker_processes("gpuish"), 20, "the idle worker to exit")
    log = server.log()
    assert len(re.findall(r"started worker pid \d+ for model 'gpuish' on cpu", log)) == 2
    warnings = re.findall(r"WARNING.*model 'gpuish': instance group #0 asks for KIND_GPU.*", log)
    assert len(warnings) == 1, log[-3000:]
    assert "no GPU on this machine: it runs on the CPU" in warnings[0]
