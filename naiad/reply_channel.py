"""A gateway's direct reply channel on one machine: a worker's replies by Unix socket, not Redis.

The queue protocol's reply path is the gateway's Redis list (``RPUSH`` by the worker, ``BLPOP``
by the gateway; :mod:`naiad.queue_client`): two hops, each a process wake-up, on a reply's
way. When the gateway and the worker share a machine, the gateway also listens on a Unix
socket in a private directory (:class:`ReplyServer`) and names it in every request it
enqueues (header ``ra``: ``[path, token]``, :mod:`naiad.codec`); the worker writes a
batch's replies there when the batch answers that gateway alone and brings no telemetry of
a first load (:class:`ReplyConnections`; :meth:`workers.replies.ReplySender.send`), one hop,
and sends its Redis commands (acknowledgement, next claim) as before, minus the ``RPUSH``.
A batch answering several gateways goes through Redis entirely. Anything that
stops a direct send (no such socket: another machine, a gateway gone; a refused or broken
connection; a peer that reads too slowly) sends those replies through the Redis list
instead, so a reply is never lost to this path; a second copy is dropped by the gateway.

The statistics of the batch travel in the same frame (:func:`encode_executions`) and the
gateway records them with its own (:class:`naiad.stats_writer.StatsWriter`), so a client
that has its answer sees them after that gateway's flush, as when the worker wrote them to
Redis before the reply.

Frame (worker to gateway only): ``>II`` header (statistics length, replies length), the
statistics (msgpack, or empty), the replies (encoded replies concatenated, as one element
of the reply list: :func:`naiad.codec.decode_replies`). A connection's first frame is
exactly the server's token as its replies, within :data:`TOKEN_TIMEOUT_S`; otherwise, or
for a frame over :data:`MAX_FRAME_BYTES`, or past :data:`MAX_CONNECTIONS`, the gateway
closes the connection (docs/reliability.md, "The direct reply channel").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import socket
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
#: Largest frame a gateway takes (statistics + replies, bytes): a larger one closes the connection.
MAX_FRAME_BYTES = 1 << 30
#: Seconds a connection has to present the token before the gateway closes it.
TOKEN_TIMEOUT_S = 1.0
#: Connections a gateway holds at once (one per worker on its machine); more are closed at once.
MAX_CONNECTIONS = 256
#: Seconds after which a gateway's reply folder whose socket no longer answers is stale (its
#: gateway was killed): the next gateway to start removes it.
STALE_AFTER_S = 60.0

#: ``[path, token]``: where a gateway takes replies (request header ``ra``).
Address = tuple[str, str]
#: A gateway's reply folder (in the temporary directory) and its socket's name in it.
FOLDER_PREFIX, SOCKET_NAME = "naiad-replies-", "replies.sock"


def encode_executions(model: str, runs: Sequence[stats.Execution]) -> bytes:
    """Executed batches' statistics for a frame (:func:`decode_executions`)."""
    fields = [[r.version, r.rows, list(r.queue_ns), r.phases_ns, r.finished_ms] for r in runs]
    return msgpack.packb([model, fields])


def decode_executions(raw: bytes) -> tuple[str, list[stats.Execution]]:
    """Inverse of :func:`encode_executions`. Raises ValueError on a malformed one (any field
    of the wrong type, a phase not in :data:`naiad.stats.PHASES`)."""
    try:
        model, runs = msgpack.unpackb(raw)
        return _str(model), [_execution(*run) for run in runs]
    except (ValueError, TypeError, OverflowError, msgpack.UnpackException) as exc:
        raise ValueError(f"malformed statistics in a reply frame: {exc}") from None


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _int(value: object) -> int:
    if type(value) is not int:
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value


def _execution(
    version: object, rows: object, queue_ns: object, phases_ns: object, finished: object
) -> stats.Execution:
    if not isinstance(queue_ns, list) or not isinstance(phases_ns, dict):
        raise TypeError("expected a list of queue times and a map of phases")
    if not set(phases_ns) <= set(stats.PHASES):
        raise ValueError(f"unknown phases {sorted(set(phases_ns) - set(stats.PHASES))}")
    phases = {_str(name): _int(ns) for name, ns in phases_ns.items()}
    return stats.Execution(_int(version), _int(rows), [_int(ns) for ns in queue_ns], phases, _int(finished))


def remove_stale_folders(directory: str | None = None) -> None:
    """Remove reply folders of gateways that were killed (nothing removed them): older than
    :data:`STALE_AFTER_S`, their socket gone or refusing connections."""
    directory = directory or tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            folder = os.path.join(directory, name)
            if name.startswith(FOLDER_PREFIX) and _stale(folder):
                shutil.rmtree(folder, ignore_errors=True)


def _stale(folder: str) -> bool:
    try:
        info = os.stat(folder)
    except OSError:
        return False
    if time.time() - info.st_mtime < STALE_AFTER_S or info.st_uid != os.getuid():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.1)
        try:
            probe.connect(os.path.join(folder, SOCKET_NAME))
        except (FileNotFoundError, ConnectionRefusedError):
            return True
        except OSError:
            return False
    return False


class ReplyServer:
    """The gateway's end: a Unix socket in a directory only this user can enter.

    ``deliver(replies)`` gets each frame's replies (:meth:`naiad.queue_client.QueueDispatcher.deliver`)
    and ``record(model, execution)`` its statistics, first."""

    def __init__(
        self, deliver: Callable[[bytes], None], record: Callable[[str, stats.Execution], None]
    ) -> None:
        self.deliver, self.record = deliver, record
        self.token = secrets.token_hex(16)
        self._dir = tempfile.mkdtemp(prefix=FOLDER_PREFIX)  # mode 0700
        self.path = os.path.join(self._dir, SOCKET_NAME)
        self._server: asyncio.AbstractServer | None = None
        self._receivers: set[_Receiver] = set()

    @property
    def address(self) -> Address:
        return self.path, self.token

    async def start(self) -> None:
        """Listen. Raises OSError when the socket cannot be made (e.g. a ``TMPDIR`` too long
        for a Unix socket's path); nothing is left behind then."""
        remove_stale_folders(os.path.dirname(self._dir))
        try:
            loop = asyncio.get_running_loop()
            self._server = await loop.create_unix_server(lambda: _Receiver(self), self.path)
        except OSError:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise

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
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if len(self.server._receivers) >= MAX_CONNECTIONS:
            logger.warning("closed a reply connection: %d are open already", MAX_CONNECTIONS)
            transport.close()
            return
        self.server._receivers.add(self)
        self._timer = asyncio.get_running_loop().call_later(TOKEN_TIMEOUT_S, self._untrusted_timeout)

    def _untrusted_timeout(self) -> None:
        if not self.trusted:
            logger.warning("closed a reply connection that sent no token within %g s", TOKEN_TIMEOUT_S)
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._receivers.discard(self)
        if self._timer is not None:
            self._timer.cancel()
        self.transport = None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= FRAME.size and self.transport is not None:
            stats_len, replies_len = FRAME.unpack_from(self.buffer)
            if not self.trusted and (stats_len, replies_len) != (0, len(self.server.token)):
                logger.warning("closed a reply connection whose first frame is not a token")
                self.close()
                return
            end = FRAME.size + stats_len + replies_len
            if end > MAX_FRAME_BYTES:
                logger.warning("closed a reply connection that sent a frame of %d bytes", end)
                self.close()
                return
            if len(self.buffer) < end:
                return
            with memoryview(self.buffer) as view:  # one copy of each part, not two
                raw_stats = bytes(view[FRAME.size : FRAME.size + stats_len])
                replies = bytes(view[FRAME.size + stats_len : end])
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
