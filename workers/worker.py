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

import numpy as np
import psutil
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError, ResponseError

from naiad import keys, logs, stats, telemetry, tracing
from naiad.codec import QueuedRequest, Reply, decode_request, encode_reply
from naiad.datatypes import datatype_of
from naiad.errors import DeadlineExceeded, InferenceFailed, NaiadError
from naiad.inference import Tensor
from naiad.redis_client import connect
from naiad.settings import Settings
from repository_store import ModelEntry
from workers import batching
from workers.batcher import BatchPolicy
from workers.loader import VersionLoader
from workers.model import ModelRunner
from workers.reclaim import reclaim_orphans

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
        self._next_reclaim = 0.0
        self._generation: bytes | None = None

    async def run(self) -> int:
        logs.MODEL.set(self.model)  # every record of this worker names its model
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
            entry = await self.loader.start(await self._registered())
        except NaiadError as exc:
            logger.error("model '%s' cannot be served: %s", self.model, exc.message)
            await self._fail_backlog(exc)
            return 2
        self.policy = BatchPolicy.from_config(entry.config)
        await self._record_cold_start()
        await self._serve()
        return 0

    async def _record_cold_start(self) -> None:
        """Record this cold start (process start → ready to read the queue) and what it
        pulled from the repository, before the first request is answered."""
        seconds = time.time() - psutil.Process().create_time()
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                telemetry.add_cold_start(pipe, self.model, seconds)
                self._add_downloads(pipe)
                await pipe.execute()
        except RedisError as exc:
            logger.warning("cold start of model '%s' not recorded: %s", self.model, exc)
        logger.info("model '%s' ready %.3f s after the process started", self.model, seconds)

    def _add_downloads(self, pipe: Pipeline) -> None:
        for pull in self.loader.take_pulls():
            telemetry.add_download(pipe, self.model, pull.bytes, pull.seconds)

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
                if await self._outdated():
                    self.stopping.set()  # drain: finish what is claimed, then exit

    async def _registered(self) -> ModelEntry | None:
        """The model's registry entry (None if it has none), noting the generation first."""
        self._generation = await self.redis.get(keys.REGISTRY_GENERATION)
        raw = await self.redis.hget(keys.REGISTRY, self.model)
        return ModelEntry.from_bytes(raw) if raw else None

    async def _outdated(self) -> bool:
        """True when the registry changed (one GET per heartbeat when it did not) and no
        longer serves what this worker loaded: the model was unloaded or removed, or its
        config or versions changed (the next request then cold-starts a fresh worker)."""
        loaded = self.loader.entry
        if loaded is None or await self.redis.get(keys.REGISTRY_GENERATION) == self._generation:
            return False
        current = await self._registered()
        if current is None or not current.ready:
            why = current.reason if current is not None else "removed"
            logger.info("model '%s' is unavailable (%s): draining, then exiting", self.model, why)
        elif (current.config, current.versions) != (loaded.config, loaded.versions):
            logger.info("model '%s' changed in the registry: draining, then exiting", self.model)
        else:
            return False
        return True

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
            first = await self._reclaim() or await self._read(self.policy.read_count, block_ms)
            if not first:
                continue
            batch = await self._gather(first)
            await self._process(batch)
            idle_since = time.monotonic()

    async def _reclaim(self) -> list[QueuedRequest]:
        """Every heartbeat period, take over what dead workers of this model left claimed."""
        now = time.monotonic()
        if now < self._next_reclaim:
            return []
        self._next_reclaim = now + self.settings.heartbeat_s
        min_idle_ms = int(self.settings.heartbeat_s * 1000)
        entries = await reclaim_orphans(self.redis, self.model, self.worker_id, min_idle_ms)
        if entries:
            logger.warning("reclaimed %d requests left by dead workers", len(entries))
        decoded = [await self._decode(entry_id, fields) for entry_id, fields in entries]
        return [request for request in decoded if request is not None]

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
        expired = DeadlineExceeded("request expired in the queue")
        pairs = [(r, encode_reply(Reply(r.queue_id, error=expired))) for r in requests if r.deadline <= now]
        runs: list[stats.Execution] = []
        assert self.policy is not None
        for indices in batching.plan_batches([r.request for r in live], self.policy.plan_rows):
            group = [live[i] for i in indices]
            payloads, run = await self._execute(group)
            pairs += zip(group, payloads, strict=True)
            runs += [run] if run is not None else []
        await self._reply(pairs, runs)

    async def _execute(self, group: list[QueuedRequest]) -> tuple[list[bytes], stats.Execution | None]:
        """:meth:`_execute_batch` with the batch's log context (version, request ids) and,
        when tracing is on, a ``naiad.queue`` span per request and the ``naiad.batch`` span."""
        version, ids = group[0].request.version, [q.request_id for q in group]
        started_ns = time.time_ns()
        for queued in group:
            tracing.record("naiad.queue", int(queued.enqueued_at * 1e9), started_ns,
                           {"naiad.request_id": queued.request_id}, parent=queued.traceparent)
        attributes = {"naiad.model": self.model, "naiad.version": version,
                      "naiad.request_ids": ids, "naiad.batch_requests": len(group)}
        with logs.request_context(logs.batch_ids(ids), version=version), tracing.span(
            "naiad.batch", attributes, kind="consumer", parent=group[0].traceparent,
            links=[q.traceparent for q in group],
        ):
            payloads, run = await self._execute_batch(group)
            elapsed_ms = (time.time_ns() - started_ns) / 1e6
            logger.debug("batch of %d requests done in %.2f ms", len(group), elapsed_ms)
            return payloads, run

    async def _execute_batch(
        self, group: list[QueuedRequest]
    ) -> tuple[list[bytes], stats.Execution | None]:
        """Run one batch: encoded replies in ``group`` order, and its statistics if it ran."""
        try:
            runner = await self.loader.get(group[0].request.version)
            return await self._run(runner, group)
        except NaiadError as exc:
            error = exc
        except Exception as exc:  # the backend's own errors reach the client with their text
            logger.exception("inference failed on model '%s'", self.model)
            error = InferenceFailed(f"inference failed: {exc}")
        return [encode_reply(Reply(q.queue_id, error=error)) for q in group], None

    async def _run(
        self, runner: ModelRunner, group: list[QueuedRequest]
    ) -> tuple[list[bytes], stats.Execution]:
        """Triton's phases, timed: compute_input (merge, reshape), compute_infer (the
        backend, in a thread), compute_output (reshape back, split, encode the replies)."""
        requests = [queued.request for queued in group]
        started_s, t0 = time.time(), time.perf_counter_ns()
        batched = runner.config.max_batch_size > 0
        sizes = [batching.rows(r) if batched else 1 for r in requests]
        feed = runner.feed(batching.merge(requests), sum(sizes))
        names = runner.names([o.name for o in requests[0].outputs])
        t1 = time.perf_counter_ns()
        with tracing.span("naiad.backend", {"naiad.batch_rows": sum(sizes)}):
            results = await asyncio.to_thread(runner.backend.infer, feed, names)
        t2 = time.perf_counter_ns()
        outputs = runner.restore(results, names, sum(sizes))
        parts = batching.split(outputs, sizes) if batched else [outputs]
        phases = {"compute_input": t1 - t0, "compute_infer": t2 - t1}
        payloads = [
            encode_reply(Reply(q.queue_id, _tensors(part), timings_ns=dict(phases)))
            for q, part in zip(group, parts, strict=True)
        ]
        phases["compute_output"] = time.perf_counter_ns() - t2
        queue_ns = [max(0, int((started_s - q.enqueued_at) * 1e9)) for q in group]
        finished_ms = int(time.time() * 1000)
        return payloads, stats.Execution(requests[0].version, sum(sizes), queue_ns, phases, finished_ms)

    async def _reply(
        self, pairs: list[tuple[QueuedRequest, bytes]], runs: list[stats.Execution] | None = None
    ) -> None:
        """One pipeline: statistics first (so a gateway that has its reply sees them), then
        each encoded reply onto its gateway's list, then XACK and XDEL of the entries."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for run in runs or []:
                stats.add_execution(pipe, self.model, run)
            self._add_downloads(pipe)  # a version first asked for now, pulled lazily
            for queued, payload in pairs:
                pipe.rpush(queued.reply_to, payload)
                pipe.expire(queued.reply_to, keys.REPLY_TTL_S)
            ids = [queued.entry_id for queued, _ in pairs]
            if ids:
                pipe.xack(self.stream, keys.WORKER_GROUP, *ids)
                pipe.xdel(self.stream, *ids)
            await pipe.execute()

    async def _fail_backlog(self, error: NaiadError) -> None:
        """A model that cannot load answers what waits for it with the reason, then exits."""
        while requests := await self._read(100, None):
            await self._reply([(r, encode_reply(Reply(r.queue_id, error=error))) for r in requests])


def _tensors(arrays: dict[str, np.ndarray]) -> list[Tensor]:
    return [Tensor(name, datatype_of(a.dtype), list(a.shape), a) for name, a in arrays.items()]
