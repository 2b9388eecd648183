"""``gateway.http_codec.loads`` / ``dumps``: orjson where it can, and ``json``'s own values and
errors where orjson refuses; answers in compact JSON, as Triton writes them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gateway.http_codec import dumps, loads, parse_infer_request, render_infer_response
from naiad.inference import InferResponse, Tensor

ACCEPTED = [
    b'{"inputs": [{"name": "x", "data": [1, 2.5, -0.0, 1e-7]}]}',
    b'{"a": NaN, "b": Infinity, "c": -Infinity}',  # json accepts these tokens; orjson does not
    b'{"big": 123456789012345678901234567890, "neg": -123456789012345678901234567890}',
    b'{"edge": [18446744073709551615, -9223372036854775808, -9223372036854775809, 18446744073709551616]}',
    b'{"lone": "\\ud800", "dup": 1, "dup": 2}',
    b'{"huge": 1e400}',
    b"\xef\xbb\xbf{}",  # a UTF-8 byte order mark
    b"[" * 900 + b"]" * 900,
    b"[0.016527635976672173, 12345678901234567890.5, 1e0000000000000000005, 1.0000000000000000000001e-3]",
    b"[1.5, 12345678901234567890]",  # an integer after floats
    b"12345678901234567890",
    b'{"id": "12345678901234567890123"}',
]
REFUSED = [b"", b"{", b'{"a": 1,}', b"\xff", b'{"a": "\x01"}', b"[1] 2"]


@pytest.mark.parametrize("text", ACCEPTED)
def test_loads_gives_what_json_gives(text):
    got, want = loads(text), json.loads(text)
    assert json.dumps(got) == json.dumps(want)  # NaN != NaN: compare as text (an int stays an int)


@pytest.mark.parametrize("text", REFUSED)
def test_loads_refuses_what_json_refuses_with_its_error(text):
    with pytest.raises(ValueError) as ours:
        loads(text)
    with pytest.raises(ValueError) as theirs:
        json.loads(text)
    assert (type(ours.value), str(ours.value)) == (type(theirs.value), str(theirs.value))


def test_float_data_with_long_fractions_is_parsed_by_orjson(monkeypatch):
    """FP32 data as clients write it (``0.0027385002467781305``: 19 digits after the point) is
    no long integer: orjson parses it, ``json.loads`` is never called."""
    monkeypatch.setattr(json, "loads", lambda *_: pytest.fail("json.loads used"))
    data = [0.0027385002467781305, *np.random.default_rng(0).random(63, np.float32).tolist()]
    text = json.dumps({"inputs": [{"name": "x", "data": data}]}, separators=(",", ":")).encode()
    assert loads(text)["inputs"][0]["data"] == data


def test_deep_nesting_is_jsons_recursion_error():
    with pytest.raises(RecursionError):
        loads(b"[" * 100_000 + b"]" * 100_000)
    for depth in (985, 1000, 1023):  # orjson parses these; json does not, nor may code walk them
        with pytest.raises(RecursionError):
            loads(b'{"shape": ' + b"[" * depth + b"]" * depth + b"}")


def test_dumps_is_compact_utf8_json_and_writes_any_integer():
    value = {"name": "é", "data": [1, 2.5, 2**64 - 1], "nested": {"ok": True, "none": None}}
    assert dumps(value) == json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    assert json.loads(dumps({"n": 2**70})) == {"n": 2**70}  # past orjson's 64 bits
    assert dumps({"id": "\ud800"}) == b'{"id":"\\ud800"}'  # a lone surrogate, escaped as json does


def test_an_answer_round_trips_through_the_codec():
    body = b'{"id": "7", "inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}'
    request = parse_infer_request(body, None, "m", 1)
    assert request.id == "7" and request.inputs[0].data.tolist() == [[1.0, 2.0, 3.0]]
    out = Tensor("y", "FP32", [1, 3], np.array([[0.5, np.nan, np.inf]], np.float32))
    payload, headers = render_infer_response(InferResponse("m", 1, [out], "7"), request)
    assert headers == {"Content-Type": "application/json"}
    assert json.loads(payload) == {"model_name": "m", "model_version": "1", "id": "7", "outputs": [
        {"name": "y", "datatype": "FP32", "shape": [1, 3], "data": [0.5, "NaN", "Infinity"]}]}
