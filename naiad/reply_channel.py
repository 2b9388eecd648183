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
Redis before the reply. It queues them undecoded: they are decoded when written, off the
answer's path (:meth:`naiad.queue_client.QueueDispatcher.record_executions`).

The same connection also carries requests the other way, to a worker that is idle (direct
hand-off): a worker about to wait for work *offers* each gateway it is connected to up to
one batch of requests of its model (``max_batch_size``, one without dynamic batching) for
the versions it loaded (an offer frame; the next reply frame carries it when the worker will
be idle after that batch). A gateway with an offer for a request's model and version (and
none of its requests of the model in the stream:
:meth:`naiad.queue_client.QueueDispatcher.infer`) sends the request down that connection
instead of through Redis (:meth:`ReplyServer.take`, :meth:`WorkerLink.hand`; the requests of
a burst in one write, or two when it is over half the offer): two hops a request, as
Triton's server to its stub, instead of four process wake-ups through Redis; under load a
whole batch goes this way, without a Redis command. A worker handed requests is busy with
them: an idle worker's whole offer is taken first (:meth:`ReplyServer.take`), and the rest
of a busy worker's only while no idle one offers; requests handed to a busy worker wait for
its next batch, as claimed stream entries do, at most one offer's worth a gateway (plus,
rarely, requests of an older offer that arrive after a newer one was made). An offer counts
requests, not rows: the worker's batcher splits what it was handed by ``max_batch_size``
rows as it does claimed entries. The gateway holds the request until its answer comes: when
the connection closes first (the worker exited or died) it queues the request through Redis
as any other (:meth:`naiad.queue_client.QueueDispatcher.infer`), so no request is lost to
this path; one answered twice keeps its first answer.

Frames, worker to gateway: ``>II`` header (statistics length, replies length), the
statistics (msgpack, or empty), the replies (encoded replies concatenated, as one element
of the reply list: :func:`naiad.codec.decode_replies`); or, with :data:`OFFER` as the
statistics length, an offer: msgpack ``[model, [version, ...], requests, worker id]``
(``requests`` 0 withdraws it). A connection's first frame is exactly the server's token as
its replies, within :data:`TOKEN_TIMEOUT_S`; otherwise, or for a frame over :data:`MAX_FRAME_BYTES`, or
a malformed offer, or past :data:`MAX_CONNECTIONS`, the gateway closes the connection
(docs/reliability.md, "The direct reply channel"). Gateway to worker: ``>III`` header
(priority level, entry header length, entry data length), then the two fields of the
request's stream entry (:func:`naiad.codec.encode_request`); or, with :data:`WITHDRAW` as
the level, the withdrawal of a request handed earlier whose caller went away (the queue id
as the header, no data): the worker drops it unless it is running already.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from struct import Struct

import msgpack

from naiad import group_commit, stats
from naiad.stale_folders import remove_stale_folders

logger = logging.getLogger(__name__)

FRAME = Struct(">II")
#: The statistics length that marks a worker's frame as an offer (module doc).
OFFER = 0xFFFF_FFFF
#: Most requests one offer may ask for (a worker offers its ``max_batch_size``, at most this).
MAX_OFFER = 1024
#: A request handed to a worker: priority level, entry header length, entry data length.
REQUEST = Struct(">III")
#: The level that marks a gateway's frame as a withdrawal: its header is the request's queue id.
WITHDRAW = 0xFFFF_FFFF
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
    of the wrong type, a count out of 0..:data:`MAX_STAT`, a phase not in
    :data:`naiad.stats.PHASES`). Checked in plain loops, no call a value: a reply frame's
    statistics are decoded once per batch."""
    try:
        model, runs = msgpack.unpackb(raw)
        if type(model) is not str:
            raise TypeError(f"expected a model name, got {type(model).__name__}")
        return model, [_execution(*run) for run in runs]
    except (ValueError, TypeError, OverflowError, msgpack.UnpackException) as exc:
        raise ValueError(f"malformed statistics in a reply frame: {exc}") from None


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


#: Largest count or duration (ns, ms) a frame's statistics may carry: ~3 days in ns; Redis's
#: counters are 64-bit, and a sum of such values stays far below that.
MAX_STAT = 1 << 48
_PHASES = frozenset(stats.PHASES)


def _int(value: object) -> int:
    if type(value) is not int:
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value


def _execution(
    version: object, rows: object, queue_ns: object, phases_ns: object, finished: object
) -> stats.Execution:
    if type(queue_ns) is not list or type(phases_ns) is not dict:
        raise TypeError("expected a list of queue times and a map of phases")
    if not phases_ns.keys() <= _PHASES:
        raise ValueError(f"unknown phases {sorted(map(str, phases_ns.keys() - _PHASES))}")
    for value in (version, rows, finished, *queue_ns, *phases_ns.values()):
        if type(value) is not int:  # bool is not: a count is never True
            raise TypeError(f"expected an integer, got {type(value).__name__}")
        if not 0 <= value <= MAX_STAT:
            raise ValueError(f"{value} is out of range 0..{MAX_STAT}")
    return stats.Execution(version, rows, queue_ns, phases_ns, finished)  # type: ignore[arg-type]


class ReplyServer:
    """The gateway's end: a Unix socket in a directory only this user can enter.

    ``deliver(replies)`` gets each frame's replies (:meth:`naiad.queue_client.QueueDispatcher.deliver`)
    and ``record(raw)`` its statistics first, as sent (:func:`encode_executions`' bytes,
    undecoded: :meth:`naiad.queue_client.QueueDispatcher.record_executions`)."""

    def __init__(
        self, deliver: Callable[[bytes], None], record: Callable[[bytes], None],
        orphaned: Callable[[str], None] | None = None,
    ) -> None:  # fmt: skip
        #: ``orphaned(queue_id)`` takes back a request handed to a worker that went away; without
        #: it, workers' offers are ignored and no request goes this way (direct hand-off off).
        self.deliver, self.record, self.orphaned = deliver, record, orphaned
        self.token = secrets.token_hex(16)
        self._dir = tempfile.mkdtemp(prefix=FOLDER_PREFIX)  # mode 0700
        self.path = os.path.join(self._dir, SOCKET_NAME)
        self._server: asyncio.AbstractServer | None = None
        self._receivers: set[WorkerLink] = set()
        self._offers: dict[str, list[WorkerLink]] = {}  # model -> connections with an offer
        #: True while the request being handed is the only one its gateway carries: its write
        #: then goes at once (:meth:`WorkerLink._send`); set by the gateway (its data plane).
        self.lone: Callable[[], bool] = _never

    @property
    def address(self) -> Address:
        return self.path, self.token

    async def start(self) -> None:
        """Listen. Raises OSError when the socket cannot be made (e.g. a ``TMPDIR`` too long
        for a Unix socket's path); nothing is left behind then."""
        remove_stale_folders(FOLDER_PREFIX, os.path.dirname(self._dir))  # of killed gateways
        try:
            loop = asyncio.get_running_loop()
            self._server = await loop.create_unix_server(lambda: WorkerLink(self), self.path)
        except OSError:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise

    def take(self, model: str, version: int) -> WorkerLink | None:
        """A worker connection with an offer for ``model`` at ``version``, one request of
        its offer taken (the request must then go by :meth:`WorkerLink.hand`); None when there
        is none. An idle worker's (its offer whole, nothing handed since) comes first, the last
        to offer first (its caches are warmest); a worker handed requests since its offer is
        busy with them, so it gets more only while no idle one offers."""
        offers = self._offers.get(model)
        usable = [
            link for link in reversed(offers or ()) if version in link.versions and link.transport is not None
        ]
        if not usable:
            return None
        link = usable[0]
        for candidate in usable:  # the first idle one (a loop: no generator a request)
            if candidate.offered == candidate.offer_size:
                link = candidate
                break
        link.offered -= 1
        if link.offered <= 0:
            offers.remove(link)  # type: ignore[union-attr]
        return link

    def _offer(self, link: WorkerLink, model: str, versions: frozenset[int], count: int) -> None:
        self._withdraw(link)
        link.model, link.versions, link.offered, link.offer_size = model, versions, count, count
        if count > 0 and self.orphaned is not None:
            self._offers.setdefault(model, []).append(link)

    def _withdraw(self, link: WorkerLink) -> None:
        offers = self._offers.get(link.model or "")
        if offers and link in offers:
            offers.remove(link)
        link.offered = 0

    async def close(self) -> None:
        """Stop listening and close every connection (after the gateway's callers are done)."""
        if self._server is not None:
            self._server.close()
            for receiver in list(self._receivers):
                receiver.close()
            await self._server.wait_closed()
        shutil.rmtree(self._dir, ignore_errors=True)


#: The share of a worker's offer at which a hand-off write stops waiting for more requests
#: (:meth:`WorkerLink._send`).
BURST_PART = 0.5


def _never() -> bool:
    return False


class WorkerLink(asyncio.Protocol):
    """One worker's connection: frames in, handed to the server's callbacks; requests out
    (:meth:`hand`) while the worker offers them."""

    def __init__(self, server: ReplyServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.trusted = False
        self._timer: asyncio.TimerHandle | None = None
        self.model: str | None = None  # the worker's model, from its first offer
        self.worker_id = ""  # its id (heartbeats: naiad.keys.workers)
        self.versions: frozenset[int] = frozenset()  # the versions it offered
        self.offered = 0  # requests it still takes by its last offer
        self.offer_size = 0  # requests its last offer was for
        self.handed: dict[str, None] = {}  # queue ids handed to it, not answered yet, in order
        self._outgoing: list[bytes] = []  # frames to send with the next write (_send)
        self._outgoing_requests = 0
        self._last_requests = 0  # requests the last write carried
        self._sending = False  # that write is scheduled

    def hand(self, queue_id: str, level: int, header: bytes, data: bytes) -> bool:
        """Send the request ``queue_id`` (its stream entry's fields) to the worker (False:
        the connection is closed, nothing sent); until :meth:`forget`, its caller is told
        (``orphaned``) if the connection closes. Sent with the requests handed within the
        next loop turns (:func:`naiad.group_commit.after_gathering`), in one write, so the
        worker starts one batch on them rather than a batch on the first; a write that
        carries half of the worker's offer goes at once (:meth:`_send`)."""
        if self.transport is None or self.transport.is_closing():
            return False
        self.handed[queue_id] = None
        self._send((REQUEST.pack(level, len(header), len(data)), header, data), 1)
        return True

    def withdraw(self, queue_id: str) -> None:
        """The caller of a request handed here went away: the worker drops it unless it is
        running already (as a withdrawn stream entry: :mod:`naiad.queue_client`); sent after
        the requests waiting to be sent, so after that request."""
        if queue_id in self.handed and self.transport is not None and not self.transport.is_closing():
            raw = queue_id.encode()
            self._send((REQUEST.pack(WITHDRAW, len(raw), 0), raw), 0)

    def _send(self, parts: tuple[bytes, ...], requests: int) -> None:
        """Queue ``parts`` for the next write. Once the write carries half of the worker's
        last offer (:data:`BURST_PART`), it goes now: the worker runs the first part of a
        burst while this gateway still reads the rest, so a closed loop of clients keeps two
        groups in flight, one in the worker and one here, instead of one that each side
        waits for in turn (``digits_python`` at c32 on 2 cores, one server, windows
        alternating: 1.12–1.27× the throughput, docs/benchmarks.md "Stop 27"). A request
        its gateway carries alone (:attr:`ReplyServer.lone`) goes now too, none could join it
        (a c1 request: 3 ``epoll_pwait`` calls of the gateway instead of 5, "Stop 36"),
        unless the last write carried several: at c32 a batch's clients come back one by one
        after its answers, the first of them alone in the gateway (``digits_python`` JSON
        c32 without this exception: mean batch 10.6–10.9 against 12.4–14.4, 3 of 3 rounds)."""
        self._outgoing += parts
        self._outgoing_requests += requests
        if requests and (
            self._outgoing_requests >= max(1, math.ceil(self.offer_size * BURST_PART))
            or (self._last_requests <= 1 and self.server.lone())
        ):
            self._write_now()
            return
        if not self._sending:
            self._sending = True
            group_commit.after_gathering(lambda: self._outgoing_requests, self._flush)

    def _flush(self) -> None:
        self._sending = False
        self._write_now()

    def _write_now(self) -> None:
        """Write what waits (a scheduled :meth:`_flush` then writes what came after)."""
        if self._outgoing_requests:
            self._last_requests = self._outgoing_requests
        parts, self._outgoing, self._outgoing_requests = self._outgoing, [], 0
        if parts and self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(parts)  # a closed one: connection_lost took the requests back

    def forget(self, queue_id: str) -> None:
        self.handed.pop(queue_id, None)

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
        self.server._withdraw(self)
        if self._timer is not None:
            self._timer.cancel()
        self.transport = None
        handed, self.handed = self.handed, {}
        if handed:
            logger.info("worker %s went away holding %d requests handed to it: they go through Redis",
                        self.worker_id, len(handed))  # fmt: skip
        for queue_id in handed:  # the worker is gone: those go through Redis now, in order
            if self.server.orphaned is not None:
                self.server.orphaned(queue_id)

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
            offer = stats_len == OFFER
            end = FRAME.size + (0 if offer else stats_len) + replies_len
            if end > MAX_FRAME_BYTES:
                logger.warning("closed a reply connection that sent a frame of %d bytes", end)
                self.close()
                return
            if len(self.buffer) < end:
                return
            if offer:
                raw = bytes(self.buffer[FRAME.size : end])
                del self.buffer[:end]
                self._take_offer(raw)
                continue
            with memoryview(self.buffer) as view:  # one copy of each part, not two
                raw_stats = bytes(view[FRAME.size : FRAME.size + stats_len])
                replies = bytes(view[FRAME.size + stats_len : end])
            del self.buffer[:end]
            self._frame(raw_stats, replies)

    def _take_offer(self, raw: bytes) -> None:
        """An offer frame (module doc); a malformed one closes the connection."""
        try:
            model, versions, count, worker_id = msgpack.unpackb(raw)
            model, count, self.worker_id = _str(model), _int(count), _str(worker_id)
            if type(versions) is not list:
                raise TypeError("expected a list of version numbers")
            for version in versions:  # a loop, no generator: an offer comes with each answer
                _int(version)
            versions = frozenset(versions)
            if not 0 <= count <= MAX_OFFER or (self.model is not None and model != self.model):
                raise ValueError(f"an offer of {count} requests of '{model}'")
        except (ValueError, TypeError, OverflowError, msgpack.UnpackException) as exc:
            logger.warning("closed a reply connection that sent a malformed offer: %s", exc)
            self.close()
            return
        self.server._offer(self, model, versions, count)

    def _frame(self, raw_stats: bytes, replies: bytes) -> None:
        if not self.trusted:
            self.trusted = secrets.compare_digest(replies, self.server.token.encode())
            if not self.trusted:
                logger.warning("closed a reply connection that did not present this gateway's token")
                self.close()
            return
        if raw_stats:
            self.server.record(raw_stats)
        if replies:
            self.server.deliver(replies)


class GatewayLink(asyncio.Protocol):
    """A worker's connection to one gateway: requests handed to it come in here."""

    def __init__(self, owner: ReplyConnections) -> None:
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.offered = 0  # requests this worker's open offer at that gateway still takes
        self.received = 0  # requests it handed here
        self.unsent: asyncio.Future[None] | None = None  # set while a write waits for the socket

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=0)  # type: ignore[attr-defined]  # pause_writing at once

    def pause_writing(self) -> None:
        """A write left bytes unsent (the socket was full): they go as the gateway reads."""
        self.unsent = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        self._written()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._written()

    def _written(self) -> None:
        unsent, self.unsent = self.unsent, None
        if unsent is not None and not unsent.done():
            unsent.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        received = self.received
        try:
            self._frames()
        finally:  # the requests handed before a failure too
            if self.received != received:
                self.owner.on_read()

    def _frames(self) -> None:
        """Hand each whole frame of the buffer to the owner's callbacks."""
        while len(self.buffer) >= REQUEST.size and self.transport is not None:
            level, header_len, data_len = REQUEST.unpack_from(self.buffer)
            end = REQUEST.size + header_len + data_len
            if end > MAX_FRAME_BYTES:
                logger.warning("closed the connection to a gateway that sent a frame of %d bytes", end)
                self.transport.close()
                return
            if len(self.buffer) < end:
                return
            with memoryview(self.buffer) as view:
                header = bytes(view[REQUEST.size : REQUEST.size + header_len])
                entry_data = bytes(view[REQUEST.size + header_len : end])
            del self.buffer[:end]
            if level == WITHDRAW:
                self.owner.on_withdraw(header.decode("ascii", "replace"))
                continue
            self.offered = max(self.offered - 1, 0)  # one request of the offer (a request of an
            # older offer may arrive after a newer one: the two sides' counts can differ)
            self.received += 1
            self.owner.on_request(level, header, entry_data)


class ReplyConnections:
    """A worker's end: one connection per gateway address, opened on first use.
    ``on_request(level, header, data)`` takes each request a gateway hands over (direct
    hand-off; module doc), ``on_withdraw(queue_id)`` each withdrawal; :attr:`offer` is what
    the worker offers when idle."""

    def __init__(
        self, on_request: Callable[[int, bytes, bytes], None] | None = None, worker_id: str = ""
    ) -> None:  # fmt: skip
        self.worker_id = worker_id
        self._links: dict[Address, GatewayLink] = {}
        self._failed: dict[Address, float] = {}  # address -> monotonic time to try again
        self.on_request = on_request or (lambda level, header, data: None)
        self.on_withdraw: Callable[[str], None] = lambda queue_id: None
        #: Called once a read's requests are all handed to ``on_request`` (those that came together).
        self.on_read: Callable[[], None] = lambda: None
        #: ``(model, versions)`` this worker takes requests of when idle; None: it offers none.
        self.offer: tuple[str, list[int]] | None = None
        #: Requests one offer asks for: the worker's batch (at most :data:`MAX_OFFER`).
        self.offer_count = 1

    @property
    def connected(self) -> bool:
        return any(link.transport is not None for link in self._links.values())

    async def send(
        self, address: Address, replies: bytes, raw_stats: bytes = b"", offer: bool = False
    ) -> bool:  # fmt: skip
        """Write one frame to ``address``; False when it cannot go this way (the caller
        sends the replies, and the statistics, through Redis). ``offer``: the worker will
        be idle after this batch: the frame carries its offer when that gateway has none."""
        link = self._open(address) or await self._connect(address)
        return link is not None and self._write(link, replies, raw_stats, offer)

    def unsent(self) -> list[asyncio.Future[None]]:
        """For each connection still holding bytes unsent, a future set once they are written."""
        return [link.unsent for link in self._links.values() if link.unsent is not None]

    async def flushed(self, timeout_s: float) -> None:
        """Wait until every connection has written what it holds, at most ``timeout_s``: a
        frame larger than its socket's buffer goes out on the loop's turns, as its gateway
        reads, and a worker about to stall its loop (a Python model's ``execute``,
        :mod:`naiad.loop_stall`) lets it go first, or it would wait for the stall's end."""
        unsent = self.unsent()
        if unsent:
            await asyncio.wait(unsent, timeout=timeout_s)

    def takes_now(self, address: Address) -> bool:
        """Whether :meth:`send_now` to ``address`` would write: its connection is open and
        its write buffer under :data:`MAX_BUFFERED_BYTES`."""
        link = self._open(address)
        return link is not None and link.transport.get_write_buffer_size() <= MAX_BUFFERED_BYTES  # type: ignore[union-attr]

    def send_now(self, address: Address, replies: bytes, raw_stats: bytes = b"", offer: bool = False) -> bool:
        """:meth:`send` within the caller's turn of the event loop: False, nothing written,
        when it would have to connect first, or cannot write."""
        link = self._open(address)
        return link is not None and self._write(link, replies, raw_stats, offer)

    def _open(self, address: Address) -> GatewayLink | None:
        link = self._links.get(address)
        if link is None or link.transport is None or link.transport.is_closing():
            return None
        return link

    def _write(self, link: GatewayLink, replies: bytes, raw_stats: bytes, offer: bool) -> bool:
        transport = link.transport
        assert transport is not None
        if transport.get_write_buffer_size() > MAX_BUFFERED_BYTES:
            return False
        parts = [FRAME.pack(len(raw_stats), len(replies)), raw_stats, replies]
        if offer and link.offered < self.offer_count and self.offer is not None:
            parts += self._offer_frame(link, self.offer_count)
        transport.writelines(parts)
        return True

    def offer_all(self) -> None:
        """Offer :attr:`offer_count` requests to every connected gateway where this worker's
        offer is not whole, as far as it knows (taken in part or in full, or never made)."""
        if self.offer is None:
            return
        for link in self._links.values():
            transport = link.transport
            if link.offered < self.offer_count and transport is not None and not transport.is_closing():
                transport.writelines(self._offer_frame(link, self.offer_count))

    def withdraw_all(self) -> None:
        """Withdraw every open offer; no more are made (the worker stops taking requests
        this way). A request already on its way still arrives (``on_request``)."""
        if self.offer is not None:  # to every gateway: requests of an older offer, arriving
            for link in self._links.values():  # after a newer one went, leave this side unsure
                if link.transport is not None and not link.transport.is_closing():
                    link.transport.writelines(self._offer_frame(link, 0))
        self.offer = None

    def _offer_frame(self, link: GatewayLink, count: int) -> list[bytes]:
        assert self.offer is not None
        model, versions = self.offer
        raw = msgpack.packb([model, versions, count, self.worker_id])
        link.offered = count
        return [FRAME.pack(OFFER, len(raw)), raw]

    def close(self) -> None:
        """Close every connection: the gateways queue what they handed here and was not
        answered through Redis. The next :meth:`send` connects again."""
        for link in self._links.values():
            if link.transport is not None:
                link.transport.close()
        self._links.clear()

    async def _connect(self, address: Address) -> GatewayLink | None:
        self._links.pop(address, None)
        if len(self._links) + len(self._failed) > 64:  # gateways come and go: forget the gone
            now = time.monotonic()
            self._links = {a: link for a, link in self._links.items() if link.transport is not None}
            self._failed = {a: until for a, until in self._failed.items() if until > now}
        if time.monotonic() < self._failed.get(address, 0.0):
            return None
        path, token = address
        try:
            _, link = await asyncio.wait_for(
                asyncio.get_running_loop().create_unix_connection(lambda: GatewayLink(self), path),
                CONNECT_TIMEOUT_S,
            )
        except (OSError, TimeoutError) as exc:
            logger.debug("replies to %s go through Redis: %s", path, exc)
            self._failed[address] = time.monotonic() + RETRY_AFTER_S
            return None
        self._failed.pop(address, None)
        assert link.transport is not None
        link.transport.write(FRAME.pack(0, len(token)) + token.encode())
        self._links[address] = link
        return link
