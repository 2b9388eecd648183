"""Bad requests over real HTTP: the right status, a JSON ``{"error": ...}`` body, and the
server keeps serving (a valid infer succeeds after each one)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from naiad_harness import run_server
from tritonclient.utils import InferenceServerException

DIGITS = "/v2/models/digits/infer"
ROW = [0.0] * 64


@pytest.fixture(scope="module")
def server(example_repository, tmp_path_factory):
    with run_server(example_repository, tmp_path_factory.mktemp("errors")) as running:
        yield running


def body(**overrides) -> dict:
    tensor = {"name": "input", "datatype": "FP32", "shape": [1, 64], "data": ROW}
    tensor.update(overrides)
    return {"inputs": [tensor]}


def binary_body(header: dict, tail: bytes) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(header).encode()
    return head + tail, {"Inference-Header-Content-Length": str(len(head))}


def assert_still_serving(server) -> None:
    response = requests.post(server.http + DIGITS, json=body(), timeout=60)
    assert response.status_code == 200, response.text
    assert [o["name"] for o in response.json()["outputs"]] == ["probabilities", "label"]


def _raw_cases() -> list:
    fp32 = np.zeros((1, 64), np.float32).tobytes()
    cases = [
        ("unknown-model", "POST", "/v2/models/nope/infer", {"json": body()}, 404),
        ("unknown-version", "POST", "/v2/models/digits/versions/7/infer", {"json": body()}, 404),
        ("unknown-model-metadata", "GET", "/v2/models/nope", {}, 404),
        ("unknown-model-config", "GET", "/v2/models/nope/config", {}, 404),
        ("wrong-input-name", "POST", DIGITS, {"json": body(name="pixels")}, 400),
        ("wrong-datatype", "POST", DIGITS, {"json": body(datatype="FP64")}, 400),
        ("unknown-datatype", "POST", DIGITS, {"json": body(datatype="FLOAT")}, 400),
        ("wrong-shape", "POST", DIGITS, {"json": body(shape=[1, 63], data=ROW[:63])}, 400),
        ("missing-batch-dim", "POST", DIGITS, {"json": body(shape=[64])}, 400),
        ("batch-zero", "POST", DIGITS, {"json": body(shape=[0, 64], data=[])}, 400),
        ("batch-over-max", "POST", DIGITS, {"json": body(shape=[65, 64], data=ROW * 65)}, 400),
        ("element-count", "POST", DIGITS, {"json": body(shape=[2, 64])}, 400),
        ("negative-dim", "POST", DIGITS, {"json": body(shape=[-1, 64])}, 400),
        ("no-inputs", "POST", DIGITS, {"json": {"inputs": []}}, 400),
        ("unknown-output", "POST", DIGITS, {"json": {**body(), "outputs": [{"name": "logits"}]}}, 400),
        (
            "malformed-json",
            "POST",
            DIGITS,
            {"data": b'{"inputs": [', "headers": {"Content-Type": "application/json"}},
            400,
        ),
        ("json-not-object", "POST", DIGITS, {"data": b"[1, 2]"}, 400),
        ("non-utf8-body", "POST", DIGITS, {"data": b'{"inputs": "\xff\xfe"}'}, 400),
        ("fp16-as-json", "POST", DIGITS, {"json": body(datatype="FP16")}, 400),
        ("data-not-numbers", "POST", DIGITS, {"json": body(data="abc")}, 400),
    ]
    past, past_headers = binary_body(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": [1, 64],
                    "parameters": {"binary_data_size": 257},
                }
            ]
        },
        fp32,
    )
    cases.append(("binary-size-past-body", "POST", DIGITS, {"data": past, "headers": past_headers}, 400))
    short, short_headers = binary_body(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": [1, 64],
                    "parameters": {"binary_data_size": 128},
                }
            ]
        },
        fp32[:128],
    )
    cases.append(("binary-size-vs-shape", "POST", DIGITS, {"data": short, "headers": short_headers}, 400))
    extra, extra_headers = binary_body(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": [1, 64],
                    "parameters": {"binary_data_size": 256},
                }
            ]
        },
        fp32 + b"\0\0\0\0",
    )
    cases.append(("binary-left-over", "POST", DIGITS, {"data": extra, "headers": extra_headers}, 400))
    huge = {"Inference-Header-Content-Length": "100000"}
    cases.append(
        (
            "header-length-past-body",
            "POST",
            DIGITS,
            {"data": json.dumps(body()).encode(), "headers": huge},
            400,
        )
    )
    cases.append(
        (
            "header-length-not-int",
            "POST",
            DIGITS,
            {"json": body(), "headers": {"Inference-Header-Content-Length": "x"}},
            400,
        )
    )
    cases.append(("framework-404", "GET", "/nope", {}, 404))
    cases.append(("framework-405", "GET", DIGITS, {}, 405))
    return [
        pytest.param(method, path, kwargs, status, id=name) for name, method, path, kwargs, status in cases
    ]


@pytest.mark.parametrize(("method", "path", "kwargs", "status"), _raw_cases())
def test_bad_request_gets_json_error(server, method, path, kwargs, status):
    response = requests.request(method, server.http + path, timeout=60, **kwargs)
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    payload = response.json()
    assert isinstance(payload.get("error"), str) and payload["error"]
    assert_still_serving(server)


def _triton_error(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def test_tritonclient_sees_the_errors(server):
    triton = httpclient.InferenceServerClient(server.url)
    try:
        good = httpclient.InferInput("input", [1, 64], "FP32")
        good.set_data_from_numpy(np.zeros((1, 64), np.float32))
        assert _triton_error(lambda: triton.infer("nope", [good])).status() == "404"
        assert _triton_error(lambda: triton.infer("digits", [good], model_version="9")).status() == "404"
        wrong = httpclient.InferInput("input", [1, 64], "FP64")
        wrong.set_data_from_numpy(np.zeros((1, 64), np.float64))
        error = _triton_error(lambda: triton.infer("digits", [wrong]))
        assert error.status() == "400" and "FP64" in error.message()
        big = httpclient.InferInput("input", [65, 64], "FP32")
        big.set_data_from_numpy(np.zeros((65, 64), np.float32))
        assert _triton_error(lambda: triton.infer("digits", [big])).status() == "400"
        assert not triton.is_model_ready("nope")
        assert triton.infer("digits", [good]).as_numpy("label").shape == (1, 1)
    finally:
        triton.close()
