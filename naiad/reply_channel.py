"""A gateway's direct reply channel on one machine: a worker's replies by Unix socket, not Redis.

The queue protocol's reply path is the gateway's Redis list (``RPUSH`` by the worker, ``BLPOP``
by the gateway; :mod:`naiad.queue_client`): two hops, each a process wake-up, on a reply's
way. When the gateway and the worker share a machine, the gateway also listens on a Unix
socket in a private directory (:class:`ReplyServer`) and names it in every request it
enqueues (header ``ra``: ``[path, token]``, :mod:`naiad.codec`); the worker writes the
batch's replies for that gateway there (:class:`ReplyConnections`), one hop, and sends its
Redis commands (acknowledgement, next claim) as before, minus the ``RPUSH``. Anything that
stops a direct send (no such socket: another machine, a gateway gone; a refused or broken
connection; a peer that reads too slowly) sends those replies through the Redis list
instead, so a reply is never lost to this path; a second copy is dropped by the gateway.

The statistics of the batch travel in the same frame (:func:`encode_executions`) and the
gateway records them with its own (:class:`naiad.stats_writer.StatsWriter`), so a client
that has its answer sees them after that gateway's flush, as when the worker wrote them to
Redis before the reply.

Frame (both directions use one): ``>II`` header (statistics length, replies length), the
statistics (msgpack, or empty), the replies (encoded replies concatenated, as one element
of the reply list: :func:`naiad.codec.decode_replies`). A connection's first frame carries
the server's token as its replies; a connection whose first frame does not is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from struct import Struct

import msgpack

from naiad import stats

logger = logging.getLogger(__name__)

FRAME = Struct(">II")
#: Bytes a worker leaves unsent on one connection before it sends through Redis instead.
MAX_BUFFERED_BYTES = 64 * 1024 * 1024
#: Seconds a worker waits to connect, and then goes through Redis for that gateway.
CONNECT_TIMEOUT_S = 0.5
#: Seconds a worker sends through Redis to a gateway it could not connect to before trying again.
RETRY_AFTER_S = 10.0

#: ``[path, token]``: where a gateway takes replies (request header ``ra``).
Address = tuple[str, str]


def encode_executions(model: str, runs: Sequence[stats.Execution]) -> bytes:
    """Executed batches' statistics for a frame (:func:`decode_executions`)."""
    fields = [[r.version, r.rows, list(r.queue_ns), r.phases_ns, r.finished_ms] for r in runs]
    return msgpack.packb([model, fields])


def decode_executions(raw: bytes) -> tuple[str, list[stats.Execution]]:
    """Inverse of :func:`encode_executions`. Raises ValueError on a malformed one."""
    try:
        model, runs = msgpack.unpackb(raw)
        return str(model), [
            stats.Execution(int(v), int(rows), [int(n) for n in queue_ns], dict(phases_ns), int(finished))
            for v, rows, queue_ns, phases_ns, finished in runs
        ]
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ValueError(f"malformed statistics in a reply frame: {exc}") from None


class ReplyServer:
    """The gateway's end: a Unix socket in a directory only this user can enter.

    ``deliver(replies)`` gets each frame's replies (:meth:`naiad.queue_client.QueueDispatcher.deliver`)
    and ``record(model, execution)`` its statistics, first."""

    def __init__(
        self, deliver: Callable[[bytes], None], record: Callable[[str, stats.Execution], None]
    ) -> None:
        self.deliver, self.record = deliver, record
        self.token = secrets.token_hex(16)
        self._dir = tempfile.mkdtemp(prefix="naiad-replies-")  # mode 0700
        self.path = os.path.join(self._dir, "replies.sock")
        self._server: asyncio.AbstractServer | None = None
        self._receivers: set[_Receiver] = set()

    @property
    def address(self) -> Address:
        return self.path, self.token

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _Receiver(self), self.path)

    async def close(self) -> None:
        """Stop listening and close every connection (after the gateway's callers are done)."""
        if self._server is not None:
            self._server.close()
            for receiver in list(self._receivers):
                receiver.close()
            await self._server.wait_closed()
        shutil.rmtree(self._dir, ignore_errors=True)


class _Receiver(asyncio.Protocol):
    """One worker's connection: frames in, handed to the server's callbacks."""

    def __init__(self, server: ReplyServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.trusted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server._receivers.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._receivers.discard(self)
        self.transport = None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= FRAME.size and self.transport is not None:
            stats_len, replies_len = FRAME.unpack_from(self.buffer)
            end = FRAME.size + stats_len + replies_len
            if len(self.buffer) < end:
                return
            raw_stats = bytes(self.buffer[FRAME.size : FRAME.size + stats_len])
            replies = bytes(self.buffer[FRAME.size + stats_len : end])
            del self.buffer[:end]
            self._frame(raw_stats, replies)

    def _frame(self, raw_stats: bytes, replies: bytes) -> None:
        if not self.trusted:
            self.trusted = secrets.compare_digest(replies, self.server.token.encode())
            if not self.trusted:
                logger.warning("closed a reply connection that did not present this gateway's token")
                self.close()
            return
        if raw_stats:
            try:
                model, runs = decode_executions(raw_stats)
            except ValueError as exc:
                logger.warning("%s", exc)
            else:
                for run in runs:
                    self.server.record(model, run)
        self.server.deliver(replies)


class ReplyConnections:
    """A worker's end: one connection per gateway address, opened on first use."""

    def __init__(self) -> None:
        self._transports: dict[Address, asyncio.Transport] = {}
        self._failed: dict[Address, float] = {}  # address -> monotonic time to try again

    async def send(self, address: Address, replies: bytes, raw_stats: bytes = b"") -> bool:
        """Write one frame to ``address``; False when it cannot go this way (the caller
        sends the replies, and the statistics, through Redis)."""
        transport = self._transports.get(address)
        if transport is None or transport.is_closing():
            transport = await self._connect(address)
            if transport is None:
                return False
        if transport.get_write_buffer_size() > MAX_BUFFERED_BYTES:
            return False
        transport.writelines((FRAME.pack(len(raw_stats), len(replies)), raw_stats, replies))
        return True

    async def _connect(self, address: Address) -> asyncio.Transport | None:
        self._transports.pop(address, None)
        if len(self._transports) + len(self._failed) > 64:  # gateways come and go: forget the gone
            now = time.monotonic()
            self._transports = {a: t for a, t in self._transports.items() if not t.is_closing()}
            self._failed = {a: until for a, until in self._failed.items() if until > now}
        if time.monotonic() < self._failed.get(address, 0.0):
            return None
        path, token = address
        try:
            transport, _ = await asyncio.wait_for(
                asyncio.get_running_loop().create_unix_connection(asyncio.Protocol, path), CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError) as exc:
            logger.debug("replies to %s go through Redis: %s", path, exc)
            self._failed[address] = time.monotonic() + RETRY_AFTER_S
            return None
        self._failed.pop(address, None)
        transport.write(FRAME.pack(0, len(token)) + token.encode())
        self._transports[address] = transport  # type: ignore[assignment]
        return transport  # type: ignore[return-value]

    def close(self) -> None:
        for transport in self._transports.values():
            with contextlib.suppress(Exception):
                transport.close()
        self._transports.clear()
