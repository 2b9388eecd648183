"""A worker's reply pipeline: one Redis round trip per batch for everything it has to say.

:meth:`ReplySender.send` first writes a batch that answers one gateway, and carries no
telemetry, to that gateway's direct reply channel when it has one (:mod:`naiad.reply_channel`:
the replies and the batch's statistics in one frame). Then, in one write of commands
(:class:`naiad.redis_client.HeldConnection`): the versions pulled and loaded since the last batch
(:mod:`naiad.telemetry`), the batch's statistics unless a frame carried them (one command,
:func:`naiad.stats.add_execution`, before any reply, so a gateway that has its reply already
sees them), one ``RPUSH`` per gateway not answered directly of the batch's replies for it,
concatenated (:func:`naiad.codec.decode_replies`), with the reply list's TTL (a dead
gateway's replies vanish), ``XACK`` and ``XDEL`` of the entries, and, when asked, the
worker's next claim (``XREADGROUP``) as its last command: one write and one wake-up of Redis
less per batch. Redis answers the commands before the claim at once (the
gateways have their replies) and the pipeline then waits for the claim, which blocks when
the worker holds nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

from naiad import keys, stats, telemetry
from naiad.codec import QueuedRequest
from naiad.redis_client import CommandBatch, HeldConnection
from naiad.reply_channel import Address, ReplyConnections, encode_executions
from workers.loader import VersionLoad, VersionLoader
from workers.queue_reader import QueueReader

logger = logging.getLogger(__name__)

#: First and longest wait (seconds) before retrying after a Redis failure.
REDIS_BACKOFF_S = (0.1, 2.0)

#: A claim to send with the replies: ``(count, block_ms or None)`` (:meth:`QueueReader.read_on`).
Claim = tuple[int, int | None]


class ReplySender:
    """The reply pipeline of one worker of ``model`` (module docstring)."""

    def __init__(self, redis: Redis, model: str, queue: QueueReader, loader: VersionLoader):
        self.redis, self.model, self.queue, self.loader = redis, model, queue, loader
        self._connection = HeldConnection(redis)  # a batch's pipeline at a time, as a rule
        # to gateways on this machine (naiad.reply_channel)
        self.direct = ReplyConnections(worker_id=queue.consumer)
        #: Called when a send meets a Redis failure, before it retries: the worker takes no
        #: more requests by the gateways' sockets while Redis is down (:mod:`workers.worker`).
        self.on_redis_failure: Callable[[], None] | None = None

    async def send(
        self, pairs: Sequence[tuple[QueuedRequest, bytes]], runs: Sequence[stats.Execution] = (),
        claim: Claim | None = None, offer: bool = False,
    ) -> tuple[list[QueuedRequest], float] | None:  # fmt: skip
        """Answer each ``(request, encoded reply)`` and record ``runs``; with ``claim``, what
        the claim sent last got and when it was sent (monotonic s), None without one or when it
        failed (the next claim meets the failure). ``offer``: the worker will be idle after
        this batch; a direct reply carries its offer (:mod:`naiad.reply_channel`).

        A Redis failure is retried with backoff until the batch's latest deadline: the
        gateway still waits on the same reply list, even on a restarted Redis. Past it, the
        error propagates and the entries stay pending; the reclaim pass takes them again
        (answered DeadlineExceeded by then). A pipeline cut midway may have pushed some
        replies: the retry pushes them again and the gateway drops the second copy. A retry
        carries neither the statistics nor the claim: the failed attempt may have counted
        them (a timeout waiting for its claim, the process frozen past the socket timeout,
        comes after Redis ran everything else), and counting twice is worse than not at all;
        nor an offer, and :attr:`on_redis_failure` is called before each retry."""
        give_up_at = max([queued.deadline for queued, _ in pairs], default=0.0)
        backoff = REDIS_BACKOFF_S[0]
        while True:
            try:
                return await self._send_once(pairs, runs, claim, offer)
            except RedisError as exc:
                if time.time() + backoff > give_up_at:
                    raise
                logger.warning("reply not sent (%s); retrying in %.1f s", exc, backoff)
                if self.on_redis_failure is not None:
                    self.on_redis_failure()
                runs, claim, offer = (), None, False  # no offer: no hand-off while Redis is down
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, REDIS_BACKOFF_S[1])

    async def _send_once(
        self, pairs: Sequence[tuple[QueuedRequest, bytes]], runs: Sequence[stats.Execution],
        claim: Claim | None, offer: bool = False,
    ) -> tuple[list[QueuedRequest], float] | None:  # fmt: skip
        batch = CommandBatch()  # one write, raw replies (naiad.redis_client.HeldConnection)
        self.add_downloads(batch)  # a version first asked for now, pulled lazily
        by_list: dict[str, list[bytes]] = {}  # one element per gateway, replies in order
        for queued, payload in pairs:
            by_list.setdefault(queued.reply_to, []).append(payload)
        # direct only for a batch that answers one gateway and has no telemetry: what a client
        # may read once it has its answer (the statistics) then travels with that answer
        address = pairs[0][0].reply_address if len(by_list) == 1 and not batch.commands else None
        if address is not None:
            raw_stats = encode_executions(self.model, runs) if runs else b""
            replies = b"".join([payload for _, payload in pairs])
            if await self.direct.send(address, replies, raw_stats, offer):
                by_list, runs = {}, ()  # that gateway records the statistics
        for run in runs:
            stats.add_execution(batch, self.model, run)
        for reply_to, payloads in by_list.items():
            batch.rpush(reply_to, b"".join(payloads))  # naiad.codec.decode_replies
            batch.expire(reply_to, keys.REPLY_TTL_S)
        self.queue.acknowledge(batch, [queued for queued, _ in pairs])
        sent = self.queue.read_on(batch, *claim) if claim is not None else 0.0
        if not batch.commands:  # requests handed over directly, answered the same way
            return None
        results = await self._connection.send(batch)
        reply = results.pop() if claim is not None else None
        for result in results:
            if isinstance(result, Exception):
                raise result
        if claim is None:
            return None
        if isinstance(reply, Exception):
            logger.debug("claim sent with the replies failed: %s", reply)
            return None
        return await self.queue.claimed(reply, *claim, sent), sent

    def takes_now(self, queued: QueuedRequest) -> bool:
        """Whether :meth:`send_now` would answer ``queued`` alone (no entry to acknowledge,
        no telemetry to send, its gateway's direct connection open and taking writes)."""
        address = self._direct_address([queued])
        return address is not None and self.direct.takes_now(address)

    def send_now(
        self, pairs: Sequence[tuple[QueuedRequest, bytes]], runs: Sequence[stats.Execution] = (),
        offer: bool = False,
    ) -> bool:  # fmt: skip
        """:meth:`send` within the caller's turn of the event loop, for a batch whose frame
        alone answers it (:meth:`_direct_address`): its replies and statistics in one frame
        on that gateway's direct connection; False, nothing sent, otherwise."""
        address = self._direct_address([queued for queued, _ in pairs])
        if address is None:
            return False
        raw_stats = encode_executions(self.model, runs) if runs else b""
        return self.direct.send_now(address, b"".join([payload for _, payload in pairs]), raw_stats, offer)

    def _direct_address(self, requests: Sequence[QueuedRequest]) -> Address | None:
        """The one gateway's direct reply address ``requests`` all name, when a frame there
        alone answers them (no stream entry to acknowledge, no telemetry waiting); else None."""
        address = requests[0].reply_address if requests else None
        for queued in requests:  # a loop, no comprehension: one request at c1
            if queued.entry_id or queued.reply_address != address:
                return None
        return None if address is None or self.loader.has_news() else address

    def add_downloads(self, pipe: Pipeline, loads: list[VersionLoad] | None = None) -> None:
        """Queue the versions pulled from the repository and loaded since the last call
        (``loads``: those already taken from the loader)."""
        for pull in self.loader.take_pulls():
            telemetry.add_download(pipe, self.model, pull.bytes, pull.seconds)
        for load in self.loader.take_loads() if loads is None else loads:
            telemetry.add_load(pipe, self.model, load.load_s)
