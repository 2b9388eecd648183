"""The gateway's side of the queue: a remote model that looks local.

:meth:`QueueDispatcher.infer` appends the request to the model's Redis stream and awaits its
reply, which a single background reader takes off this gateway's reply list with BLPOP and
hands to the waiting future by queue id (no polling). When the model has no live worker the
scaler is woken through :data:`naiad.keys.SCALER_WAKE`; the request waits in the stream
meanwhile, bounded by its deadline.

Backpressure: the XADD is a script that first checks the stream's length (entries queued or
being run: answered ones are deleted) against the model's maximum queue size, atomically, so
a full queue answers :class:`Overloaded` at once and never grows past its bound.

Cancellation: a caller that goes away (its task cancelled: an HTTP client that disconnected,
a cancelled gRPC call) or whose deadline passes *withdraws* its entry: ``XACK`` + ``XDEL``.
Unclaimed, the entry is gone before any worker reads it; claimed but not yet run, it is no
longer pending for its worker, which checks that right before running a batch
(:meth:`workers.worker.Worker._still_ours`) and skips it. Only a request already running is
executed anyway; its late reply, like any reply whose caller is gone, is dropped here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from naiad import keys, logs, tracing
from naiad.codec import Reply, decode_reply, encode_request
from naiad.errors import DeadlineExceeded, InvalidInput, Overloaded, Unavailable
from naiad.inference import InferRequest, InferResponse

logger = logging.getLogger(__name__)

#: Seconds one BLPOP of the reply reader blocks before it loops (to notice shutdown).
READER_BLOCK_S = 5

#: XADD unless the stream already holds ``ARGV[1]`` entries or more (0: no bound); returns the
#: new entry's id, or nil when the queue is full. KEYS[1]: the stream; ARGV[2..]: the fields.
BOUNDED_XADD = """
local limit = tonumber(ARGV[1])
if limit > 0 and redis.call('XLEN', KEYS[1]) >= limit then
  return false
end
return redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2))
"""
#: Seconds a withdrawal (XACK + XDEL of a cancelled request's entry) may take.
WITHDRAW_TIMEOUT_S = 2.0


class QueueDispatcher:
    """Sends requests through Redis and matches replies to waiting callers.

    ``redis`` sends commands; ``reader`` (a client whose socket timeout exceeds
    :data:`READER_BLOCK_S`, see :func:`naiad.redis_client.connect`) blocks on replies.
    """

    def __init__(
        self, redis: aioredis.Redis, reader: aioredis.Redis, gateway_id: str | None = None
    ):
        self.redis = redis
        self.reader = reader
        self.gateway_id = gateway_id or uuid.uuid4().hex
        self.reply_key = keys.reply_list(self.gateway_id)
        self._pending: dict[str, asyncio.Future[Reply]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._closing = False
        self._xadd = redis.register_script(BOUNDED_XADD)
        self._withdrawals: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._reader = asyncio.create_task(self._read_replies(), name="reply-reader")

    async def stop(self) -> None:
        """Stop the reply reader and cancel every waiting caller.

        redis-py may turn the reader's cancellation into a ConnectionError, which the
        reader's retry loop would swallow; ``_closing`` makes that loop end instead.
        """
        self._closing = True
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, RedisError):
                await self._reader
        for future in self._pending.values():
            future.cancel()
        if self._withdrawals:
            await asyncio.wait(list(self._withdrawals), timeout=WITHDRAW_TIMEOUT_S)

    async def infer(self, request: InferRequest, timeout_s: float, max_queue: int = 0) -> InferResponse:
        """Queue ``request`` and wait at most ``timeout_s`` seconds for its answer.

        ``max_queue``: the model's maximum queue size (0: no bound). Raises
        :class:`Overloaded` when the queue is full, :class:`DeadlineExceeded` on timeout,
        :class:`Unavailable` when Redis cannot be reached, or the error the worker sent back.
        A timed-out or cancelled request withdraws its entry (see the module doc).
        """
        queue_id = uuid.uuid4().hex
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[queue_id] = future
        # shielded: a caller cancelled mid-XADD still learns the entry id, to withdraw it
        enqueue = asyncio.ensure_future(self._enqueue(queue_id, request, timeout_s, max_queue))
        try:
            entry_id = await asyncio.shield(enqueue)
            reply = await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            self._withdraw(request.model, entry_id)
            raise DeadlineExceeded(
                f"request to model '{request.model}' timed out after {timeout_s:g} s"
            ) from None
        except asyncio.CancelledError:
            enqueue.add_done_callback(functools.partial(self._withdraw_queued, request.model))
            raise
        finally:
            self._pending.pop(queue_id, None)
        if reply.error is not None:
            raise reply.error
        return InferResponse(request.model, request.version, reply.outputs, request.id)

    async def _enqueue(
        self, queue_id: str, request: InferRequest, timeout_s: float, max_queue: int
    ) -> bytes:
        with tracing.span("naiad.enqueue", kind="producer"):
            now = time.time()
            fields = encode_request(
                queue_id, request, self.reply_key, now + timeout_s, now,
                traceparent=tracing.traceparent(), log_id=logs.REQUEST_ID.get(),
            )
            return await self._send(request, fields, now, max_queue)

    async def _send(
        self, request: InferRequest, fields: dict[bytes, bytes], now: float, max_queue: int
    ) -> bytes:
        """The bounded XADD and the live-worker count in one round trip; the new entry's id."""
        stream = keys.request_stream(request.model)
        args: list[bytes | int] = [max_queue]
        for name, value in fields.items():
            args += [name, value]
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                await self._xadd(keys=[stream], args=args, client=pipe)
                pipe.zcount(keys.workers(request.model), now, "+inf")
                entry_id, live = await pipe.execute()
            if entry_id is None:
                raise Overloaded(f"the queue of model '{request.model}' is full ({max_queue} requests)")
            if live == 0:
                await self._wake(request.model)
        except RedisError as exc:
            raise Unavailable(f"queue unavailable: {exc}") from None
        return entry_id

    def _withdraw_queued(self, model: str, enqueue: asyncio.Future[bytes]) -> None:
        """Done callback of a cancelled caller's enqueue: withdraw the entry if one was added."""
        if not enqueue.cancelled() and enqueue.exception() is None:
            self._withdraw(model, enqueue.result())

    def _withdraw(self, model: str, entry_id: bytes | None) -> None:
        """XACK + XDEL ``entry_id`` in the background (the caller is being cancelled, and a
        second cancellation must not interrupt it); errors are logged, never raised."""
        if entry_id is None:
            return
        task = asyncio.create_task(self._withdraw_entry(model, entry_id))
        self._withdrawals.add(task)
        task.add_done_callback(self._withdrawals.discard)

    async def _withdraw_entry(self, model: str, entry_id: bytes) -> None:
        stream = keys.request_stream(model)
        try:
            async with asyncio.timeout(WITHDRAW_TIMEOUT_S):
                async with self.redis.pipeline(transaction=True) as pipe:
                    pipe.xack(stream, keys.WORKER_GROUP, entry_id)
                    pipe.xdel(stream, entry_id)  # runs even when XACK finds no group
                    _, deleted = await pipe.execute(raise_on_error=False)
        except (RedisError, TimeoutError) as exc:
            logger.warning("could not withdraw a cancelled request of model '%s': %s", model, exc)
            return
        if deleted:
            logger.debug("withdrew entry %s of model '%s'", entry_id, model)

    async def _wake(self, model: str) -> None:
        """Ask the scaler for a worker. The list is capped (LTRIM): under KEDA no local
        scaler pops it, and one wake per model is all a scaler needs anyway."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.rpush(keys.SCALER_WAKE, model)
            pipe.ltrim(keys.SCALER_WAKE, -keys.SCALER_WAKE_MAX, -1)
            await pipe.execute()

    async def _read_replies(self) -> None:
        backoff = 0.1
        while not self._closing:
            try:
                item = await self.reader.blpop([self.reply_key], timeout=READER_BLOCK_S)
                backoff = 0.1
            except RedisError as exc:
                if self._closing:
                    return
                logger.warning("reply reader: %s; retrying in %.1f s", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            if item is not None:
                self._deliver(item[1])

    def _deliver(self, payload: bytes) -> None:
        try:
            reply = decode_reply(payload)
        except InvalidInput:
            logger.exception("dropping a malformed reply")
            return
        future = self._pending.get(reply.queue_id)
        if future is not None and not future.done():
            future.set_result(reply)
