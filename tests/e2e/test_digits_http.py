"""``digits`` end to end over HTTP with NVIDIA's tritonclient: answers equal onnxruntime's.

One ``naiad serve`` (embedded Redis, local repository) is shared by the module: these tests
only read, and a warm worker keeps the module fast.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from naiad_harness import run_server

OUTPUTS = ("probabilities", "label")


@pytest.fixture(scope="module")
def server(example_repository, tmp_path_factory):
    with run_server(example_repository, tmp_path_factory.mktemp("digits")) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    triton = httpclient.InferenceServerClient(server.url, network_timeout=60)
    yield triton
    triton.close()


def reference(session, x: np.ndarray) -> dict[str, np.ndarray]:
    return dict(zip(OUTPUTS, session.run(list(OUTPUTS), {"input": x}), strict=True))


def infer(client, x, input_binary=True, outputs_binary=(True, True), request_outputs=True):
    tensor = httpclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=input_binary)
    outputs = None
    if request_outputs:
        outputs = [
            httpclient.InferRequestedOutput(name, binary_data=binary)
            for name, binary in zip(OUTPUTS, outputs_binary, strict=True)
        ]
    return client.infer("digits", [tensor], outputs=outputs)


def assert_matches(result, expected: dict[str, np.ndarray]) -> None:
    probabilities = result.as_numpy("probabilities")
    label = result.as_numpy("label")
    assert probabilities.dtype == np.float32 and label.dtype == np.int64
    assert probabilities.shape == expected["probabilities"].shape
    assert label.shape == expected["label"].shape
    np.testing.assert_allclose(probabilities, expected["probabilities"], rtol=1e-5)
    np.testing.assert_array_equal(label, expected["label"])


def wire_kinds(result) -> dict[str, str]:
    """``binary`` or ``json`` per output, as the response header says it was sent."""
    return {
        out["name"]: "binary" if "binary_data_size" in out.get("parameters", {}) else "json"
        for out in result.get_response()["outputs"]
    }


@pytest.mark.parametrize("batch", [1, 64])
@pytest.mark.parametrize("input_binary", [True, False], ids=["in-binary", "in-json"])
@pytest.mark.parametrize(
    "outputs_binary",
    [(True, True), (False, False), (True, False)],
    ids=["out-binary", "out-json", "out-mixed"],
)
def test_digits_equals_onnxruntime(client, digits_onnx, digits_holdout, batch, input_binary, outputs_binary):
    x = np.ascontiguousarray(digits_holdout[0][:batch])
    result = infer(client, x, input_binary, outputs_binary)
    assert_matches(result, reference(digits_onnx, x))
    expected_kinds = {n: "binary" if b else "json" for n, b in zip(OUTPUTS, outputs_binary, strict=True)}
    assert wire_kinds(result) == expected_kinds
    assert result.get_response()["model_name"] == "digits"
    assert result.get_response()["model_version"] == "1"


@pytest.mark.parametrize("batch", [1, 64])
def test_no_outputs_requested_returns_all_as_binary(client, digits_onnx, digits_holdout, batch):
    """tritonclient sends ``binary_data_output: true`` when no outputs are named."""
    x = np.ascontiguousarray(digits_holdout[0][:batch])
    result = infer(client, x, request_outputs=False)
    assert_matches(result, reference(digits_onnx, x))
    assert wire_kinds(result) == {"probabilities": "binary", "label": "binary"}


def test_one_requested_output_only(client, digits_onnx, digits_holdout):
    x = np.ascontiguousarray(digits_holdout[0][:3])
    tensor = httpclient.InferInput("input", [3, 64], "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("digits", [tensor], outputs=[httpclient.InferRequestedOutput("label")])
    assert [out["name"] for out in result.get_response()["outputs"]] == ["label"]
    np.testing.assert_array_equal(result.as_numpy("label"), reference(digits_onnx, x)["label"])


def test_explicit_version_and_request_id(client, digits_onnx, digits_holdout):
    x = np.ascontiguousarray(digits_holdout[0][5:7])
    tensor = httpclient.InferInput("input", [2, 64], "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("digits", [tensor], model_version="1", request_id="req-42")
    assert result.get_response()["id"] == "req-42"
    assert_matches(result, reference(digits_onnx, x))


def test_holdout_accuracy_equals_onnxruntime(client, digits_onnx, digits_holdout):
    x, y = digits_holdout
    direct = reference(digits_onnx, x)["label"][:, 0]
    served = np.concatenate(
        [
            infer(client, np.ascontiguousarray(x[i : i + 64])).as_numpy("label")[:, 0]
            for i in range(0, len(x), 64)
        ]
    )
    np.testing.assert_array_equal(served, direct)
    assert float(np.mean(served == y)) == float(np.mean(direct == y)) > 0.9


def test_concurrent_requests_each_get_their_own_answer(server, digits_onnx, digits_holdout):
    """32 concurrent requests of 1..4 rows (so the dynamic batcher merges unequal sizes)."""
    x = digits_holdout[0]
    slices = [np.ascontiguousarray(x[(7 * i) % 300 : (7 * i) % 300 + 1 + i % 4]) for i in range(32)]

    async def one(triton, i: int, rows: np.ndarray):
        tensor = aiohttpclient.InferInput("input", list(rows.shape), "FP32")
        tensor.set_data_from_numpy(rows, binary_data=bool(i % 2))
        return await triton.infer("digits", [tensor], request_id=f"r{i}")

    async def all_of_them():
        triton = aiohttpclient.InferenceServerClient(server.url, conn_limit=64)
        try:
            return await asyncio.gather(*(one(triton, i, rows) for i, rows in enumerate(slices)))
        finally:
            await triton.close()

    results = asyncio.run(all_of_them())
    for i, (rows, result) in enumerate(zip(slices, results, strict=True)):
        assert result.get_response()["id"] == f"r{i}"
        assert_matches(result, reference(digits_onnx, rows))


# --- health and metadata -------------------------------------------------------------------


def test_health(client, server):
    assert client.is_server_live()
    assert client.is_server_ready()
    import requests

    assert requests.get(f"{server.http}/v2/health/live", timeout=5).status_code == 200
    assert requests.get(f"{server.http}/v2/health/ready", timeout=5).status_code == 200


def test_server_metadata(client):
    metadata = client.get_server_metadata()
    assert metadata["name"] == "naiad"
    assert isinstance(metadata["version"], str) and metadata["version"]
    assert {"binary_tensor_data", "model_configuration"} <= set(metadata["extensions"])


def test_model_metadata(client):
    metadata = client.get_model_metadata("digits")
    assert metadata["name"] == "digits"
    assert metadata["versions"] == ["1"]
    assert metadata["platform"] == "onnxruntime_onnx"
    assert metadata["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
    assert metadata["outputs"] == [
        {"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]},
        {"name": "label", "datatype": "INT64", "shape": [-1, 1]},
    ]
    assert client.get_model_metadata("digits", model_version="1") == metadata


def test_model_ready(client):
    assert client.is_model_ready("digits")
    assert client.is_model_ready("digits", model_version="1")


def test_model_config(client):
    """Triton's HTTP config: 64-bit integers are JSON numbers, defaults are printed."""
    config = client.get_model_config("digits")
    assert config["name"] == "digits"
    assert config["max_batch_size"] == 64
    assert config["input"][0]["dims"] == [64] and config["output"][1]["label_filename"] == ""
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 2000
    assert [i["name"] for i in config["input"]] == ["input"]
    assert [o["name"] for o in config["output"]] == ["probabilities", "label"]
    assert "dynamic_batching" in config
