"""gRPC converters, error statuses and the deadline bound, without a server."""

from __future__ import annotations

import logging

import grpc
import ml_dtypes
import numpy as np
import pytest
from bytes_samples import MIXED, MIXED_BYTES, STRINGS
from tritonclient.grpc import service_pb2 as pb

from gateway.grpc_codec import (
    CONTENTS_FIELDS,
    EMPTY_FINAL,
    RESERVED_PREFIX_MESSAGE,
    from_infer_request,
    from_infer_response,
    from_parameters,
    request_parameters,
    to_contents,
    to_infer_request,
    to_infer_response,
    to_parameters,
)
from gateway.grpc_server import bounded_timeout, status_of
from naiad import errors
from naiad.datatypes import numpy_dtype
from naiad.errors import InvalidInput
from naiad.inference import InferRequest, InferResponse, RequestedOutput, Tensor


def sample(datatype: str, shape: list[int]) -> np.ndarray:
    count = int(np.prod(shape))
    if datatype == "BYTES":
        array = np.empty(count, dtype=np.object_)
        array[:] = [f"item-{i}\0\xff".encode("latin-1") for i in range(count)]
        return array.reshape(shape)
    dtype = numpy_dtype(datatype)
    if dtype.kind == "b":
        return (np.arange(count) % 2 == 0).reshape(shape)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = [int(info.min), int(info.max), *range(count - 2)]  # the extremes, then 0, 1...
        return np.array(values[:count], dtype=dtype).reshape(shape)
    return np.linspace(-3.5, 7.25, count).astype(dtype).reshape(shape)


def request_of(*tensors: Tensor) -> InferRequest:
    return InferRequest("m", 3, list(tensors), [RequestedOutput("out", None, 2)], "id-1", {"timeout": 7})


def assert_same_request(got: InferRequest, want: InferRequest) -> None:
    assert (got.model, got.version, got.id, got.parameters, got.outputs) == (
        want.model, want.version, want.id, want.parameters, want.outputs,
    )  # fmt: skip
    for a, b in zip(got.inputs, want.inputs, strict=True):
        assert (a.name, a.datatype, a.shape) == (b.name, b.datatype, b.shape)
        assert a.data.dtype == b.data.dtype
        np.testing.assert_array_equal(a.data, b.data)


@pytest.mark.parametrize("datatype", sorted(CONTENTS_FIELDS))
@pytest.mark.parametrize("raw", [True, False], ids=["raw", "typed"])
def test_request_round_trip(datatype, raw):
    want = request_of(
        Tensor("x", datatype, [2, 3], sample(datatype, [2, 3])), Tensor("y", "FP32", [1], sample("FP32", [1]))
    )
    message = to_infer_request(want, raw=raw)
    assert bool(message.raw_input_contents) == raw
    assert_same_request(from_infer_request(message, "m", 3), want)


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_floats_travel_raw_only(datatype):
    tensor = Tensor("x", datatype, [4], sample(datatype, [4]))
    assert_same_request(from_infer_request(to_infer_request(request_of(tensor)), "m", 3), request_of(tensor))
    with pytest.raises(InvalidInput, match="raw_input_contents"):
        to_infer_request(request_of(tensor), raw=False)
    message = pb.ModelInferRequest(
        inputs=[pb.ModelInferRequest.InferInputTensor(name="x", datatype=datatype, shape=[1])]
    )
    message.inputs[0].contents.fp32_contents.append(1.0)
    with pytest.raises(InvalidInput, match="raw_input_contents"):
        from_infer_request(message, "m", 1)
    assert sample("BF16", [1]).dtype == ml_dtypes.bfloat16


def typed(datatype: str, shape: list[int], field: str, values: list) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest()
    spec = message.inputs.add(name="x", datatype=datatype, shape=shape)
    getattr(spec.contents, field).extend(values)
    return message


@pytest.mark.parametrize(
    ("message", "match"),
    [
        (typed("INT8", [1], "int_contents", [300]), "does not fit INT8"),
        (typed("UINT16", [1], "uint_contents", [70000]), "does not fit UINT16"),
        (typed("FP32", [2], "fp32_contents", [1.0]), "needs 2 elements"),
        (typed("FP32", [1], "fp64_contents", [1.0]), "belongs in fp32_contents"),
        (typed("FP32", [-1], "fp32_contents", [1.0]), "shape"),
        (typed("NOPE", [1], "fp32_contents", [1.0]), "unknown datatype"),
        (pb.ModelInferRequest(), "at least one input"),
    ],
)
def test_bad_typed_requests(message, match):
    with pytest.raises(InvalidInput, match=match):
        from_infer_request(message, "m", 1)


def test_raw_rules():
    message = to_infer_request(request_of(Tensor("x", "FP32", [1], sample("FP32", [1]))))
    message.inputs.add(name="y", datatype="FP32", shape=[1])
    with pytest.raises(InvalidInput, match="one per input"):
        from_infer_request(message, "m", 1)
    message.raw_input_contents.append(b"\0\0\0\0")
    message.inputs[1].contents.fp32_contents.append(1.0)
    with pytest.raises(InvalidInput, match="contents must not be given"):
        from_infer_request(message, "m", 1)
    message.inputs[1].ClearField("contents")
    message.raw_input_contents[1] = b"\0"
    with pytest.raises(InvalidInput, match="input 'y'"):
        from_infer_request(message, "m", 1)


def test_parameters_round_trip():
    values = {"timeout": 5, "priority": 2**63 + 1, "flag": True, "name": "x", "ratio": 1.5, "neg": -3}
    assert from_parameters(to_parameters(values)) == values
    assert to_parameters({"priority": 2**63 + 1})["priority"].WhichOneof("parameter_choice") == "uint64_param"
    with pytest.raises(InvalidInput, match="no value"):
        from_parameters({"empty": pb.InferParameter()})
    with pytest.raises(TypeError):
        to_parameters({"bad": [1]})


def test_response_round_trip_is_raw():
    outputs = [
        Tensor("p", "FP32", [2, 2], sample("FP32", [2, 2])),
        Tensor("s", "BYTES", [3], sample("BYTES", [3])),
    ]
    want = InferResponse("m", 2, outputs, "rid", {"cached": True})
    message = to_infer_response(want)
    assert message.raw_output_contents[1][:4] == len(outputs[1].data[0]).to_bytes(4, "little")
    assert not any(o.HasField("contents") for o in message.outputs)
    got = from_infer_response(message)
    assert (got.model, got.version, got.id, got.parameters) == ("m", 2, "rid", {"cached": True})
    for a, b in zip(got.outputs, want.outputs, strict=True):
        np.testing.assert_array_equal(a.data, b.data)


def test_typed_bytes_contents_follow_tritons_rule():
    assert list(to_contents(Tensor("m", "BYTES", [2, 4], MIXED.reshape(2, 4))).bytes_contents) == MIXED_BYTES
    assert list(to_contents(Tensor("s", "BYTES", [2], STRINGS)).bytes_contents) == [b"x", b"yz"]
    message = to_infer_request(request_of(Tensor("m", "BYTES", [8], MIXED)), raw=False)
    assert list(message.inputs[0].contents.bytes_contents) == MIXED_BYTES


def test_raw_bytes_output_follows_tritons_rule():
    outputs = [Tensor("m", "BYTES", [2, 4], MIXED.reshape(2, 4)), Tensor("s", "BYTES", [2], STRINGS)]
    message = to_infer_response(InferResponse("m", 1, outputs))
    assert message.raw_output_contents[0] == b"".join(len(b).to_bytes(4, "little") + b for b in MIXED_BYTES)
    got = from_infer_response(message).outputs
    assert got[0].data.reshape(-1).tolist() == MIXED_BYTES and got[1].data.tolist() == [b"x", b"yz"]


@pytest.mark.parametrize(
    ("parameters", "remaining_s", "expected"),
    [
        ({}, None, {}),
        ({"timeout": 10**6}, None, {"timeout": 10**6}),
        ({}, 0.5, {"timeout": 500_000}),  # bounds the server default (60 s)
        ({"timeout": 0}, 0.5, {"timeout": 500_000}),  # 0: no timeout of its own, the default
        ({}, 100.0, {"timeout": 60_000_000}),
        ({"timeout": 10**6}, 0.25, {"timeout": 250_000}),
        ({"timeout": 1000}, 0.25, {"timeout": 1000}),
        ({"timeout": 1000}, -1.0, {"timeout": 1}),
        ({"timeout": "soon"}, 0.25, {"timeout": "soon"}),  # left for the data plane to reject
    ],
)
def test_bounded_timeout(parameters, remaining_s, expected):
    assert bounded_timeout(parameters, remaining_s, 60.0) == expected


def test_every_error_class_has_a_grpc_code():
    assert set(errors.ERRORS_BY_NAME.values()) <= set(errors.GRPC_CODES)
    assert all(code in grpc.StatusCode.__members__ for code in errors.GRPC_CODES.values())


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (errors.InvalidInput, grpc.StatusCode.INVALID_ARGUMENT),
        (errors.ConfigError, grpc.StatusCode.INVALID_ARGUMENT),
        (errors.ModelNotFound, grpc.StatusCode.NOT_FOUND),
        (errors.ModelNotReady, grpc.StatusCode.UNAVAILABLE),
        (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
        (errors.DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED),
        (errors.Unsupported, grpc.StatusCode.UNIMPLEMENTED),
        (errors.InferenceFailed, grpc.StatusCode.INTERNAL),
        (errors.NaiadError, grpc.StatusCode.INTERNAL),
    ],
)
def test_status_of_naiad_errors(error, code):
    assert status_of(error("details"), "M") == (code, "details")


def test_status_of_unknown_error_is_generic_and_logged(caplog):
    class Sub(errors.ModelNotFound):
        pass

    assert status_of(Sub("x"), "M") == (grpc.StatusCode.NOT_FOUND, "x")
    with caplog.at_level(logging.ERROR, logger="gateway.grpc_server"):
        code, message = status_of(KeyError("secret"), "/inference.GRPCInferenceService/ModelInfer")
    assert (code, message) == (grpc.StatusCode.INTERNAL, "internal server error")
    assert "secret" not in message
    assert caplog.records and caplog.records[0].exc_info is not None


def test_request_parameters_named_triton_are_refused_but_the_empty_final_flag():
    """Triton 2.51's gRPC front, asked of it (tests/differential: infer/triton_parameter ...)."""
    given = {"k": pb.InferParameter(int64_param=1), EMPTY_FINAL: pb.InferParameter(bool_param=True)}
    assert request_parameters(given) == {"k": 1}  # the stream's option is not the model's
    with pytest.raises(InvalidInput) as caught:
        request_parameters({"triton_x": pb.InferParameter(int64_param=1)})
    assert caught.value.message == RESERVED_PREFIX_MESSAGE
    with pytest.raises(InvalidInput) as caught:
        request_parameters({EMPTY_FINAL: pb.InferParameter(string_param="yes")})
    assert caught.value.message == f"invalid value type for '{EMPTY_FINAL}' parameter, expected bool_param."
    assert request_parameters({"TRITON_x": pb.InferParameter(bool_param=False)}) == {"TRITON_x": False}
