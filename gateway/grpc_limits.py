"""Limits on what a gRPC call can make the gateway hold before any work is done.

The gRPC front (:mod:`gateway.grpc_front`) and grpc core (``--grpc-front grpcio``) both
refuse a message over the largest size from its declared length (a raw HTTP/2 client
declaring 2^31-1 bytes: the call ends, the server's memory does not grow;
``tests/hardening/test_limits.py``). Under that size either reads a message whole before a
unary handler runs, so every unary-request method
is served as a request-streaming one that reads the message itself (:func:`receive`, from the
handler wrapper of :mod:`gateway.grpc_server`), which lets it:

- refuse a call before its message is read (an access refusal never reads the request);
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
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from gateway.limits import ByteBudget, Reservation
from naiad.errors import InvalidInput, RequestTimeout

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


def reservation(limits: GrpcLimits | None) -> contextlib.AbstractContextManager[Reservation | None]:
    """What a call holds of the shared budget while it runs (nothing without ``limits``)."""
    return limits.budget.reservation() if limits is not None else contextlib.nullcontext()


async def receive(
    requests: AsyncIterator[bytes], limits: GrpcLimits | None, held: Reservation | None
) -> bytes:
    """A unary call's one raw message, read within ``limits`` (module doc) and then held in
    ``held`` at its size; at once when ``requests`` has a ``ready()`` giving the message
    already received (:class:`gateway.grpc_front.Requests`: no task, no wait). Raises
    :class:`RequestTimeout` past ``read_timeout_s``, :class:`InvalidInput` for a call
    without a message, :class:`Overloaded` (from the budget) when the budget cannot hold a
    message being read."""
    ready = getattr(requests, "ready", None)  # the gRPC front's: the message arrived already
    raw = ready() if ready is not None else None
    if raw is None and (limits is None or held is None):
        try:
            return await anext(aiter(requests))
        except StopAsyncIteration:
            raise InvalidInput("the call carried no request message") from None
    if raw is None:
        raw = await _read(requests, limits, held)  # type: ignore[arg-type]
    if held is not None:
        held.resize(len(raw))
    return raw


async def _read(requests: AsyncIterator[bytes], limits: GrpcLimits, held: Reservation) -> bytes:
    read = asyncio.ensure_future(anext(aiter(requests)))
    try:
        done, _ = await asyncio.wait({read}, timeout=PROMPT_S)
        if not done:
            held.add(limits.max_message_bytes)
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
