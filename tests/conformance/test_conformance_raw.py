"""What clients never send, over raw HTTP (``requests``) and the raw gRPC stub.

Every case gets its status (HTTP: a JSON ``{"error": ...}`` body; gRPC: the code) and then
the same test sends a valid request, which must still be answered.
"""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest
import requests
from tritonclient.grpc import service_pb2 as pb

DIGITS = "/v2/models/digits/infer"
VERSIONED = "/v2/models/versioned/infer"
ROW = [0.0] * 64
HEADER = "Inference-Header-Content-Length"


def tensor(**overrides) -> dict:
    return {"name": "input", "datatype": "FP32", "shape": [1, 64], "data": ROW, **overrides}


def body(**overrides) -> dict:
    return {"inputs": [tensor()], **overrides}


def assert_still_serving_http(server) -> None:
    response = requests.post(server.http + DIGITS, json=body(), timeout=60)
    assert response.status_code == 200, response.text
    assert [o["name"] for o in response.json()["outputs"]] == ["probabilities", "label"]


def assert_json_error(response: requests.Response, status: int) -> None:
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    error = response.json()["error"]
    assert isinstance(error, str) and error


def deep(depth: int) -> bytes:
    """An infer body whose ``data`` is a list nested ``depth`` levels deep."""
    head = json.dumps(body()).encode().replace(b"[0.0", b"[" * depth + b"0.0", 1)
    return head.replace(b"]}]}", b"]" * depth + b"]}]}", 1)


def _http_cases() -> list:
    one = {"inputs": [tensor()]}
    dims_64 = np.zeros((1, 64), np.float32).tobytes()
    binary_header = json.dumps(
        {"inputs": [tensor(data=None, parameters={"binary_data_size": 256})]}
    ).encode().replace(b', "data": null', b"")
    cases = [
        ("malformed-json", DIGITS, {"data": b'{"inputs": [{"name": '}, 400),
        ("json-null", DIGITS, {"data": b"null"}, 400),
        ("json-trailing-garbage", DIGITS, {"data": json.dumps(one).encode() + b"}"}, 400),
        ("header-length-past-body", DIGITS, {"json": one, "headers": {HEADER: "100000"}}, 400),
        ("header-length-negative", DIGITS, {"json": one, "headers": {HEADER: "-5"}}, 400),
        ("header-length-zero", DIGITS, {"json": one, "headers": {HEADER: "0"}}, 400),
        ("header-length-superscript-digit", DIGITS, {"json": one, "headers": {HEADER: "\u00b2"}}, 400),
        ("header-length-arabic-digits", DIGITS, {"json": one, "headers": {HEADER: "١٢".encode()}}, 400),
        ("header-length-huge", DIGITS, {"json": one, "headers": {HEADER: "9" * 40}}, 400),
        (
            "header-length-splits-the-json",
            DIGITS,
            {"data": binary_header + dims_64, "headers": {HEADER: str(len(binary_header) - 3)}},
            400,
        ),
        ("shape-over-int64", DIGITS, {"json": body(inputs=[tensor(shape=[2**63, 64])])}, 400),
        ("shape-negative", DIGITS, {"json": body(inputs=[tensor(shape=[1, -64])])}, 400),
        ("shape-too-many-dims", DIGITS, {"json": body(inputs=[tensor(shape=[1] * 65)])}, 400),
        (
            "shape-product-overflows-json",
            VERSIONED,
            {"json": {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2**32, 2**32], "data": []}]}},
            400,
        ),
        ("element-count-short", DIGITS, {"json": body(inputs=[tensor(shape=[2, 64])])}, 400),
        ("element-count-long", DIGITS, {"json": body(inputs=[tensor(data=ROW + [1.0])])}, 400),
        ("ragged-nested-data", DIGITS, {"json": body(inputs=[tensor(data=[ROW[:32], ROW[:31]])])}, 400),
        ("unknown-output", DIGITS, {"json": body(outputs=[{"name": "logits"}])}, 400),
        ("duplicated-output", DIGITS, {"json": body(outputs=[{"name": "label"}, {"name": "label"}])}, 400),
        ("duplicated-input", DIGITS, {"json": {"inputs": [tensor(), tensor()]}}, 400),
        ("nested-too-deep", DIGITS, {"data": deep(100_000)}, 400),
        ("nested-deep-but-wrong-shape", DIGITS, {"data": deep(500)}, 400),
        ("inputs-an-object", DIGITS, {"json": {"inputs": tensor()}}, 400),
        ("inputs-a-string", DIGITS, {"json": {"inputs": "input"}}, 400),
        ("inputs-missing", DIGITS, {"json": {"outputs": [{"name": "label"}]}}, 400),
        ("input-not-an-object", DIGITS, {"json": {"inputs": [["input"]]}}, 400),
        ("name-a-number", DIGITS, {"json": body(inputs=[tensor(name=7)])}, 400),
        ("datatype-a-number", DIGITS, {"json": body(inputs=[tensor(datatype=11)])}, 400),
        ("shape-strings", DIGITS, {"json": body(inputs=[tensor(shape=["1", "64"])])}, 400),
        ("shape-a-number", DIGITS, {"json": body(inputs=[tensor(shape=64)])}, 400),
        ("shape-floats", DIGITS, {"json": body(inputs=[tensor(shape=[1.0, 64.0])])}, 400),
        ("shape-booleans", DIGITS, {"json": body(inputs=[tensor(shape=[True, 64])])}, 400),
        ("data-strings", DIGITS, {"json": body(inputs=[tensor(data=["0"] * 64)])}, 400),
        ("data-null", DIGITS, {"json": body(inputs=[tensor(data=None)])}, 400),
        ("data-objects", DIGITS, {"json": body(inputs=[tensor(data=[{}] * 64)])}, 400),
        ("parameters-a-list", DIGITS, {"json": body(parameters=["binary_data_output"])}, 400),
        ("parameters-a-string", DIGITS, {"json": body(parameters="x")}, 400),
        ("input-parameters-a-list", DIGITS, {"json": body(inputs=[tensor(parameters=[1])])}, 400),
        ("id-a-number", DIGITS, {"json": body(id=7)}, 400),
        ("id-an-object", DIGITS, {"json": body(id={"a": 1})}, 400),
        ("outputs-an-object", DIGITS, {"json": body(outputs={"name": "label"})}, 400),
        ("output-not-an-object", DIGITS, {"json": body(outputs=["label"])}, 400),
        ("output-name-a-number", DIGITS, {"json": body(outputs=[{"name": 1}])}, 400),
        (
            "output-parameters-a-list",
            DIGITS,
            {"json": body(outputs=[{"name": "label", "parameters": ["binary_data"]}])},
            400,
        ),
        (
            "classification-a-string",
            DIGITS,
            {"json": body(outputs=[{"name": "label", "parameters": {"classification": "3"}}])},
            400,
        ),
        (
            "binary-data-size-a-string",
            DIGITS,
            {"json": body(inputs=[tensor(data=None, parameters={"binary_data_size": "256"})])},
            400,
        ),
        ("empty-model-name", "/v2/models//infer", {"json": body()}, 404),
        ("unknown-version", "/v2/models/versioned/versions/3/infer", {"json": body()}, 404),
        ("version-not-a-number", "/v2/models/versioned/versions/x/infer", {"json": body()}, 400),
    ]
    return [pytest.param(path, kwargs, status, id=name) for name, path, kwargs, status in cases]


@pytest.mark.parametrize(("path", "kwargs", "status"), _http_cases())
def test_raw_http_is_refused_and_the_server_serves_on(server, path, kwargs, status):
    response = requests.post(server.http + path, timeout=60, **kwargs)
    assert_json_error(response, status)
    assert_still_serving_http(server)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v2/models/digits/generate"),
        ("POST", "/v2/models/digits/generate_stream"),
        ("GET", "/v2/cudasharedmemory/status"),
        ("POST", "/v2/cudasharedmemory/region/r/unregister"),
        ("GET", "/v2/trace/setting"),
        ("POST", "/v2/models/digits/trace/setting"),
        ("GET", "/v2/logging"),
        ("POST", "/v2/logging"),
    ],
)
def test_unimplemented_http_routes_answer_json_errors(server, method, path):
    response = requests.request(method, server.http + path, json={}, timeout=30)
    assert 400 <= response.status_code < 600
    assert_json_error(response, response.status_code)


# --- raw gRPC -----------------------------------------------------------------------------------


def digits_request(raw: bool = True) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="digits")
    spec = request.inputs.add(name="input", datatype="FP32", shape=[1, 64])
    if raw:
        request.raw_input_contents.append(np.zeros((1, 64), np.float32).tobytes())
    else:
        spec.contents.fp32_contents.extend(ROW)
    return request


def versioned_request(shape, raw: bytes | None = None) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="versioned")
    request.inputs.add(name="x", datatype="FP32", shape=shape)
    if raw is not None:
        request.raw_input_contents.append(raw)
    return request


def _grpc_cases() -> list:
    def edit(change, raw: bool = True):
        def build():
            request = digits_request(raw)
            change(request)
            return request

        return build

    def add_output(name):
        return lambda r: r.outputs.add(name=name)

    def add_outputs(*names):
        return lambda r: [r.outputs.add(name=name) for name in names]

    def duplicate_input(request):
        request.inputs.add().CopyFrom(request.inputs[0])
        request.raw_input_contents.append(request.raw_input_contents[0])

    def no_value_parameter(request):
        request.parameters["custom"].CopyFrom(pb.InferParameter())

    def classification_string(request):
        request.outputs.add(name="label").parameters["classification"].string_param = "3"

    invalid, not_found = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
    cases = [
        ("raw-count-over-inputs", edit(lambda r: r.raw_input_contents.append(b"\0" * 256)), invalid),
        ("raw-count-under-inputs", lambda: _silero_with_raws(2), invalid),
        ("raw-and-typed-mixed", edit(lambda r: r.raw_input_contents.append(b"\0" * 256), raw=False), invalid),
        ("typed-in-the-wrong-field", lambda: _typed("FP32", "int64_contents"), invalid),
        ("typed-in-two-fields", edit(lambda r: r.inputs[0].contents.int_contents.append(1), False), invalid),
        ("typed-count-short", edit(lambda r: r.inputs[0].contents.fp32_contents.pop(), raw=False), invalid),
        ("raw-bytes-short", edit(lambda r: r.raw_input_contents.__setitem__(0, b"\0" * 255)), invalid),
        ("empty-model-name", edit(lambda r: setattr(r, "model_name", "")), not_found),
        ("unknown-model", edit(lambda r: setattr(r, "model_name", "no_such_model")), not_found),
        ("unknown-version", edit(lambda r: setattr(r, "model_version", "9")), not_found),
        ("version-not-a-number", edit(lambda r: setattr(r, "model_version", "x")), invalid),
        ("unknown-datatype", edit(lambda r: setattr(r.inputs[0], "datatype", "FLOAT")), invalid),
        ("negative-dim", lambda: versioned_request([1, -2], b""), invalid),
        ("too-many-dims", lambda: versioned_request([1] * 65, b"\0" * 4), invalid),
        ("shape-product-overflows-raw", lambda: versioned_request([2**32, 2**32], b""), invalid),
        ("shape-product-overflows-typed", lambda: versioned_request([2**32, 2**32]), invalid),
        ("shape-int64-max", lambda: versioned_request([2**63 - 1, 2], b""), invalid),
        ("unknown-output", edit(add_output("logits")), invalid),
        ("duplicated-output", edit(add_outputs("label", "label")), invalid),
        ("duplicated-input", edit(duplicate_input), invalid),
        ("no-inputs", lambda: pb.ModelInferRequest(model_name="digits"), invalid),
        ("parameter-without-value", edit(no_value_parameter), invalid),
        ("classification-a-string", edit(classification_string), invalid),
    ]
    return [pytest.param(build, code, id=name) for name, build, code in cases]


def _typed(datatype: str, field: str) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="digits")
    spec = request.inputs.add(name="input", datatype=datatype, shape=[1, 64])
    getattr(spec.contents, field).extend([0] * 64)
    return request


def _silero_with_raws(count: int) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="silero_vad")
    for name, shape in (("input", [1, 512]), ("state", [2, 1, 128]), ("sr", [1])):
        request.inputs.add(name=name, datatype="INT64" if name == "sr" else "FP32", shape=shape)
    request.raw_input_contents.extend([b"\0" * 2048, b"\0" * 1024][:count])
    return request


def assert_still_serving_grpc(stub) -> None:
    response = stub.ModelInfer(digits_request(), timeout=60)
    assert [o.name for o in response.outputs] == ["probabilities", "label"]


@pytest.mark.parametrize(("build", "code"), _grpc_cases())
def test_raw_grpc_is_refused_and_the_server_serves_on(stub, build, code):
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(build(), timeout=60)
    assert caught.value.code() == code, caught.value.details()
    assert caught.value.details()
    assert_still_serving_grpc(stub)


@pytest.mark.parametrize("model", ["versioned", "reshape_scalar"])
def test_grpc_typed_and_raw_contents_answer_the_same(stub, model):
    """KServe v2 gRPC: typed ``contents`` and ``raw_input_contents`` are two spellings of one
    tensor; outputs always come back raw."""
    if model == "versioned":
        array, datatype, field = np.array([[1.5, -2.0, 3.25]], np.float32), "FP32", "fp32_contents"
    else:
        array, datatype, field = np.array([[4], [-9]], np.int64), "INT64", "int64_contents"
    typed = pb.ModelInferRequest(model_name=model, id="t")
    spec = typed.inputs.add(name="x", datatype=datatype, shape=list(array.shape))
    getattr(spec.contents, field).extend(array.reshape(-1).tolist())
    raw = pb.ModelInferRequest(model_name=model, id="t")
    raw.inputs.add(name="x", datatype=datatype, shape=list(array.shape))
    raw.raw_input_contents.append(array.tobytes())
    typed_answer, raw_answer = stub.ModelInfer(typed, timeout=60), stub.ModelInfer(raw, timeout=60)
    assert typed_answer == raw_answer
    assert typed_answer.id == "t" and len(typed_answer.raw_output_contents) == 1
    got = np.frombuffer(raw_answer.raw_output_contents[0], array.dtype).reshape(array.shape)
    np.testing.assert_array_equal(got, array + (2 if model == "versioned" else 1))
