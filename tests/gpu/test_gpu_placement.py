"""On a real GPU (skipped elsewhere, see conftest.py): the scaler places KIND_GPU workers on a
GPU through ``CUDA_VISIBLE_DEVICES``, never more per GPU than the instance group's count,
and the frameworks run there; warmup runs on the GPU before the first request.

One ``naiad serve`` (warm pool off) serves every model here. Requests go as plain v2 JSON
(``requests``), so the GPU machine needs no tritonclient HTTP stack. Where the installed
ONNX Runtime has no CUDA execution provider (a CPU build), its worker is still placed and
told its GPU, and falls back to the CPU as the backend documents.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import onnx
import psutil
import pytest
import requests
from naiad_harness import NaiadServer, run_server, slow_onnx
from onnx import TensorProto, helper

from naiad.host import GpuDevice, GpuReader
from workers.placement import visible_gpus

ENV = {"NAIAD_WARM_POOL_SIZE": "0"}


def torch_on_cuda() -> bool:
    if any(importlib.util.find_spec(name) is None for name in ("torch", "workers.backends.pytorch")):
        return False
    import torch

    return torch.cuda.is_available()


def ort_has_cuda() -> bool:
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()


def gpus() -> list[GpuDevice]:
    """The GPUs the server (started from this process's environment) may use."""
    return visible_gpus(GpuReader().devices(), os.environ.get("CUDA_VISIBLE_DEVICES"))


def best_gpu() -> int:
    """NVML index of the GPU with the most free memory (where the first worker goes)."""
    return max(gpus(), key=lambda g: (g.memory_free_bytes, -g.index)).index


def config(name: str, backend: str, tensors: str, extra: str) -> str:
    return f'name: "{name}"\nbackend: "{backend}"\nmax_batch_size: 8\n{tensors}\n{extra}\n'


ONNX_TENSORS = ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
                'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]')  # fmt: skip
WARMUP = ('model_warmup [ { name: "w" batch_size: 4 count: 2 inputs { key: "%s" value: '
          '{ data_type: TYPE_FP32 dims: [ 4 ] random_data: true } } } ]')  # fmt: skip


def double_onnx(path: Path) -> None:
    """``y = 2 x`` for ``x`` FP32 [batch, 4]."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"])], "double",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))


def double_torchscript(path: Path) -> None:
    import torch

    class Double(torch.nn.Module):
        def forward(self, input__0: torch.Tensor) -> torch.Tensor:
            return input__0 * 2

    torch.jit.script(Double()).save(str(path))


def write(repository: Path, name: str, text: str, filename: str, build) -> None:
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(text)
    build(repository / name / "1" / filename)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NaiadServer]:
    repository = tmp_path_factory.mktemp("gpu") / "models"
    write(repository, "onnx_gpu", config("onnx_gpu", "onnxruntime", ONNX_TENSORS,
          "instance_group [ { kind: KIND_GPU count: 1 } ]\n" + WARMUP % "x"), "model.onnx", double_onnx)
    write(repository, "onnx_pair", config("onnx_pair", "onnxruntime", ONNX_TENSORS,
          "instance_group [ { kind: KIND_GPU count: 2 gpus: [ 0 ] } ]\n"
          'parameters { key: "naiad.max_workers" value: { string_value: "5" } }\n'
          'parameters { key: "naiad.target_inflight" value: { string_value: "1" } }'),
          "model.onnx", lambda path: onnx.save(slow_onnx(48, width=4), str(path)))  # fmt: skip
    if torch_on_cuda():
        torch_tensors = ('input [ { name: "input__0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
                         'output [ { name: "output__0" data_type: TYPE_FP32 dims: [ 4 ] } ]')  # fmt: skip
        write(repository, "torch_gpu", config("torch_gpu", "pytorch", torch_tensors,
              "instance_group [ { kind: KIND_GPU count: 1 } ]\n" + WARMUP % "input__0"),
              "model.pt", double_torchscript)  # fmt: skip
    with run_server(repository, tmp_path_factory.mktemp("serve"), extra_env=ENV) as running:
        yield running


def infer(server: NaiadServer, model: str, name: str = "x") -> list[float]:
    body = {"inputs": [{"name": name, "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    answer = requests.post(f"{server.http}/v2/models/{model}/infer", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.json()["outputs"][0]["data"]


def maps_libcuda(process: psutil.Process) -> bool:
    with open(f"/proc/{process.pid}/maps") as maps:
        return any("libcuda.so" in line for line in maps)


def test_a_kind_gpu_worker_is_placed_on_a_gpu_and_warmed_up_there(server):
    gpu = best_gpu()
    assert infer(server, "onnx_gpu") == [2, 4, 6, 8]
    [worker] = server.worker_processes("onnx_gpu")
    env = worker.environ()
    assert (env["CUDA_VISIBLE_DEVICES"], env["NAIAD_DEVICE"]) == (str(gpu), f"gpu:{gpu}")
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    log = server.log()
    assert f"for model 'onnx_gpu' on gpu:{gpu}" in log
    assert re.search(rf"model 'onnx_gpu' version 1: .*loaded on gpu:{gpu} in", log), log[-3000:]
    assert "model 'onnx_gpu': warmup sample 'w' ran 2 time(s), batch 4" in log
    if ort_has_cuda():
        assert "with ['CUDAExecutionProvider', 'CPUExecutionProvider']" in log
        assert maps_libcuda(worker)
    else:  # a CPU build of ONNX Runtime: placed on the GPU, runs on the CPU
        assert "with ['CPUExecutionProvider']" in log


def test_kind_gpu_count_caps_the_workers_on_a_gpu_over_naiad_max_workers(server):
    most = 0
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = [pool.submit(infer, server, "onnx_pair") for _ in range(8)]
        while not all(a.done() for a in answers):
            workers = server.worker_processes("onnx_pair")
            most = max(most, len(workers))
            for worker in workers:
                try:
                    assert worker.environ()["CUDA_VISIBLE_DEVICES"] == str(server_gpu0())
                except psutil.NoSuchProcess:
                    pass
            time.sleep(0.05)
        for answer in answers:
            answer.result()
    # naiad.max_workers says 5; count 2 on gpu 0 says 2 (a CUDA ONNX Runtime may drain the
    # backlog before a second worker is needed)
    assert most == 2 or (ort_has_cuda() and most == 1), most
    started = re.findall(r"started worker pid \d+ for model 'onnx_pair' on (\S+)", server.log())
    assert set(started) == {f"gpu:{server_gpu0()}"}


def server_gpu0() -> int:
    """NVML index of the config's ``gpus: [ 0 ]``: the first GPU the server sees."""
    return gpus()[0].index


def test_torchscript_runs_on_cuda_after_its_warmup(server):
    if not torch_on_cuda():
        pytest.skip("torch with CUDA (and the pytorch backend) is not here")
    assert infer(server, "torch_gpu", "input__0") == [2, 4, 6, 8]
    [worker] = server.worker_processes("torch_gpu")
    assert worker.environ()["NAIAD_DEVICE"].startswith("gpu:")
    assert maps_libcuda(worker)
    log = server.log()
    assert re.search(r"loaded \S+model\.pt on cuda", log), log[-3000:]
    assert "model 'torch_gpu': warmup sample 'w' ran 2 time(s), batch 4" in log
