"""``gateway.http2.HeaderDecoder``: a header block decoded last time is not decoded again
while the dynamic table is as that decoding left it, and never once a block changed the
table (RFC 7541: the same bytes on a different table mean other headers)."""

from __future__ import annotations

import hpack
import pytest

from gateway.http2 import HeaderDecoder

GRPC_CALL = [(":method", "POST"), (":scheme", "http"),
             (":path", "/inference.GRPCInferenceService/ModelInfer"), (":authority", "127.0.0.1:8001"),
             ("content-type", "application/grpc"), ("te", "trailers")]


def counted(decoder: HeaderDecoder) -> list[int]:
    """Count the calls that reach hpack's own decoder."""
    calls, decode = [0], decoder.decoder.decode

    def wrapper(*args, **kwargs):
        calls[0] += 1
        return decode(*args, **kwargs)

    decoder.decoder.decode = wrapper
    return calls


def test_a_repeated_block_that_left_the_table_alone_is_not_decoded_again():
    encoder, decoder = hpack.Encoder(), HeaderDecoder(1 << 16)
    calls = counted(decoder)
    first = encoder.encode(GRPC_CALL)  # literals with incremental indexing: the table grows
    again = encoder.encode(GRPC_CALL)  # indexed fields only
    assert first != again
    assert decoder.decode(first) == GRPC_CALL
    assert decoder.decode(again) == GRPC_CALL
    assert decoder.decode(again) == GRPC_CALL and decoder.decode(again) == GRPC_CALL
    assert calls[0] == 2  # the first block changed the table: decoded; the second once
    decoder.decode(again).append(("x", "y"))  # a caller's list is its own
    assert decoder.decode(again) == GRPC_CALL


def test_the_same_bytes_after_the_table_changed_are_decoded_anew():
    decoder = HeaderDecoder(1 << 16)
    calls = counted(decoder)

    def insert(name: bytes, value: bytes) -> bytes:  # literal with incremental indexing, new name
        return bytes([0x40, len(name)]) + name + bytes([len(value)]) + value

    newest = b"\xbe"  # indexed field 62: the newest dynamic entry
    decoder.decode(insert(b"x-a", b"1"))
    decoder.decode(insert(b"x-a", b"1"))  # the same block again inserts again: decoded again
    assert decoder.decode(b"\xbf") == [("x-a", "1")]  # index 63: the first insertion
    assert decoder.decode(newest) == [("x-a", "1")]
    assert decoder.decode(newest) == [("x-a", "1")]
    decoder.decode(insert(b"x-b", b"2"))
    assert decoder.decode(newest) == [("x-b", "2")]  # not the remembered ("x-a", "1")
    assert decoder.decode(newest) == [("x-b", "2")]
    assert calls[0] == 6
    decoder.decode(b"\x3f\x01")  # a table size update to 32 bytes: every entry (36 bytes) evicted
    with pytest.raises(hpack.exceptions.InvalidTableIndex):
        decoder.decode(newest)  # nothing at index 62 now

