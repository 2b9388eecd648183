"""The gateway's own gRPC front (gateway/grpc_front.py on gateway/http2.py), driven by
grpcio's own client and by raw HTTP/2 frames.

Handlers here are plain grpc method handlers wrapped as the gateway wraps its servicer's
(gateway.grpc_server._wrapped: the unary ones read their message through the limits); the
servicer behind the real ones is covered by tests/gateway/test_grpc.py and the conformance
suite, which run on this front by default.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

import grpc
import hpack
import pytest

from gateway import http2
from gateway.grpc_front import MAX_STATUS_BYTES, TRUNCATED, GrpcFront, fitting, percent_encoded, timeout_s
from gateway.grpc_limits import GrpcLimits
from gateway.grpc_server import _wrapped
from gateway.limits import ByteBudget
from naiad.errors import InferenceFailed

MiB = 2**20
seen: dict[str, object] = {}


async def _echo(request: bytes, context) -> bytes:
    seen["metadata"] = context.invocation_metadata()
    seen["remaining"] = context.time_remaining()
    return request


async def _slow(request: bytes, context) -> bytes:
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        seen["cancelled"] = True
        raise
    return request


async def _refuse(request: bytes, context) -> bytes:
    await context.abort(grpc.StatusCode.PERMISSION_DENIED, "não: 100% refused")
    return b""


async def _fails(request: bytes, context) -> bytes:
    raise InferenceFailed("é" + "  /models/m/1/model.py(5): helper\n" * 2000)  # a long traceback


async def _chat(requests, context) -> None:
    async for message in requests:
        await context.write(message[::-1])


def _handlers(limits: GrpcLimits) -> dict[str, grpc.RpcMethodHandler]:
    raw = {"request_deserializer": bytes, "response_serializer": bytes}
    handlers = {name: grpc.unary_unary_rpc_method_handler(f, **raw)
                for name, f in (("Echo", _echo), ("Slow", _slow), ("Refuse", _refuse),
                                ("Fails", _fails))}  # fmt: skip
    handlers["Chat"] = grpc.stream_stream_rpc_method_handler(_chat, **raw)
    return {f"/t.T/{name}": _wrapped(h, f"/t.T/{name}", None, limits) for name, h in handlers.items()}


@contextlib.asynccontextmanager
async def _front(max_message=8 * MiB, **http2_limits):
    limits = GrpcLimits(ByteBudget(1024 * MiB), max_message_bytes=max_message, read_timeout_s=5.0)
    front = GrpcFront(_handlers(limits), limits, http2.Http2Limits(**http2_limits))
    await front.start("127.0.0.1", 0)
    seen.clear()
    try:
        yield front, front._server.sockets[0].getsockname()[1]
    finally:
        await front.stop(1.0)


@contextlib.asynccontextmanager
async def _channel(port: int, **options):
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=list(options.items()))
    try:
        yield channel
    finally:
        await channel.close()


def run(coroutine) -> None:
    asyncio.run(coroutine)


def test_unary_calls_in_both_directions_past_the_windows():
    async def body():
        unbounded = {"grpc.max_receive_message_length": -1}
        async with _front() as (_, port), _channel(port, **unbounded) as channel:
            echo = channel.unary_unary("/t.T/Echo")
            big = bytes(range(256)) * (5 * MiB // 256)  # 5 MiB: past the 64 KiB and 4 MiB windows
            small = (echo(b"x%d" % i, timeout=20) for i in range(50))
            answers = await asyncio.gather(echo(big, timeout=20), *small)
            assert answers[0] == big
            assert answers[1:] == [b"x%d" % i for i in range(50)]

    run(body())


def test_a_stream_answers_each_message_in_order():
    async def body():
        async with _front() as (_, port), _channel(port) as channel:
            call = channel.stream_stream("/t.T/Chat")(timeout=10)
            for i in range(30):
                await call.write(b"m%03d" % i)
            await call.done_writing()
            assert [m async for m in call] == [(b"m%03d" % i)[::-1] for i in range(30)]
            assert await call.code() == grpc.StatusCode.OK

    run(body())


def test_metadata_deadline_and_reserved_headers():
    async def body():
        async with _front() as (_, port), _channel(port) as channel:
            echo = channel.unary_unary("/t.T/Echo")
            metadata = (("x-route", "blue"), ("trace-bin", b"\x00\xffbin"))
            assert await echo(b"hi", timeout=7, metadata=metadata) == b"hi"
        items = dict(seen["metadata"])
        assert items["x-route"] == "blue" and items["trace-bin"] == b"\x00\xffbin"
        assert not {"content-type", "te", "grpc-timeout"} & set(items)
        assert not any(key.startswith(":") for key in items)
        # grpc core's client may round the grpc-timeout it sends up ("encoding may round up
        # arbitrarily": src/core/lib/transport/timeout_encoding.h); a CI run saw 7.0099 s
        assert 5.0 < seen["remaining"] <= 7.0 * 1.05

    run(body())


def test_a_deadline_cancels_the_handler_and_answers_deadline_exceeded():
    async def body():
        async with _front() as (_, port), _channel(port) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await channel.unary_unary("/t.T/Slow")(b"x", timeout=0.3)
            assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await asyncio.sleep(0.2)
            assert seen.get("cancelled") is True
            assert await channel.unary_unary("/t.T/Echo")(b"after", timeout=5) == b"after"

    run(body())


def test_a_client_that_cancels_cancels_the_handler():
    async def body():
        async with _front() as (front, port), _channel(port) as channel:
            call = channel.unary_unary("/t.T/Slow")(b"x", timeout=10)
            await asyncio.sleep(0.2)
            call.cancel()
            await asyncio.sleep(0.3)
            assert seen.get("cancelled") is True
            assert not front.calls  # nothing left behind

    run(body())


def test_errors_unknown_methods_and_oversized_messages():
    async def body():
        async with _front(max_message=MiB) as (_, port), _channel(port) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await channel.unary_unary("/t.T/Refuse")(b"x", timeout=5)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert refused.value.details() == "não: 100% refused"
            with pytest.raises(grpc.aio.AioRpcError) as unknown:
                await channel.unary_unary("/t.T/Nope")(b"x", timeout=5)
            assert unknown.value.code() == grpc.StatusCode.UNIMPLEMENTED
            with pytest.raises(grpc.aio.AioRpcError) as large:
                await channel.unary_unary("/t.T/Echo")(bytes(MiB + 1), timeout=5)
            assert large.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "larger than max" in large.value.details()
            assert await channel.unary_unary("/t.T/Echo")(b"still", timeout=5) == b"still"

    run(body())


@pytest.mark.parametrize("algorithm", [grpc.Compression.Gzip, grpc.Compression.Deflate])
def test_compressed_requests_are_inflated(algorithm):
    async def body():
        async with _front() as (_, port), _channel(port) as channel:
            message = b"compress me " * 10_000
            echo = channel.unary_unary("/t.T/Echo")
            assert await echo(message, timeout=5, compression=algorithm) == message

    run(body())


def test_header_values_and_timeouts_as_the_protocol_writes_them():
    assert percent_encoded("ok: 100% é") == "ok: 100%25 %C3%A9"
    assert timeout_s("250m") == 0.25 and timeout_s("2S") == 2.0 and timeout_s("1H") == 3600.0
    assert timeout_s("123456789S") is None and timeout_s("5x") is None and timeout_s(None) is None


# -- raw HTTP/2 ------------------------------------------------------------------------------


_REQUEST_HEADERS = [(":method", "POST"), (":scheme", "http"), (":path", "/t.T/Echo"), (":authority", "x"),
                    ("content-type", "application/grpc")]  # fmt: skip


def _request_block(path: str = "/t.T/Echo", content_type: str = "application/grpc", extra=()) -> bytes:
    return hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                                   (":authority", "x"), ("content-type", content_type), *extra])  # fmt: skip


def _message(payload: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(payload)) + payload


async def _raw(port: int, frames: bytes, read_s: float = 1.0) -> list[tuple[int, int, int, bytes]]:
    """Send the preface and ``frames``; the frames read back within ``read_s`` (type, flags,
    stream, payload), until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(http2.PREFACE + http2.frame(http2.SETTINGS, 0, 0) + frames)
    got, buffer = [], b""
    loop = asyncio.get_running_loop()
    until = loop.time() + read_s
    with contextlib.suppress(TimeoutError, ConnectionError):
        while (left := until - loop.time()) > 0:
            data = await asyncio.wait_for(reader.read(65536), left)
            if not data:
                break
            buffer += data
            while len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3], "big"):
                length = int.from_bytes(buffer[:3], "big")
                kind, flags, stream = struct.unpack(">BBI", buffer[3:9])
                got.append((kind, flags, stream, buffer[9 : 9 + length]))
                buffer = buffer[9 + length :]
    writer.close()
    return got


def _decoded(frames, kind=http2.HEADERS) -> list[dict[str, str]]:
    decoder = hpack.Decoder()
    return [dict(decoder.decode(p, raw=False)) for k, _, _, p in frames if k == kind]


def test_a_header_block_in_continuation_frames_and_padded_data():
    async def body():
        async with _front() as (_, port):
            block = _request_block(extra=[("x-long", "v" * 3000)])
            half = len(block) // 2
            padded = b"\x04" + _message(b"padded!") + b"\x00" * 4
            frames = (http2.frame(http2.HEADERS, 0, 1, block[:half])
                      + http2.frame(http2.CONTINUATION, http2.END_HEADERS, 1, block[half:])
                      + http2.frame(http2.DATA, http2.END_STREAM | http2.PADDED, 1, padded))  # fmt: skip
            got = await _raw(port, frames)
        data = [p for k, _, s, p in got if k == http2.DATA and s == 1]
        assert data == [_message(b"padded!")]
        assert _decoded(got)[-1]["grpc-status"] == "0"

    run(body())


def test_pings_are_answered_and_a_wrong_content_type_is_415():
    async def body():
        async with _front() as (_, port):
            frames = (http2.frame(http2.PING, 0, 0, b"12345678")
                      + http2.frame(http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, 1,
                                    _request_block(content_type="application/json")))  # fmt: skip
            got = await _raw(port, frames)
        assert (http2.PING, http2.ACK, 0, b"12345678") in got
        assert _decoded(got)[0][":status"] == "415"

    run(body())


def test_protocol_violations_end_the_connection_with_goaway():
    async def body():
        async with _front() as (_, port):
            cases = {
                http2.PROTOCOL_ERROR: http2.frame(http2.HEADERS, 0, 1, _request_block())  # interrupted
                + http2.frame(http2.PING, 0, 0, b"12345678"),
                http2.FRAME_SIZE_ERROR: http2.frame(http2.DATA, 0, 1, bytes(http2.FRAME_SIZE + 1)),
                http2.COMPRESSION_ERROR: http2.frame(http2.HEADERS, http2.END_HEADERS, 1, b"\xff" * 4),
            }
            for code, frames in cases.items():
                got = await _raw(port, frames)
                goaway = [p for k, _, _, p in got if k == http2.GOAWAY]
                assert goaway and struct.unpack(">II", goaway[0][:8])[1] == code, (code, got)
            async with _channel(port) as channel:  # the server goes on
                assert await channel.unary_unary("/t.T/Echo")(b"ok", timeout=5) == b"ok"

    run(body())


def test_data_past_the_stream_window_resets_that_stream():
    async def body():
        async with _front() as (_, port):
            frames = http2.frame(http2.HEADERS, http2.END_HEADERS, 1, _request_block())
            frames += b"".join(http2.frame(http2.DATA, 0, 1, bytes(http2.FRAME_SIZE))
                               for _ in range(http2.STREAM_WINDOW // http2.FRAME_SIZE + 1))  # fmt: skip
            got = await _raw(port, frames, read_s=2.0)
        resets = [p for k, _, s, p in got if k == http2.RST_STREAM and s == 1]
        assert resets and int.from_bytes(resets[0], "big") in (http2.FLOW_CONTROL_ERROR, http2.NO_ERROR), got

    run(body())


def _window_updates(frames, stream: int) -> list[int]:
    return [int.from_bytes(p, "big") for k, _, s, p in frames if k == http2.WINDOW_UPDATE and s == stream]


def test_windows_are_given_back_once_half_spent_not_per_call():
    """A unary call's request costs no WINDOW_UPDATE (the client is not woken once more per
    call); a stream that keeps sending gets its window back once half of it is read, and
    calls past the connection window (16 MiB) go on: it is given back too."""

    async def body():
        async with _front() as (_, port):
            echo = http2.frame(http2.HEADERS, http2.END_HEADERS, 1, _request_block())
            echo += http2.frame(http2.DATA, http2.END_STREAM, 1, _message(b"hi"))
            got = await _raw(port, echo, read_s=0.5)
            assert [p for k, _, _, p in got if k == http2.DATA] == [_message(b"hi")]
            raised = (http2.CONNECTION_WINDOW - http2.DEFAULT_WINDOW,)  # this side's first frames
            assert (*_window_updates(got, 0), *_window_updates(got, 1)) == raised
            reads_all = http2.frame(http2.SETTINGS, 0, 0, struct.pack(">HI", 0x4, 2**31 - 1))
            reads_all += http2.frame(http2.WINDOW_UPDATE, 0, 0, (2**31 - 2**16).to_bytes(4, "big"))
            chat = reads_all + http2.frame(http2.HEADERS, http2.END_HEADERS, 1, _request_block("/t.T/Chat"))
            chunk = _message(bytes(16_000))
            chat += b"".join(http2.frame(http2.DATA, 0, 1, chunk) for _ in range(3 * MiB // len(chunk)))
            got = await _raw(port, chat, read_s=1.5)
            given = _window_updates(got, 1)
            assert given and sum(given) >= http2.STREAM_WINDOW * http2.UPDATE_AT, given
            assert _window_updates(got, 0) == list(raised)  # 3 MiB: under half the connection's
        unbounded = {"grpc.max_receive_message_length": -1}
        async with _front() as (_, port), _channel(port, **unbounded) as channel:
            big = bytes(7 * MiB)
            for i in range(4):  # 28 MiB on one connection
                assert await channel.unary_unary("/t.T/Echo")(big + b"%d" % i, timeout=20) == big + b"%d" % i

    run(body())


def test_answers_of_one_turn_go_out_in_one_write():
    """Eight calls read together are answered in the same turn of the loop: their 24 frames
    leave in one ``send``, not eight (each would wake the client's reader once more)."""

    async def body():
        async with _front() as (front, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(http2.PREFACE + http2.frame(http2.SETTINGS, 0, 0))
            await reader.read(65536)  # this side's SETTINGS and window
            (connection,) = front.connections
            writes: list[bytes] = []
            send = connection.transport.write
            connection.transport.write = lambda data: (writes.append(data), send(data))[1]
            calls = b"".join(http2.frame(http2.HEADERS, http2.END_HEADERS, 2 * i + 1, _request_block())
                             + http2.frame(http2.DATA, http2.END_STREAM, 2 * i + 1, _message(b"%d" % i))
                             for i in range(8))  # fmt: skip
            writer.write(calls)
            got = b""
            while got.count(_message(b"7")) == 0 or len(writes) < 1:
                got += await asyncio.wait_for(reader.read(65536), 5)
            await asyncio.sleep(0.2)
            answers = [w for w in writes if bytes([http2.DATA]) in w]
            assert len(writes) <= 2 and len(answers) == 1, [len(w) for w in writes]  # SETTINGS ACK, answers
            assert all(_message(b"%d" % i) in answers[0] for i in range(8))
            writer.close()

    run(body())


def test_silent_and_idle_connections_are_closed():
    async def body():
        async with _front(handshake_timeout_s=0.3, idle_timeout_s=0.5) as (_, port):
            silent = socket.create_connection(("127.0.0.1", port))
            silent.settimeout(3)
            got = b""
            while chunk := await asyncio.to_thread(silent.recv, 65536):  # a timeout raises
                got += chunk
            silent.close()
            assert got[3] == http2.SETTINGS  # its SETTINGS, then the close
            frames = await _raw(port, b"", read_s=3.0)  # a preface, then nothing
            goaway = [p for k, _, _, p in frames if k == http2.GOAWAY]
            assert goaway and struct.unpack(">II", goaway[0][:8])[1] == http2.NO_ERROR

    run(body())


def test_stopping_lets_calls_in_flight_finish_and_refuses_new_ones():
    async def body():
        limits = GrpcLimits(ByteBudget(64 * MiB), max_message_bytes=MiB)
        handlers = _handlers(limits)

        async def quick_then_done(request, context):
            await asyncio.sleep(0.3)
            return request

        quick = grpc.unary_unary_rpc_method_handler(quick_then_done, request_deserializer=bytes,
                                                    response_serializer=bytes)  # fmt: skip
        handlers["/t.T/Quick"] = _wrapped(quick, "/t.T/Quick", None, limits)
        front = GrpcFront(handlers, limits)
        await front.start("127.0.0.1", 0)
        port = front._server.sockets[0].getsockname()[1]
        async with _channel(port) as channel:
            pending = asyncio.ensure_future(channel.unary_unary("/t.T/Quick")(b"in flight", timeout=5))
            await asyncio.sleep(0.1)
            await front.stop(2.0)
            assert await pending == b"in flight"
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()

    run(body())


def test_a_client_that_does_not_read_is_not_read_either():
    """Answers and PING acknowledgements to a peer that reads nothing stay near the
    transport's high-water mark: reading stops while writing is paused."""

    async def body():
        async with _front() as (front, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            unlimited = struct.pack(">HI", 0x4, 2**31 - 1)  # SETTINGS_INITIAL_WINDOW_SIZE
            wider = (2**31 - 2**16).to_bytes(4, "big")
            writer.write(http2.PREFACE + http2.frame(http2.SETTINGS, 0, 0, unlimited)
                         + http2.frame(http2.WINDOW_UPDATE, 0, 0, wider))  # fmt: skip
            payload = _message(bytes(60_000))
            chunks = [payload[at : at + http2.FRAME_SIZE] for at in range(0, len(payload), http2.FRAME_SIZE)]
            encoder = hpack.Encoder()
            for i in range(300):  # 18 MB of answers asked for
                stream, block = 2 * i + 1, encoder.encode(_REQUEST_HEADERS)
                writer.write(http2.frame(http2.HEADERS, http2.END_HEADERS, stream, block)
                             + b"".join(http2.frame(http2.DATA, 0, stream, chunk) for chunk in chunks)
                             + http2.frame(http2.DATA, http2.END_STREAM, stream))  # fmt: skip
            pings = (http2.frame(http2.PING, 0, 0, b"%08d" % i) for i in range(200_000))  # 3.4 MB
            writer.write(b"".join(pings))
            await asyncio.sleep(3.0)
            open_ = [c.transport for c in front.connections if c.transport is not None]
            held = sum(transport.get_write_buffer_size() for transport in open_)
            writer.transport.abort()
            assert held < 4 * 2**20, held

    run(body())


def test_a_call_ended_by_its_connection_frees_its_bytes_without_a_collection():
    async def body():
        import gc
        import weakref

        async with _front() as (front, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            declared = b"\x00" + struct.pack(">I", 4 * MiB)
            writer.write(http2.PREFACE + http2.frame(http2.SETTINGS, 0, 0)
                         + http2.frame(http2.HEADERS, http2.END_HEADERS, 1, _request_block())
                         + http2.frame(http2.DATA, 0, 1, declared + bytes(10_000)))  # fmt: skip
            await asyncio.sleep(0.3)
            [call] = front.calls
            left = weakref.ref(call)
            del call
            gc.disable()
            try:
                writer.transport.abort()
                await asyncio.sleep(0.3)
                assert left() is None and not front.calls
            finally:
                gc.enable()

    run(body())


def test_metadata_over_the_header_list_limit_fails_that_call_alone():
    async def body():
        async with _front(max_header_list=4096) as (_, port), _channel(port) as channel:
            slow = asyncio.ensure_future(channel.unary_unary("/t.T/Echo")(b"beside", timeout=5))
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await channel.unary_unary("/t.T/Echo")(b"x", timeout=5, metadata=(("x-big", "v" * 6000),))
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert await slow == b"beside"
            assert await channel.unary_unary("/t.T/Echo")(b"after", timeout=5) == b"after"

    run(body())


def test_a_status_message_past_grpcs_metadata_limit_is_cut_not_lost():
    """A model's exception with many frames: the client gets INTERNAL and the message's start,
    not RESOURCE_EXHAUSTED (gRPC's 8 KiB metadata limit) with the text lost."""

    async def body():
        async with _front() as (_, port), _channel(port) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await channel.unary_unary("/t.T/Fails")(b"x", timeout=20)
            assert caught.value.code() == grpc.StatusCode.INTERNAL
            details = caught.value.details()
            assert details.startswith("é  /models/m/1/model.py(5): helper") and details.endswith(TRUNCATED)
            assert len(percent_encoded(details)) <= MAX_STATUS_BYTES

    run(body())


@pytest.mark.parametrize("char", ["a", "%", "é", "😀"])
def test_fitting_cuts_at_a_character_within_the_limit(char):
    for length in (1, 100, 1000, 5000):
        message = char * length
        cut = fitting(message, limit=300)
        assert len(percent_encoded(cut)) <= 300
        assert cut == message or (cut.endswith(TRUNCATED) and message.startswith(cut.removesuffix(TRUNCATED)))
    assert fitting("short") == "short"
