"""Limits on what a gRPC call can make the gateway hold before any work is done.

grpc core refuses a message over ``grpc.max_receive_message_length`` from its declared
length (measured with a raw HTTP/2 client declaring 2^31-1 bytes: the stream is reset after
~8 MiB, the server's memory does not grow; ``tests/hardening/test_grpc_limits.py``). Under
that size it reads a message whole before a unary handler runs, so :class:`LimitsInterceptor`
turns every unary-request method into a request-streaming one whose behavior receives the
message itself, which lets it:

- refuse a call before its message is read (an access refusal, placed outside it, never
  iterates the request: :func:`gateway.grpc_server._refusing`);
- bound the read in time (``read_timeout_s``: DEADLINE_EXCEEDED, the call ends and grpc
  drops what it buffered);
- count the message against the gateway's shared :class:`gateway.limits.ByteBudget`: a
  message that has not arrived within :data:`PROMPT_S` is being read (it may be up to
  ``max_message_bytes``) and holds that much until it arrived, then its real size until
  the call ends. A message that arrives at once (the usual small request) holds only its
  size. A full budget answers UNAVAILABLE at once.

``ModelStreamInfer`` (already request-streaming) is left as it is: each of its messages is
bounded by the largest message size, and its requests by the gateway's ``--max-inflight``.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from gateway.limits import ByteBudget
from naiad.errors import InvalidInput, RequestTimeout

#: Wrapped method handlers an interceptor keeps (the service has 20 methods; grpc hands the
#: same handler to every call of one; a refused call's handler is new each time and ages out).
HANDLERS_CACHED = 128

#: Seconds a call's message may take to be there before the call counts as reading a
#: message of the largest size (a small request arrives in the same packets as its headers).
#: Not shorter: a loaded event loop hands an arrived message over late (at 32 concurrent
#: clients on 2 cores, turns of 5-60 ms), and at 5 ms three small calls so delayed held
#: 3 x 64 MiB of the 256 MiB budget and the next one was refused UNAVAILABLE.
PROMPT_S = 0.1


@dataclass
class GrpcLimits:
    """``max_message_bytes`` (each way), ``read_timeout_s`` (one message), the shared
    ``budget``, and the connection timeouts handed to grpc core (milliseconds there)."""

    budget: ByteBudget
    max_message_bytes: int = 64 * 1024**2
    read_timeout_s: float = 60.0
    handshake_timeout_s: float = 10.0
    idle_timeout_s: float = 75.0

    def server_options(self) -> list[tuple[str, int]]:
        """grpc core channel arguments for these limits."""
        return [
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.server_handshake_timeout_ms", int(self.handshake_timeout_s * 1000)),
            ("grpc.max_connection_idle_ms", int(self.idle_timeout_s * 1000)),
        ]


class LimitsInterceptor(grpc.aio.ServerInterceptor):
    """Reads each unary request itself, within :class:`GrpcLimits` (see the module doc)."""

    def __init__(self, limits: GrpcLimits):
        self._limits = limits
        self._reading = functools.lru_cache(maxsize=HANDLERS_CACHED)(self._reading_handler)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming or handler.response_streaming:
            return handler  # the service's only streaming method is ModelStreamInfer
        return self._reading(handler)

    def _reading_handler(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """``handler`` made request-streaming (:func:`_reading`), once per method handler."""
        behavior = _reading(handler.unary_unary, handler.request_deserializer, self._limits)
        return handler._replace(
            request_streaming=True, request_deserializer=None, unary_unary=None, stream_unary=behavior
        )


def _reading(
    behavior: Callable[..., Any], deserializer: Callable[[bytes], Any] | None, limits: GrpcLimits
) -> Callable[..., Any]:
    """A request-streaming behavior that reads one raw message within ``limits``, decodes
    it (:class:`InvalidInput` when it is not a valid message) and runs ``behavior`` on it."""

    async def call(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> Any:
        with limits.budget.reservation() as reservation:
            raw = await _receive(requests, limits, reservation)
            reservation.resize(len(raw))
            try:
                request = deserializer(raw) if deserializer else raw
            except DecodeError as exc:
                raise InvalidInput(f"the request is not a valid protobuf message: {exc}") from None
            del raw
            return await behavior(request, context)

    return call


async def _receive(requests: AsyncIterator[bytes], limits: GrpcLimits, reservation: Any) -> bytes:
    read = asyncio.ensure_future(anext(aiter(requests)))
    try:
        done, _ = await asyncio.wait({read}, timeout=PROMPT_S)
        if not done:
            reservation.add(limits.max_message_bytes)
            done, _ = await asyncio.wait({read}, timeout=limits.read_timeout_s)
        if not done:
            raise RequestTimeout(f"the request message did not arrive within {limits.read_timeout_s:g} s")
        try:
            return read.result()
        except StopAsyncIteration:
            raise InvalidInput("the call carried no request message") from None
    finally:
        if not read.done():
            read.cancel()
        elif not read.cancelled():
            read.exception()  # retrieved: a call cancelled as its stream ended logs no "never retrieved"
