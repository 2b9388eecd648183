"""Time and connection limits of the HTTP ports, and the bounded body read.

aiohttp (3.14) has no header or body read timeout and no connection cap, so a client that
sends nothing, half a header, or a body at 1 byte/s would hold a socket (and an in-flight
slot) for as long as it likes. This module adds them around aiohttp's public seams:

- :class:`LimitedAppRunner`: an ``AppRunner`` whose server answers a connection past
  ``max_connections`` with a raw 503 and closes it, and closes a connection whose request
  head has not arrived within ``header_timeout_s`` of the connection's start (first request)
  or of the head's first byte (later requests). Idle keep-alive connections are aiohttp's own
  ``keepalive_timeout`` (``keepalive_timeout_s``).
- :func:`limits_middleware`: holds the request's :class:`gateway.limits.Reservation` until
  its answer is made (the header timer stops when aiohttp builds the request object).
- :func:`read_body_limited`: the body, refused with 413 from its declared
  ``Content-Length`` before any byte is read, then read chunk by chunk within
  ``body_first_byte_timeout_s`` (first byte) and ``body_timeout_s`` (whole body), each
  chunk counted against the shared :class:`gateway.limits.ByteBudget`. A refusal closes the
  connection after its answer (after at most :data:`LINGER_S` of reading and dropping what
  is left, so the client sees the answer rather than a reset).
- A malformed request head (a header over the size limit, too many headers) is answered
  400 with a JSON ``error`` and the connection lingers the same way
  (:data:`LINGER_QUIET_S`) before it closes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from gateway.limits import ByteBudget, Reservation
from naiad.errors import NaiadError, PayloadTooLarge, RequestTimeout

logger = logging.getLogger(__name__)

RESERVATION = web.RequestKey("reservation", Reservation)


@dataclass
class HttpLimits:
    """The HTTP ports' limits (:class:`naiad.settings.Settings` ``http_*`` fields)."""

    max_body_bytes: int = 64 * 1024**2
    header_timeout_s: float = 10.0
    body_first_byte_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    keepalive_timeout_s: float = 75.0
    max_connections: int = 1024
    budget: ByteBudget = field(default_factory=lambda: ByteBudget(256 * 1024**2))

    @classmethod
    def from_settings(cls, settings: Any, budget: ByteBudget) -> HttpLimits:
        return cls(
            max_body_bytes=settings.http_max_body_bytes,
            header_timeout_s=settings.http_header_timeout_s,
            body_first_byte_timeout_s=settings.http_body_first_byte_timeout_s,
            body_timeout_s=settings.http_body_timeout_s,
            keepalive_timeout_s=settings.http_keepalive_timeout_s,
            max_connections=settings.http_max_connections,
            budget=budget,
        )


#: Seconds an answered connection whose body was left unread still reads (and drops) it
#: before closing, so the client reads the answer instead of a reset (aiohttp's default: 10).
LINGER_S = 2.0

_REFUSED = json.dumps({"error": "too many open connections; retry later"}).encode()
#: What a connection past the cap gets before it is closed (HTTP/1.1, RFC 9110 §15.6.4).
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_REFUSED), _REFUSED)
)


#: Characters of a malformed request's parse error that reach the log.
LOGGED_ERROR_CHARS = 200
#: After answering a malformed head, the connection reads and drops what the client still
#: sends until it has been quiet this long (seconds), it ends its side, or :data:`LINGER_S`
#: passed: closing with unread input makes the kernel send a reset, and the client loses the
#: answer (nginx's ``lingering_close``, whose ``lingering_timeout`` is this quiet period).
LINGER_QUIET_S = 0.5


class _Handler(RequestHandler):
    """aiohttp's connection handler, with its own errors (a malformed request line, a header
    over ``max_field_size``, too many headers) answered as JSON ``{"error": ...}`` like
    every other non-200, and logged as one short INFO line instead of a traceback at ERROR
    (a header flood would otherwise fill the log)."""

    awaiting_head = False  # between requests: the next byte starts a head (header timer)
    refused_head = False  # a malformed head was answered: linger, then close
    _dropping: asyncio.Event | None = None  # set at each chunk dropped while lingering
    _peer_done = False

    def data_received(self, data: bytes) -> None:
        if self._dropping is not None:  # lingering: read and drop
            self._dropping.set()
            return
        server = self._manager
        if self.awaiting_head and isinstance(server, _GuardedServer) and self.transport is not None:
            server.arm_header_timer(self, self.transport)  # a later request's head began
        super().data_received(data)

    def eof_received(self) -> None:
        self._peer_done = True
        if self._dropping is not None:
            self._dropping.set()
        super().eof_received()

    async def finish_response(self, request: Any, resp: web.StreamResponse, start_time: float | None) -> Any:
        result = await super().finish_response(request, resp, start_time)
        self.awaiting_head = True
        if self.refused_head:
            await self._linger()
        return result

    async def _linger(self) -> None:
        """Read and drop input until the client is quiet for :data:`LINGER_QUIET_S`, ends
        its side, or :data:`LINGER_S` passed (then aiohttp closes the connection)."""
        dropping = self._dropping = asyncio.Event()
        deadline = self._loop.time() + LINGER_S
        if self.transport is not None:
            self.transport.resume_reading()  # paused with a full message queue: read on
        while not self._peer_done and self.transport is not None and not self.transport.is_closing():
            left = deadline - self._loop.time()
            if left <= 0:
                return
            dropping.clear()
            try:
                async with asyncio.timeout(min(LINGER_QUIET_S, left)):
                    await dropping.wait()
            except TimeoutError:
                return  # quiet: what it sent is read, closing sends no reset

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if isinstance(exc, HttpProcessingError):
            peer = args[1] if len(args) > 1 else "?"
            text = " ".join(str(exc.message).split())[:LOGGED_ERROR_CHARS]
            self.logger.info("refused a malformed request from %s: %d %s", peer, exc.code, text)
            return
        super().log_exception(*args, **kwargs)

    def handle_error(
        self, request: Any, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs; raises if already answering
        if isinstance(exc, HttpProcessingError):
            text = " ".join(str(exc.message).split())[:LOGGED_ERROR_CHARS]
        else:
            text = "internal server error" if status >= 500 else "bad request"
        response = web.json_response({"error": text}, status=status)
        response.force_close()
        self.refused_head = isinstance(exc, HttpProcessingError)
        return response


class _GuardedServer(web.Server):
    """aiohttp's low-level server plus the connection cap, the header timer, and
    :class:`_Handler` for each connection."""

    limits: HttpLimits
    header_timers: dict[RequestHandler, asyncio.TimerHandle]
    #: Builds a connection's first protocol instead of :meth:`handler` (:mod:`gateway.http_fast`).
    front: Callable[[_GuardedServer], asyncio.Protocol] | None = None

    def __call__(self) -> asyncio.Protocol:
        return self.front(self) if self.front is not None else self.handler()

    def handler(self) -> RequestHandler:
        """aiohttp's handler of a connection (:class:`_Handler`)."""
        return _Handler(self, loop=self._loop, **self._kwargs)

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        if len(self._connections) > self.limits.max_connections:
            transport.write(REFUSAL)
            transport.close()
            return
        self.arm_header_timer(handler, transport)

    def arm_header_timer(
        self, handler: RequestHandler, transport: asyncio.Transport, at: float | None = None
    ) -> None:
        """Close ``transport`` unless a request head arrives within the header timeout; with
        ``at`` (loop time), by then instead, replacing a timer already armed."""
        if at is not None:
            armed = self.header_timers.pop(handler, None)
            if armed is not None:
                armed.cancel()
            self.header_timers[handler] = self._loop.call_at(at, self._header_timeout, handler, transport)
        elif handler not in self.header_timers:
            timeout = self.limits.header_timeout_s
            timer = self._loop.call_later(timeout, self._header_timeout, handler, transport)
            self.header_timers[handler] = timer

    def header_deadline(self, handler: object) -> float | None:
        """When ``handler``'s header timer fires (loop time), or None when none is armed."""
        timer = self.header_timers.get(handler)  # type: ignore[call-overload]
        return timer.when() if timer is not None else None

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        self.headers_received(handler)
        super().connection_lost(handler, exc)

    def headers_received(self, handler: object) -> None:
        if isinstance(handler, _Handler):
            handler.awaiting_head = False
        timer = self.header_timers.pop(handler, None)  # type: ignore[call-overload]
        if timer is not None:
            timer.cancel()

    def _header_timeout(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        self.header_timers.pop(handler, None)
        peer = transport.get_extra_info("peername")
        logger.info("closing a connection from %s: no complete request headers after %g s",
                    peer, self.limits.header_timeout_s)
        transport.close()


class LimitedAppRunner(web.AppRunner):
    """``web.AppRunner`` serving ``app`` under ``limits`` (see the module doc); ``front``,
    when given, builds each connection's first protocol from the server (which keeps
    counting it, timing its heads and shutting it down), and that protocol may hand the
    connection to :meth:`_GuardedServer.handler`."""

    def __init__(
        self, app: web.Application, limits: HttpLimits,
        front: Callable[[_GuardedServer], asyncio.Protocol] | None = None, **kwargs: Any,
    ):  # fmt: skip
        kwargs.setdefault("keepalive_timeout", limits.keepalive_timeout_s)
        kwargs.setdefault("lingering_time", LINGER_S)
        super().__init__(app, **kwargs)
        self._limits = limits
        self._front = front

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _GuardedServer  # same state, two more hooks (aiohttp builds it)
        guarded: _GuardedServer = server  # type: ignore[assignment]
        guarded.limits = self._limits
        guarded.header_timers = {}
        guarded.front = self._front
        make_request = server.request_factory

        def request_factory(message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> Any:
            guarded.headers_received(protocol)  # aiohttp parsed a whole request head
            return make_request(message, payload, protocol, writer, task)

        server.request_factory = request_factory
        return server


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def limits_middleware(limits: HttpLimits) -> Callable[..., Awaitable[web.StreamResponse]]:
    """The outermost middleware: the request's :class:`Reservation` lives as long as its
    handler."""

    @web.middleware
    async def limit(request: web.Request, handler: Handler) -> web.StreamResponse:
        with limits.budget.reservation() as reservation:
            request[RESERVATION] = reservation
            return await handler(request)

    return limit


async def read_body_limited(request: web.Request, limits: HttpLimits) -> bytes:
    """The raw body (bytes, ``Content-Encoding`` not undone), within ``limits``.

    Raises :class:`PayloadTooLarge` (413) when the declared or read length is over
    ``max_body_bytes``, :class:`RequestTimeout` (408) when the first byte or the whole body
    is late, :class:`naiad.errors.Overloaded` (503) when the shared budget is full. Each
    error has ``close_connection`` set: the HTTP error middleware then closes the connection
    after the answer, so what is left of the body is never read into a handler. A client
    gone before its body was read (aiohttp's ``ConnectionResetError``) cancels the handler:
    nobody is left to answer, and nothing is logged as an error."""
    try:
        return await _read(request, limits)
    except NaiadError as exc:
        exc.close_connection = True  # type: ignore[attr-defined]
        raise
    except ConnectionResetError:
        raise asyncio.CancelledError("the client went away before its body was read") from None


async def _read(request: web.Request, limits: HttpLimits) -> bytes:
    declared = request.content_length
    if declared is not None and declared > limits.max_body_bytes:
        raise PayloadTooLarge(
            f"the request body ({declared} bytes) is over the limit of {limits.max_body_bytes}"
        )
    if not request.body_exists:
        return b""
    reservation: Reservation = request.get(RESERVATION) or limits.budget.reservation()
    buffered = _buffered_body(request, limits)
    if buffered is not None:  # it came with the head: no wait, no timer
        reservation.add(len(buffered))
        return buffered
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limits.body_timeout_s
    body = bytearray()
    while True:
        wait = deadline - loop.time()
        if not body:
            wait = min(wait, limits.body_first_byte_timeout_s)
        try:
            async with asyncio.timeout(max(wait, 0)):
                chunk = await request.content.readany()
        except TimeoutError:
            what = "its first byte" if not body else f"the whole body ({len(body)} bytes so far)"
            raise RequestTimeout(f"the request body did not arrive in time: {what}") from None
        if not chunk:
            return bytes(body)
        if len(body) + len(chunk) > limits.max_body_bytes:
            raise PayloadTooLarge(f"the request body is over the limit of {limits.max_body_bytes} bytes")
        reservation.add(len(chunk))
        body += chunk


def _buffered_body(request: web.Request, limits: HttpLimits) -> bytes | None:
    """The whole body when the connection already holds all of it (a small request arrives
    with its head, in one segment: aiohttp's parser has seen its end), else None, nothing
    read: then :func:`_read` reads it under its timers."""
    content = request.content
    declared = request.content_length
    if declared is None or declared > limits.max_body_bytes or not content.is_eof():
        return None
    return content.read_nowait(-1)  # every byte, the end seen: all of it is buffered
