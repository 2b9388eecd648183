"""A worker's side of its model's queue: the request streams, one per priority level.

The worker reads every stream of its model (:func:`naiad.keys.request_streams`) as consumer
``consumer`` of the group :data:`naiad.keys.WORKER_GROUP`. A read claims entries highest
level first (one Lua script: ``XREADGROUP`` on each stream in turn until it has enough), so
a request of a higher level overtakes whatever lower levels hold, and blocks on all streams
at once only when every one is empty. Everything else works per stream: reclaiming a dead
worker's entries, checking that claimed entries are still this worker's, acknowledging and
deleting answered ones, handing entries back, re-creating the groups after a restarted Redis
lost them (NOGROUP).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import ResponseError

from naiad import keys
from naiad.codec import QueuedRequest, decode_request, encode_request, entry_order
from naiad.errors import NaiadError
from workers import reclaim

logger = logging.getLogger(__name__)

#: Claim up to ARGV[3] entries for consumer ARGV[2] of group ARGV[1] from KEYS in their order
#: (highest priority first), stopping once it has enough; returns ``{{index, entries}, ...}``
#: with ``index`` the 1-based position of the stream in KEYS.
PRIORITY_READ = """
local out, left = {}, tonumber(ARGV[3])
for i, key in ipairs(KEYS) do
  if left <= 0 then break end
  local got = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', left, 'STREAMS', key, '>')
  if got then
    left = left - #got[1][2]
    out[#out + 1] = {i, got[1][2]}
  end
end
return out
"""


#: Seconds after the read that claimed it during which an entry counts as still this
#: worker's without asking Redis (:meth:`QueueReader.still_ours`); far below any reclaim's
#: idle time (a heartbeat period), above a batching delay plus a fast model's batch.
FRESH_S = 0.05


class QueueReader:
    """The request streams of ``model`` as consumer ``consumer``; ``redis``: the worker's
    client. :meth:`configure` sets the number of priority levels (0 until the config is
    known: the plain stream only)."""

    def __init__(self, redis: Redis, model: str, consumer: str):
        self.redis, self.model, self.consumer = redis, model, consumer
        self.levels = 0
        self.streams = keys.request_streams(model, 0)
        self._read = redis.register_script(PRIORITY_READ)

    def configure(self, levels: int) -> None:
        self.levels = levels
        self.streams = keys.request_streams(self.model, levels)

    def _level(self, index: int) -> int:
        return index + 1 if self.levels else 0

    def stream_of(self, queued: QueuedRequest) -> str:
        return keys.request_stream(self.model, queued.level)

    async def ensure_groups(self) -> None:
        """Create the consumer group on every stream (and the stream) where it is missing."""
        for stream in self.streams:
            try:
                await self.redis.xgroup_create(stream, keys.WORKER_GROUP, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    async def read(self, count: int, block_ms: int | None) -> list[QueuedRequest]:
        """Claim up to ``count`` new entries, highest level first; when there are none and
        ``block_ms`` is set, wait that long for the first to arrive on any stream."""
        if count <= 0:
            return []
        if len(self.streams) == 1:
            return await self._read_blocking(count, block_ms)
        sent = time.monotonic()
        found = await self._read(keys=self.streams, args=[keys.WORKER_GROUP, self.consumer, count])
        return await self.claimed(found, count, block_ms, sent)

    def read_on(self, pipe: Pipeline, count: int, block_ms: int | None) -> float:
        """Queue :meth:`read`'s claim as the next command of ``pipe`` (sent with what the
        worker sends anyway: one round trip less per batch); decode its reply with
        :meth:`claimed`, passing the time returned (``time.monotonic()``, the claim's
        ``sent``). ``pipe`` must not be a transaction: a blocking read inside MULTI does
        not block. With priority levels the claim queued is the script's, which never
        blocks; :meth:`claimed` then blocks on its own when it found nothing."""
        if len(self.streams) == 1:
            pipe.xreadgroup(keys.WORKER_GROUP, self.consumer, dict.fromkeys(self.streams, ">"),
                            count=count, block=block_ms)  # fmt: skip
        else:  # EVAL: a pipeline holding a registered script would first send SCRIPT EXISTS
            streams = self.streams
            pipe.eval(PRIORITY_READ, len(streams), *streams, keys.WORKER_GROUP, self.consumer, count)
        return time.monotonic()

    async def claimed(
        self, reply: list | None, count: int, block_ms: int | None, sent: float
    ) -> list[QueuedRequest]:  # fmt: skip
        """The requests claimed by the reply of a claim queued by :meth:`read_on` (or sent by
        :meth:`read`) at ``sent``; a priority script's empty one, with ``block_ms`` set, is
        followed by the blocking read on every stream."""
        if len(self.streams) == 1:
            return await self._decode_read(reply, sent)
        requests = []
        for index, entries in reply or []:
            for entry_id, flat in entries:
                fields = dict(zip(flat[::2], flat[1::2], strict=True))
                requests.append(await self._decode(entry_id, fields, self._level(index - 1), sent))
        if not requests and block_ms is not None:
            return await self._read_blocking(count, block_ms)
        return [r for r in requests if r is not None]

    async def _read_blocking(self, count: int, block_ms: int | None) -> list[QueuedRequest]:
        sent = time.monotonic()
        response = await self.redis.xreadgroup(
            keys.WORKER_GROUP, self.consumer, dict.fromkeys(self.streams, ">"), count=count, block=block_ms
        )
        return await self._decode_read(response, sent)

    async def _decode_read(self, response: list | None, sent: float) -> list[QueuedRequest]:
        requests = []
        if isinstance(response, dict):  # RESP3's map, raw (naiad.redis_client.send_batch)
            response = list(response.items())
        for stream, entries in response or []:
            level = self._level(self.streams.index(stream.decode() if isinstance(stream, bytes) else stream))
            for entry_id, fields in entries:
                requests.append(await self._decode(entry_id, fields, level, sent))
        return [r for r in requests if r is not None]

    async def _decode(
        self, entry_id: bytes, fields: dict | list, level: int, sent: float
    ) -> QueuedRequest | None:
        if isinstance(fields, list):  # a raw reply's [field, value, ...] (naiad.redis_client.send_batch)
            fields = dict(zip(fields[::2], fields[1::2], strict=True))
        try:
            queued = decode_request(self.model, fields, entry_id)
        except NaiadError:
            logger.exception("dropping malformed stream entry %s", entry_id)
            stream = keys.request_stream(self.model, level)
            await self.redis.xack(stream, keys.WORKER_GROUP, entry_id)
            await self.redis.xdel(stream, entry_id)
            return None
        queued.level, queued.claimed_at = level, sent
        return queued

    async def reclaim(self, min_idle_ms: int, held: Sequence[QueuedRequest] = ()) -> QueuedRequest | None:
        """Take over one request dead workers of this model left claimed, highest level
        first (:func:`workers.reclaim.reclaim_one`), its ``deliveries`` set; None when there
        is none. ``held``: what this worker holds claimed and has not answered yet."""
        ours = {(self.stream_of(q), q.entry_id) for q in held}
        for index, stream in enumerate(self.streams):
            sent = time.monotonic()
            mine = {entry_id for s, entry_id in ours if s == stream}
            found = await reclaim.reclaim_one(self.redis, self.model, self.consumer, min_idle_ms, stream,
                                              mine)  # fmt: skip
            queued = found and await self._decode(found.entry_id, found.fields, self._level(index), sent)
            if queued:
                queued.deliveries = found.deliveries
                return queued
        return None

    async def still_ours(
        self, requests: Sequence[QueuedRequest], fresh_s: float = 0.0
    ) -> list[QueuedRequest]:
        """The requests still pending for this consumer, by one ``XPENDING`` over their id
        range per stream. One withdrawn by its gateway (the client went away, its deadline
        passed) or taken over by another worker (this one was frozen past the reclaim time)
        is not: it is neither run nor answered here.

        A request handed over directly (no entry: :mod:`naiad.reply_channel`) is always
        this worker's. With ``fresh_s`` (the worker passes :data:`FRESH_S`), requests claimed by a read
        sent less than that many seconds ago are not asked about (no round trip when none
        is older): no reclaim takes an entry that young, and one withdrawn that soon counts
        as withdrawn once running (run anyway, its reply dropped). A worker frozen or slowed
        past that (a long batch before) asks."""
        now = time.monotonic()
        by_stream: dict[str, list[bytes]] = {}
        for queued in requests:
            if queued.entry_id and now - queued.claimed_at >= fresh_s:
                by_stream.setdefault(self.stream_of(queued), []).append(queued.entry_id)
        if not by_stream:
            return list(requests)
        ours: set[tuple[str, bytes]] = set()
        for stream, ids in by_stream.items():
            ids.sort(key=entry_order)
            pending = await self.redis.xpending_range(
                stream, keys.WORKER_GROUP, ids[0], ids[-1], len(ids) + reclaim.SCAN_COUNT,
                consumername=self.consumer,
            )  # fmt: skip
            ours |= {(stream, p["message_id"]) for p in pending}
        kept = [q for q in requests
                if not q.entry_id or now - q.claimed_at < fresh_s or (self.stream_of(q), q.entry_id) in ours]
        if len(kept) < len(requests):
            logger.info("skipped %d requests withdrawn or taken over by another worker",
                        len(requests) - len(kept))  # fmt: skip
        return kept

    def acknowledge(self, pipe: Pipeline, requests: Sequence[QueuedRequest]) -> None:
        """Queue ``XACK`` + ``XDEL`` of the requests' entries on ``pipe``, per stream (a
        request handed over directly has none)."""
        by_stream: dict[str, list[bytes]] = {}
        for queued in requests:
            if queued.entry_id:
                by_stream.setdefault(self.stream_of(queued), []).append(queued.entry_id)
        for stream, ids in by_stream.items():
            pipe.xack(stream, keys.WORKER_GROUP, *ids)
            pipe.xdel(stream, *ids)

    async def hand_back(self, requests: Sequence[QueuedRequest]) -> None:
        """Put ``requests`` back on their streams for another worker: a copy added, the
        claimed entry acknowledged and deleted, in one transaction."""
        async with self.redis.pipeline(transaction=True) as pipe:
            for queued in requests:
                pipe.xadd(self.stream_of(queued), encode_request(
                    queued.queue_id, queued.request, queued.reply_to, queued.deadline,
                    queued.enqueued_at, traceparent=queued.traceparent, log_id=queued.log_id,
                ))  # fmt: skip
            self.acknowledge(pipe, requests)
            await pipe.execute()

    async def backlog(self) -> int:
        """Entries in all of the model's streams (queued or being run)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for stream in self.streams:
                pipe.xlen(stream)
            return sum(await pipe.execute())

    async def leave(self) -> None:
        """Remove this consumer from the group of every stream where nothing is pending for
        it (removing it would drop its pending entries: they stay for a reclaim instead)."""
        for stream in self.streams:
            pending = await self.redis.xpending_range(
                stream, keys.WORKER_GROUP, "-", "+", 1, consumername=self.consumer
            )  # fmt: skip
            if pending:
                logger.warning("claimed requests of '%s' left unanswered for another worker", self.model)
            else:
                await self.redis.xgroup_delconsumer(stream, keys.WORKER_GROUP, self.consumer)
