"""naiad.datatypes and naiad.codec (the queue wire format): round trips and malformed input."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from bytes_samples import MIXED, MIXED_BYTES
from hypothesis import given, settings
from hypothesis import strategies as st

from naiad import codec
from naiad.datatypes import (
    NUMPY_DTYPES,
    bytes_elements,
    config_to_datatype,
    datatype_of,
    datatype_to_config,
    deserialize_bytes,
    element_size,
    from_bytes,
    numpy_dtype,
    serialize_bytes,
    to_bytes,
)
from naiad.errors import DeadlineExceeded, InvalidInput, ModelNotFound, NaiadError
from naiad.inference import InferRequest, RequestedOutput, Tensor

FIXED = [name for name in NUMPY_DTYPES if name != "BYTES"]


def sample(datatype: str, shape: list[int]) -> np.ndarray:
    count = int(np.prod(shape)) if shape else 1
    if datatype == "BYTES":
        values = [b"", b"\xff\xfe\x00", "héllo".encode(), b"x" * 300][: max(count, 0)]
        values += [bytes([i % 256]) * i for i in range(count - len(values))]
        array = np.empty(count, dtype=np.object_)
        array[:] = values
        return array.reshape(shape)
    if datatype == "BOOL":
        return (np.arange(count) % 3 == 0).reshape(shape)
    return (np.arange(count) * 3 - 2).astype(NUMPY_DTYPES[datatype]).reshape(shape)


# --- datatypes -------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", list(NUMPY_DTYPES))
@pytest.mark.parametrize("shape", [[2, 3], [0, 4], [], [5]])
def test_to_from_bytes_round_trip(datatype, shape):
    array = sample(datatype, shape)
    raw = to_bytes(array, datatype)
    back = from_bytes(raw, datatype, shape)
    assert back.shape == tuple(shape)
    if datatype == "BYTES":
        assert back.tolist() == array.tolist()
    else:
        assert back.dtype == NUMPY_DTYPES[datatype]
        assert len(raw) == array.size * element_size(datatype)
        assert back.tobytes() == np.ascontiguousarray(array).tobytes()


def test_to_bytes_is_little_endian_and_row_major():
    big = np.array([[1, 2], [3, 4]], dtype=">i4")
    assert to_bytes(big, "INT32") == np.array([1, 2, 3, 4], "<i4").tobytes()
    assert to_bytes(np.asfortranarray(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)), "FP32") == (
        np.array([1, 2, 3, 4], "<f4").tobytes()
    )


def test_from_bytes_size_mismatch():
    with pytest.raises(InvalidInput):
        from_bytes(b"\0" * 7, "FP32", [2])
    with pytest.raises(InvalidInput):
        from_bytes(b"\0" * 8, "FP32", [3])


def test_bytes_serialization_is_triton_length_prefixed():
    array = np.array([b"ab", b"", "é"], dtype=np.object_)
    assert serialize_bytes(array) == b"\x02\0\0\0ab" + b"\0\0\0\0" + b"\x02\0\0\0\xc3\xa9"


def prefixed(items: list[bytes]) -> bytes:
    return b"".join(len(item).to_bytes(4, "little") + item for item in items)


def test_bytes_elements_follow_tritons_rule():
    got = bytes_elements(MIXED)
    assert got == MIXED_BYTES and all(type(item) is bytes for item in got)
    assert got[6] is MIXED[6]  # bytes are taken as they are, not copied


def test_bytes_elements_of_byte_and_unicode_string_arrays():
    # S: each element's bytes as they are (numpy drops trailing NULs, as Triton's .item() does).
    assert bytes_elements(np.array([b"x", b"yz", b"a\0"], dtype="S2")) == [b"x", b"yz", b"a"]
    assert bytes_elements(np.array(["é", "ab"])) == [b"\xc3\xa9", b"ab"]


def test_bytes_elements_are_row_major():
    array = np.asfortranarray(MIXED.reshape(2, 4))
    assert bytes_elements(array) == MIXED_BYTES
    assert bytes_elements(np.array(7, dtype=np.object_)) == [b"7"]  # a scalar tensor


def test_serialize_bytes_follows_tritons_rule():
    assert serialize_bytes(MIXED) == prefixed(MIXED_BYTES)
    assert to_bytes(MIXED, "BYTES") == prefixed(MIXED_BYTES)
    assert serialize_bytes(np.array([b"x", b"yz"], dtype="S2")) == prefixed([b"x", b"yz"])
    assert serialize_bytes(np.empty(0, dtype=np.object_)) == b""


def test_worker_reply_carries_non_bytes_elements_as_triton_does():
    outputs = [Tensor("m", "BYTES", [2, 4], MIXED.reshape(2, 4)),
               Tensor("s", "BYTES", [2], np.array([b"x", b"yz"], dtype="S2"))]  # fmt: skip
    got = codec.decode_reply(codec.encode_reply(codec.Reply("q", outputs))).outputs
    assert got[0].shape == [2, 4] and got[0].data.reshape(-1).tolist() == MIXED_BYTES
    assert got[1].data.tolist() == [b"x", b"yz"]


@pytest.mark.parametrize(
    ("raw", "count"),
    [(b"\x01\0\0", None), (b"\x05\0\0\0abc", None), (b"\x01\0\0\0a", 2), (b"\x00\0\0\0\x00\0\0\0", 1)],
)
def test_deserialize_bytes_rejects_malformed(raw, count):
    with pytest.raises(InvalidInput):
        deserialize_bytes(raw, count)


@given(st.lists(st.binary(max_size=40), max_size=20))
def test_bytes_round_trip_property(items):
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    assert deserialize_bytes(serialize_bytes(array), len(items)).tolist() == items


@given(st.binary(max_size=64))
def test_deserialize_bytes_never_raises_anything_but_invalid_input(raw):
    try:
        deserialize_bytes(raw)
    except InvalidInput:
        pass


def test_datatype_of_non_native_byte_order():
    """A big-endian array (to_bytes accepts one) still has a v2 datatype."""
    assert datatype_of(np.dtype(">f4")) == "FP32"
    assert datatype_of(np.dtype(">i8")) == "INT64"


def test_datatype_names():
    assert numpy_dtype("FP32") == np.float32
    with pytest.raises(InvalidInput):
        numpy_dtype("FLOAT")
    assert datatype_of(np.dtype(np.int64)) == "INT64"
    assert datatype_of(np.dtype(np.object_)) == "BYTES"
    assert datatype_of(np.dtype("S3")) == "BYTES"
    assert datatype_of(np.dtype("<U3")) == "BYTES"
    with pytest.raises(InvalidInput):
        datatype_of(np.dtype(np.complex64))
    assert config_to_datatype("TYPE_STRING") == "BYTES"
    assert config_to_datatype("TYPE_FP16") == "FP16"
    assert datatype_to_config("BYTES") == "TYPE_STRING"
    assert datatype_to_config("BF16") == "TYPE_BF16"
    for name in FIXED:
        assert datatype_of(NUMPY_DTYPES[name]) == name
        assert config_to_datatype(datatype_to_config(name)) == name
    assert element_size("BYTES") == 0
    assert element_size("FP16") == 2 and element_size("BF16") == 2 and element_size("UINT64") == 8


# --- codec -----------------------------------------------------------------------------------


def make_request(tensors: list[Tensor]) -> InferRequest:
    return InferRequest(
        model="m",
        version=3,
        inputs=tensors,
        outputs=[RequestedOutput("out0"), RequestedOutput("out1")],
        id="req-1",
        parameters={"timeout": 5, "flag": True},
    )


def assert_tensors_equal(got: list[Tensor], want: list[Tensor]) -> None:
    assert [(t.name, t.datatype, list(t.shape)) for t in got] == [
        (t.name, t.datatype, list(t.shape)) for t in want
    ]
    for g, w in zip(got, want, strict=True):
        if w.datatype == "BYTES":
            assert g.data.tolist() == w.data.tolist()
        else:
            assert g.data.dtype == NUMPY_DTYPES[w.datatype]
            assert g.data.tobytes() == np.ascontiguousarray(w.data).tobytes()


def all_tensors() -> list[Tensor]:
    return [Tensor(f"t_{dt}", dt, [2, 2], sample(dt, [2, 2])) for dt in NUMPY_DTYPES] + [
        Tensor("empty", "FP32", [0, 3], sample("FP32", [0, 3])),
        Tensor("scalar", "INT64", [], sample("INT64", [])),
    ]


def test_request_round_trip_every_datatype():
    request = make_request(all_tensors())
    fields = codec.encode_request("q1", request, "naiad:reply:g", 123.5, 100.25)
    assert set(fields) == {codec.HEADER, codec.DATA}
    queued = codec.decode_request("m", fields, b"1-0")
    assert (queued.queue_id, queued.reply_to, queued.deadline, queued.enqueued_at, queued.entry_id) == (
        "q1",
        "naiad:reply:g",
        123.5,
        100.25,
        b"1-0",
    )
    got = queued.request
    assert (got.model, got.version, got.id, got.parameters) == ("m", 3, "req-1", {"timeout": 5, "flag": True})
    assert [o.name for o in got.outputs] == ["out0", "out1"]
    assert_tensors_equal(got.inputs, request.inputs)


def test_reply_round_trip_outputs_and_errors():
    outputs = all_tensors()
    reply = codec.decode_reply(codec.encode_reply(codec.Reply("q", outputs, timings_ns={"compute_infer": 7})))
    assert reply.queue_id == "q" and reply.error is None and reply.timings_ns == {"compute_infer": 7}
    assert_tensors_equal(reply.outputs, outputs)
    for error in (ModelNotFound("gone"), DeadlineExceeded("late"), InvalidInput("bad")):
        back = codec.decode_reply(codec.encode_reply(codec.Reply("q", error=error))).error
        assert type(back) is type(error) and back.message == error.message and back.status == error.status


def test_reply_with_unknown_error_class_becomes_500():
    payload = msgpack.packb([{"q": "q", "ok": False, "e": ["KeyboardInterrupt", "x"]}, b""])
    error = codec.decode_reply(payload).error
    assert type(error) is NaiadError and error.status == 500


def good_fields() -> dict[bytes, bytes]:
    return codec.encode_request(
        "q", make_request([Tensor("a", "FP32", [2], np.ones(2, np.float32))]), "r", 1.0, 0.0
    )


def header_with(**changes) -> dict[bytes, bytes]:
    fields = good_fields()
    header = msgpack.unpackb(fields[codec.HEADER])
    header.update(changes)
    for key, value in list(header.items()):
        if value is ...:
            del header[key]
    return {**fields, codec.HEADER: msgpack.packb(header)}


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {codec.HEADER: b"\xc1"},
        {codec.HEADER: msgpack.packb(5)},
        {codec.HEADER: msgpack.packb([1, 2])},
        {codec.HEADER: good_fields()[codec.HEADER] + b"\x00"},
        {**good_fields(), codec.DATA: b"\0" * 7},
        {**good_fields(), codec.DATA: b""},
        header_with(q=...),
        header_with(v="one"),
        header_with(dl="soon"),
        header_with(**{"in": [["a", "FP32", [2]]]}),
        header_with(**{"in": [["a", "FLOAT", [2], 8]]}),
        header_with(**{"in": [["a", "FP32", [3], 8]]}),
        header_with(**{"in": [["a", "FP32", [-1, -2], 8]]}),
        header_with(**{"in": [["a", "FP32", [2], -8]]}),
        header_with(**{"in": [["a", "FP32", [0], -8], ["b", "FP32", [2], 8]]}),
        {**header_with(**{"in": [["a", "FP32", [0], -16], ["b", "FP32", [2], 8]]}), codec.DATA: b"\0" * 16},
    ],
    ids=lambda f: None,
)
def test_decode_request_malformed_raises_invalid_input(fields):
    with pytest.raises(InvalidInput):
        codec.decode_request("m", fields)


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",
        msgpack.packb(1),
        msgpack.packb([{"q": "q"}, b""]),
        msgpack.packb([{"q": "q", "ok": True, "out": [["a", "FP32", [4], 16]]}, b"\0" * 8]),
    ],
)
def test_decode_reply_malformed_raises_invalid_input(payload):
    with pytest.raises(InvalidInput):
        codec.decode_reply(payload)
    with pytest.raises(InvalidInput):
        codec.decode_replies(payload)


def test_replies_of_one_batch_travel_as_one_element():
    """A worker concatenates a batch's replies for one gateway; they come back in order,
    and a truncated element is refused whole."""
    outputs = all_tensors()
    replies = [codec.Reply("a", outputs), codec.Reply("b", error=DeadlineExceeded("late")), codec.Reply("c")]
    payload = b"".join(codec.encode_reply(r) for r in replies)
    back = codec.decode_replies(payload)
    assert [r.queue_id for r in back] == ["a", "b", "c"]
    assert_tensors_equal(back[0].outputs, outputs)
    assert isinstance(back[1].error, DeadlineExceeded) and back[2].outputs == []
    with pytest.raises(InvalidInput):
        codec.decode_replies(payload[:-1])


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64), st.binary(max_size=32))
def test_decode_request_garbage_only_raises_invalid_input(header, data):
    try:
        codec.decode_request("m", {codec.HEADER: header, codec.DATA: data})
    except InvalidInput:
        pass


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(FIXED),
    st.lists(st.integers(0, 4), max_size=3),
    st.text(max_size=10),
)
def test_request_round_trip_property(datatype, shape, request_id):
    tensor = Tensor("x", datatype, shape, sample(datatype, shape))
    request = InferRequest("m", 1, [tensor], [], request_id, {})
    back = codec.decode_request("m", codec.encode_request("q", request, "r", 2.0, 1.0)).request
    assert back.id == request_id
    assert_tensors_equal(back.inputs, [tensor])


def test_a_tensor_spec_seen_before_decodes_the_same_and_is_still_bounded():
    """Valid fixed-size specs are remembered: the same spec again gives the same tensor
    (its own bytes), a spec equal only in value (``1.0`` for ``1``) gets integer dims, and
    a remembered spec whose bytes are short is refused as before."""
    out = [Tensor("p", "FP32", [1, 3], np.arange(3, dtype=np.float32).reshape(1, 3))]
    for values in ([0, 1, 2], [5, 6, 7]):
        out[0].data = np.array([values], dtype=np.float32)
        (reply,) = codec.decode_replies(codec.encode_reply(codec.Reply("q", outputs=out)))
        assert reply.outputs[0].shape == [1, 3] and reply.outputs[0].data.tolist() == [values]
    header, raw = msgpack.unpackb(codec.encode_reply(codec.Reply("q", outputs=out)))
    header["out"][0][2] = [1.0, 3]  # equal in value to the remembered [1, 3]
    (reply,) = codec.decode_replies(msgpack.packb([header, raw]))
    assert [type(d) for d in reply.outputs[0].shape] == [int, int] and reply.outputs[0].data.shape == (1, 3)
    with pytest.raises(InvalidInput, match="shorter than its header says"):
        codec.decode_replies(msgpack.packb([header, raw[:-1]]))
