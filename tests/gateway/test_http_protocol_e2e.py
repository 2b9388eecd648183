"""Protocol details over a real ``naiad serve`` (HTTP body limit 1 MiB): compression the way
tritonclient uses it, compression bombs, request ids, scheduling parameters, per-output
binary choices, JSON errors for every non-200, and the served OpenAPI document."""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib

import grpc
import numpy as np
import psutil
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from naiad_harness import run_server
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from gateway.http import load_openapi
from gateway.http_encoding import COMPRESS_MIN_BYTES

LIMIT = 1 << 20
DIGITS = "/v2/models/digits/infer"
OUTPUTS = ("probabilities", "label")
HEADER_LENGTH = "Inference-Header-Content-Length"


@pytest.fixture(scope="module")
def server(example_repository, tmp_path_factory):
    env = {"NAIAD_HTTP_MAX_BODY_BYTES": str(LIMIT)}
    with run_server(example_repository, tmp_path_factory.mktemp("protocol"), extra_env=env) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    triton = httpclient.InferenceServerClient(server.url, network_timeout=60)
    yield triton
    triton.close()


@pytest.fixture(scope="module")
def grpc_url(server):
    return server.grpc_url


def reference(session, x: np.ndarray) -> dict[str, np.ndarray]:
    return dict(zip(OUTPUTS, session.run(list(OUTPUTS), {"input": x}), strict=True))


def digits_input(module, x: np.ndarray, binary: bool = True):
    tensor = module.InferInput("input", list(x.shape), "FP32")
    if module is grpcclient:
        tensor.set_data_from_numpy(x)
    else:
        tensor.set_data_from_numpy(x, binary_data=binary)
    return tensor


def assert_digits(result, expected) -> None:
    np.testing.assert_allclose(result.as_numpy("probabilities"), expected["probabilities"], rtol=1e-5)
    np.testing.assert_array_equal(result.as_numpy("label"), expected["label"])


def json_body(**extra) -> dict:
    return {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}], **extra}


def split(response: requests.Response, body: bytes | None = None) -> tuple[dict, bytes]:
    """The JSON header and the binary tail of an infer response body."""
    body = response.content if body is None else body
    length = int(response.headers.get(HEADER_LENGTH, len(body)))
    return json.loads(body[:length]), body[length:]


def assert_json_error(response: requests.Response, status: int) -> str:
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    message = response.json()["error"]
    assert isinstance(message, str) and message
    return message


# --- compression -----------------------------------------------------------------------


@pytest.mark.parametrize("request_coding", [None, "gzip", "deflate"])
@pytest.mark.parametrize("response_coding", [None, "gzip", "deflate"])
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_compression(
    client, digits_onnx, digits_holdout, request_coding, response_coding, binary
):
    x = np.ascontiguousarray(digits_holdout[0][:16])
    outputs = [httpclient.InferRequestedOutput(name, binary_data=binary) for name in OUTPUTS]
    result = client.infer(
        "digits",
        [digits_input(httpclient, x, binary)],
        outputs=outputs,
        request_id="compressed",
        request_compression_algorithm=request_coding,
        response_compression_algorithm=response_coding,
    )
    assert_digits(result, reference(digits_onnx, x))
    assert result.get_response()["id"] == "compressed"


def test_tritonclient_aio_compression(server, digits_onnx, digits_holdout):
    x = np.ascontiguousarray(digits_holdout[0][:5])

    async def run():
        triton = aiohttpclient.InferenceServerClient(server.url)
        try:
            return [
                await triton.infer(
                    "digits",
                    [digits_input(aiohttpclient, x, binary=coding == "gzip")],
                    request_compression_algorithm=coding,
                    response_compression_algorithm=coding,
                )
                for coding in ("gzip", "deflate")
            ]
        finally:
            await triton.close()

    for result in asyncio.run(run()):
        assert_digits(result, reference(digits_onnx, x))


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_compressed_response_on_the_wire(server, digits_holdout, coding):
    """A body of COMPRESS_MIN_BYTES or more is compressed and Inference-Header-Content-Length
    counts uncompressed bytes; a smaller one goes as it is. Both say ``Vary``."""
    rows = digits_holdout[0][:64]
    spec = {"name": "input", "datatype": "FP32", "shape": [64, 64], "data": rows.ravel().tolist()}
    body = {"inputs": [spec], "parameters": {"binary_data_output": True}}
    response = requests.post(
        server.http + DIGITS, json=body, headers={"Accept-Encoding": coding}, stream=True, timeout=60
    )
    raw = response.raw.read(decode_content=False)
    assert response.status_code == 200
    assert response.headers["Content-Encoding"] == coding and response.headers["Vary"] == "Accept-Encoding"
    plain = gzip.decompress(raw) if coding == "gzip" else zlib.decompress(raw)
    assert len(plain) >= COMPRESS_MIN_BYTES
    header, tail = split(response, plain)
    sizes = [out["parameters"]["binary_data_size"] for out in header["outputs"]]
    assert sizes == [64 * 40, 64 * 8] and len(tail) == 64 * 48

    small = requests.post(server.http + DIGITS, json=json_body(parameters={"binary_data_output": True}),
                          headers={"Accept-Encoding": coding}, stream=True, timeout=60)  # fmt: skip
    plain = small.raw.read(decode_content=False)
    assert small.status_code == 200 and "Content-Encoding" not in small.headers
    assert small.headers["Vary"] == "Accept-Encoding" and len(plain) < COMPRESS_MIN_BYTES
    header, tail = split(small, plain)
    assert [out["parameters"]["binary_data_size"] for out in header["outputs"]] == [40, 8] and len(tail) == 48


def test_compressed_binary_request_header_length_is_uncompressed(server):
    spec = {"name": "input", "datatype": "FP32", "shape": [1, 64], "parameters": {"binary_data_size": 256}}
    head = json.dumps({"inputs": [spec]}).encode()
    body = gzip.compress(head + np.ones((1, 64), np.float32).tobytes())
    headers = {"Content-Encoding": "gzip", HEADER_LENGTH: str(len(head)), "Accept-Encoding": "identity"}
    response = requests.post(server.http + DIGITS, data=body, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    assert "Content-Encoding" not in response.headers  # nothing asked for


def zeros_bomb(coding: str, size: int) -> bytes:
    encoder = zlib.compressobj(9, zlib.DEFLATED, 31 if coding == "gzip" else zlib.MAX_WBITS)
    chunk = bytes(1 << 20)
    return b"".join([*(encoder.compress(chunk) for _ in range(size >> 20)), encoder.flush()])


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_compression_bomb_is_413_without_inflating_it(server, coding):
    bomb = zeros_bomb(coding, 256 << 20)  # ~250 KiB on the wire, 256 MiB inflated
    assert len(bomb) < LIMIT
    process = psutil.Process(server.process.pid)
    before = process.memory_info().rss
    response = requests.post(
        server.http + DIGITS, data=bomb, headers={"Content-Encoding": coding}, timeout=60
    )
    assert "limit" in assert_json_error(response, 413)
    assert process.memory_info().rss - before < 64 << 20


@pytest.mark.parametrize("coding", ["br", "compress", "zstd"])
def test_unknown_content_encoding_is_501(server, coding):
    response = requests.post(
        server.http + DIGITS, data=json.dumps(json_body()), headers={"Content-Encoding": coding}, timeout=60
    )
    assert coding in assert_json_error(response, 501)


def test_corrupt_gzip_is_400(server):
    response = requests.post(
        server.http + DIGITS, data=b"{not gzip}", headers={"Content-Encoding": "gzip"}, timeout=60
    )
    assert_json_error(response, 400)


def test_tritonclient_gzip_of_a_zero_tensor_under_the_limit(client):
    x = np.zeros((64, 64), np.float32)  # 16 KiB of zeros: tiny compressed, fine inflated
    result = client.infer("digits", [digits_input(httpclient, x)], request_compression_algorithm="gzip")
    assert result.as_numpy("label").shape == (64, 1)


# --- request id ------------------------------------------------------------------------


@pytest.mark.parametrize("binary_output", [False, True])
def test_request_id_is_echoed_over_http(server, binary_output):
    body = json_body(id="my-id-7", parameters={"binary_data_output": binary_output})
    response = requests.post(server.http + DIGITS, json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert split(response)[0]["id"] == "my-id-7"
    without = requests.post(server.http + DIGITS, json=json_body(), timeout=60).json()
    assert "id" not in without  # Triton leaves an empty id out


def test_request_id_is_echoed_over_grpc(grpc_url, digits_holdout):
    x = np.ascontiguousarray(digits_holdout[0][:2])
    triton = grpcclient.InferenceServerClient(grpc_url)
    try:
        result = triton.infer("digits", [digits_input(grpcclient, x)], request_id="grpc-id-9")
        assert result.get_response().id == "grpc-id-9"
        assert triton.infer("digits", [digits_input(grpcclient, x)]).get_response().id == ""
    finally:
        triton.close()


# --- scheduling parameters ---------------------------------------------------------------


@pytest.mark.parametrize(
    "parameters",
    [{"priority": 0}, {"priority": 3}, {"priority": 2**64 - 1}, {"timeout": 0}, {"timeout": 30_000_000}],
)
def test_valid_priority_and_timeout(server, parameters):
    response = requests.post(server.http + DIGITS, json=json_body(parameters=parameters), timeout=60)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("name", ["priority", "timeout"])
@pytest.mark.parametrize("value", [-1, 1.5, "5", True, 2**64])
def test_invalid_priority_and_timeout_are_400(server, name, value):
    response = requests.post(server.http + DIGITS, json=json_body(parameters={name: value}), timeout=60)
    assert name in assert_json_error(response, 400)


def test_tritonclient_priority_and_timeout(client, grpc_url, digits_holdout):
    x = np.ascontiguousarray(digits_holdout[0][:1])
    http_result = client.infer("digits", [digits_input(httpclient, x)], priority=2, timeout=30_000_000)
    triton = grpcclient.InferenceServerClient(grpc_url)
    try:
        grpc_result = triton.infer("digits", [digits_input(grpcclient, x)], priority=2, timeout=30_000_000)
    finally:
        triton.close()
    np.testing.assert_array_equal(http_result.as_numpy("label"), grpc_result.as_numpy("label"))


def test_negative_priority_over_grpc_is_invalid_argument(grpc_url):
    request = service_pb2.ModelInferRequest(model_name="digits")
    request.inputs.add(name="input", datatype="FP32", shape=[1, 64])
    request.raw_input_contents.append(np.zeros((1, 64), np.float32).tobytes())
    request.parameters["priority"].int64_param = -4
    with grpc.insecure_channel(grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "priority" in caught.value.details()


# --- binary_data_output with per-output overrides ----------------------------------------


@pytest.mark.parametrize(
    ("default", "overrides", "expected"),
    [
        (True, {"probabilities": False}, {"probabilities": "json", "label": "binary"}),
        (False, {"label": True}, {"probabilities": "json", "label": "binary"}),
        (None, {"probabilities": True}, {"probabilities": "binary", "label": "json"}),
        (True, {"probabilities": False, "label": False}, {"probabilities": "json", "label": "json"}),
    ],
)
def test_binary_data_output_with_per_output_override(server, digits_onnx, default, overrides, expected):
    outputs = [
        {"name": name, **({"parameters": {"binary_data": overrides[name]}} if name in overrides else {})}
        for name in OUTPUTS
    ]
    parameters = {} if default is None else {"binary_data_output": default}
    response = requests.post(
        server.http + DIGITS, json=json_body(outputs=outputs, parameters=parameters), timeout=60
    )
    assert response.status_code == 200, response.text
    header, tail = split(response)
    kinds = {
        o["name"]: "binary" if "binary_data_size" in o.get("parameters", {}) else "json"
        for o in header["outputs"]
    }
    assert kinds == expected
    want = reference(digits_onnx, np.ones((1, 64), np.float32))
    offset = 0
    for out in header["outputs"]:
        if kinds[out["name"]] == "binary":
            size = out["parameters"]["binary_data_size"]
            value = np.frombuffer(tail[offset : offset + size], want[out["name"]].dtype)
            offset += size
        else:
            value = np.array(out["data"], want[out["name"]].dtype)
        np.testing.assert_allclose(value.reshape(out["shape"]), want[out["name"]], rtol=1e-5)
    assert offset == len(tail)


# --- every non-200 is JSON -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/nope", 404),
        ("GET", "/v2/models/digits/versions/1/nope", 404),
        ("POST", "/v2/models/digits/infer/extra", 404),
        ("GET", DIGITS, 405),
        ("DELETE", "/v2/models/digits", 405),
        ("POST", "/v2/health/ready", 405),
    ],
)
def test_framework_errors_are_json(server, method, path, status):
    assert_json_error(requests.request(method, server.http + path, timeout=30), status)


def test_body_over_the_limit_is_413(server):
    headers = {"Content-Type": "application/json"}
    response = requests.post(server.http + DIGITS, data=b" " * (LIMIT + 1024), headers=headers, timeout=60)
    assert_json_error(response, 413)


def test_413_reaches_tritonclient(client):
    x = np.zeros((64, 64 * 65), np.float32)  # 1.06 MiB of tensor data
    tensor = httpclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("digits", [tensor])
    assert caught.value.status() == "413"


# --- the OpenAPI document ------------------------------------------------------------------


def test_openapi_json_is_the_yaml(server):
    response = requests.get(server.http + "/v2/openapi.json", timeout=30)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("application/json")
    assert response.json() == json.loads(json.dumps(load_openapi()))
