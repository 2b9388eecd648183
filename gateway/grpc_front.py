"""The gateway's gRPC front: gRPC calls on Naiad's own HTTP/2 connections (:mod:`gateway.http2`).

It serves the same method handlers as a ``grpc.aio`` server would (:func:`gateway.grpc_server.
method_handlers`: the servicer, its error mapping, access checks and message limits are
unchanged), with each call's ``context`` a :class:`Call`: ``invocation_metadata``,
``time_remaining``, ``abort`` and ``write``, what those handlers use. Why: the gateway's CPU
a gRPC request at c32 fell from 708–746 µs on grpc.aio to 315–329 (docs/benchmarks.md,
"Stop 26"); ``--grpc-front grpcio`` keeps grpc.aio.

The protocol followed is gRPC over HTTP/2 (grpc's ``doc/PROTOCOL-HTTP2.md``):

- a request is ``POST`` with ``content-type: application/grpc[+proto]`` (else HTTP 415) and
  ``:path`` ``/service/method`` (an unknown one: UNIMPLEMENTED); its other headers, but the
  reserved ones, are the call's metadata (``-bin`` values base64-decoded to bytes);
- ``grpc-timeout`` (``1-8 digits`` and a unit of ``HMSmun``) sets the call's deadline: past
  it the call is cancelled and answered DEADLINE_EXCEEDED;
- messages are length-prefixed (a compressed flag, 4 bytes of length); one declared over the
  largest message size is refused at once (RESOURCE_EXHAUSTED) before its bytes are read;
  a compressed one is inflated per ``grpc-encoding`` (``gzip``, ``deflate``), bounded by the
  same size;
- the answer is ``:status 200`` and ``content-type: application/grpc``, the messages, and
  trailers with ``grpc-status`` and a percent-encoded ``grpc-message``; an error before any
  message is a trailers-only answer (one header block).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import logging
import re
import zlib
from collections.abc import Callable
from typing import Any, NamedTuple

import grpc

from gateway import http2
from gateway.grpc_limits import GrpcLimits

logger = logging.getLogger(__name__)

#: grpc's own bound on a received message when none is configured (4 MiB).
DEFAULT_MAX_RECEIVE = 4 * 2**20
#: Headers of a request that are not its metadata (as grpc core takes them out).
RESERVED = frozenset({"content-type", "te", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding"})
_TIMEOUT = re.compile(r"(\d{1,8})([HMSmun])")
_UNIT_S = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
#: zlib window bits by ``grpc-encoding`` (gzip's header, or zlib's for grpc's "deflate").
_INFLATE = {"gzip": 31, "deflate": 15}
#: The message codings read (``grpc-encoding`` of a request); answers are not compressed.
ACCEPT_ENCODING = "identity,deflate,gzip"
_HEAD = http2.header_block(
    [(":status", "200"), ("content-type", "application/grpc"), ("grpc-accept-encoding", ACCEPT_ENCODING)]
)
_OK = http2.header_block([("grpc-status", "0")])
_PREFIX = 5  # a message's compressed flag and 4 bytes of length
_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


class Metadatum(NamedTuple):
    """One item of a call's metadata, as ``grpc.aio`` gives them."""

    key: str
    value: str | bytes


def percent_encoded(message: str) -> str:
    """``grpc-message``'s encoding: UTF-8, bytes outside printable ASCII and ``%`` as ``%XX``."""
    return "".join(map(_percent_encoded_char, message))


def _percent_encoded_char(char: str) -> str:
    if " " <= char <= "~" and char != "%":
        return char
    return "".join(f"%{b:02X}" for b in char.encode())


#: Most bytes of a status message once percent-encoded: gRPC's C core refuses received
#: metadata past 8 KiB by default (its soft limit, ``grpc.max_metadata_size``; 16 KiB hard), so
#: a longer message (a Python model's exception with all its frames) would reach a client as
#: RESOURCE_EXHAUSTED, its status and text lost.
MAX_STATUS_BYTES = 4096
TRUNCATED = " [... truncated]"


def fitting(message: str, limit: int = MAX_STATUS_BYTES) -> str:
    """``message``, cut at a character (and marked :data:`TRUNCATED`) where its
    :func:`percent_encoded` form would pass ``limit`` bytes."""
    if len(message) * 12 <= limit:  # a character encodes to at most 12 bytes (4 UTF-8 bytes as %XX)
        return message
    size = 0
    for index, char in enumerate(message):
        size += len(_percent_encoded_char(char))
        if size > limit - len(TRUNCATED):
            return message[:index] + TRUNCATED
    return message


def timeout_s(value: str | None) -> float | None:
    """Seconds of a ``grpc-timeout`` header; None without one, or for a malformed one."""
    match = _TIMEOUT.fullmatch(value) if value else None
    return int(match[1]) * _UNIT_S[match[2]] if match else None


def _status(code: grpc.StatusCode, details: str, leading: bool) -> bytes:
    """The trailers of ``code``; with ``leading``, a trailers-only answer's whole block."""
    fields = [("grpc-status", str(code.value[0])), ("grpc-message", percent_encoded(details))]
    if leading:
        fields = [(":status", "200"), ("content-type", "application/grpc"), *fields]
    return http2.header_block(fields)


class Call:
    """One call on one stream: the stream's :class:`gateway.http2.Receiver` and the handler's
    ``context``. Its task runs the handler and answers; the stream's end, reset, the
    deadline and an oversized message reach it from here."""

    def __init__(self, front: GrpcFront, stream: http2.Stream, handler: grpc.RpcMethodHandler, headers: dict):
        self.front, self.stream, self.handler = front, stream, handler
        self._metadata = tuple(_metadata(headers))
        self._encoding = headers.get("grpc-encoding", "identity")
        self._buffer, self._messages = bytearray(), collections.deque()
        self._ended = self._peer_gone = self._headers_sent = self._started = False
        self._waiter: asyncio.Future[None] | None = None
        self._owed = 0  # bytes received, given back to the stream's window once read
        self._failure: tuple[grpc.StatusCode, str] | None = None  # ends the call when cancelled
        self._aborted: tuple[grpc.StatusCode, str] = (grpc.StatusCode.UNKNOWN, "")
        loop = asyncio.get_running_loop()
        seconds = timeout_s(headers.get("grpc-timeout"))
        self._deadline = None if seconds is None else loop.time() + seconds
        self._timer = None if seconds is None else loop.call_later(seconds, self._expired)
        if seconds is None and "grpc-timeout" in headers:
            self._fail(grpc.StatusCode.INTERNAL, "Error parsing 'grpc-timeout' metadata")
        elif _header_list_size(headers) > (most := front.http2_limits.max_header_list):
            self._fail(_EXHAUSTED, f"received metadata size exceeds limit ({most})")
        self.task = loop.create_task(self._run())

    # -- the stream's side (gateway.http2.Receiver) ----------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._failure is not None:  # answered already: the rest is dropped
            self.stream.consumed(len(data))
            return
        self._buffer += data
        if len(self._messages) >= 2:  # a reader behind: its sender waits for the window
            self._owed += len(data)
        else:
            self.stream.consumed(len(data))
        while len(self._buffer) >= _PREFIX:
            length = int.from_bytes(self._buffer[1:_PREFIX], "big")
            if length > self.front.max_receive:
                self._fail(_EXHAUSTED, _too_large("Received", length, self.front.max_receive))
                return
            if len(self._buffer) < _PREFIX + length:
                break
            compressed, message = self._buffer[0], bytes(self._buffer[_PREFIX : _PREFIX + length])
            del self._buffer[: _PREFIX + length]
            if compressed:
                message = self._inflate(message)
                if message is None:
                    return
            self._messages.append(message)
            self._wake()

    def end_received(self) -> None:
        self._ended = True
        if self._buffer:
            self._fail(grpc.StatusCode.INTERNAL, "the request stream ended inside a message")
        self._wake()

    def reset_received(self) -> None:
        self._peer_gone = True
        if self._started:
            self.task.cancel()

    # -- the handler's context (what grpc.aio.ServicerContext offers and the servicer uses) -----

    def invocation_metadata(self) -> tuple[Metadatum, ...]:
        return self._metadata

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - asyncio.get_running_loop().time())

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        """End the call with ``code`` and ``details`` (raises, as grpc.aio's does)."""
        self._aborted = (code, details)
        raise grpc.aio.AbortError()

    async def write(self, message: Any) -> None:
        """Send one response message of a response-streaming call."""
        payload = self.handler.response_serializer(message)
        self._check_send(payload)
        if not self._headers_sent:
            self._headers_sent = True
            self.stream.send_headers(_HEAD)
        await self.stream.send_data(_framed(payload))

    # -- running the call ----------------------------------------------------------------------

    async def _run(self) -> None:
        # A task cancelled before its first step never runs its body: what would have
        # cancelled it before now (_fail, reset_received) is looked at here instead.
        self._started, handler = True, self.handler
        try:
            if self._failure is not None or self._peer_gone:
                await self._cancelled()
            elif handler.response_streaming:
                await handler.stream_stream(Requests(self), self)
                await self._finish(grpc.StatusCode.OK, "")
            else:
                await self._answer(await handler.stream_unary(Requests(self), self))
        except grpc.aio.AbortError:
            await self._finish(*self._aborted)
        except asyncio.CancelledError:
            await self._cancelled()
        except ConnectionResetError:
            pass  # the stream was reset or its connection lost while answering
        except Exception as exc:
            logger.error("unhandled error in %s", self.front.path_of(handler), exc_info=exc)
            await self._finish(grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc).__name__}")
        finally:
            if self._timer is not None:
                self._timer.cancel()
            self._buffer, self._messages = bytearray(), collections.deque()
            self.front.calls.discard(self)

    async def _cancelled(self) -> None:
        """The call's task was cancelled: answer why, unless the peer is gone."""
        if self._failure is not None and not self._peer_gone:
            await self._finish(*self._failure)
        elif not self._peer_gone and not self.stream.reset:  # the server stops (as grpc.aio says it)
            await self._finish(grpc.StatusCode.UNAVAILABLE, "Cancelling all calls")

    async def _next(self) -> bytes | None:
        while not self._messages:
            if self._ended:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return self._take()

    def _take(self) -> bytes:
        message = self._messages.popleft()
        if self._owed and len(self._messages) < 2:
            self.stream.consumed(self._owed)
            self._owed = 0
        return message

    async def _answer(self, response: Any) -> None:
        payload = self.handler.response_serializer(response)
        self._check_send(payload)
        message = _framed(payload)
        stream = self.stream
        if not self._headers_sent and stream.can_send_now(len(message)):
            stream.send_all(_HEAD, message, _OK)  # the usual answer: one write
            return
        if not self._headers_sent:
            self._headers_sent = True
            stream.send_headers(_HEAD)
        await stream.send_data(message)
        stream.send_headers(_OK, end_stream=True)

    async def _finish(self, code: grpc.StatusCode, details: str) -> None:
        if code is grpc.StatusCode.OK:
            if not self._headers_sent:
                self.stream.send_headers(_HEAD)
            self.stream.send_headers(_OK, end_stream=True)
            return
        self.stream.send_headers(_status(code, details, leading=not self._headers_sent), end_stream=True)

    def _check_send(self, payload: bytes) -> None:
        if len(payload) > self.front.max_send:
            self._aborted = (_EXHAUSTED, _too_large("Sent", len(payload), self.front.max_send))
            raise grpc.aio.AbortError()

    def _inflate(self, message: bytes) -> bytes | None:
        bits = _INFLATE.get(self._encoding)
        if self._encoding == "identity":
            self._fail(grpc.StatusCode.INTERNAL, "Compression bit set but no encoding configured")
            return None
        if bits is None:
            self._fail(grpc.StatusCode.UNIMPLEMENTED, f"messages compressed with {self._encoding!r}")
            return None
        inflater = zlib.decompressobj(bits)
        try:
            out = inflater.decompress(message, self.front.max_receive + 1)
        except zlib.error as exc:
            self._fail(grpc.StatusCode.INTERNAL, f"a compressed message that does not inflate: {exc}")
            return None
        if len(out) > self.front.max_receive:
            self._fail(_EXHAUSTED, _too_large("Received", len(out), self.front.max_receive))
            return None
        return out

    def _fail(self, code: grpc.StatusCode, details: str) -> None:
        """End the call with ``code`` from outside its task (it is cancelled and answers)."""
        if self._failure is None:
            self._failure = (code, details)
            self._buffer.clear()
            if self._started:
                self.task.cancel()

    def _expired(self) -> None:
        self._timer = None
        self._fail(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class Requests:
    """A call's request messages, deserialized as its handler says, as an async iterator;
    :meth:`ready` takes one that arrived already without waiting (the usual unary request
    comes with its headers: :func:`gateway.grpc_limits.receive` then needs no task)."""

    def __init__(self, call: Call):
        self._call = call

    def __aiter__(self) -> Requests:
        return self

    async def __anext__(self) -> Any:
        message = await self._call._next()
        if message is None:
            raise StopAsyncIteration
        return self._decoded(message)

    def ready(self) -> Any | None:
        """A message received and not yet taken, or None."""
        call = self._call
        if not call._messages:
            return None
        return self._decoded(call._take())

    def _decoded(self, message: bytes) -> Any:
        deserializer = self._call.handler.request_deserializer
        return deserializer(message) if deserializer is not None else message


def _header_list_size(headers: dict[str, str]) -> int:
    """RFC 9113 §6.5.2's size of a header list: names, values and 32 bytes a field."""
    return sum(map(len, headers)) + sum(map(len, headers.values())) + 32 * len(headers)


def _too_large(which: str, size: int, limit: int) -> str:
    """grpc core's words for a message over its limit (tritonclient users match on them)."""
    return f"{which} message larger than max ({size} vs. {limit})"


def _framed(payload: bytes) -> bytes:
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


def _metadata(headers: dict[str, str]) -> list[Metadatum]:
    items = []
    for key, value in headers.items():
        if key.startswith(":") or key in RESERVED:
            continue
        if key.endswith("-bin"):
            try:
                items.append(Metadatum(key, base64.b64decode(value + "=" * (-len(value) % 4))))
            except ValueError:
                continue
        else:
            items.append(Metadatum(key, value))
    return items


class GrpcFront:
    """A gRPC server of ``handlers`` (full method path → ``grpc.RpcMethodHandler``) on HTTP/2
    connections of its own, with grpc's message limits from ``limits`` and the connection
    limits of ``http2_limits``. Every handler is request-streaming (a unary one reads its
    message itself: :func:`gateway.grpc_server.method_handlers`); raises ValueError if not."""

    def __init__(
        self, handlers: dict[str, grpc.RpcMethodHandler], limits: GrpcLimits | None,
        http2_limits: http2.Http2Limits | None = None,
    ) -> None:  # fmt: skip
        if not all(handler.request_streaming for handler in handlers.values()):
            raise ValueError("a handler must read its own requests (grpc_server.method_handlers)")
        self.handlers = handlers
        self.max_receive = limits.max_message_bytes if limits is not None else DEFAULT_MAX_RECEIVE
        self.max_send = limits.max_message_bytes if limits is not None else 2**31 - 1
        self.http2_limits = http2_limits or http2.Http2Limits()
        self.calls: set[Call] = set()
        self.connections: set[http2.Http2Connection] = set()
        self._server: asyncio.AbstractServer | None = None

    async def start(self, host: str, port: int, reuse_port: bool = False) -> None:
        """Listen on ``host:port`` (``reuse_port``: shared with sibling gateway processes).
        Raises OSError when the port cannot be bound."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._connection, host, port, reuse_port=reuse_port or None)

    async def stop(self, grace_s: float) -> None:
        """Refuse new calls at once (GOAWAY), give the calls in flight ``grace_s`` seconds,
        then cancel what is left and close every connection."""
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.go_away()
        tasks = [call.task for call in self.calls]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=grace_s)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=1.0)
        for connection in list(self.connections):
            connection.close()
        if self._server is not None:
            await self._server.wait_closed()

    def path_of(self, handler: grpc.RpcMethodHandler) -> str:
        return next((path for path, h in self.handlers.items() if h is handler), "?")

    def _connection(self) -> http2.Http2Connection:
        return _Connection(self._stream, self.http2_limits, self.connections)

    def _stream(self, stream: http2.Stream, header_list: list[tuple[str, str]]) -> http2.Receiver:
        headers = dict(header_list)
        if len(headers) != len(header_list):  # a name sent twice: its first value, as grpc.aio
            headers = {}
            for name, value in header_list:
                headers.setdefault(name, value)
        content_type = headers.get("content-type", "")
        if headers.get(":method") != "POST" or not content_type.startswith("application/grpc"):
            stream.send_headers(http2.header_block([(":status", "415")]), end_stream=True)
            return _Ignored()
        handler = self.handlers.get(headers.get(":path", ""))
        if handler is None:
            unknown = _status(grpc.StatusCode.UNIMPLEMENTED, "Method not found!", leading=True)
            stream.send_headers(unknown, end_stream=True)
            return _Ignored()
        call = Call(self, stream, handler, headers)
        self.calls.add(call)
        return call


class _Ignored:
    """The receiver of a stream answered already (refused): what it sends is dropped."""

    def data_received(self, data: bytes) -> None:
        pass

    def end_received(self) -> None:
        pass

    def reset_received(self) -> None:
        pass


class _Connection(http2.Http2Connection):
    """A connection that keeps itself in its server's set while open."""

    def __init__(self, on_stream: Callable, limits: http2.Http2Limits, registry: set):
        super().__init__(on_stream, limits)
        self._registry = registry

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._registry.add(self)
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._registry.discard(self)
        super().connection_lost(exc)
