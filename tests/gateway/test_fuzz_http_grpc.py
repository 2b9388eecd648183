"""Fuzzing a real ``naiad serve`` over the wire.

- **HTTP**: schemathesis generates requests for every operation of ``gateway/openapi.yaml``
  (valid and invalid parameters, bodies and headers) and checks each answer: no 5xx but the
  documented 501 and 503, every non-200 is JSON ``{"error": "..."}``, and status codes, content
  types and bodies conform to the document. Bounded (a few examples per operation, fixed
  seed); ``NAIAD_FUZZ=long`` runs many more (tests/fuzzing.py).
- **gRPC**: bytes that are not a valid ``ModelInferRequest`` (or any message) sent through a
  generic channel with identity serializers: grpc itself refuses them, and the server keeps
  serving.
"""

from __future__ import annotations

import pathlib

import grpc
import numpy as np
import pytest
import requests
import schemathesis
from fuzzing import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st
from naiad_harness import run_server
from schemathesis.checks import content_type_conformance, response_schema_conformance, status_code_conformance
from tritonclient.grpc import service_pb2 as pb

OPENAPI = pathlib.Path(__file__).resolve().parents[2] / "gateway" / "openapi.yaml"
schema = schemathesis.openapi.from_path(OPENAPI)
DOCUMENTED_5XX = {501, 503}


@pytest.fixture(scope="module")
def server(example_repository, tmp_path_factory):
    with run_server(
        example_repository,
        tmp_path_factory.mktemp("fuzz"),
        request_timeout_s=10,
        extra_args=["--model-control-mode", "explicit", "--load-model", "*"],
    ) as running:
        yield running
        log = running.log()
    assert "unhandled error" not in log, log[-3000:]


@schema.parametrize()
@fuzz_settings(8)
def test_http_surface_against_openapi(case, server):
    response = case.call(base_url=server.http, timeout=60)
    status = response.status_code
    assert status < 500 or status in DOCUMENTED_5XX, f"{case.method} {case.formatted_path}: {status}"
    if status != 200:
        content_type = response.headers.get("content-type", [""])[0]  # schemathesis: lowercase, lists
        assert content_type.startswith("application/json"), (status, response.text[:200])
        assert isinstance(response.json().get("error"), str), response.text[:200]
    case.validate_response(
        response, checks=[status_code_conformance, content_type_conformance, response_schema_conformance]
    )


# --- gRPC at the wire level ---------------------------------------------------------------

INFER = "/inference.GRPCInferenceService/ModelInfer"
METHODS = [INFER, *(f"/inference.GRPCInferenceService/{m}" for m in ("ModelMetadata", "ServerLive"))]
NOT_PROTOBUF = [
    b"\xff" * 16,  # field 31, wire type 7: no such wire type
    b"\x0a\xff\xff\xff\xff\x0f",  # a length far past the end
    b"\x0a\x05abc",  # truncated string
    b"\x08",  # a varint key with no value
    b"\x0b" + b"\x00" * 8,  # wire type 3 (start group) never ended
    b"\x80" * 11,  # a varint over 10 bytes
]


def raw_call(channel: grpc.Channel, method: str, payload: bytes) -> bytes:
    call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    return call(payload, timeout=30)


def digits_request() -> bytes:
    request = pb.ModelInferRequest(model_name="digits")
    request.inputs.add(name="input", datatype="FP32", shape=[1, 64])
    request.raw_input_contents.append(np.zeros((1, 64), np.float32).tobytes())
    return request.SerializeToString()


def assert_still_serving(channel: grpc.Channel) -> None:
    reply = pb.ModelInferResponse.FromString(raw_call(channel, INFER, digits_request()))
    assert [o.name for o in reply.outputs] == ["probabilities", "label"]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("payload", NOT_PROTOBUF, ids=lambda p: p[:6].hex())
def test_bytes_that_are_not_protobuf(server, method, payload):
    with grpc.insecure_channel(server.grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            raw_call(channel, method, payload)
        assert caught.value.code() in (grpc.StatusCode.INVALID_ARGUMENT,)
        assert_still_serving(channel)


@fuzz_settings(60)
@given(st.binary(max_size=200))
def test_random_bytes_to_model_infer(server, payload):
    """Whatever grpc makes of them: a refusal (bad protobuf, or a request that does not
    validate), never a hang; the server answers the next valid request."""
    with grpc.insecure_channel(server.grpc_url) as channel:
        try:
            raw_call(channel, INFER, payload)
        except grpc.RpcError as exc:
            assert exc.code() in (
                grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL, grpc.StatusCode.NOT_FOUND,
            ), exc  # fmt: skip
    response = requests.get(f"{server.http}/v2/health/live", timeout=10)
    assert response.status_code == 200


def test_unknown_method_and_service(server):
    with grpc.insecure_channel(server.grpc_url) as channel:
        for method in ("/inference.GRPCInferenceService/NoSuch", "/no.Such/Method", "garbage"):
            with pytest.raises(grpc.RpcError) as caught:
                raw_call(channel, method, b"")
            assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert_still_serving(channel)
