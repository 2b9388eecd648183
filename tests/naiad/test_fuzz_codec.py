"""Fuzzing the queue codec and the BYTES encoding with hypothesis (bounded; see tests/fuzzing.py).

The queue is written only by gateways and workers, but a worker must never die on one bad
entry, so every malformed message must be :class:`InvalidInput`, whatever its shape: random
bytes, and msgpack headers whose values have the wrong types, sizes or signs.
"""

from __future__ import annotations

import msgpack
import numpy as np
from fuzzing import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

from naiad import codec
from naiad.datatypes import NUMPY_DTYPES, deserialize_bytes, from_bytes, serialize_bytes, to_bytes
from naiad.errors import InvalidInput

DATATYPES = list(NUMPY_DTYPES)
INTS = st.integers(-(2**63), 2**64 - 1)  # what msgpack can carry
#: msgpack-encodable values of every kind, nested a little.
SCALARS = (
    st.none() | st.booleans() | INTS | st.floats()
    | st.text(max_size=8) | st.binary(max_size=8)
)  # fmt: skip
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=10,
)
def mostly(strategy: st.SearchStrategy) -> st.SearchStrategy:
    """``strategy`` nine times in ten, any value the tenth."""
    return st.integers(0, 9).flatmap(lambda n: VALUES if n == 0 else strategy)


DIMS = st.integers(-3, 6) | st.sampled_from([2**31, 2**32, 2**62, 2**63 - 1, 2**64 - 1]) | VALUES
SPEC = st.one_of(
    st.tuples(st.text(max_size=4), mostly(st.sampled_from(DATATYPES)), mostly(st.lists(DIMS, max_size=4)),
              mostly(st.integers(-8, 64))).map(list),
    VALUES,
)  # fmt: skip


def headers(keys: dict) -> st.SearchStrategy[dict]:
    """A request/reply header: every key present, or each key present or not; each value
    typed right or not (mostly right, so that decoding gets past the first keys)."""
    values = {key: mostly(strategy) for key, strategy in keys.items()}
    return st.fixed_dictionaries(values) | st.fixed_dictionaries({}, optional=values)


REQUEST_HEADER = headers({
    "q": st.text(max_size=8), "id": st.text(max_size=8), "v": st.integers(0, 2**64 - 1) | st.floats(),
    "r": st.text(max_size=8), "dl": st.floats() | INTS, "t": st.floats(),
    "in": st.lists(SPEC, max_size=3), "out": st.lists(st.text(max_size=4), max_size=3),
    "p": st.dictionaries(st.text(max_size=4), SCALARS, max_size=3), "tp": st.text(max_size=8),
    "rid": st.text(max_size=8),
})  # fmt: skip
REPLY_HEADER = headers({
    "q": st.text(max_size=8), "ok": st.booleans(), "st": st.dictionaries(st.text(max_size=4), INTS),
    "out": st.lists(SPEC, max_size=3),
    "e": st.lists(st.text(max_size=16) | st.sampled_from(["InvalidInput", "Bogus"]), max_size=3),
})  # fmt: skip


@fuzz_settings(300)
@given(st.binary(max_size=256), st.binary(max_size=64))
def test_decode_request_random_bytes(header, data):
    try:
        codec.decode_request("m", {codec.HEADER: header, codec.DATA: data})
    except InvalidInput:
        pass


@fuzz_settings(400)
@given(REQUEST_HEADER, st.binary(max_size=64), st.booleans())
def test_decode_request_structured_garbage(header, data, with_data):
    fields = {codec.HEADER: msgpack.packb(header)}
    if with_data:
        fields[codec.DATA] = data
    try:
        queued = codec.decode_request("m", fields)
    except InvalidInput:
        return
    for tensor in queued.request.inputs:  # what decoded is consistent with its own header
        assert list(tensor.data.shape) == tensor.shape


@fuzz_settings(300)
@given(st.binary(max_size=256))
def test_decode_reply_random_bytes(payload):
    try:
        codec.decode_reply(payload)
    except InvalidInput:
        pass


@fuzz_settings(400)
@given(REPLY_HEADER, st.binary(max_size=64) | VALUES)
def test_decode_reply_structured_garbage(header, raw):
    try:
        reply = codec.decode_reply(msgpack.packb([header, raw]))
    except InvalidInput:
        return
    assert (reply.error is None) == bool(header.get("ok"))


@fuzz_settings(200)
@given(st.binary(max_size=256) | VALUES.map(msgpack.packb))
def test_decode_tensors_garbage(payload):
    try:
        codec.decode_tensors(payload)
    except InvalidInput:
        pass


# --- BYTES (4-byte little-endian length + bytes per element) -------------------------------


@fuzz_settings(300)
@given(st.lists(st.binary(max_size=300), max_size=30), st.lists(st.integers(0, 3), max_size=3))
def test_bytes_round_trip_any_shape(items, extra_dims):
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    raw = to_bytes(array, "BYTES")
    assert raw == serialize_bytes(array)
    back = from_bytes(raw, "BYTES", [len(items)])
    assert back.tolist() == items
    # The same bytes under a shape with another element count are refused, never misread.
    shape = [len(items), *extra_dims]
    if int(np.prod(shape)) != len(items):
        try:
            from_bytes(raw, "BYTES", shape)
            raise AssertionError("a wrong element count was accepted")
        except InvalidInput:
            pass


@fuzz_settings(300)
@given(st.lists(st.text(max_size=20), max_size=10))
def test_bytes_strings_are_utf8(items):
    array = np.array(items, dtype=np.object_) if items else np.empty(0, np.object_)
    assert deserialize_bytes(serialize_bytes(array)).tolist() == [s.encode() for s in items]


@fuzz_settings(500)
@given(st.binary(max_size=512), st.none() | st.integers(0, 2**40))
def test_deserialize_arbitrary_bytes(raw, count):
    try:
        items = deserialize_bytes(raw, count)
    except InvalidInput:
        return
    # A parse is exact: serializing it again gives back every byte.
    assert serialize_bytes(items) == raw


@fuzz_settings(300)
@given(st.binary(max_size=128), st.sampled_from(DATATYPES), st.lists(st.integers(0, 2**63 - 1), max_size=4))
def test_from_bytes_arbitrary(raw, datatype, shape):
    try:
        array = from_bytes(raw, datatype, shape)
    except InvalidInput:
        return
    assert list(array.shape) == shape


def valid_header(**changes) -> dict:
    header = {"q": "q", "id": "", "v": 1, "r": "r", "dl": 2.0, "t": 1.0, "in": [], "out": [], "p": {}}
    return {**header, **changes}


NUMBERS = st.floats() | INTS | VALUES


@fuzz_settings(300)
@given(st.sampled_from(["v", "dl", "t", "q", "r", "id", "out", "p", "tp", "rid"]), NUMBERS)
def test_decode_request_one_field_of_any_value(key, value):
    """Found: ``v`` = inf raised OverflowError out of the codec (a worker crash)."""
    try:
        codec.decode_request("m", {codec.HEADER: msgpack.packb(valid_header(**{key: value}))})
    except InvalidInput:
        pass


@fuzz_settings(300)
@given(st.lists(DIMS, max_size=5), st.sampled_from(DATATYPES), st.integers(0, 64), st.binary(max_size=64))
def test_decode_request_any_shape(shape, datatype, nbytes, data):
    """Found: a shape ``[2**40, "a"]`` made ``math.prod`` build a 1 TiB string (MemoryError)."""
    header = valid_header(**{"in": [["x", datatype, shape, nbytes]]})
    try:
        queued = codec.decode_request("m", {codec.HEADER: msgpack.packb(header), codec.DATA: data})
    except InvalidInput:
        return
    assert list(queued.request.inputs[0].data.shape) == shape
