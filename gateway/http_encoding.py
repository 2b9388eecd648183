"""HTTP content codings (RFC 9110 §8.4): request bodies in, infer responses out.

``tritonclient.http``'s ``request_compression_algorithm`` sends ``Content-Encoding: gzip`` or
``deflate`` (a zlib stream, as ``zlib.compress`` writes it) and its
``response_compression_algorithm`` sends ``Accept-Encoding``. Its ``InferResult`` undoes the
response's ``Content-Encoding`` first and then splits the body at
``Inference-Header-Content-Length``, so that header always counts uncompressed bytes, both ways.

Request bodies are inflated here, not by aiohttp (the HTTP site runs with
``auto_decompress=False``), in bounded steps: the decoded size is checked after each step of at
most :data:`STEP_BYTES`, so a compression bomb is refused (:class:`PayloadTooLarge`) without
ever being inflated whole. No aiohttp import: this is plain bytes in, bytes out.
"""

from __future__ import annotations

import zlib

from naiad.errors import InvalidInput, PayloadTooLarge, Unsupported

#: Codings this server decodes and encodes (``x-gzip`` is gzip's old alias, RFC 9110 §8.4.1.3).
CODINGS = ("gzip", "deflate")
_ALIASES = {"x-gzip": "gzip"}
#: Largest piece inflated at once.
STEP_BYTES = 256 * 1024
#: zlib level for responses: tensors of floats barely shrink at higher levels, and time matters.
COMPRESS_LEVEL = 1
#: Responses shorter than this go uncompressed whatever ``Accept-Encoding`` allows (identity is
#: always acceptable unless refused with ``q=0``, RFC 9110 §12.5.3), as nginx's
#: ``gzip_min_length``: under ~1 KiB gzip saves less than one packet, and its stream set-up cost
#: ~5 % of the gateway's CPU on 200-byte answers (issue 14's profile).
COMPRESS_MIN_BYTES = 1024

_GZIP_WBITS = 16 + zlib.MAX_WBITS
_ZLIB_WBITS = zlib.MAX_WBITS
_RAW_WBITS = -zlib.MAX_WBITS


def content_codings(header: str | None) -> list[str]:
    """The codings of a ``Content-Encoding`` value in the order they were applied.

    Raises :class:`Unsupported` (501) for any coding other than gzip, deflate or identity.
    """
    codings = []
    for item in (header or "").split(","):
        coding = item.strip().lower()
        coding = _ALIASES.get(coding, coding)
        if coding in ("", "identity"):
            continue
        if coding not in CODINGS:
            raise Unsupported(f"Content-Encoding '{item.strip()}' is not supported (gzip, deflate)")
        codings.append(coding)
    return codings


def _wbits(coding: str, data: bytes) -> int:
    if coding == "gzip":
        return _GZIP_WBITS
    # "deflate" is a zlib stream (RFC 9110); some clients send raw DEFLATE, which has no
    # zlib header (CMF = 8 with a valid FCHECK), so accept that too.
    zlib_header = len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
    return _ZLIB_WBITS if zlib_header else _RAW_WBITS


def inflate(data: bytes, coding: str, limit: int) -> bytes:
    """``data`` decoded from ``coding``; at most ``limit`` bytes decoded, or
    :class:`PayloadTooLarge`. Corrupt, truncated or trailing data is :class:`InvalidInput`.
    A gzip body may hold several members (RFC 1952 §2.2), decoded one after the other."""
    out = bytearray()
    wbits = _wbits(coding, data)
    decoder = zlib.decompressobj(wbits)
    pending = data
    try:
        while True:
            piece = decoder.decompress(pending, STEP_BYTES)
            out += piece
            if len(out) > limit:
                raise PayloadTooLarge(f"the decoded request body is over the {limit}-byte limit")
            pending = decoder.unconsumed_tail
            if decoder.eof:
                rest = decoder.unused_data
                if not rest:
                    return bytes(out)
                if coding != "gzip":
                    raise InvalidInput(f"{len(rest)} bytes follow the end of the {coding} stream")
                decoder, pending = zlib.decompressobj(wbits), rest
            elif not pending and not piece:
                raise InvalidInput(f"the {coding} request body is truncated")
    except zlib.error as exc:
        raise InvalidInput(f"the request body is not valid {coding}: {exc}") from None


def decode_body(body: bytes, content_encoding: str | None, limit: int) -> bytes:
    """``body`` with its ``Content-Encoding`` undone (codings in reverse order of application),
    each decoded size at most ``limit`` bytes."""
    for coding in reversed(content_codings(content_encoding)):
        body = inflate(body, coding, limit)
    return body


def accepted_coding(accept_encoding: str | None) -> str | None:
    """The coding to answer with for an ``Accept-Encoding`` value: gzip or deflate, whichever
    has the higher ``q`` (gzip on a tie; ``*`` stands for both), or None for identity."""
    weights: dict[str, float] = {}
    for item in (accept_encoding or "").split(","):
        token, *params = item.split(";")
        coding = token.strip().lower()
        coding = _ALIASES.get(coding, coding)
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if coding:
            weights[coding] = q
    best, best_q = None, 0.0
    for coding in CODINGS:
        q = weights.get(coding, weights.get("*", 0.0))
        if q > best_q:
            best, best_q = coding, q
    return best


def compress(body: bytes, coding: str) -> bytes:
    """``body`` encoded as ``coding`` (``gzip`` or ``deflate``, the latter a zlib stream)."""
    wbits = _GZIP_WBITS if coding == "gzip" else _ZLIB_WBITS
    encoder = zlib.compressobj(COMPRESS_LEVEL, zlib.DEFLATED, wbits)
    return encoder.compress(body) + encoder.flush()
