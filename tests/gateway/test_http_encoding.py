"""Content codings of HTTP bodies (:mod:`gateway.http_encoding`), without a server."""

from __future__ import annotations

import gzip
import zlib

import pytest

from gateway.http_encoding import (
    STEP_BYTES,
    accepted_coding,
    compress,
    content_codings,
    decode_body,
    inflate,
)
from naiad.errors import InvalidInput, PayloadTooLarge, Unsupported

BODY = b'{"inputs": []}' * 1000


def raw_deflate(data: bytes) -> bytes:
    encoder = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return encoder.compress(data) + encoder.flush()


def zeros_bomb(coding: str, size: int) -> bytes:
    """``size`` zero bytes compressed (about 1000:1), built without holding them at once."""
    encoder = zlib.compressobj(9, zlib.DEFLATED, 31 if coding == "gzip" else zlib.MAX_WBITS)
    chunk = bytes(1 << 20)
    return b"".join([*(encoder.compress(chunk) for _ in range(size >> 20)), encoder.flush()])


@pytest.mark.parametrize(
    ("header", "encoded"),
    [
        ("gzip", gzip.compress(BODY)),
        ("x-gzip", gzip.compress(BODY)),
        ("GZIP", gzip.compress(BODY)),
        ("deflate", zlib.compress(BODY)),  # what tritonclient sends: a zlib stream
        ("deflate", raw_deflate(BODY)),  # what some other clients send
        ("identity", BODY),
        ("gzip, deflate", zlib.compress(gzip.compress(BODY))),
        ("gzip", gzip.compress(BODY[:7000]) + gzip.compress(BODY[7000:])),  # two members
    ],
)
def test_decode(header, encoded):
    assert decode_body(encoded, header, len(BODY)) == BODY


def test_decode_empty():
    assert decode_body(gzip.compress(b""), "gzip", 0) == b""
    assert decode_body(zlib.compress(b""), "deflate", 0) == b""


@pytest.mark.parametrize("header", ["br", "compress", "zstd", "gzip, br"])
def test_unknown_coding_is_unsupported(header):
    with pytest.raises(Unsupported) as caught:
        decode_body(b"x", header, 100)
    assert caught.value.status == 501


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_bomb_stops_after_one_step_past_the_limit(coding, monkeypatch):
    bomb = zeros_bomb(coding, 64 << 20)
    sizes = []
    real = zlib.decompressobj

    class Spy:
        def __init__(self, wbits):
            self._d = real(wbits)

        def decompress(self, data, max_length):
            piece = self._d.decompress(data, max_length)
            sizes.append(len(piece))
            return piece

        def __getattr__(self, name):
            return getattr(self._d, name)

    monkeypatch.setattr(zlib, "decompressobj", Spy)
    with pytest.raises(PayloadTooLarge) as caught:
        inflate(bomb, coding, 1 << 20)
    assert caught.value.status == 413
    assert max(sizes) <= STEP_BYTES and sum(sizes) <= (1 << 20) + STEP_BYTES


def test_exactly_the_limit_is_accepted():
    assert len(decode_body(gzip.compress(bytes(1000)), "gzip", 1000)) == 1000
    with pytest.raises(PayloadTooLarge):
        decode_body(gzip.compress(bytes(1001)), "gzip", 1000)


@pytest.mark.parametrize(
    ("header", "encoded"),
    [
        ("gzip", b"not gzip at all"),
        ("gzip", gzip.compress(BODY)[:-12]),  # truncated
        ("deflate", zlib.compress(BODY)[:-3]),
        ("deflate", zlib.compress(BODY) + b"junk"),  # trailing bytes
        ("gzip", gzip.compress(BODY) + b"junk"),
        ("deflate", b""),
    ],
)
def test_corrupt_bodies_are_invalid(header, encoded):
    with pytest.raises(InvalidInput):
        decode_body(encoded, header, 1 << 20)


@pytest.mark.parametrize(
    ("accept", "coding"),
    [
        (None, None),
        ("", None),
        ("identity", None),
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("br, deflate", "deflate"),
        ("gzip, deflate", "gzip"),
        ("gzip;q=0.5, deflate", "deflate"),
        ("gzip;q=0", None),
        ("*", "gzip"),
        ("*;q=0.1, gzip;q=0", "deflate"),
        ("gzip;q=bogus, deflate;q=0.2", "deflate"),
    ],
)
def test_accepted_coding(accept, coding):
    assert accepted_coding(accept) == coding


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_compress_is_what_tritonclient_reads(coding):
    # tritonclient/http/_infer_result.py: gzip.decompress or zlib.decompress
    undo = gzip.decompress if coding == "gzip" else zlib.decompress
    assert undo(compress(BODY, coding)) == BODY


def test_content_codings_order_and_identity():
    assert content_codings("identity, gzip ,deflate") == ["gzip", "deflate"]
    assert content_codings(None) == []
