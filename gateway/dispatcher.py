"""The gateway's side of the queue: a remote model that looks local.

:meth:`QueueDispatcher.infer` appends the request to the model's Redis stream and awaits its
reply, which a single background reader takes off this gateway's reply list with BLPOP and
hands to the waiting future by queue id (no polling). When the model has no live worker the
scaler is woken through :data:`naiad.keys.SCALER_WAKE`; the request waits in the stream
meanwhile, bounded by its deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from naiad import keys, logs, tracing
from naiad.codec import Reply, decode_reply, encode_request
from naiad.errors import DeadlineExceeded, InvalidInput, Unavailable
from naiad.inference import InferRequest, InferResponse

logger = logging.getLogger(__name__)

#: Seconds one BLPOP of the reply reader blocks before it loops (to notice shutdown).
READER_BLOCK_S = 5


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

    async def infer(self, request: InferRequest, timeout_s: float) -> InferResponse:
        """Queue ``request`` and wait at most ``timeout_s`` seconds for its answer.

        Raises :class:`DeadlineExceeded` on timeout, :class:`Unavailable` when Redis cannot
        be reached, or the error the worker sent back.
        """
        queue_id = uuid.uuid4().hex
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[queue_id] = future
        try:
            await self._enqueue(queue_id, request, timeout_s)
            reply = await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            raise DeadlineExceeded(
                f"request to model '{request.model}' timed out after {timeout_s:g} s"
            ) from None
        finally:
            self._pending.pop(queue_id, None)
        if reply.error is not None:
            raise reply.error
        return InferResponse(request.model, request.version, reply.outputs, request.id)

    async def _enqueue(self, queue_id: str, request: InferRequest, timeout_s: float) -> None:
        with tracing.span("naiad.enqueue", kind="producer"):
            now = time.time()
            fields = encode_request(
                queue_id, request, self.reply_key, now + timeout_s, now,
                traceparent=tracing.traceparent(), log_id=logs.REQUEST_ID.get(),
            )
            await self._send(request, fields, now)

    async def _send(self, request: InferRequest, fields: dict[bytes, bytes], now: float) -> None:
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.xadd(keys.request_stream(request.model), fields)
                pipe.zcount(keys.workers(request.model), now, "+inf")
                _, live = await pipe.execute()
            if live == 0:
                await self.redis.rpush(keys.SCALER_WAKE, request.model)
        except RedisError as exc:
            raise Unavailable(f"queue unavailable: {exc}") from None

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
