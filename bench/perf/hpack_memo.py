"""A gRPC client's repeated header block: decoded by ``hpack`` against skipped by
:class:`gateway.http2.HeaderDecoder`'s memo, µs a block on this machine.

grpc-core sends a call's headers as literals once (they enter the dynamic table), then, for
each later call on the connection, the same 8 bytes of indexed fields (captured from a
``grpc.aio`` client, docs/benchmarks.md "Stop 27"); the headers here are such a client's.

    .venv/bin/python -m bench.perf.hpack_memo --calls 20000
"""

from __future__ import annotations

import argparse
import time

import hpack

from gateway.http2 import HeaderDecoder

HEADERS = [(":method", "POST"), (":scheme", "http"), (":path", "/inference.GRPCInferenceService/ModelInfer"),
           (":authority", "127.0.0.1:8001"), ("te", "trailers"), ("content-type", "application/grpc"),
           ("user-agent", "grpc-python/1.x"), ("grpc-accept-encoding", "identity,deflate,gzip")]  # fmt: skip


def per_block_us(memo: bool, calls: int) -> float:
    """µs to decode the repeated block, with or without the memo."""
    encoder, decoder = hpack.Encoder(), HeaderDecoder(1 << 16)
    decoder.decode(encoder.encode(HEADERS))  # the first call: literals, into the table
    again = encoder.encode(HEADERS)  # every later call: indexed fields only
    if memo:
        def decode() -> object:
            return decoder.decode(again)
    else:
        raw = decoder.decoder

        def decode() -> object:
            return [(n.decode("latin-1"), v.decode("latin-1")) for n, v in raw.decode(again, raw=True)]
    decode()
    start = time.perf_counter()
    for _ in range(calls):
        decode()
    return (time.perf_counter() - start) / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20000)
    args = p.parse_args(argv)
    print("| decoding | µs a block |\n| --- | --- |")
    for memo in (False, True):
        name = "HeaderDecoder (memo)" if memo else "hpack.Decoder"
        print(f"| {name} | {per_block_us(memo, args.calls):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
