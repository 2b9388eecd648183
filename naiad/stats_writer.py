"""Group commit of statistics: the counters of requests that finish together, in one pipeline.

A finished request adds its counters (:mod:`naiad.stats`) with :meth:`StatsWriter.add` and
is answered without waiting for them (a statistics write is not on the answer's path): they
are written in the background, and a reader of the statistics on the same gateway (the
statistics extension, ``/metrics``, the status page) first awaits :meth:`StatsWriter.flush`,
so a client that has its answer still sees its counters there. A request that finishes while
a write is in flight joins the next one: under load, one pipeline (one round trip) carries
the counters of every request that finished meanwhile, instead of one per request, its
counters summed per field (:class:`Counters`). A write lingers :data:`LINGER_S` after its
first counters (as Kafka's ``linger.ms``), unless a reader flushes first: one request at a
time (c=1) then costs one statistics write per tens of requests instead of one each (a
write and a wake-up of Redis, and one of this process for its reply, each ~40–100 µs of CPU
on a 2-core VM; docs/benchmarks.md "Stop 17"; at 10 ms a c1 request still cost 3.4 Redis
commands, at 100 ms 0.3: "Stop 36"). A client answered here that then asks another
gateway finds its counters there unless it asks within that time (no flush covers that
case), and a gateway killed (SIGKILL) loses the counters of its last :data:`LINGER_S` at most.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import operator
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

from naiad import stats
from naiad.redis_client import CommandBatch, HeldConnection

logger = logging.getLogger(__name__)

#: Seconds a statistics write waits after its first counters for more (a reader's flush
#: sends it at once).
LINGER_S = 0.1

#: Queues counters on a pipeline (e.g. :func:`naiad.stats.add_execution` of a batch).
Add = Callable[[Pipeline], None]
#: One request's outcome (:meth:`StatsWriter.add_request`): model, version, ok, failure
#: reason, duration (ns), end (Unix ms).
Outcome = tuple[str, int, bool, str, int, int]


def _add_outcomes(counters: Counters, outcomes: list[Outcome]) -> None:
    """``outcomes`` added to ``counters``, those of one model version, result and reason at
    once (:func:`naiad.stats.add_requests`, each group with its latest end)."""
    durations: dict[tuple[str, int, bool, str], list[int]] = {}
    ends: dict[tuple[str, int, bool, str], int] = {}
    for model, version, ok, reason, duration_ns, now_ms in outcomes:
        group = (model, version, ok, reason)
        durations.setdefault(group, []).append(duration_ns)
        ends[group] = max(ends.get(group, now_ms), now_ms)
    for group, group_ns in durations.items():
        model, version, ok, reason = group
        stats.add_requests(counters, model, version, ok, group_ns, ends[group], reason)  # type: ignore[arg-type]


class Counters:
    """Stands in for a pipeline to the ``add_*`` functions of :mod:`naiad.stats` (HINCRBY,
    HSET, and :func:`naiad.stats.add_counters`' many fields at once), summing what they add
    per hash field; :meth:`queue` sends the sums as one command per hash. A field set
    (HSET) keeps the largest value set within the write: the only ones set are times
    (``<v>:last_inference_ms``, Unix ms), and the requests and batches a write carries come
    in any order (a failure's outcome, a worker's batch statistics), so the newest wins."""

    def __init__(self) -> None:
        self.increments: dict[str, dict[str, int]] = {}
        self.values: dict[str, dict[str, int]] = {}

    def hincrby(self, key: str, name: str, amount: int = 1) -> None:
        fields = self.increments.setdefault(key, {})
        fields[name] = fields.get(name, 0) + int(amount)

    def hset(self, key: str, name: str, value: int) -> None:
        fields = self.values.setdefault(key, {})
        fields[name] = max(fields.get(name, value), value)

    def merge_counters(self, key: str, increments: dict[str, int], values: dict[str, int]) -> None:
        """What :func:`naiad.stats.add_counters` would send as one command, summed in."""
        for name, value in values.items():
            self.hset(key, name, value)
        fields = self.increments.setdefault(key, {})
        # summed by map in C: a batch's ~16 counters without a Python loop (ints already)
        sums = list(map(operator.add, map(fields.get, increments, itertools.repeat(0)), increments.values()))
        fields.update(zip(increments, sums, strict=True))

    def queue(self, pipe: Pipeline) -> None:
        for key in {**self.increments, **self.values}:
            stats.add_counters(pipe, key, self.increments.get(key, {}), self.values.get(key, {}))


class StatsWriter:
    """Writes statistics through ``redis``, one pipeline at a time (see the module doc)."""

    def __init__(self, redis: aioredis.Redis):
        self.redis = redis
        self._connection = HeldConnection(redis)  # one write at a time (_write)
        self._adds: list[Add] = []
        self._requests: list[Outcome] = []  # requests' outcomes (add_request), with ``_adds``
        self._done: asyncio.Future[None] | None = None  # resolved when those are written
        self._sending: asyncio.Future[None] | None = None  # the write in flight
        self._writer: asyncio.Task[None] | None = None
        self._hurry: asyncio.Future[None] | None = None  # resolved: stop lingering

    def add(self, add: Add) -> asyncio.Future[None]:
        """Queue ``add`` for the next write (started now unless one is in flight); the
        future of that write. A failed write is logged here, its waiters see the error."""
        self._adds.append(add)
        return self._next_write()

    def add_request(
        self, model: str, version: int, ok: bool, duration_ns: int, now_ms: int, reason: str = "OTHER"
    ) -> asyncio.Future[None]:
        """:meth:`add` of one request's outcome, kept as a tuple: the write adds those of a
        model version's requests of one result at once (:func:`naiad.stats.add_requests`),
        not request by request."""
        self._requests.append((model, version, ok, reason, duration_ns, now_ms))
        return self._next_write()

    def _next_write(self) -> asyncio.Future[None]:
        if self._done is None:
            self._done = asyncio.get_running_loop().create_future()
        if self._writer is None:  # in a context of its own: its log records belong to no request
            # made now, not when the task first runs: a flush in this loop turn hurries it too
            self._hurry = asyncio.get_running_loop().create_future()
            self._writer = asyncio.create_task(self._write(), context=contextvars.Context())
        return self._done

    async def record(self, add: Add) -> None:
        """Queue ``add`` and wait until it is written. Raises RedisError when that write
        failed. A cancelled caller does not cancel the write (others wait on it)."""
        await asyncio.shield(self.add(add))

    async def flush(self) -> None:
        """Wait until everything added so far is written (or its write failed: logged)."""
        waiting = self._done if self._adds or self._requests else self._sending
        if waiting is not None:
            self._stop_lingering()
            await asyncio.wait([waiting])

    def _stop_lingering(self) -> None:
        if self._hurry is not None and not self._hurry.done():
            self._hurry.set_result(None)

    async def _linger(self) -> None:
        """Wait :data:`LINGER_S`, or until a flush (:meth:`flush`) asks for the write
        (``_hurry``, made by :meth:`add` with this task)."""
        hurry = self._hurry
        assert hurry is not None
        timer = asyncio.get_running_loop().call_later(LINGER_S, self._stop_lingering)
        try:
            await hurry
        finally:
            timer.cancel()
            self._hurry = None

    async def _write(self) -> None:
        try:
            await self._linger()
            while self._adds or self._requests:
                adds, requests, done = self._adds, self._requests, self._done
                self._adds, self._requests, self._done, self._sending = [], [], None, done
                assert done is not None
                counters = Counters()
                try:
                    _add_outcomes(counters, requests)
                except Exception:  # never the write's end: its waiters must hear of it
                    logger.exception("statistics of %d requests not recorded", len(requests))
                for add in adds:
                    try:
                        add(counters)  # type: ignore[arg-type]
                    except Exception:  # a malformed one is dropped, not the write
                        logger.exception("statistics not recorded")
                try:
                    batch = CommandBatch()
                    counters.queue(batch)
                    for reply in await self._connection.send(batch):
                        if isinstance(reply, Exception):
                            raise reply
                except asyncio.CancelledError:
                    for waiting in (done, self._done):
                        if waiting is not None:
                            waiting.cancel()
                    self._adds, self._requests, self._done = [], [], None
                    raise
                except Exception as exc:  # every waiter of this write sees its failure
                    lost = len(adds) + len(requests)
                    logger.warning("statistics of %d requests not recorded: %s", lost, exc)
                    done.set_exception(exc)
                    done.exception()  # retrieved here: nobody may wait on it
                else:
                    if not done.done():
                        done.set_result(None)
        finally:
            self._writer, self._sending = None, None
