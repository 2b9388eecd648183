"""What the gRPC front alone costs per call: grpc.aio against Python HTTP/2 servers.

Every server answers the v2 gRPC ``ModelInfer`` (the digits request :mod:`bench.perf.loadgen`
sends: 64 FP32 values in ``raw_input_contents``) with the same fixed serialized
``ModelInferResponse`` after parsing the request message with protobuf: no model, no queue.

- ``grpc.aio``: a ``grpc.aio`` server with one generic unary-unary handler, bytes in and out
  (as the floor server and the gateway use grpcio, less their wrappers);
- ``h2``: an ``asyncio.Protocol`` driving python-hyper's ``h2`` state machine (flow control,
  stream states and HPACK all handled by ``h2``);
- ``protocol``: an ``asyncio.Protocol`` that frames HTTP/2 itself (RFC 9113 §4.1: a 9-byte
  header per frame), decodes request headers with python-hyper's ``hpack`` (RFC 7541) and
  answers with header blocks encoded once (literal fields without indexing, so they need
  no encoder state); it acknowledges SETTINGS and PING and returns every DATA byte to the
  client's windows at once, and ignores the client's window for its small answers: the least
  a Python HTTP/2 front can do on this event loop (a lower bound, not a server).

Each runs in its own process on uvloop, loaded by :mod:`bench.perf.loadgen`'s ``grpc.aio``
client (one channel, closed loop) at each concurrency; the table gives throughput, p50 and
the server process's CPU µs per call (user + system, psutil), alternating the servers
``--rounds`` times so a drifting machine hits all alike.

    .venv/bin/python -m bench.perf.grpc_front --concurrency 1 32 --duration 4 --rounds 2
"""

from __future__ import annotations

import asyncio
import socket
import struct

from tritonclient.grpc import service_pb2 as pb

from bench.perf import front_probe, loadgen
from gateway.http2 import (
    ACK,
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    PADDED,
    PING,
    PREFACE,
    PRIORITY_FLAG,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
    header_block,
)

METHOD = "/inference.GRPCInferenceService/ModelInfer"
ANSWER = pb.ModelInferResponse(
    model_name="digits", model_version="1",
    outputs=[pb.ModelInferResponse.InferOutputTensor(name="label", datatype="INT64", shape=[1, 1]),
             pb.ModelInferResponse.InferOutputTensor(name="probabilities", datatype="FP32", shape=[1, 10])],
    raw_output_contents=[b"\x03" + bytes(7), bytes(40)],
).SerializeToString()  # fmt: skip


def serve_grpc_aio(sock: socket.socket) -> None:
    import grpc  # noqa: PLC0415

    async def infer(request: bytes, context) -> bytes:
        pb.ModelInferRequest.FromString(request)
        return ANSWER

    async def main() -> None:
        server = grpc.aio.server()
        handler = grpc.unary_unary_rpc_method_handler(infer)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {"ModelInfer": handler}),)
        )
        server.add_insecure_port(f"127.0.0.1:{sock.getsockname()[1]}")
        sock.close()  # grpc binds its own socket (SO_REUSEPORT); the port was only reserved
        await server.start()
        await server.wait_for_termination()

    loadgen.run(main)


class HyperH2(asyncio.Protocol):
    """``h2.connection.H2Connection`` on a transport: every ``ModelInfer`` answered with
    :data:`ANSWER` (status 0 in the trailers)."""

    def connection_made(self, transport) -> None:
        import h2.config  # noqa: PLC0415
        import h2.connection  # noqa: PLC0415
        import h2.events  # noqa: PLC0415

        self.events = h2.events
        self.transport, self.bodies = transport, {}
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        self.conn.initiate_connection()
        transport.write(self.conn.data_to_send())

    def data_received(self, data: bytes) -> None:
        conn, events = self.conn, self.events
        for event in conn.receive_data(data):
            if isinstance(event, events.DataReceived):
                self.bodies[event.stream_id] = self.bodies.get(event.stream_id, b"") + event.data
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, events.StreamEnded):
                body = self.bodies.pop(event.stream_id, b"")
                pb.ModelInferRequest.FromString(body[5:])
                conn.send_headers(event.stream_id, [(":status", "200"), ("content-type", "application/grpc")])
                conn.send_data(event.stream_id, struct.pack(">BI", 0, len(ANSWER)) + ANSWER)
                conn.send_headers(event.stream_id, [("grpc-status", "0")], end_stream=True)
        self.transport.write(conn.data_to_send())


class BareHttp2(asyncio.Protocol):
    """HTTP/2 frames split by hand; request headers decoded by ``hpack``; every stream that
    ends is answered with :data:`ANSWER`."""

    RESPONSE_HEADERS = header_block([(":status", "200"), ("content-type", "application/grpc")])
    TRAILERS = header_block([("grpc-status", "0")])
    MESSAGE = struct.pack(">BI", 0, len(ANSWER)) + ANSWER

    def connection_made(self, transport) -> None:
        import hpack  # noqa: PLC0415

        self.transport, self.buffer, self.preface = transport, bytearray(), False
        self.decoder, self.paths, self.bodies = hpack.Decoder(), {}, {}
        transport.write(frame(SETTINGS, 0, 0))

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.preface:
            if len(self.buffer) < len(PREFACE):
                return
            del self.buffer[: len(PREFACE)]
            self.preface = True
        out, buffer, at = [], self.buffer, 0
        while len(buffer) - at >= 9:
            length = int.from_bytes(buffer[at : at + 3], "big")
            if len(buffer) - at < 9 + length:
                break
            kind, flags = buffer[at + 3], buffer[at + 4]
            stream = int.from_bytes(buffer[at + 5 : at + 9], "big") & 0x7FFF_FFFF
            payload = bytes(buffer[at + 9 : at + 9 + length])
            at += 9 + length
            self._frame(kind, flags, stream, payload, out)
        del buffer[:at]
        if out:
            self.transport.write(b"".join(out))

    def _frame(self, kind: int, flags: int, stream: int, payload: bytes, out: list[bytes]) -> None:
        if kind == HEADERS:
            if flags & PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            if flags & PRIORITY_FLAG:
                payload = payload[5:]
            assert flags & END_HEADERS, "CONTINUATION is not handled by this probe"
            self.paths[stream] = dict(self.decoder.decode(payload)).get(":path")
            self.bodies[stream] = b""
        elif kind == DATA:
            self.bodies[stream] += payload
            if payload:  # give the bytes back to both windows at once
                increment = struct.pack(">I", len(payload))
                out += (frame(WINDOW_UPDATE, 0, 0, increment), frame(WINDOW_UPDATE, 0, stream, increment))
            if flags & END_STREAM:
                self._answer(stream, out)
        elif kind == SETTINGS and not flags & ACK:
            out.append(frame(SETTINGS, ACK, 0))
        elif kind == PING and not flags & ACK:
            out.append(frame(PING, ACK, 0, payload))

    def _answer(self, stream: int, out: list[bytes]) -> None:
        body, path = self.bodies.pop(stream), self.paths.pop(stream)
        assert path == METHOD, path
        pb.ModelInferRequest.FromString(body[5:])
        out += (frame(HEADERS, END_HEADERS, stream, self.RESPONSE_HEADERS),
                frame(DATA, 0, stream, self.MESSAGE),
                frame(HEADERS, END_HEADERS | END_STREAM, stream, self.TRAILERS))  # fmt: skip


def _serve(factory: type[asyncio.Protocol], sock: socket.socket) -> None:
    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(factory, sock=sock)
        await server.serve_forever()

    loadgen.run(main)


def serve_h2(sock: socket.socket) -> None:
    _serve(HyperH2, sock)


def serve_protocol(sock: socket.socket) -> None:
    _serve(BareHttp2, sock)


SERVERS = {"grpc.aio": serve_grpc_aio, "h2": serve_h2, "protocol": serve_protocol}


if __name__ == "__main__":
    front_probe.main(SERVERS, "grpc", __doc__.splitlines()[0])
