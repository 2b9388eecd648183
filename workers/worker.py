"""One worker process serving one model: pull, load, read the queue, batch, run, reply.

:class:`Worker` orchestrates; each concern has its own module:

- the queue (:mod:`workers.queue_reader`): its model's Redis streams read as a member of the
  consumer group :data:`naiad.keys.WORKER_GROUP` (XREADGROUP, blocking), claims, withdrawals,
  acknowledgements;
- dynamic batching (:mod:`workers.batcher`, :mod:`workers.batching`): per the config's
  ``dynamic_batching``;
- running a batch and timing Triton's phases (:mod:`workers.execution`);
- the reply pipeline, which also sends the next claim (:mod:`workers.replies`);
- heartbeat, registry watch, retirement and leaving (:mod:`workers.lifecycle`);
- requests dead workers left claimed (:mod:`workers.reclaim`);
- the cold-start record (:mod:`workers.cold_start`).

The worker exits after its model's idle timeout without requests (scale to zero) unless that
would leave fewer live workers than the model's ``min_workers`` (:mod:`workers.scaling`), and
on SIGTERM it stops claiming, finishes what it claimed, then exits (drain). When the registry
stops serving what it loaded (unload, changed config, a new version), it drains the same way;
a request it claimed for a version it did not load goes back to the stream for its successor.
A load that fails in the model itself (backend error, failing warmup) marks the model
UNAVAILABLE in the registry with the reason (:mod:`workers.load_failure`), then the worker
answers what waits with it and exits 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from naiad import ids, logs, loop_stall, procs, queue_policy, stats, tasks
from naiad.codec import DATA, HEADER, QueuedRequest, Reply, decode_request, encode_reply, entry_order
from naiad.errors import DeadlineExceeded, InvalidInput, NaiadError, QueueTimeout
from naiad.redis_client import connect
from naiad.reply_channel import MAX_OFFER
from naiad.settings import Settings
from repository_store import RepositoryStore
from workers import bls, cold_start, load_failure, rate_limiter, reclaim, scaling
from workers.batcher import Batcher, BatchPolicy
from workers.execution import BatchExecutor
from workers.lifecycle import Lifecycle
from workers.loader import VersionLoader
from workers.queue_reader import FRESH_S, QueueReader
from workers.replies import REDIS_BACKOFF_S, ReplySender
from workers.stand_in import HeartbeatStandIn

logger = logging.getLogger(__name__)

#: Redis checks blocked clients' timeouts only every ``1000/hz`` ms (100 ms at the default
#: ``hz 10``): a blocking claim while a batch waits ends this much before the batching delay.
BLOCK_MARGIN_S = 0.11
#: The step of the sleep-and-claim rounds of a short batching wait (seconds).
WAIT_STEP_S = 0.001
#: Longest wait (seconds) for the frames still being written to gateways before a batch
#: stalls the loop (a Python model's): a gateway that stopped reading does not hold the worker.
FLUSH_S = 1.0


def _arrival_order(pair: tuple[QueuedRequest, bytes]) -> tuple[tuple[int, int], float]:
    """Replies in the order their requests arrived: stream entries by id, then by enqueue time."""
    return entry_order(pair[0].entry_id), pair[0].enqueued_at


def _set_once(future: asyncio.Future[None], _: object = None) -> None:
    if not future.done():
        future.set_result(None)


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
        self.worker_id = worker_id or settings.worker_id or ids.worker_id(model)
        self.prepared = prepared
        self.redis = (prepared and prepared.redis) or connect(redis_url, 1.0, tolerate_stalls=True)
        self.redis_url = redis_url
        self.stopping = asyncio.Event()
        self.queue = QueueReader(self.redis, model, self.worker_id)
        self.loader = VersionLoader(settings, model, prepared.store if prepared else None)
        self.executor = BatchExecutor(model, self.loader)
        self.replies = ReplySender(self.redis, model, self.queue, self.loader)
        self.direct = self.replies.direct  # gateways on this machine (naiad.reply_channel)
        self.replies.on_redis_failure = self._give_back_handed
        self.direct.on_request, self.direct.on_withdraw = self._handed, self._withdrawn
        self.direct.on_read = self._handed_read
        self._handed_over: list[QueuedRequest] = []  # requests gateways handed over directly
        self._arrival: asyncio.Future[None] | None = None  # set when one comes while waiting
        #: A blocking claim still out: a request handed over directly came first (_collect).
        self._claiming: asyncio.Future[tuple[list[QueuedRequest], float] | None] | None = None
        self.lifecycle = Lifecycle(settings, self.redis, model, self.worker_id, self.queue, self.loader,
                                   self.stopping)  # fmt: skip
        self.stand_in = HeartbeatStandIn(redis_url, model, self.worker_id, settings.heartbeat_s,
                                         self.lifecycle.deadline)  # fmt: skip
        self._marks: dict[str, float] = {}  # cold-start phases: name -> epoch seconds at its end
        self.policy: BatchPolicy | None = None
        self.batcher: Batcher | None = None  # the claimed requests not yet run
        self.scaling = scaling.default_policy(settings)
        self._next_reclaim = 0.0
        self._claimed_at: float | None = None  # monotonic: the next turn's claim went out with replies
        self._served_at = 0.0  # monotonic: the last request answered within its arrival's turn (_run_now)

    async def run(self) -> int:
        self._marks["start"] = time.time()
        logs.MODEL.set(self.model)  # every record of this worker names its model
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        loop_stall.keep_signals((signal.SIGTERM, signal.SIGINT), self.stopping.set)  # a model's own loop
        self.loader.thread.before_first_call = self.stand_in.start  # beats while a call stalls the loop
        await self.queue.ensure_groups()
        await self.lifecycle.heartbeat()
        beat = asyncio.create_task(self.lifecycle.heartbeat_loop())
        calls = bls.install(self.settings, self.redis_url, self.worker_id)  # Python models' BLS
        try:
            return await self._load_and_serve()
        finally:
            self.direct.close()  # the gateways queue what they handed here unanswered
            await self.loader.thread.run(self.loader.close)  # backends' close(): Python models' finalize()
            await calls.close()
            await tasks.cancel_and_wait(beat)
            self.stand_in.stop()
            await self.lifecycle.deregister()
            await self.redis.aclose()

    async def _load_and_serve(self) -> int:
        tried: bytes | None = None  # the READY registry entry this worker loads, as read
        try:
            registered = await self.lifecycle.registered()
            tried = self.lifecycle.registered_raw if registered is not None and registered.ready else None
            self._marks["registry"] = time.time()
            if registered is not None and registered.config is not None:  # its priority levels
                self.queue.configure(queue_policy.priority_levels(registered.config))
                await self.queue.ensure_groups()
            entry = await self.loader.start(registered)
            self.executor.rate_limit = await rate_limiter.for_worker(
                self.settings, self.redis, self.worker_id, entry.config
            )
        except NaiadError as exc:
            logger.error("model '%s' cannot be served: %s", self.model, exc.message)
            if tried is not None and load_failure.is_model_fault(exc):
                await self.lifecycle.mark_unavailable(tried, exc, max(registered.versions))
            await self._fail_backlog(exc)
            return 2
        self.policy = BatchPolicy.from_config(entry.config)
        self.batcher = Batcher(self.model, entry.config, self.policy)
        self.direct.offer_count = min(self.policy.max_batch_size, MAX_OFFER) if self.policy.enabled else 1
        self.scaling = scaling.policy_for(entry.config, self.settings)
        origin = self.prepared.claimed_at if self.prepared else cold_start.process_started_at()
        await cold_start.record(self.redis, self.model, origin, self.prepared is not None, self._marks,
                                self.loader.take_loads(), self.replies)  # fmt: skip
        procs.report_ready()  # the scaler: this worker got past its load (workers.scaler)
        await self._serve()
        return 0

    async def _serve(self) -> None:
        """Serve until idle, told to stop, or retired. A Redis failure (an outage, a restart)
        never ends the worker: it backs off and tries again; a group lost with a restarted
        Redis's memory (NOGROUP) is created again. On the way out it runs what it still holds
        claimed (:meth:`_drain`). On a Redis failure it closes its connections to gateways
        (:meth:`_give_back_handed`), so no request waits here on a Redis that is down."""
        assert self.policy is not None and self.loader.entry is not None
        offer = (self.model, sorted(self.loader.entry.versions))
        idle_since, backoff = time.monotonic(), REDIS_BACKOFF_S[0]
        self.direct.offer = offer
        while not self.stopping.is_set() and not self.lifecycle.retired():
            try:
                turn = await self._turn(idle_since)
            except RedisError as exc:
                self._give_back_handed()
                await self._redis_failed(exc, backoff)
                backoff = min(backoff * 2, REDIS_BACKOFF_S[1])
                continue
            backoff, self.direct.offer = REDIS_BACKOFF_S[0], offer  # withdrawn by an idle exit that stayed
            if turn is None:
                break
            idle_since = max(turn, self._served_at)  # requests answered at once count as work
        await self._drain()

    async def _drain(self) -> None:
        """Run every request still held, without batching delays; a Redis failure leaves the
        rest pending for another worker's reclaim."""
        assert self.batcher is not None
        self.direct.withdraw_all()
        try:
            if self._claiming is not None:
                await self._collect(wait=False, finish=True)
            self._take_handed()
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
        self._take_handed()
        if remaining <= 0 and not len(self.batcher) and self._claiming is None:
            return await self._leave_if_idle()
        if self._claiming is not None and self._claiming.done():  # its entries are ours: held,
            await self._collect(wait=False)  # not a dead worker's for the reclaim pass
        self.batcher.add(await self._reclaim())
        if self._claimed_at is not None:  # this turn's claim went out with the last replies
            self._claimed_at = None
        elif self._claiming is None:
            count, block_ms = self._claim(remaining)
            if block_ms is not None and self.direct.connected and self.direct.offer is not None:
                self._claiming = asyncio.ensure_future(self._read(count, block_ms))
            else:
                self.batcher.add(await self.queue.read(count, block_ms))
        if self._claiming is not None:
            await self._collect(wait=not len(self.batcher))
        if not len(self.batcher):
            return None if self.lifecycle.superseded else idle_since  # retiring, and nothing is queued
        await self._process(*await self._next_batch(), claim_ahead=True)
        return self._claimed_at if self._claimed_at is not None else time.monotonic()

    async def _leave_if_idle(self) -> float | None:
        """Idle past the idle timeout: no more requests handed over directly, then leave
        (None) unless a request raced the decision or ``min_workers`` keeps this worker
        (:meth:`Lifecycle.leave_if_idle`): then the new start of its idle time."""
        assert self.batcher is not None
        self.direct.withdraw_all()  # offered again by the next turn when this worker stays
        late = await self.lifecycle.leave_if_idle(self.scaling)
        if late is None and self._handed_over:  # handed over before the gateway saw the withdrawal
            await self.lifecycle.heartbeat()
            late = []
        if late is None:
            logger.info("idle for %g s, exiting (scale to zero)", self.scaling.idle_timeout_s)
            return None
        self.batcher.add(late)  # served by the next turns
        return time.monotonic()  # kept (a late request, or the minimum)

    def _handed(self, level: int, header: bytes, data: bytes) -> None:
        """A request a gateway handed over directly (:mod:`naiad.reply_channel`): held until
        the next turn takes it; a wait for work ends (:meth:`_collect`)."""
        try:
            queued = decode_request(self.model, {HEADER: header, DATA: data})
        except InvalidInput:
            logger.exception("dropping a malformed request handed over by a gateway")
            return
        queued.level, queued.claimed_at = level, time.monotonic()
        self._handed_over.append(queued)

    def _handed_read(self) -> None:
        """The requests of one read are all handed over: a wait for work ends, unless a lone
        one is answered at once (:meth:`_run_now`)."""
        arrival, claiming = self._arrival, self._claiming
        if arrival is None or not self._handed_over:
            return
        # a claim back already (its entries not yet in the batcher) goes with them: no lane
        if arrival.done() or (claiming is not None and claiming.done()) or not self._run_now():
            _set_once(arrival)

    def _run_now(self) -> bool:
        """Run and answer a lone request handed to this idle worker (its serve loop waiting
        for work, holding nothing) within this turn of the event loop, when nothing of its
        way needs awaiting (:meth:`BatchExecutor.runnable_now`, :meth:`ReplySender.takes_now`)
        and the batcher has it due now (not held for a batching delay): the way of
        :meth:`_process` without the serve loop's wake-up and turn (docs/benchmarks.md "Stop
        40"). True when it was answered; False leaves it to the serve loop."""
        batcher = self.batcher
        if batcher is None or len(self._handed_over) != 1 or len(batcher):
            return False
        queued = self._handed_over[0]
        loaded, version = self.loader.entry, queued.request.version
        if self.stopping.is_set() or loaded is None or version not in loaded.versions:
            return False
        runner = self.executor.runnable_now(version, sum([t.data.size for t in queued.request.inputs]))
        if runner is None or not self.replies.takes_now(queued) or self.direct.unsent():
            return False  # (unsent: a frame still being written goes before the loop stalls, _process)
        self._take_handed()
        batch, rejected, _ = self._due(time.time())
        if not batch and not rejected:
            return False  # held for a batching delay: the serve loop waits for it
        live, pairs = self._refused([*batch, *rejected], rejected)
        runs: list[stats.Execution] = []
        if live:
            payloads, run = self.executor.execute_now(runner, live)
            pairs += zip(live, payloads, strict=True)
            runs += [run] if run is not None else []
        pairs.sort(key=_arrival_order)
        idle = not (len(batcher) or self._handed_over or self.stopping.is_set())
        if not self.replies.send_now(pairs, runs, offer=idle):  # cannot happen within the turn
            raise RuntimeError("a reply checked to go at once did not")
        self._served_at = time.monotonic()
        return True

    def _withdrawn(self, queue_id: str) -> None:
        """A gateway withdrew a request it handed over (its caller went away): dropped
        unless it is running already."""
        held = self.batcher.requests() if self.batcher is not None else []
        gone = [q for q in (*self._handed_over, *held) if not q.entry_id and q.queue_id == queue_id]
        self._handed_over = [q for q in self._handed_over if q.queue_id != queue_id]
        if self.batcher is not None:
            self.batcher.remove(gone)
        if gone:
            logger.info("skipped a request withdrawn by its gateway")

    def _give_back_handed(self) -> None:
        """Close the connections to gateways: each queues what it handed here and was not
        answered through Redis itself (refused at once while Redis is down); none is run
        here. A worker connects again with its next direct reply."""
        self.direct.close()
        self._handed_over = []
        if self.batcher is not None:
            self.batcher.remove([q for q in self.batcher.requests() if not q.entry_id])

    def _take_handed(self) -> None:
        if self._handed_over and self.batcher is not None:
            self.batcher.add(self._handed_over)
            self._handed_over = []

    async def _read(self, count: int, block_ms: int | None) -> tuple[list[QueuedRequest], float]:
        sent = time.monotonic()
        return await self.queue.read(count, block_ms), sent

    async def _collect(self, wait: bool, finish: bool = False) -> float | None:
        """Take what the blocking claim still out (``_claiming``) got, when it is back, and
        the requests handed over meanwhile; the claim's send time (monotonic s) when it came
        back with this call, else None. ``wait``: first wait for the claim or a request
        handed over, whichever comes first, with this worker's offer open at every gateway
        it is connected to; ``finish``: wait for the claim alone. Raises the claim's error."""
        assert self.batcher is not None and self._claiming is not None
        claiming = self._claiming
        if finish:
            await asyncio.wait([claiming])
        elif wait and not claiming.done() and not self._handed_over:
            # after the steps already due: a reply being written carries the offer (one write)
            asyncio.get_running_loop().call_soon(self.direct.offer_all)
            await self._arrival_of(claiming)
        self._take_handed()
        if not claiming.done():
            return None
        self._claiming = None
        claimed = claiming.result()
        if claimed is None:
            return None
        self.batcher.add(claimed[0])
        return claimed[1]

    async def _arrival_of(self, claiming: asyncio.Future, timeout_s: float | None = None) -> None:
        """Wait until ``claiming`` is back or a request is handed over (or ``timeout_s``
        seconds pass): one future that any of them sets (cheaper than ``asyncio.wait``)."""
        loop = asyncio.get_running_loop()
        arrival = self._arrival = loop.create_future()
        wake = functools.partial(_set_once, arrival)
        claiming.add_done_callback(wake)
        timer = loop.call_later(timeout_s, wake) if timeout_s is not None else None
        try:
            await arrival
        finally:
            claiming.remove_done_callback(wake)
            if timer is not None:
                timer.cancel()
            arrival.cancel()
            self._arrival = None

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

    async def _next_batch(self) -> tuple[list[QueuedRequest], list[QueuedRequest]]:
        """Dynamic batching: the batch to run and the requests whose queue timeout passed
        under REJECT (either may be empty, not both). While the batcher wants to wait (for a
        preferred batch size within ``max_queue_delay_microseconds``, or a queue timeout), it
        claims what comes meanwhile (:meth:`_wait_for_more`) and asks the batcher again.
        """
        assert self.batcher is not None
        while True:
            self._take_handed()
            batch, rejected, wait_s = self._due(time.time())
            if batch or rejected or not len(self.batcher):
                return batch, rejected
            await self._wait_for_more(wait_s)

    async def _wait_for_more(self, wait_s: float) -> None:
        """Claim what arrives within ``wait_s`` seconds, returning as soon as something does,
        so a preferred batch size is sent the moment it can be formed (Triton batcher.md).
        A long wait blocks on the streams (Redis answers at the first arrival) for all but
        :data:`BLOCK_MARGIN_S` of it (a blocked read may wake that late); the rest, and a
        short wait, is slept in steps of :data:`WAIT_STEP_S` with a claim after each. While
        the serve loop's blocking claim is out, that claim is waited for instead (with the
        requests handed over): a second one would miss what Redis gives the first."""
        assert self.batcher is not None
        room = self.batcher.room
        if self._claiming is not None:  # the serve loop's blocking claim is still out: Redis
            # gives what arrives to it first (the oldest blocked reader), so it is waited for
            if not self._handed_over and not self._claiming.done():
                await self._arrival_of(self._claiming, wait_s)
            await self._collect(wait=False)
        elif not room:
            await asyncio.sleep(wait_s)
        elif wait_s > 2 * BLOCK_MARGIN_S:
            block_s = min(wait_s - BLOCK_MARGIN_S, 1.0)  # the client's longest block
            self.batcher.add(await self.queue.read(room, int(block_s * 1000)))
        else:
            await asyncio.sleep(min(wait_s, WAIT_STEP_S))
            self.batcher.add(await self.queue.read(room, None))

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
        (:meth:`_reply`)."""
        requests = await self.queue.still_ours([*batch, *rejected], FRESH_S)
        if not requests:
            return
        live, pairs = self._refused(requests, rejected)
        live = await self.lifecycle.hand_over(live)
        runs: list[stats.Execution] = []
        if live:
            if self.loader.thread.on_loop:  # what is still being written goes before the loop stalls
                await self.direct.flushed(FLUSH_S)
            payloads, run = await self.executor.execute(live)
            pairs += zip(live, payloads, strict=True)
            runs += [run] if run is not None else []
        pairs.sort(key=_arrival_order)
        await self._reply(pairs, runs, claim_ahead)

    @staticmethod
    def _refused(
        requests: list[QueuedRequest], rejected: Sequence[QueuedRequest]
    ) -> tuple[list[QueuedRequest], list[tuple[QueuedRequest, bytes]]]:  # fmt: skip
        """``requests`` split into those to run and the answers of those refused: the
        ``rejected`` (:class:`QueueTimeout`) and any past its deadline (:class:`DeadlineExceeded`)."""
        turned_away, now = {id(r) for r in rejected}, time.time()
        live: list[QueuedRequest] = []
        pairs: list[tuple[QueuedRequest, bytes]] = []
        for r in requests:
            if id(r) in turned_away:
                error: NaiadError = QueueTimeout("Request timeout expired")  # Triton's words
            elif r.deadline <= now:
                error = DeadlineExceeded("request expired in the queue")
            else:
                live.append(r)
                continue
            pairs.append((r, encode_reply(Reply(r.queue_id, error=error))))
        return live, pairs

    async def _reply(
        self, pairs: list[tuple[QueuedRequest, bytes]], runs: Sequence[stats.Execution] = (),
        claim_ahead: bool = False,
    ) -> None:  # fmt: skip
        """Answer ``pairs`` and record ``runs`` (:meth:`ReplySender.send`). With
        ``claim_ahead`` and unless stopping, the next turn's claim (:meth:`_claim`, its idle
        time starting now) goes with them: what it claimed goes to the batcher, and the next
        turn does not claim again and counts its idle time from the claim (:meth:`_turn`)."""
        claim, batcher = None, self.batcher
        ahead = claim_ahead and self._claiming is None and not self.stopping.is_set()
        if ahead and batcher is not None and batcher.room:
            claim = self._claim(self.scaling.idle_timeout_s)
        idle = not (batcher is None or len(batcher) or self._handed_over or self.stopping.is_set())
        sending = self.replies.send(pairs, runs, claim, offer=idle)
        if claim is None or claim[1] is None or self.direct.offer is None:
            claimed = await sending
            if claimed is not None and batcher is not None:
                batcher.add(claimed[0])
                self._claimed_at = claimed[1]
            return
        # the claim blocks: a request handed over directly may come first (_collect)
        self._claiming = asyncio.ensure_future(sending)
        self._claimed_at = await self._collect(wait=True)

    async def _fail_backlog(self, error: NaiadError) -> None:
        """A model that cannot load answers what waits for it with the reason, then exits."""
        while requests := await self.queue.read(100, None):
            await self._reply([(r, encode_reply(Reply(r.queue_id, error=error))) for r in requests])
