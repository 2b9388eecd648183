"""Triton's model_warmup on a real ``naiad serve``: a good warmup runs in the worker after the
load and before its first request (and is no inference in the statistics); bad warmup data
makes the model UNAVAILABLE with the reason in the repository index; a sample the model
refuses fails its load, and the waiting request gets the reason."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import requests
import tritonclient.http as httpclient
from naiad_harness import NaiadServer, run_server, wait_for
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

ENV = {"NAIAD_WARM_POOL_SIZE": "0"}


def x_input(kind: str, width: int = 4) -> str:
    return f'inputs {{ key: "x" value: {{ data_type: TYPE_FP32 dims: [ {width} ] {kind} }} }}'


def write_model(repository: Path, name: str, warmup: str, files: dict[str, bytes] | None = None) -> None:
    """``y = 2 x``, ``x`` FP32 [batch, 4] (the config says [-1]: ONNX Runtime checks the 4)."""
    folder = repository / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        f"model_warmup [ {warmup} ]\n"
    )
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"])], "double",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(folder / "1" / "model.onnx"))
    for path, data in (files or {}).items():
        (folder / "warmup").mkdir(exist_ok=True)
        (folder / "warmup" / path).write_bytes(data)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NaiadServer]:
    repository = tmp_path_factory.mktemp("warmup") / "models"
    from_file = x_input('input_data_file: "x.bin"')
    write_model(repository, "warm",
                f'{{ name: "zeros" batch_size: 2 count: 3 {x_input("zero_data: true")} }}, '
                f'{{ name: "file" batch_size: 1 {from_file} }}',
                {"x.bin": np.arange(4, dtype="<f4").tobytes()})  # fmt: skip
    write_model(repository, "short", f'{{ name: "file" batch_size: 1 {from_file} }}', {"x.bin": b"\0" * 8})
    write_model(repository, "refused", f'{{ name: "wide" batch_size: 1 {x_input("zero_data: true", 5)} }}')
    with run_server(repository, tmp_path_factory.mktemp("serve"), extra_env=ENV) as running:
        yield running


def infer(server: NaiadServer, model: str) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        tensor = httpclient.InferInput("x", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        return client.infer(model, [tensor]).as_numpy("y")
    finally:
        client.close()


def test_a_good_warmup_runs_before_the_first_request(server):
    np.testing.assert_array_equal(infer(server, "warm"), [[2, 2, 2, 2]])
    log = server.log()
    zeros = log.index("model 'warm': warmup sample 'zeros' ran 3 time(s), batch 2")
    from_file = log.index("model 'warm': warmup sample 'file' ran 1 time(s), batch 1")
    ready = re.search(r"model 'warm' ready [\d.]+ s after .*warmup (\d+\.\d+) s", log)
    assert ready and zeros < from_file < ready.start(), log[-3000:]
    assert float(ready.group(1)) > 0
    client = httpclient.InferenceServerClient(server.url)
    try:
        (stats,) = client.get_inference_statistics("warm")["model_stats"]
    finally:
        client.close()
    assert stats["inference_count"] == 1  # warmup runs are no inferences


def test_bad_warmup_data_makes_the_model_unavailable_with_the_reason(server):
    index = requests.post(f"{server.http}/v2/repository/index", json={}, timeout=10).json()
    short = next(entry for entry in index if entry["name"] == "short")
    assert short["state"] == "UNAVAILABLE"
    assert short["reason"] == "model_warmup 'file' input 'x': warmup/x.bin has 8 bytes, the sample needs 16"
    assert requests.get(f"{server.http}/v2/models/short/ready", timeout=10).status_code != 200
    assert requests.get(f"{server.http}/v2/health/ready", timeout=10).status_code == 200
    assert {e["name"]: e["state"] for e in index}["warm"] == "READY"


def test_a_sample_the_model_refuses_fails_its_load_with_the_reason(server):
    with pytest.raises(InferenceServerException) as caught:
        infer(server, "refused")
    message = caught.value.message()
    assert "model 'refused' version 1 failed to load: warmup sample 'wide' failed:" in message
    wait_for(lambda: not server.worker_processes("refused"), 20, "the failed worker to exit")
    assert "model 'refused' cannot be served" in server.log()
