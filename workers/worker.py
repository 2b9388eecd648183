"""One worker process serving one model: pull, load, read the queue, batch, run, reply.

The worker reads its model's Redis stream as a member of the consumer group
:data:`naiad.keys.WORKER_GROUP` (XREADGROUP, blocking), forms dynamic batches per the
config's ``dynamic_batching``, runs them in a thread so heartbeats keep flowing, and answers
each request on its gateway's reply list, acknowledging and deleting the stream entry in the
same pipeline. It exits after ``idle_timeout_s`` without requests (scale to zero) and on
SIGTERM it stops claiming, finishes what it claimed, then exits (drain).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
import uuid

from redis.exceptions import ResponseError

from naiad import keys
from naiad.codec import QueuedRequest, Reply, decode_request, encode_reply
from naiad.datatypes import datatype_of
from naiad.errors import DeadlineExceeded, InferenceFailed, NaiadError
from naiad.inference import Tensor
from naiad.redis_client import connect
from naiad.settings import Settings
from workers import batching
from workers.batcher import BatchPolicy
from workers.loader import VersionLoader

logger = logging.getLogger(__name__)


class Worker:
    """Serves ``model`` until idle or told to stop. ``run()`` returns the exit code."""

    def __init__(self, settings: Settings, model: str, redis_url: str, worker_id: str | None = None):
        self.settings = settings
        self.model = model
        self.worker_id = worker_id or f"{model}-{uuid.uuid4().hex[:8]}"
        self.redis = connect(redis_url, longest_block_s=1.0)
        self.stream = keys.request_stream(model)
        self.loader = VersionLoader(settings, model)
        self.policy: BatchPolicy | None = None
        self.stopping = asyncio.Event()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        await self._ensure_group()
        await self._heartbeat()
        beat = asyncio.create_task(self._heartbeat_loop())
        try:
            return await self._load_and_serve()
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
            await self._deregister()
            await self.redis.aclose()

    async def _load_and_serve(self) -> int:
        try:
            entry = await self.loader.start()
        except NaiadError as exc:
            logger.error("model '%s' cannot be served: %s", self.model, exc.message)
            await self._fail_backlog(exc)
            return 2
        self.policy = BatchPolicy.from_config(entry.config)
        await self._serve()
        return 0

    async def _ensure_group(self) -> None:
        try:
            await self.redis.xgroup_create(self.stream, keys.WORKER_GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def _heartbeat(self) -> None:
        deadline = time.time() + 3 * self.settings.heartbeat_s
        await self.redis.zadd(keys.workers(self.model), {self.worker_id: deadline})

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat_s)
            with contextlib.suppress(Exception):
                await self._heartbeat()

    async def _deregister(self) -> None:
        with contextlib.suppress(Exception):
            await self.redis.zrem(keys.workers(self.model), self.worker_id)
            await self.redis.xgroup_delconsumer(self.stream, keys.WORKER_GROUP, self.worker_id)

    async def _read(self, count: int, block_ms: int | None) -> list[QueuedRequest]:
        response = await self.redis.xreadgroup(
            keys.WORKER_GROUP, self.worker_id, {self.stream: ">"}, count=count, block=block_ms
        )
        requests = []
        for _, entries in response or []:
            for entry_id, fields in entries:
                requests.append(await self._decode(entry_id, fields))
        return [r for r in requests if r is not None]

    async def _decode(self, entry_id: bytes, fields: dict) -> QueuedRequest | None:
        try:
            return decode_request(self.model, fields, entry_id)
        except NaiadError:
            logger.exception("dropping malformed stream entry %s", entry_id)
            await self.redis.xack(self.stream, keys.WORKER_GROUP, entry_id)
            await self.redis.xdel(self.stream, entry_id)
            return None

    async def _serve(self) -> None:
        assert self.policy is not None
        idle_since = time.monotonic()
        while not self.stopping.is_set():
            remaining = self.settings.idle_timeout_s - (time.monotonic() - idle_since)
            if remaining <= 0 and await self._leave_if_idle():
                return
            block_ms = max(1, int(min(max(remaining, 0.001), 1.0) * 1000))
            first = await self._read(self.policy.read_count, block_ms)
            if not first:
                continue
            batch = await self._gather(first)
            await self._process(batch)
            idle_since = time.monotonic()

    async def _leave_if_idle(self) -> bool:
        """Deregister, then look once more: a request that raced the decision keeps us."""
        await self.redis.zrem(keys.workers(self.model), self.worker_id)
        late = await self._read(1, None)
        if not late:
            logger.info("idle for %.0f s, exiting (scale to zero)", self.settings.idle_timeout_s)
            return True
        await self._heartbeat()
        await self._process(await self._gather(late))
        return False

    async def _gather(self, requests: list[QueuedRequest]) -> list[QueuedRequest]:
        """Dynamic batching: take what is queued now; if the batch is still short, wait out
        the queue delay once and take what came meanwhile.

        The wait is an asyncio sleep, not ``XREADGROUP BLOCK``: Redis checks blocked clients'
        timeouts only every ``1000/hz`` ms (100 ms at the default ``hz 10``), far coarser
        than a batching delay of a few milliseconds.
        """
        assert self.policy is not None
        if not self.policy.enabled:
            return requests
        started = time.monotonic()
        if (want := self.policy.rows_wanted(requests)) > 0:
            requests += await self._read(want, None)
        left_s = self.policy.max_queue_delay_s - (time.monotonic() - started)
        if (want := self.policy.rows_wanted(requests)) > 0 and left_s > 0:
            await asyncio.sleep(left_s)
            requests += await self._read(want, None)
        return requests

    async def _process(self, requests: list[QueuedRequest]) -> None:
        now = time.time()
        live = [r for r in requests if r.deadline > now]
        expired = [r for r in requests if r.deadline <= now]
        replies = [Reply(r.queue_id, error=DeadlineExceeded("request expired in the queue")) for r in expired]
        assert self.policy is not None
        plan = batching.plan_batches([r.request for r in live], self.policy.plan_rows)
        for indices in plan:
            group = [live[i] for i in indices]
            replies += await self._execute(group)
        await self._reply(list(zip([*expired, *self._ordered(live, plan)], replies, strict=True)))

    @staticmethod
    def _ordered(live: list[QueuedRequest], plan: list[list[int]]) -> list[QueuedRequest]:
        return [live[i] for indices in plan for i in indices]

    async def _execute(self, group: list[QueuedRequest]) -> list[Reply]:
        requests = [queued.request for queued in group]
        started = time.perf_counter_ns()
        try:
            runner = await self.loader.get(requests[0].version)
            sizes = [batching.rows(r) if runner.config.max_batch_size > 0 else 1 for r in requests]
            inputs = batching.merge(requests)
            names = [o.name for o in requests[0].outputs]
            outputs = await asyncio.to_thread(runner.run, inputs, names, sum(sizes))
            parts = batching.split(outputs, sizes) if runner.config.max_batch_size > 0 else [outputs]
        except NaiadError as exc:
            return [Reply(q.queue_id, error=exc) for q in group]
        except Exception as exc:  # the backend's own errors reach the client with their text
            logger.exception("inference failed on model '%s'", self.model)
            return [Reply(q.queue_id, error=InferenceFailed(f"inference failed: {exc}")) for q in group]
        elapsed = time.perf_counter_ns() - started
        return [
            Reply(q.queue_id, [Tensor(n, datatype_of(a.dtype), list(a.shape), a) for n, a in part.items()],
                  timings_ns={"compute_infer": elapsed})
            for q, part in zip(group, parts, strict=True)
        ]

    async def _reply(self, pairs: list[tuple[QueuedRequest, Reply]]) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            for queued, reply in pairs:
                pipe.rpush(queued.reply_to, encode_reply(reply))
                pipe.expire(queued.reply_to, keys.REPLY_TTL_S)
            ids = [queued.entry_id for queued, _ in pairs]
            if ids:
                pipe.xack(self.stream, keys.WORKER_GROUP, *ids)
                pipe.xdel(self.stream, *ids)
            await pipe.execute()

    async def _fail_backlog(self, error: NaiadError) -> None:
        """A model that cannot load answers what waits for it with the reason, then exits."""
        while requests := await self._read(100, None):
            await self._reply([(r, Reply(r.queue_id, error=error)) for r in requests])
