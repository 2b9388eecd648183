"""Ensembles end to end: a real ``naiad serve`` with real workers, NVIDIA's tritonclient (HTTP
and gRPC) as the client.

The repository holds the example preprocessing ensemble (``digits_ensemble``: the Python
``digits_preprocess`` then the ONNX ``digits_mlp``, built by ``examples/build_repository.py``)
next to ``digits``, and small ONNX models written here (``double``, ``plus1``, ``add``) with
ONNX-only ensembles over them: a chain, a fan-out whose two branches run in parallel, and
broken ones (a missing model, a cycle, an undefined tensor, a shape only a request reveals).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from naiad_harness import run_server
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE_MODELS = ("digits", "digits_mlp", "digits_preprocess", "digits_ensemble")

VECTOR = "data_type: TYPE_FP32 dims: [ 4 ]"


def onnx_model(path: Path, inputs: list[str], node: onnx.NodeProto, constant: float | None = None) -> None:
    """A one-node FP32 [batch, 4] graph (``out`` = node(inputs[, constant]))."""
    initializers = []
    if constant is not None:
        initializers.append(helper.make_tensor("c", TensorProto.FLOAT, [1], [constant]))
    graph = helper.make_graph(
        [node],
        path.parent.parent.name,
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [None, 4]) for name in inputs],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [None, 4])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True)
    path.write_bytes(model.SerializeToString())


def model_config(name: str, inputs: list[str]) -> str:
    ios = ", ".join(f'{{ name: "{i}" {VECTOR} }}' for i in inputs)
    return (
        f'name: "{name}" platform: "onnxruntime_onnx" max_batch_size: 8\n'
        f'input [ {ios} ]\noutput [ {{ name: "out" {VECTOR} }} ]\n'
    )


def step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    maps = "".join(f' input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    maps += "".join(f' output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: -1{maps} }}'


def ensemble(name: str, steps: list[str], outputs=("y",), input_dims: str = "4") -> str:
    outs = ", ".join(f'{{ name: "{o}" {VECTOR} }}' for o in outputs)
    return (
        f'name: "{name}" platform: "ensemble" max_batch_size: 8\n'
        f'input [ {{ name: "x" data_type: TYPE_FP32 dims: [ {input_dims} ] }} ]\noutput [ {outs} ]\n'
        f"ensemble_scheduling {{ step [ {', '.join(steps)} ] }}\n"
    )


ENSEMBLES = {
    # y = 2x + 1
    "chain": ensemble(
        "chain", [step("double", {"in": "x"}, {"out": "t"}), step("plus1", {"in": "t"}, {"out": "y"})]
    ),
    # doubled = 2x and t2 = x + 1 in parallel, then y = doubled + t2
    "fanout": ensemble(
        "fanout",
        [
            step("double", {"in": "x"}, {"out": "doubled"}),
            step("plus1", {"in": "x"}, {"out": "t2"}),
            step("add", {"left": "doubled", "right": "t2"}, {"out": "y"}),
        ],
        outputs=("y", "doubled"),
    ),
    # an ensemble as a step: y = chain(x) + 1 = 2x + 2
    "nested": ensemble(
        "nested", [step("chain", {"x": "x"}, {"y": "t"}), step("plus1", {"in": "t"}, {"out": "y"})]
    ),
    # accepts any row length; 'double' only 4
    "loose": ensemble("loose", [step("double", {"in": "x"}, {"out": "y"})], input_dims="-1"),
    "missing": ensemble("missing", [step("nowhere", {"in": "x"}, {"out": "y"})]),
    "cyclic": ensemble(
        "cyclic",
        [
            step("add", {"left": "x", "right": "t2"}, {"out": "t1"}),
            step("plus1", {"in": "t1"}, {"out": "t2"}),
            step("double", {"in": "t2"}, {"out": "y"}),
        ],
    ),
    "undefined": ensemble("undefined", [step("add", {"left": "x", "right": "ghost"}, {"out": "y"})]),
}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ensembles") / "models"
    flags = [arg for name in EXAMPLE_MODELS for arg in ("--model", name)]
    subprocess.run(
        [sys.executable, str(EXAMPLES / "build_repository.py"), str(root), *flags],
        check=True, capture_output=True, timeout=110,
    )  # fmt: skip
    onnx_model(
        root / "double" / "1" / "model.onnx", ["in"], helper.make_node("Mul", ["in", "c"], ["out"]), 2.0
    )
    onnx_model(
        root / "plus1" / "1" / "model.onnx", ["in"], helper.make_node("Add", ["in", "c"], ["out"]), 1.0
    )
    onnx_model(
        root / "add" / "1" / "model.onnx",
        ["left", "right"],
        helper.make_node("Add", ["left", "right"], ["out"]),
    )
    (root / "double" / "config.pbtxt").write_text(model_config("double", ["in"]))
    (root / "plus1" / "config.pbtxt").write_text(model_config("plus1", ["in"]))
    (root / "add" / "config.pbtxt").write_text(model_config("add", ["left", "right"]))
    for name, text in ENSEMBLES.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(text)
    return root


@pytest.fixture(scope="module")
def server(repository, tmp_path_factory):
    with run_server(repository, tmp_path_factory.mktemp("serve")) as running:
        yield running


@pytest.fixture(scope="module")
def http(server):
    client = httpclient.InferenceServerClient(server.url, network_timeout=90)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


def x_rows(rows: int) -> np.ndarray:
    return np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) - 3


def infer(client, module, model: str, x: np.ndarray, outputs=None, **kwargs):
    tensor = module.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    requested = [module.InferRequestedOutput(name) for name in outputs] if outputs else None
    return client.infer(model, [tensor], outputs=requested, **kwargs)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_chain_and_parallel_fan_out(request, transport):
    client, module = request.getfixturevalue(transport), httpclient if transport == "http" else grpcclient
    x = x_rows(3)
    chain = infer(client, module, "chain", x)
    np.testing.assert_array_equal(chain.as_numpy("y"), 2 * x + 1)
    fanout = infer(client, module, "fanout", x)
    np.testing.assert_array_equal(fanout.as_numpy("y"), 2 * x + (x + 1))
    np.testing.assert_array_equal(fanout.as_numpy("doubled"), 2 * x)
    only = infer(client, module, "fanout", x, outputs=["doubled"])
    np.testing.assert_array_equal(only.as_numpy("doubled"), 2 * x)
    assert only.as_numpy("y") is None
    nested = infer(client, module, "nested", x)
    np.testing.assert_array_equal(nested.as_numpy("y"), 2 * x + 2)


def test_no_worker_ever_serves_an_ensemble(server, http):
    infer(http, httpclient, "fanout", x_rows(1))
    assert server.workers("fanout") == 0 and server.workers("chain") == 0
    assert server.workers("double") >= 1  # its steps ran on the composing models' workers
    assert not server.worker_processes("fanout") and not server.worker_processes("chain")
    assert "for model 'fanout'" not in server.log() and "for model 'chain'" not in server.log()


def digits_reference(http, x: np.ndarray, model: str = "digits") -> dict[str, np.ndarray]:
    tensor = httpclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = http.infer(model, [tensor])
    return {name: result.as_numpy(name) for name in ("probabilities", "label")}


@pytest.mark.parametrize("rows", [1, 64])
@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_preprocessing_ensemble_equals_the_classifier(
    request, repository, http, digits_holdout, rows, transport
):
    client, module = request.getfixturevalue(transport), httpclient if transport == "http" else grpcclient
    x = np.ascontiguousarray(digits_holdout[0][:rows])
    pixels = module.InferInput("pixels", [rows, 8, 8], "UINT8")
    pixels.set_data_from_numpy(x.reshape(rows, 8, 8).astype(np.uint8))
    result = client.infer("digits_ensemble", [pixels])
    statistics = json.loads((repository / "digits_preprocess" / "1" / "normalization.json").read_text())
    normalised = ((x - np.float32(statistics["mean"])) / np.float32(statistics["scale"])).astype(np.float32)
    for expected in (digits_reference(http, normalised, "digits_mlp"), digits_reference(http, x)):
        np.testing.assert_allclose(
            result.as_numpy("probabilities"), expected["probabilities"], rtol=1e-5, atol=1e-6
        )
        np.testing.assert_array_equal(result.as_numpy("label"), expected["label"])
    assert result.as_numpy("probabilities").shape == (rows, 10)
    assert np.mean(result.as_numpy("label")[:, 0] == digits_holdout[1][:rows]) > 0.9


def test_classification_through_the_ensemble(http, digits_holdout):
    x = digits_holdout[0][:2]
    pixels = httpclient.InferInput("pixels", [2, 8, 8], "UINT8")
    pixels.set_data_from_numpy(x.reshape(2, 8, 8).astype(np.uint8))
    result = http.infer(
        "digits_ensemble", [pixels], outputs=[httpclient.InferRequestedOutput("probabilities", class_count=1)]
    )
    top = [item.decode().split(":") for item in result.as_numpy("probabilities")[:, 0]]
    assert [label for _, _, label in top] == [str(v) for v in digits_holdout[1][:2]]


def http_error(server, model: str, body: dict) -> requests.Response:
    return requests.post(f"{server.http}/v2/models/{model}/infer", json=body, timeout=60)


def x_json(rows: int, width: int = 4) -> dict:
    return {
        "inputs": [{"name": "x", "shape": [rows, width], "datatype": "FP32", "data": [0.5] * rows * width}]
    }


def test_a_python_step_error_fails_the_request_with_its_message(server, grpc):
    body = {"inputs": [{"name": "pixels", "shape": [1, 8, 8], "datatype": "UINT8", "data": [200] * 64}]}
    response = http_error(server, "digits_ensemble", body)
    assert response.status_code == 400
    assert response.json() == {
        "error": "in ensemble 'digits_ensemble', step 0 ('digits_preprocess'): "
        "pixel values must be 0..16, got 200"
    }
    pixels = grpcclient.InferInput("pixels", [1, 8, 8], "UINT8")
    pixels.set_data_from_numpy(np.full((1, 8, 8), 17, np.uint8))
    with pytest.raises(InferenceServerException) as caught:
        grpc.infer("digits_ensemble", [pixels])
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "step 0 ('digits_preprocess'): pixel values must be 0..16, got 17" in caught.value.message()


def test_a_bad_shape_reaching_a_step(server, grpc):
    response = http_error(server, "loose", x_json(2, width=3))
    assert response.status_code == 400
    message = response.json()["error"]
    assert message.startswith("in ensemble 'loose', step 0 ('double'): unexpected shape for input 'in'")
    with pytest.raises(InferenceServerException) as caught:
        infer(grpc, grpcclient, "loose", np.zeros((1, 5), np.float32))
    assert (
        caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        and "step 0 ('double')" in caught.value.message()
    )
    assert infer(grpc, grpcclient, "loose", x_rows(1)).as_numpy("y").shape == (1, 4)


REASONS = {
    "missing": "ensemble 'missing' contains models that are not in the repository: nowhere",
    "cyclic": "ensemble 'cyclic' has a cycle: step 0 ('add'), step 1 ('plus1'), step 2 ('double') wait on",
    "undefined": "step 0 ('add') reads ensemble tensor 'ghost' (its input 'right'), which is neither",
}


def test_broken_ensembles_are_not_ready_with_a_reason(server, http, grpc):
    index = {item["name"]: item for item in http.get_model_repository_index()}
    for name, reason in REASONS.items():
        assert index[name]["state"] == "UNAVAILABLE", name
        assert reason in index[name]["reason"], index[name]
        assert not http.is_model_ready(name) and not grpc.is_model_ready(name)
        response = http_error(server, name, x_json(1))
        assert response.status_code == 400 and reason in response.json()["error"], response.text
        with pytest.raises(InferenceServerException) as caught:
            infer(grpc, grpcclient, name, x_rows(1))
        assert caught.value.status() == "StatusCode.UNAVAILABLE" and reason in caught.value.message()
    for name in ("chain", "fanout", "nested", "digits_ensemble"):
        assert index[name]["state"] == "READY" and http.is_model_ready(name), index[name]


def test_requested_output_not_in_the_ensemble(server, grpc):
    body = {**x_json(1), "outputs": [{"name": "t"}]}  # an intermediate tensor, not an output
    response = http_error(server, "chain", body)
    assert response.status_code == 400
    assert response.json() == {"error": "unexpected inference output 't' for model 'chain'"}
    with pytest.raises(InferenceServerException) as caught:
        infer(grpc, grpcclient, "chain", x_rows(1), outputs=["nope"])
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_metadata_and_config(http, grpc):
    metadata = http.get_model_metadata("fanout")
    assert metadata["platform"] == "ensemble" and metadata["versions"] == ["1"]
    assert [(t["name"], t["shape"]) for t in metadata["outputs"]] == [("y", [-1, 4]), ("doubled", [-1, 4])]
    config = grpc.get_model_config("digits_ensemble", as_json=True)["config"]
    assert [s["model_name"] for s in config["ensemble_scheduling"]["step"]] == [
        "digits_preprocess",
        "digits_mlp",
    ]
    assert grpc.get_model_metadata("chain").platform == "ensemble"


def stat(http, model: str) -> dict:
    (found,) = http.get_inference_statistics(model)["model_stats"]
    return found


def test_statistics_count_the_ensemble_and_its_steps(http):
    infer(http, httpclient, "chain", x_rows(1))  # warm
    before = {m: stat(http, m) for m in ("chain", "double", "plus1")}
    for rows in (2, 3):
        infer(http, httpclient, "chain", x_rows(rows))
    after = {m: stat(http, m) for m in ("chain", "double", "plus1")}
    for model in ("chain", "double", "plus1"):
        success = (
            after[model]["inference_stats"]["success"]["count"]
            - before[model]["inference_stats"]["success"]["count"]
        )
        assert success == 2, model
        assert after[model]["inference_count"] - before[model]["inference_count"] == 5, model
    assert after["chain"]["execution_count"] - before["chain"]["execution_count"] == 2
    sizes = {b["batch_size"] for b in after["chain"]["batch_stats"]}
    assert {2, 3} <= sizes
    with pytest.raises(InferenceServerException):
        infer(http, httpclient, "loose", np.zeros((1, 5), np.float32))
    failed = stat(http, "loose")["inference_stats"]["fail"]["count"]
    assert failed >= 1
