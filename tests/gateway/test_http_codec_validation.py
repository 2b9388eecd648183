"""gateway.http_codec (v2 JSON and binary bodies) and naiad.validation, without servers."""

from __future__ import annotations

import json

import numpy as np
import pytest
from bytes_samples import MIXED, MIXED_BYTES, STRINGS
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from gateway import http_codec
from gateway.http_codec import HEADER_LENGTH, parse_infer_request, parse_raw_request, render_infer_response
from naiad.errors import InvalidInput
from naiad.inference import InferRequest, InferResponse, RequestedOutput, Tensor
from naiad.validation import client_shape, validate_request, wire_datatype


def binary(header: dict, *chunks: bytes) -> tuple[bytes, int]:
    head = json.dumps(header).encode()
    return head + b"".join(chunks), len(head)


def spec(name="x", datatype="FP32", shape=(1, 2), **extra) -> dict:
    return {"name": name, "datatype": datatype, "shape": list(shape), **extra}


# --- parse -----------------------------------------------------------------------------------


def test_parse_json_nested_and_flat():
    body = json.dumps(
        {
            "id": "a",
            "inputs": [spec(data=[[1, 2]]), spec("y", "INT64", (2,), data=[3, 4])],
            "outputs": [{"name": "o", "parameters": {"binary_data": True}}],
            "parameters": {"binary_data_output": False},
        }
    ).encode()
    request = parse_infer_request(body, None, "m", 2)
    assert (request.model, request.version, request.id) == ("m", 2, "a")
    np.testing.assert_array_equal(request.inputs[0].data, np.array([[1, 2]], np.float32))
    assert request.inputs[0].data.dtype == np.float32 and request.inputs[1].data.dtype == np.int64
    assert request.outputs[0].name == "o" and request.outputs[0].binary is True
    assert request.parameters == {"binary_data_output": False}


def test_parse_binary_inputs_in_order_with_json_between():
    a, b = np.arange(2, dtype=np.float32).reshape(1, 2), np.array([b"\xff", b""], dtype=object)
    raw_b = b"\x01\0\0\0\xff\0\0\0\0"
    body, length = binary(
        {
            "inputs": [
                spec(parameters={"binary_data_size": 8}),
                spec("j", "INT32", (1,), data=[7]),
                spec("s", "BYTES", (2,), parameters={"binary_data_size": len(raw_b)}),
            ]
        },
        a.tobytes(),
        raw_b,
    )
    request = parse_infer_request(body, length, "m", 1)
    np.testing.assert_array_equal(request.inputs[0].data, a)
    assert request.inputs[1].data.tolist() == [7]
    assert request.inputs[2].data.tolist() == b.tolist()


def test_a_binary_header_seen_again_gives_the_same_request_with_its_own_bytes():
    """A binary request's header is remembered: the next body with it gets its own tensor
    bytes, fresh containers, and the same refusals (short or extra bytes) with the same text."""
    header = {"id": "r1", "inputs": [spec(shape=(1, 2), parameters={"binary_data_size": 8}),
                                     spec("s", "BYTES", (1,), parameters={"binary_data_size": 5})],
              "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
              "parameters": {"binary_data_output": True, "k": 3}}  # fmt: skip
    x1, x2 = np.array([[1, 2]], np.float32), np.array([[3, 4]], np.float32)
    chunks = [(x1, b"\x01\0\0\0a"), (x2, b"\x01\0\0\0b")]
    first, second = (parse_infer_request(*binary(header, x.tobytes(), s), "m", 1) for x, s in chunks)
    for request, (x, s) in zip((first, second), chunks, strict=True):
        np.testing.assert_array_equal(request.inputs[0].data, x)
        assert request.inputs[1].data.tolist() == [s[4:]] and request.inputs[1].shape == [1]
        assert (request.id, request.parameters) == ("r1", header["parameters"])
        assert [(o.name, o.binary) for o in request.outputs] == [("y", True)]
    assert second.parameters is not first.parameters and second.outputs[0] is not first.outputs[0]
    assert second.inputs[0].shape is not first.inputs[0].shape
    body, length = binary(header, x1.tobytes(), chunks[0][1])
    assert body[:length] in http_codec._binary_headers  # remembered, by the header's bytes
    floats = x1.tobytes()
    tails = (floats + b"\x01\0\0\0", floats + b"\x01\0\0\0a!", floats + b"\x02\0\0\0a")
    head = binary(header)[0]  # the remembered header alone, said to be longer than the body
    with pytest.raises(InvalidInput, match=f"does not fit a {len(head)}-byte body"):
        parse_infer_request(head, len(head) + 1, "m", 1)
    wanted = ("runs past the request body", "belong to no input", "runs past the end of its data")
    for tail, text in zip(tails, wanted, strict=True):  # remembered header (r1), new one (r2)
        answers = []
        for request_id in ("r1", "r2"):
            with pytest.raises(InvalidInput) as refused:
                parse_infer_request(*binary({**header, "id": request_id}, tail), "m", 1)
            answers.append(str(refused.value))
        assert answers[0] == answers[1] and text in answers[0], answers


def test_parse_bytes_json_strings():
    body = json.dumps({"inputs": [spec("s", "BYTES", (2,), data=["", "é"])]}).encode()
    assert parse_infer_request(body, None, "m", 1).inputs[0].data.tolist() == [b"", "é".encode()]


def good_binary() -> tuple[bytes, int]:
    return binary({"inputs": [spec(parameters={"binary_data_size": 8})]}, b"\0" * 8)


@pytest.mark.parametrize(
    ("body", "length"),
    [
        (good_binary()[0], 0),  # header length 0
        (good_binary()[0], len(good_binary()[0]) + 1),  # past the body
        (good_binary()[0], good_binary()[1] - 1),  # cuts the JSON
        (good_binary()[0], None),  # binary bytes without a header length
        (good_binary()[0] + b"\0", good_binary()[1]),  # a byte left over
        (good_binary()[0][:-1], good_binary()[1]),  # a byte short
        (b"\xff\xfe", None),
        (b"{", None),
        (b"[]", None),
        (b"{}", None),
        (json.dumps({"inputs": [spec(data=[1])]}).encode(), None),  # element count
        (json.dumps({"inputs": [spec(data=[1, 2, 3])]}).encode(), None),
        (json.dumps({"inputs": [spec("h", "FP16", data=[1, 2])]}).encode(), None),
        (json.dumps({"inputs": [spec("h", "BF16", data=[1, 2])]}).encode(), None),
        (json.dumps({"inputs": [spec(datatype="FLOAT", data=[1, 2])]}).encode(), None),
        (json.dumps({"inputs": [spec(shape=(1, -2), data=[1, 2])]}).encode(), None),
        (json.dumps({"inputs": [spec(shape=(True, 2), data=[1, 2])]}).encode(), None),
        (json.dumps({"inputs": [spec(shape="12", data=[1, 2])]}).encode(), None),
        (json.dumps({"inputs": [spec()]}).encode(), None),  # neither data nor binary size
        (json.dumps({"inputs": [spec(data="ab")]}).encode(), None),
        (json.dumps({"inputs": [spec("i", "INT8", data=[1, 300])]}).encode(), None),
        (json.dumps({"inputs": [spec("s", "BYTES", (1,), data=[1])]}).encode(), None),
        (json.dumps({"inputs": [spec(parameters={"binary_data_size": -1})]}).encode(), None),
        (json.dumps({"inputs": [spec(data=[1, 2])], "id": 5}).encode(), None),
        (json.dumps({"inputs": [spec(data=[1, 2])], "parameters": [1]}).encode(), None),
        (json.dumps({"inputs": [spec(data=[1, 2])], "outputs": [{"nam": "o"}]}).encode(), None),
        (json.dumps({"inputs": [{"datatype": "FP32"}]}).encode(), None),
    ],
)
def test_parse_rejects_malformed(body, length):
    with pytest.raises(InvalidInput):
        parse_infer_request(body, length, "m", 1)


@pytest.mark.parametrize(
    ("datatype", "data", "kind"),
    [("FP32", ["a", "b"], "string"), ("FP32", [True, False], "boolean"), ("FP32", [1, "x"], "string"),
     ("FP64", [None, 1], "null, object, mixed or over-64-bit"), ("BOOL", [1, 0], "number")],
)  # fmt: skip
def test_json_data_of_the_wrong_kind_is_named_by_its_json_kind(datatype, data, kind):
    """The refusal names the JSON kind of the values and what the datatype needs, never
    numpy's type code (``'<U1'`` meant nothing to a client)."""
    body = json.dumps({"inputs": [spec(datatype=datatype, data=data)]}).encode()
    with pytest.raises(InvalidInput) as caught:
        parse_infer_request(body, None, "m", 1)
    needs = "booleans" if datatype == "BOOL" else "numbers"
    expected = f"input 'x': data does not fit {datatype}: JSON {kind} values are not {needs}"
    assert caught.value.message == expected


@pytest.mark.parametrize("key", ["triton_x", "triton_enable_empty_final_response"])
def test_a_request_parameter_named_triton_is_refused_with_tritons_message(key):
    body = json.dumps({"inputs": [spec(data=[1, 2])], "parameters": {"k": 1, key: True}}).encode()
    with pytest.raises(InvalidInput) as caught:
        parse_infer_request(body, None, "m", 1)
    assert caught.value.message == http_codec.RESERVED_PREFIX_MESSAGE
    same = json.dumps({"inputs": [spec(data=[1, 2])], "parameters": {"TRITON_x": 1, "x_triton_": 2}}).encode()
    assert parse_infer_request(same, None, "m", 1).parameters == {"TRITON_x": 1, "x_triton_": 2}


@pytest.mark.parametrize("size", ["256", -4, True, 2.5, [8]], ids=repr)
def test_parse_names_a_binary_data_size_that_is_not_a_size(size):
    body, length = binary({"inputs": [spec(parameters={"binary_data_size": size})]}, b"\0" * 8)
    with pytest.raises(InvalidInput) as caught:
        parse_infer_request(body, length, "m", 1)
    assert caught.value.message == f"input 'x': binary_data_size must be a non-negative integer, got {size!r}"


def test_parse_header_length_equal_to_body_is_json_only():
    body = json.dumps({"inputs": [spec(data=[1, 2])]}).encode()
    assert parse_infer_request(body, len(body), "m", 1).inputs[0].shape == [1, 2]


# --- render ----------------------------------------------------------------------------------


def response_and_request(outputs: list[RequestedOutput], parameters: dict | None = None):
    tensors = [
        Tensor("p", "FP32", [1, 2], np.array([[0.5, 1.5]], np.float32)),
        Tensor("s", "BYTES", [1], np.array([b"ok"], dtype=object)),
    ]
    request = InferRequest("m", 1, [], outputs, "id7", parameters or {})
    return InferResponse("m", 1, tensors, "id7"), request


def split_body(payload: bytes, headers: dict[str, str]) -> tuple[dict, bytes]:
    if HEADER_LENGTH not in headers:
        assert headers["Content-Type"] == "application/json"
        return json.loads(payload), b""
    length = int(headers[HEADER_LENGTH])
    return json.loads(payload[:length]), payload[length:]


def test_render_json_by_default():
    header, tail = split_body(*render_infer_response(*response_and_request([])))
    assert tail == b"" and header["id"] == "id7" and header["model_version"] == "1"
    assert [o["data"] for o in header["outputs"]] == [[0.5, 1.5], ["ok"]]


def test_render_binary_output_default_and_per_output_choice():
    payload, headers = render_infer_response(
        *response_and_request([RequestedOutput("s", binary=False)], {"binary_data_output": True})
    )
    header, tail = split_body(payload, headers)
    p, s = header["outputs"]
    assert p["parameters"] == {"binary_data_size": 8} and "data" not in p
    assert s["data"] == ["ok"]
    assert tail == np.array([0.5, 1.5], "<f4").tobytes()
    assert int(headers[HEADER_LENGTH]) == len(payload) - 8


def test_render_binary_bytes_and_non_utf8():
    response, request = response_and_request([RequestedOutput("s", binary=True)])
    response.outputs[1].data = np.array([b"\xff"], dtype=object)
    header, tail = split_body(*render_infer_response(response, request))
    assert header["outputs"][1]["parameters"] == {"binary_data_size": 5} and tail == b"\x01\0\0\0\xff"
    with pytest.raises(InvalidInput):
        render_infer_response(response, InferRequest("m", 1, [], [RequestedOutput("s", binary=False)]))


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_render_bytes_not_built_of_bytes_as_triton_does(binary):
    outputs = [Tensor("m", "BYTES", [2, 4], MIXED.reshape(2, 4)), Tensor("s", "BYTES", [2], STRINGS)]
    request = InferRequest("m", 1, [], [], "", {"binary_data_output": binary})
    header, tail = split_body(*render_infer_response(InferResponse("m", 1, outputs), request))
    m, s = header["outputs"]
    if binary:
        items = [*MIXED_BYTES, b"x", b"yz"]
        assert tail == b"".join(len(item).to_bytes(4, "little") + item for item in items)
        assert m["parameters"]["binary_data_size"] + s["parameters"]["binary_data_size"] == len(tail)
    else:
        assert m["data"] == [item.decode() for item in MIXED_BYTES] and s["data"] == ["x", "yz"]


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_render_refuses_fp16_and_bf16_as_json_with_tritons_message(datatype):
    tensor = Tensor("h", datatype, [1], np.zeros(1, np.float16 if datatype == "FP16" else np.uint16))
    with pytest.raises(InvalidInput, match=f"^sending {datatype} data via JSON is not supported. Please use "
                                           "the binary data format for output$"):  # fmt: skip
        render_infer_response(InferResponse("m", 1, [tensor]), InferRequest("m", 1, [], []))
    payload, headers = render_infer_response(
        InferResponse("m", 1, [tensor]), InferRequest("m", 1, [], [RequestedOutput("h", binary=True)])
    )
    assert split_body(payload, headers)[1] == tensor.data.tobytes()


@pytest.mark.parametrize("value", ["false", "true", 1, 0, [True]])
def test_binary_flags_must_be_booleans(value):
    """binary_data_output and binary_data are bools (the binary extension); Triton refuses
    the string "false" (with 500; 400 here)."""
    inputs = [spec(data=[1, 2])]
    output = {"name": "o", "parameters": {"binary_data": value}}
    for header in ({"inputs": inputs, "parameters": {"binary_data_output": value}},
                   {"inputs": inputs, "outputs": [output]}):  # fmt: skip
        with pytest.raises(InvalidInput, match="must be a boolean"):
            parse_infer_request(json.dumps(header).encode(), None, "m", 1)


@pytest.mark.parametrize("value", [{"a": 1}, [1], None])
def test_request_parameters_must_be_scalars(value):
    body = json.dumps({"inputs": [spec(data=[1, 2])], "parameters": {"custom": value}}).encode()
    with pytest.raises(InvalidInput, match="parameter 'custom' has invalid type"):
        parse_infer_request(body, None, "m", 1)
    for fine in (True, 3, 1.5, "x"):
        body = json.dumps({"inputs": [spec(data=[1, 2])], "parameters": {"custom": fine}}).encode()
        assert parse_infer_request(body, None, "m", 1).parameters == {"custom": fine}


def test_data_and_binary_data_size_together_are_refused_with_tritons_message():
    body, length = binary({"inputs": [spec(data=[1, 2], parameters={"binary_data_size": 8})]}, bytes(8))
    with pytest.raises(InvalidInput, match=r"^Input must set only one of the following fields: 'data', "
                                           r"'binary_data_size' in 'parameters', 'shared_memory_region' in "
                                           r"'parameters'. But set 'data' 'binary_data_size'$"):  # fmt: skip
        parse_infer_request(body, length, "m", 1)


def test_an_empty_binary_output_is_plain_json():
    tensor = Tensor("e", "FP32", [1, 0], np.zeros((1, 0), np.float32))
    payload, headers = render_infer_response(InferResponse("m", 1, [tensor]), InferRequest(
        "m", 1, [], [], parameters={"binary_data_output": True}))  # fmt: skip
    assert HEADER_LENGTH not in headers and headers["Content-Type"] == "application/json"
    assert json.loads(payload)["outputs"][0]["parameters"] == {"binary_data_size": 0}


RAW_ONE = text_format.Parse(
    """name: "r" max_batch_size: 4
    input [ { name: "x" data_type: TYPE_INT32 dims: [ 2 ] } ]
    output [ { name: "y" data_type: TYPE_INT32 dims: [ 2 ] } ]""",
    mc.ModelConfig(),
)


def test_raw_binary_request_is_the_only_inputs_bytes():
    request = parse_raw_request(np.array([3, -4], "<i4").tobytes(), RAW_ONE, "r", 2)
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("x", "INT32", [1, 2])
    assert tensor.data.tolist() == [[3, -4]]
    assert request.parameters == {"binary_data_output": True} and request.version == 2
    nobatch = mc.ModelConfig()
    nobatch.CopyFrom(RAW_ONE)
    nobatch.max_batch_size = 0
    assert parse_raw_request(bytes(8), nobatch, "r", 1).inputs[0].shape == [2]


@pytest.mark.parametrize(
    ("config", "body", "message"),
    [
        ("two", bytes(8), "exactly one input"),
        ("one", bytes(12), "raw binary request: tensor data has 12 bytes"),
        ("one", b"", "raw binary request: tensor data has 0 bytes"),
        ("variable", bytes(8), "variable dims"),
    ],
)
def test_raw_binary_request_refusals(config, body, message):
    configs = {"one": RAW_ONE, "two": DIGITS, "variable": NOBATCH}
    with pytest.raises(InvalidInput, match=message):
        parse_raw_request(body, configs[config], "r", 1)


# --- validation ------------------------------------------------------------------------------

DIGITS = text_format.Parse(
    """name: "d" max_batch_size: 4
    input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] },
            { name: "s" data_type: TYPE_STRING dims: [ -1 ] optional: true } ]
    output [ { name: "y" data_type: TYPE_INT64 dims: [ 1 ] } ]""",
    mc.ModelConfig(),
)
NOBATCH = text_format.Parse(
    """name: "n" max_batch_size: 0
    input [ { name: "x" data_type: TYPE_FP32 dims: [ 2, -1 ] } ]
    output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]""",
    mc.ModelConfig(),
)


def t(name: str, shape: list[int], datatype: str = "FP32") -> Tensor:
    return Tensor(name, datatype, shape, np.zeros(0))


def req(*tensors: Tensor, outputs=()) -> InferRequest:
    return InferRequest("d", 1, list(tensors), [RequestedOutput(o) for o in outputs])


def test_validation_accepts():
    validate_request(DIGITS, req(t("x", [1, 3])))
    validate_request(DIGITS, req(t("x", [4, 3]), t("s", [4, 7], "BYTES"), outputs=["y"]))
    validate_request(NOBATCH, req(t("x", [2, 9])))
    assert client_shape(DIGITS, [3]) == [-1, 3] and client_shape(NOBATCH, [2, -1]) == [2, -1]
    assert wire_datatype(mc.TYPE_STRING) == "BYTES" and wire_datatype(mc.TYPE_BF16) == "BF16"


@pytest.mark.parametrize(
    ("config", "request_"),
    [
        (DIGITS, req(t("z", [1, 3]))),
        (DIGITS, req(t("x", [1, 3]), t("x", [1, 3]))),
        (DIGITS, req(t("s", [1, 2], "BYTES"))),  # required x missing
        (DIGITS, req(t("x", [1, 3], "FP64"))),
        (DIGITS, req(t("x", [1, 4]))),
        (DIGITS, req(t("x", [3]))),
        (DIGITS, req(t("x", []))),
        (DIGITS, req(t("x", [0, 3]))),
        (DIGITS, req(t("x", [5, 3]))),
        (DIGITS, req(t("x", [1, 3, 1]))),
        (DIGITS, req(t("x", [2, 3]), t("s", [1, 1], "BYTES"))),  # batch sizes disagree
        (DIGITS, req(t("x", [1, 3]), outputs=["nope"])),
        (NOBATCH, req(t("x", [1, 2, 9]))),
        (NOBATCH, req(t("x", [3, 9]))),
    ],
)
def test_validation_rejects(config, request_):
    with pytest.raises(InvalidInput):
        validate_request(config, request_)


def test_validation_follows_a_config_changed_in_place():
    config = mc.ModelConfig()
    config.CopyFrom(DIGITS)
    validate_request(config, req(t("x", [4, 3])))
    config.max_batch_size = 2  # the same message, changed: the rules are read again
    with pytest.raises(InvalidInput, match="outside 1..2"):
        validate_request(config, req(t("x", [4, 3])))
    config.input[0].dims[0] = 5
    validate_request(config, req(t("x", [2, 5])))


def test_a_request_that_looks_like_one_that_passed_passes_and_any_other_is_checked():
    """Passed requests are remembered by names, datatypes, shapes and output names: the same
    again passes; another batch size, an output, a datatype is checked anew (and one that
    failed is not remembered)."""
    config = mc.ModelConfig()
    config.CopyFrom(DIGITS)
    validate_request(config, req(t("x", [2, 3]), outputs=["y"]))
    validate_request(config, req(t("x", [2, 3]), outputs=["y"]))  # remembered
    for bad in (req(t("x", [5, 3]), outputs=["y"]), req(t("x", [2, 3]), outputs=["y", "nope"]),
                req(t("x", [2, 3], "FP64"), outputs=["y"]), req(t("x", [2, 3]), t("x", [2, 3]))):  # fmt: skip
        for _ in range(2):  # not remembered as passed
            with pytest.raises(InvalidInput):
                validate_request(config, bad)


OUT_OF_RANGE = [("INT64", 2**63), ("INT64", 2**64 - 1), ("UINT64", -1), ("UINT64", -(2**63)),
                ("INT32", 2**31), ("UINT8", 256)]  # fmt: skip
AT_THE_EDGES = [("INT64", 2**63 - 1), ("INT64", -(2**63)), ("UINT64", 2**64 - 1), ("UINT64", 2**63),
                ("INT8", -128)]  # fmt: skip


@pytest.mark.parametrize(("datatype", "value"), OUT_OF_RANGE)
def test_json_integers_out_of_range_are_refused_not_wrapped(datatype, value):
    body = json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": datatype, "data": [value]}]})
    with pytest.raises(InvalidInput, match="out of range|must be integers"):
        parse_infer_request(body.encode(), None, "m", 1)


@pytest.mark.parametrize(("datatype", "value"), AT_THE_EDGES)
def test_json_integers_at_the_edges_of_their_range_are_kept(datatype, value):
    body = json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": datatype, "data": [value]}]})
    assert parse_infer_request(body.encode(), None, "m", 1).inputs[0].data.tolist() == [value]
