"""One worker process serving one model: pull, load, read the queue, batch, run, reply.

The worker reads its model's Redis stream as a member of the consumer group
:data:`naiad.keys.WORKER_GROUP` (XREADGROUP, blocking), forms dynamic batches per the
config's ``dynamic_batching``, runs them (in a thread so heartbeats keep flowing, unless the
model is fast enough to run on the event loop: :meth:`Worker._inline`), and answers
each request on its gateway's reply list, acknowledging and deleting the stream entry in the
same pipeline. It exits after its model's idle timeout without requests (scale to zero) unless
that would leave fewer live workers than the model's ``min_workers`` (:mod:`workers.scaling`),
and on SIGTERM it stops claiming, finishes what it claimed, then exits (drain). When the
registry stops serving what it loaded (unload, changed config, a new version), it drains the
same way; a request it claimed for a version it did not load goes back to the stream for its
successor. A load that fails in the model itself (backend error, failing warmup) marks the
model UNAVAILABLE in the registry with the reason (:mod:`workers.load_failure`), then the
worker answers what waits with it and exits 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import time
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import psutil
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError, ResponseError

from naiad import keys, logs, procs, queue_policy, stats, telemetry, tracing
from naiad.codec import QueuedRequest, Reply, encode_reply, entry_order
from naiad.datatypes import datatype_of
from naiad.errors import DeadlineExceeded, InferenceFailed, NaiadError, QueueTimeout
from naiad.inference import Tensor
from naiad.redis_client import connect
from naiad.settings import Settings
from repository_store import ModelEntry, RepositoryStore
from workers import batching, bls, load_failure, reclaim, request_level, scaling
from workers.batcher import Batcher, BatchPolicy
from workers.loader import VersionLoad, VersionLoader
from workers.model import ModelRunner
from workers.queue_reader import FRESH_S, QueueReader

logger = logging.getLogger(__name__)

#: Longest time a worker whose versions left the policy keeps serving what was queued for
#: them (it stops earlier at an empty queue or at the first request for a newer version).
RETIRE_S = 10.0
#: A batch expected to compute within this many seconds runs on the event loop (:meth:`Worker._inline`).
INLINE_INFER_S = 0.001
#: First and longest wait (seconds) before retrying after a Redis failure.
REDIS_BACKOFF_S = (0.1, 2.0)


@dataclass(frozen=True)
class Prepared:
    """What a warm-pool process set up before it was claimed (:mod:`workers.warm_pool`)."""

    claimed_at: float
    """Epoch seconds of the claim: this worker's cold start is measured from here."""
    redis: Redis | None = None
    """A client of the worker's Redis, already connected."""
    store: RepositoryStore | None = None
    """The model repository, already opened."""


class Worker:
    """Serves ``model`` until idle or told to stop. ``run()`` returns the exit code.
    ``prepared``: set for a warm-pool process (its cold start counts from the claim)."""

    def __init__(
        self, settings: Settings, model: str, redis_url: str, worker_id: str | None = None,
        prepared: Prepared | None = None,
    ):  # fmt: skip
        self.settings = settings
        self.model = model
        self.worker_id = worker_id or f"{model}-{uuid.uuid4().hex[:8]}"
        self.prepared = prepared
        self.redis = (prepared and prepared.redis) or connect(redis_url, longest_block_s=1.0)
        self.redis_url = redis_url
        self.queue = QueueReader(self.redis, model, self.worker_id)
        self.loader = VersionLoader(settings, model, prepared.store if prepared else None)
        self._marks: dict[str, float] = {}  # cold-start phases: name -> epoch seconds at its end
        self.policy: BatchPolicy | None = None
        self.batcher: Batcher | None = None  # the claimed requests not yet run
        self.scaling = scaling.default_policy(settings)
        self.superseded = False  # the registry no longer serves what this worker loaded
        self._retire_by: float | None = None  # versions changed: serve the old queue until then
        self.stopping = asyncio.Event()
        self._next_reclaim = 0.0
        # each runner's last compute_infer (ns) per batch size class (rows.bit_length())
        self._infer_ns: weakref.WeakKeyDictionary[ModelRunner, dict[int, int]] = weakref.WeakKeyDictionary()
        self._generation: bytes | None = None
        self._claimed_at: float | None = None  # monotonic: the next turn's claim went out with replies
        self._registered_raw: bytes | None = None  # the registry entry as last read

    async def run(self) -> int:
        self._marks["start"] = time.time()
        logs.MODEL.set(self.model)  # every record of this worker names its model
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        await self.queue.ensure_groups()
        await self._heartbeat()
        beat = asyncio.create_task(self._heartbeat_loop())
        calls = bls.install(self.settings, self.redis, self.redis_url, self.worker_id)  # Python models' BLS
        try:
            return await self._load_and_serve()
        finally:
            await asyncio.to_thread(self.loader.close)  # backends' close(): Python models' finalize()
            await calls.close()
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
            await self._deregister()
            await self.redis.aclose()

    async def _load_and_serve(self) -> int:
        tried: bytes | None = None  # the READY registry entry this worker loads, as read
        try:
            registered = await self._registered()
            tried = self._registered_raw if registered is not None and registered.ready else None
            self._marks["registry"] = time.time()
            if registered is not None and registered.config is not None:  # its priority levels
                self.queue.configure(queue_policy.priority_levels(registered.config))
                await self.queue.ensure_groups()
            entry = await self.loader.start(registered)
        except NaiadError as exc:
            logger.error("model '%s' cannot be served: %s", self.model, exc.message)
            if tried is not None and load_failure.is_model_fault(exc):
                await self._mark_unavailable(tried, exc)
            await self._fail_backlog(exc)
            return 2
        self.policy = BatchPolicy.from_config(entry.config)
        self.batcher = Batcher(self.model, entry.config, self.policy)
        self.scaling = scaling.policy_for(entry.config, self.settings)
        await self._record_cold_start()
        procs.report_ready()  # the scaler: this worker got past its load (workers.scaler)
        await self._serve()
        return 0

    async def _record_cold_start(self) -> None:
        """Record this cold start (process start, or a warm-pool process's claim → ready to
        read the queue) and what it pulled and loaded, before the first request is answered;
        log where its time went (:func:`cold_start_phases`)."""
        ready = time.time()
        warm = self.prepared is not None
        origin = self.prepared.claimed_at if self.prepared else process_started_at()
        loads = self.loader.take_loads()
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                telemetry.add_cold_start(pipe, self.model, ready - origin, warm_pool=warm)
                self._add_downloads(pipe, loads)
                await pipe.execute()
        except RedisError as exc:
            logger.warning("cold start of model '%s' not recorded: %s", self.model, exc)
        phases = cold_start_phases(origin, self._marks, loads, ready)
        logger.info(
            "model '%s' ready %.3f s after the %s (%s)", self.model, ready - origin,
            "claim" if warm else "process started", ", ".join(f"{k} {v:.3f} s" for k, v in phases.items()),
            extra={"cold_start": {"seconds": ready - origin, "warm_pool": warm, "origin": origin, **phases}},
        )  # fmt: skip

    def _add_downloads(self, pipe: Pipeline, loads: list[VersionLoad] | None = None) -> None:
        """Queue the versions pulled from the repository and loaded since the last call."""
        for pull in self.loader.take_pulls():
            telemetry.add_download(pipe, self.model, pull.bytes, pull.seconds)
        for load in self.loader.take_loads() if loads is None else loads:
            telemetry.add_load(pipe, self.model, load.load_s)

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
        raw = self._registered_raw = await self.redis.hget(keys.REGISTRY, self.model)
        return ModelEntry.from_bytes(raw) if raw else None

    async def _mark_unavailable(self, tried: bytes, error: NaiadError) -> None:
        """The load of registry entry ``tried`` failed in the model: mark it UNAVAILABLE with
        the reason (:mod:`workers.load_failure`) before answering the backlog, so a gateway
        that gets the answer already finds the model not ready. A Redis failure is logged."""
        try:
            if await load_failure.mark_unavailable(self.redis, tried, error.message):
                logger.warning("model '%s' marked UNAVAILABLE until it is loaded again", self.model)
            else:
                logger.info("model '%s' changed in the registry meanwhile: not marked", self.model)
        except RedisError as exc:
            logger.warning("model '%s' not marked UNAVAILABLE: %s", self.model, exc)

    async def _outdated(self) -> bool:
        """True when the registry changed (one GET per heartbeat when it did not) and no
        longer serves what this worker loaded: the model was unloaded or removed, or its
        config changed (the next request then cold-starts a fresh worker). When only its
        versions changed (a new version, poll mode) it is False but the worker retires: it
        serves what is still queued for its versions, then exits (see :meth:`_serve`)."""
        loaded = self.loader.entry
        generation = await self.redis.get(keys.REGISTRY_GENERATION)
        if loaded is None or generation is None or generation == self._generation:
            return False  # None: a restarted, empty Redis; a gateway re-indexes, keep serving
        current = await self._registered()
        if current is None or not current.ready:
            why = current.reason if current is not None else "removed"
            logger.info("model '%s' is unavailable (%s): draining, then exiting", self.model, why)
        elif current.config != loaded.config:
            logger.info("model '%s' changed in the registry: draining, then exiting", self.model)
        elif current.versions != loaded.versions:
            if not self.superseded:
                logger.info("model '%s' now serves versions %s: serving what is queued for %s, "
                            "then exiting", self.model, current.versions, loaded.versions)
                self.superseded, self._retire_by = True, time.monotonic() + RETIRE_S
            return False
        else:
            return False
        self.superseded = True
        return True

    async def _deregister(self) -> None:
        with contextlib.suppress(Exception):
            await self.redis.zrem(keys.workers(self.model), self.worker_id)
            await self.queue.leave()
            if self.superseded and await self.queue.backlog():
                await self.redis.rpush(keys.SCALER_WAKE, self.model)  # start the successor now

    async def _serve(self) -> None:
        """Serve until idle, told to stop, or retired. A Redis failure (an outage, a restart)
        never ends the worker: it backs off and tries again; a group lost with a restarted
        Redis's memory (NOGROUP) is created again. On the way out it runs what it still holds
        claimed (:meth:`_drain`)."""
        assert self.policy is not None
        idle_since, backoff = time.monotonic(), REDIS_BACKOFF_S[0]
        while not self.stopping.is_set() and not self._retired():
            try:
                turn = await self._turn(idle_since)
            except RedisError as exc:
                await self._redis_failed(exc, backoff)
                backoff = min(backoff * 2, REDIS_BACKOFF_S[1])
                continue
            backoff = REDIS_BACKOFF_S[0]
            if turn is None:
                break
            idle_since = turn
        await self._drain()

    async def _drain(self) -> None:
        """Run every request still held, without batching delays; a Redis failure leaves the
        rest pending for another worker's reclaim."""
        assert self.batcher is not None
        try:
            while len(self.batcher):
                batch, rejected, _ = self._due(time.time(), flush=True)
                await self._process(batch, rejected)
        except RedisError as exc:
            logger.warning("%d claimed requests left for another worker (%s)", len(self.batcher), exc)

    async def _turn(self, idle_since: float) -> float | None:
        """One turn of the serve loop: claim what fits the batcher's window (blocking only
        when it holds nothing), run one batch; the new start of the idle time, or None to
        exit."""
        assert self.batcher is not None
        remaining = self.scaling.idle_timeout_s - (time.monotonic() - idle_since)
        if remaining <= 0 and not len(self.batcher):
            if await self._leave_if_idle():
                return None
            return time.monotonic()  # kept (a late request, or the minimum)
        self.batcher.add(await self._reclaim())
        if self._claimed_at is not None:  # this turn's claim went out with the last replies
            self._claimed_at = None
        else:
            self.batcher.add(await self.queue.read(*self._claim(remaining)))
        if not len(self.batcher):
            return None if self.superseded else idle_since  # retiring, and nothing is queued
        await self._process(*await self._next_batch(), claim_ahead=True)
        return self._claimed_at if self._claimed_at is not None else time.monotonic()

    def _claim(self, remaining_s: float) -> tuple[int, int | None]:
        """The next claim's ``(count, block_ms)``: what fits the batcher's window, blocking
        (at most 1 s, at most ``remaining_s`` of the idle timeout) only when it holds nothing
        and no reclaim pass is due (:meth:`_reclaim`: one found, more may be left)."""
        assert self.batcher is not None
        block_ms = max(1, int(min(max(remaining_s, 0.001), 1.0) * 1000))
        idle = not len(self.batcher) and time.monotonic() < self._next_reclaim
        return self.batcher.room, block_ms if idle else None

    async def _redis_failed(self, exc: RedisError, backoff_s: float) -> None:
        logger.warning("redis failed (%s); retrying in %.1f s", exc, backoff_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), backoff_s)
        if isinstance(exc, ResponseError) and "NOGROUP" in str(exc):
            with contextlib.suppress(RedisError):
                await self.queue.ensure_groups()  # a restarted, empty Redis

    def _retired(self) -> bool:
        if self._retire_by is not None and time.monotonic() > self._retire_by:
            logger.info("model '%s': retiring after %g s", self.model, RETIRE_S)
            return True
        return False

    async def _reclaim(self) -> list[QueuedRequest]:
        """Every heartbeat period, and on the next turn again after a pass that found one,
        take over one request a dead worker of this model left claimed (:mod:`workers.reclaim`):
        returned to run alone, or, when workers died holding it
        :data:`~workers.reclaim.MAX_CRASHES` times, answered with
        :func:`~workers.reclaim.crash_error` (logged; the gateway counts it failed, BACKEND)."""
        assert self.batcher is not None
        now = time.monotonic()
        if now < self._next_reclaim:
            return []
        self._next_reclaim = now + self.settings.heartbeat_s
        queued = await self.queue.reclaim(int(self.settings.heartbeat_s * 1000), self.batcher.requests())
        if queued is None:
            return []
        self._next_reclaim = now  # more may be left
        lost = reclaim.lost_deliveries(queued.deliveries)
        with logs.request_context(queued.request_id, version=queued.request.version):
            if not reclaim.gives_up(queued.deliveries):
                logger.warning("reclaimed a request left by a dead worker (%d lost deliveries): "
                               "running it alone", lost)  # fmt: skip
                return [queued]
            error = reclaim.crash_error(self.model, queued.deliveries)
            logger.error("%s", error.message)
        await self._reply([(queued, encode_reply(Reply(queued.queue_id, error=error)))])
        return []

    async def _leave_if_idle(self) -> bool:
        """Deregister, then look once more: a request that raced the decision keeps us, and
        so does the model's ``min_workers`` when too few other workers are live (of two
        deciding at once, the one that counts last sees the other gone and stays)."""
        await self.redis.zrem(keys.workers(self.model), self.worker_id)
        others = await self.redis.zcount(keys.workers(self.model), time.time(), "+inf")
        if not scaling.may_leave_idle(self.scaling, others):
            await self._heartbeat()
            return False
        late = await self.queue.read(1, None)
        if not late:
            logger.info("idle for %g s, exiting (scale to zero)", self.scaling.idle_timeout_s)
            return True
        await self._heartbeat()
        assert self.batcher is not None
        self.batcher.add(late)  # served by the next turns
        return False

    async def _hand_over(self, requests: list[QueuedRequest]) -> list[QueuedRequest]:
        """The requests this worker serves. One for a version it did not load, claimed after
        the registry moved on (a new version raced this worker's drain), goes back to the
        stream (a copy added, the claimed entry acknowledged and deleted, atomically) for the
        successor; this worker drains. Without a registry change it stays (ModelNotFound)."""
        loaded = self.loader.entry
        foreign = [r for r in requests if loaded is not None and r.request.version not in loaded.versions]
        if foreign and not self.superseded:
            await self._outdated()  # marks this worker superseded if the registry moved on
        if not foreign or not self.superseded:
            return requests
        self.stopping.set()
        await self.queue.hand_back(foreign)
        logger.info("handed %d requests for a newer version back to the queue", len(foreign))
        handed = {id(r) for r in foreign}
        return [r for r in requests if id(r) not in handed]

    async def _next_batch(self) -> tuple[list[QueuedRequest], list[QueuedRequest]]:
        """Dynamic batching: the batch to run and the requests whose queue timeout passed
        under REJECT (either may be empty, not both). While the batcher wants to wait (for a
        preferred batch size within ``max_queue_delay_microseconds``, or a queue timeout), it
        sleeps and claims what came meanwhile.

        The wait is an asyncio sleep, not ``XREADGROUP BLOCK``: Redis checks blocked clients'
        timeouts only every ``1000/hz`` ms (100 ms at the default ``hz 10``), far coarser
        than a batching delay of a few milliseconds.
        """
        assert self.batcher is not None
        while True:
            batch, rejected, wait_s = self._due(time.time())
            if batch or rejected or not len(self.batcher):
                return batch, rejected
            await asyncio.sleep(wait_s)
            self.batcher.add(await self.queue.read(self.batcher.room, None))

    def _due(
        self, now: float, flush: bool = False
    ) -> tuple[list[QueuedRequest], list[QueuedRequest], float]:  # fmt: skip
        """What the batcher has for now: ``(batch, rejected, seconds to wait otherwise)``."""
        assert self.batcher is not None
        rejected = self.batcher.expired(now)
        batch, wait_s = self.batcher.take(now, flush)
        return batch, rejected, wait_s

    async def _process(
        self, batch: list[QueuedRequest], rejected: Sequence[QueuedRequest] = (), claim_ahead: bool = False
    ) -> None:
        """Run ``batch`` and answer it, with ``rejected`` (:class:`QueueTimeout`) and what
        expired in the queue (:class:`DeadlineExceeded`), in arrival order, in one pipeline.
        Requests no longer this worker's (:meth:`QueueReader.still_ours`) are skipped.
        ``claim_ahead`` (the serve loop): the next turn's claim ends that pipeline
        (:meth:`_send_replies`)."""
        requests = await self.queue.still_ours([*batch, *rejected], FRESH_S)
        if not requests:
            return
        turned_away, now = {id(r) for r in rejected}, time.time()
        errors: dict[int, NaiadError] = {}
        for r in requests:
            if id(r) in turned_away:
                errors[id(r)] = QueueTimeout("Request timeout expired")  # Triton's words
            elif r.deadline <= now:
                errors[id(r)] = DeadlineExceeded("request expired in the queue")
        live = await self._hand_over([r for r in requests if id(r) not in errors])
        pairs = [(r, encode_reply(Reply(r.queue_id, error=e))) for r in requests if (e := errors.get(id(r)))]
        runs: list[stats.Execution] = []
        if live:
            payloads, run = await self._execute(live)
            pairs += zip(live, payloads, strict=True)
            runs += [run] if run is not None else []
        pairs.sort(key=lambda pair: (entry_order(pair[0].entry_id), pair[0].enqueued_at))
        await self._reply(pairs, runs, claim_ahead)

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
        backend, in a thread), compute_output (reshape back, split, encode the replies).
        A request-level backend (Python) gets the requests unmerged instead."""
        if request_level.is_request_level(runner):
            return await request_level.run_requests(runner, group)
        requests = [queued.request for queued in group]
        started_s, t0 = time.time(), time.perf_counter_ns()
        batched = runner.config.max_batch_size > 0
        sizes = [batching.rows(r) if batched else 1 for r in requests]
        feed = runner.feed(batching.merge(requests), sum(sizes))
        names = runner.names([o.name for o in requests[0].outputs])
        t1 = time.perf_counter_ns()
        with tracing.span("naiad.backend", {"naiad.batch_rows": sum(sizes)}):
            if self._inline(runner, sum(sizes)):
                results = runner.backend.infer(feed, names)
            else:
                results = await asyncio.to_thread(runner.backend.infer, feed, names)
        t2 = time.perf_counter_ns()
        self._infer_ns.setdefault(runner, {})[sum(sizes).bit_length()] = t2 - t1
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

    def _inline(self, runner: ModelRunner, rows: int) -> bool:
        """Run this batch on the event loop, not in a thread: when it is expected to take
        under :data:`INLINE_INFER_S`. A thread hand-off costs more than a sub-millisecond
        model; a slower one runs in a thread so heartbeats keep flowing. Expected: the last
        batch of the same size class (rows within a power of two) took; else the nearest
        smaller class's time scaled by the rows (a batch costs less per row than one row
        alone, so this overestimates), else a larger class's time. Unknown: a thread."""
        return expected_ns(self._infer_ns.get(runner, {}), rows) < INLINE_INFER_S * 1e9

    async def _reply(
        self, pairs: list[tuple[QueuedRequest, bytes]], runs: list[stats.Execution] | None = None,
        claim_ahead: bool = False,
    ) -> None:  # fmt: skip
        """One pipeline: statistics first (so a gateway that has its reply sees them), then
        each encoded reply onto its gateway's list, then XACK and XDEL of the entries; with
        ``claim_ahead``, then the serve loop's next claim (:meth:`_send_replies`).

        A Redis failure is retried with backoff until the batch's latest deadline: the
        gateway still waits on the same reply list, even on a restarted Redis. Past it, the
        error propagates and the entries stay pending; the reclaim pass takes them again
        (answered DeadlineExceeded by then). A pipeline cut midway may have pushed some
        replies: the retry pushes them again and the gateway drops the second copy. A retry
        carries neither the statistics nor the claim: the failed attempt may have counted
        them (a timeout waiting for its claim, the process frozen past the socket timeout,
        comes after Redis ran everything else), and counting twice is worse than not at all."""
        give_up_at = max((queued.deadline for queued, _ in pairs), default=0.0)
        backoff = REDIS_BACKOFF_S[0]
        while True:
            try:
                return await self._send_replies(pairs, runs, claim_ahead)
            except RedisError as exc:
                if time.time() + backoff > give_up_at:
                    raise
                logger.warning("reply not sent (%s); retrying in %.1f s", exc, backoff)
                runs, claim_ahead = None, False
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, REDIS_BACKOFF_S[1])

    async def _send_replies(
        self, pairs: list[tuple[QueuedRequest, bytes]], runs: list[stats.Execution] | None,
        claim_ahead: bool = False,
    ) -> None:  # fmt: skip
        """The reply pipeline (:meth:`_reply`). With ``claim_ahead`` and unless stopping, the
        next turn's claim (:meth:`_claim`, its idle time starting now) is its last command:
        one write and one wake-up of Redis less per batch. Redis answers the commands before
        it at once (the gateways have their replies) and this waits for the claim, which
        blocks when the batcher is empty; what it claimed goes to the batcher, and the next
        turn does not claim again and counts its idle time from the claim (:meth:`_turn`).
        A failed claim is dropped (the next turn claims, and meets the failure there); a
        failure before it raises."""
        claim = None
        if claim_ahead and self.batcher is not None and self.batcher.room and not self.stopping.is_set():
            claim = self._claim(self.scaling.idle_timeout_s)
        async with self.redis.pipeline(transaction=False) as pipe:
            for run in runs or []:
                stats.add_execution(pipe, self.model, run)
            self._add_downloads(pipe)  # a version first asked for now, pulled lazily
            by_list: dict[str, list[bytes]] = {}  # one element per gateway, replies in order
            for queued, payload in pairs:
                by_list.setdefault(queued.reply_to, []).append(payload)
            for reply_to, payloads in by_list.items():
                pipe.rpush(reply_to, b"".join(payloads))  # naiad.codec.decode_replies
                pipe.expire(reply_to, keys.REPLY_TTL_S)
            self.queue.acknowledge(pipe, [queued for queued, _ in pairs])
            if not claim:
                await pipe.execute()
                return
            sent = self.queue.read_on(pipe, *claim)
            *results, reply = await pipe.execute(raise_on_error=False)
        for result in results:
            if isinstance(result, Exception):
                raise result
        if isinstance(reply, Exception):
            logger.debug("claim sent with the replies failed: %s", reply)
            return
        self.batcher.add(await self.queue.claimed(reply, *claim, sent))
        self._claimed_at = sent

    async def _fail_backlog(self, error: NaiadError) -> None:
        """A model that cannot load answers what waits for it with the reason, then exits."""
        while requests := await self.queue.read(100, None):
            await self._reply([(r, encode_reply(Reply(r.queue_id, error=error))) for r in requests])


def expected_ns(by_class: dict[int, int], rows: int) -> float:
    """A batch of ``rows`` rows' expected compute time (ns) from ``by_class`` (the last time
    per size class, ``rows.bit_length()``; see :meth:`Worker._inline`); inf when empty."""
    size_class = rows.bit_length()
    if size_class in by_class:
        return by_class[size_class]
    smaller = [c for c in by_class if c < size_class]
    if smaller:
        nearest = max(smaller)
        return by_class[nearest] * rows / (1 << (nearest - 1))
    return min(by_class.values(), default=math.inf)


def _tensors(arrays: dict[str, np.ndarray]) -> list[Tensor]:
    return [Tensor(name, datatype_of(a.dtype), list(a.shape), a) for name, a in arrays.items()]


def process_started_at() -> float:
    """Epoch seconds when this process was created, to the kernel's clock tick (10 ms): its
    age from ``/proc/self/stat`` against ``CLOCK_BOOTTIME``. (psutil's ``create_time`` adds
    the boot time, which Linux gives in whole seconds: up to 1 s off.)"""
    try:
        with open("/proc/self/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        started_s = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - started_s)
    except (OSError, ValueError, IndexError, AttributeError):  # not Linux
        return psutil.Process().create_time()


def cold_start_phases(
    origin: float, marks: dict[str, float], loads: list[VersionLoad], ready: float
) -> dict[str, float]:
    """Where a cold start's seconds went: ``start`` (origin → the worker runs: for a bare
    process the interpreter, imports and settings; for a warm-pool process the claim reaching
    it), ``registry`` (consumer group, heartbeat and registry entry: the first Redis round
    trips), ``open`` (opening the repository and the rest of the loader's work), ``pull``
    (local cache check, download when missing), ``load`` (the backend's load) and ``warmup``
    (the config's ``model_warmup`` samples, run before the first request is read)."""
    run, registry = marks.get("start", origin), marks.get("registry", origin)
    pull, load = sum(x.pull_s for x in loads), sum(x.load_s for x in loads)
    warmup = sum(x.warmup_s for x in loads)
    return {"start": run - origin, "registry": registry - run,
            "open": max(0.0, ready - registry - pull - load - warmup), "pull": pull, "load": load,
            "warmup": warmup}  # fmt: skip
