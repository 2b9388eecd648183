"""Hostile clients for the hardening tests: a raw HTTP/2 gRPC client (``h2``) that declares a
message length it never sends in full, and raw HTTP/1.1 sockets that send slowly or not at
all. Every loop here is bounded by bytes and by seconds."""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass

import h2.config
import h2.connection
import h2.events

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


@dataclass
class StreamOutcome:
    sent_bytes: int
    ended_by_server: bool  # a reset, trailers or a closed connection came before we stopped
    grpc_status: str | None


def declare_huge_grpc_message(
    port: int, declared: int = 2**31 - 1, send_limit: int = 256 * 2**20, timeout_s: float = 30.0,
    metadata: tuple[tuple[str, str], ...] = (),
) -> StreamOutcome:
    """One ModelInfer call whose message declares ``declared`` bytes; send zeros as fast as
    flow control lets, up to ``send_limit`` bytes (5-byte prefix included), and wait for the
    server to end the call, for at most ``timeout_s`` seconds in all."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", MODEL_INFER),
                            (":authority", "127.0.0.1"), ("content-type", "application/grpc"),
                            ("te", "trailers"), *metadata])  # fmt: skip
    sock.sendall(conn.data_to_send())
    pending = b"\0" + struct.pack(">I", declared)
    sent, status, ended = 0, None, False
    deadline = time.monotonic() + timeout_s
    sock.settimeout(0.05)
    try:
        while time.monotonic() < deadline and not ended:
            try:
                data = sock.recv(65536)
                if not data:
                    ended = True
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.TrailersReceived | h2.events.ResponseReceived):
                        status = dict(event.headers).get(b"grpc-status", status)
                        ended = ended or isinstance(event, h2.events.TrailersReceived)
                    if isinstance(event, h2.events.StreamReset | h2.events.ConnectionTerminated):
                        ended = True
                sock.sendall(conn.data_to_send())
            except TimeoutError:
                pass
            except OSError:
                ended = True
            while not ended and sent < send_limit:
                window = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size,
                             16384, send_limit - sent)  # fmt: skip
                if window <= 0:
                    break
                chunk = (pending + b"\0" * window)[:window]
                pending = pending[len(chunk):]
                conn.send_data(sid, chunk)
                sock.sendall(conn.data_to_send())
                sent += len(chunk)
    finally:
        sock.close()
    return StreamOutcome(sent, ended, status.decode() if isinstance(status, bytes) else status)


def http_connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30)


def closed_within(sock: socket.socket, timeout_s: float) -> tuple[bool, bytes]:
    """Whether the server closed ``sock`` within ``timeout_s`` seconds, and what it sent."""
    sock.settimeout(0.2)
    got = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return True, got
        if not data:
            return True, got
        got += data
    return False, got
