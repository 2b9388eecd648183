"""Fuzzing the gateway's request parsers with hypothesis (bounded; see tests/fuzzing.py).

- ``http_codec.parse_infer_request``: any JSON header (right keys with wrong values, or
  anything), any binary tail, any ``Inference-Header-Content-Length`` → an InferRequest whose
  tensors match their shapes, or :class:`NaiadError` (400), nothing else.
- ``grpc_codec.from_infer_request``: any ``ModelInferRequest`` (typed contents in any field,
  raw contents of any count and size, any shapes and parameters) → the same.
"""

from __future__ import annotations

import json

from fuzzing import fuzz_settings
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from gateway.grpc_codec import CONTENTS_FIELDS, from_infer_request
from gateway.http_codec import parse_infer_request
from naiad.datatypes import NUMPY_DTYPES, element_count
from naiad.errors import NaiadError

DATATYPES = list(NUMPY_DTYPES)
JSON_SCALARS = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=6)
)  # fmt: skip
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
DIM = st.integers(0, 4) | st.sampled_from([-1, 2**31, 2**62, 2**63 - 1, 2**63, 2**64]) | JSON


def mostly(strategy: st.SearchStrategy) -> st.SearchStrategy:
    """``strategy`` nine times in ten, any JSON value the tenth."""
    return st.integers(0, 9).flatmap(lambda n: JSON if n == 0 else strategy)


def _numbers(count: int) -> st.SearchStrategy:
    return st.lists(st.integers(-300, 300) | st.floats(-1e40, 1e40) | st.booleans(), min_size=count,
                    max_size=count)  # fmt: skip


@st.composite
def http_input(draw) -> dict:
    shape = draw(mostly(st.lists(DIM, max_size=3)))
    spec = {"name": draw(mostly(st.text(max_size=4))), "datatype": draw(mostly(st.sampled_from(DATATYPES))),
            "shape": shape}  # fmt: skip
    count = element_count(shape) if isinstance(shape, list) and all(
        type(d) is int and 0 <= d <= 4 for d in shape) else 3  # fmt: skip
    choice = draw(st.integers(0, 3))
    if choice == 0:
        spec["data"] = draw(_numbers(count) | st.lists(st.text(max_size=3), min_size=count, max_size=count))
    elif choice == 1:
        spec["data"] = draw(JSON)
    elif choice == 2:
        spec["parameters"] = {"binary_data_size": draw(mostly(st.integers(-2, 64)))}
    if draw(st.booleans()):
        spec.pop(draw(st.sampled_from(["name", "datatype", "shape"])))
    return spec


HTTP_HEADER = st.fixed_dictionaries(
    {"inputs": mostly(st.lists(http_input(), max_size=3))},
    optional={
        "id": mostly(st.text(max_size=4)),
        "parameters": mostly(st.dictionaries(st.text(max_size=6), JSON_SCALARS, max_size=3)),
        "outputs": mostly(st.lists(st.fixed_dictionaries(
            {"name": mostly(st.text(max_size=4))},
            optional={"parameters": mostly(st.fixed_dictionaries({}, optional={
                "binary_data": JSON_SCALARS, "classification": JSON_SCALARS}))}), max_size=2)),
    },
)  # fmt: skip


def _check_tensors(request) -> None:
    for tensor in request.inputs:
        assert list(tensor.data.shape) == tensor.shape
        assert tensor.data.size == element_count(tensor.shape)


@fuzz_settings(400)
@given(HTTP_HEADER, st.binary(max_size=96), st.sampled_from(["exact", "none", "any"]), st.integers(-5, 4096))
def test_parse_infer_request_structured(header, tail, length_mode, length):
    head = json.dumps(header).encode()
    body = head + tail
    header_length = {"exact": len(head), "none": None, "any": length}[length_mode]
    try:
        request = parse_infer_request(body if length_mode != "none" else head, header_length, "m", 1)
    except NaiadError as exc:
        assert exc.status == 400, exc
        return
    _check_tensors(request)


@fuzz_settings(300)
@given(st.binary(max_size=512), st.none() | st.integers(-2, 600))
def test_parse_infer_request_random_bytes(body, header_length):
    try:
        parse_infer_request(body, header_length, "m", 1)
    except NaiadError as exc:
        assert exc.status == 400, exc


# --- gRPC ---------------------------------------------------------------------------------

FIELD_VALUES = {
    "bool_contents": st.booleans(),
    "int_contents": st.integers(-(2**31), 2**31 - 1),
    "int64_contents": st.integers(-(2**63), 2**63 - 1),
    "uint_contents": st.integers(0, 2**32 - 1),
    "uint64_contents": st.integers(0, 2**64 - 1),
    "fp32_contents": st.floats(width=32),
    "fp64_contents": st.floats(),
    "bytes_contents": st.binary(max_size=8),
}
PARAMETER = st.one_of(
    st.builds(pb.InferParameter),
    st.builds(lambda v: pb.InferParameter(bool_param=v), st.booleans()),
    st.builds(lambda v: pb.InferParameter(int64_param=v), st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda v: pb.InferParameter(uint64_param=v), st.integers(0, 2**64 - 1)),
    st.builds(lambda v: pb.InferParameter(string_param=v), st.text(max_size=4)),
    st.builds(lambda v: pb.InferParameter(double_param=v), st.floats()),
)
GRPC_DIM = st.integers(0, 4) | st.sampled_from([-(2**63), -1, 2**31, 2**62, 2**63 - 1])


@st.composite
def grpc_request(draw) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m", id=draw(st.text(max_size=4)))
    raw_mode = draw(st.booleans())
    for _ in range(draw(st.integers(0, 3))):
        datatype = draw(st.sampled_from(DATATYPES) | st.text(max_size=5))
        shape = draw(st.lists(GRPC_DIM, max_size=3))
        spec = request.inputs.add(name=draw(st.text(max_size=3)), datatype=datatype, shape=shape)
        small = all(0 <= d <= 4 for d in shape)
        count = element_count(shape) if small else 2
        if raw_mode:
            size = count * (NUMPY_DTYPES[datatype].itemsize if datatype in NUMPY_DTYPES else 4)
            raw = draw(st.binary(min_size=size, max_size=size) | st.binary(max_size=64))
            request.raw_input_contents.append(raw)
        if not raw_mode or draw(st.integers(0, 9)) == 0:
            own = CONTENTS_FIELDS.get(datatype, "fp32_contents")
            field = draw(st.sampled_from(list(FIELD_VALUES)) | st.just(own))
            n = draw(st.sampled_from([count, count + 1, max(count - 1, 0)]))
            getattr(spec.contents, field).extend(draw(st.lists(FIELD_VALUES[field], min_size=n, max_size=n)))
    if raw_mode and draw(st.integers(0, 9)) == 0:
        request.raw_input_contents.append(draw(st.binary(max_size=8)))
    for name in draw(st.lists(st.text(max_size=4), max_size=2)):
        output = request.outputs.add(name=name)
        if draw(st.booleans()):
            output.parameters["classification"].CopyFrom(draw(PARAMETER))
    for key in draw(st.lists(st.text(max_size=6), max_size=3)):
        request.parameters[key].CopyFrom(draw(PARAMETER))
    return request
    # fmt: skip


@fuzz_settings(400)
@given(grpc_request())
def test_from_infer_request_any_message(request):
    try:
        converted = from_infer_request(request, "m", 1)
    except NaiadError as exc:
        assert exc.status == 400, exc
        return
    _check_tensors(converted)
    assert len(converted.inputs) == len(request.inputs)


@fuzz_settings(300)
@given(st.binary(max_size=256))
def test_from_infer_request_of_parsed_garbage(raw):
    """Bytes that happen to parse as a ModelInferRequest (protobuf is lenient)."""
    request = pb.ModelInferRequest()
    try:
        request.ParseFromString(raw)
    except DecodeError:  # grpc itself answers these (tests/gateway/test_fuzz_http_grpc.py)
        return
    try:
        _check_tensors(from_infer_request(request, "m", 1))
    except NaiadError as exc:
        assert exc.status == 400, exc
