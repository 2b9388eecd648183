"""The gRPC front probe's bare servers (bench.perf.grpc_front) answer a real grpc.aio client.

Its numbers are only worth something if the hand-framed HTTP/2 server and the ``h2`` one do
what grpc.aio does for the calls measured: a client of grpcio gets the fixed answer, on many
concurrent streams and for a request larger than HTTP/2's initial 64 KiB window (the server
must give the window back for it to arrive).
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb

from bench.perf import grpc_front


async def _calls(factory: type[asyncio.Protocol]) -> list[bytes]:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(factory, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary(grpc_front.METHOD)
            small = pb.ModelInferRequest(model_name="digits", raw_input_contents=[bytes(256)])
            large = pb.ModelInferRequest(model_name="digits", raw_input_contents=[bytes(300_000)])
            many = [call(small.SerializeToString(), timeout=10) for _ in range(40)]
            return await asyncio.gather(*many, call(large.SerializeToString(), timeout=10))
    finally:
        server.close()


@pytest.mark.parametrize("factory", [grpc_front.BareHttp2, grpc_front.HyperH2], ids=["protocol", "h2"])
def test_a_bare_server_answers_grpcio(factory):
    answers = asyncio.run(_calls(factory))
    assert len(answers) == 41
    for answer in answers:
        reply = pb.ModelInferResponse.FromString(answer)
        assert [o.name for o in reply.outputs] == ["label", "probabilities"]
        assert answer == grpc_front.ANSWER
