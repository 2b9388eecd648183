"""Group commit of statistics: the counters of requests that finish together, in one pipeline.

Each finished request adds its counters (:mod:`naiad.stats`) and waits until they are in
Redis, so a client that has its answer sees them in the statistics extension, as before. A
request that finishes while a write is in flight joins the next one: under load, one
pipeline (one round trip) carries the counters of every request that finished meanwhile,
instead of one per request, its counters summed per field (:class:`Counters`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

from naiad import stats

#: Queues one request's counters on a pipeline (e.g. a partial of :func:`naiad.stats.add_request`).
Add = Callable[[Pipeline], None]


class Counters:
    """Stands in for a pipeline to the ``add_*`` functions of :mod:`naiad.stats` (HINCRBY,
    HSET, EVAL of :data:`naiad.stats.HINCRBY_MANY`), summing what they add per hash field;
    :meth:`queue` sends the sums as one command per hash."""

    def __init__(self) -> None:
        self.increments: dict[str, dict[str, int]] = {}
        self.values: dict[str, dict[str, int]] = {}

    def hincrby(self, key: str, name: str, amount: int = 1) -> None:
        fields = self.increments.setdefault(key, {})
        fields[name] = fields.get(name, 0) + int(amount)

    def hset(self, key: str, name: str, value: int) -> None:
        self.values.setdefault(key, {})[name] = value

    def eval(self, script: str, numkeys: int, key: str, *args: str | int) -> None:
        if script != stats.HINCRBY_MANY or numkeys != 1:
            raise ValueError("only naiad.stats counters can be grouped")
        sets = int(args[0])
        for name, value in zip(args[1 : 1 + 2 * sets : 2], args[2 : 2 + 2 * sets : 2], strict=True):
            self.hset(key, str(name), int(value))
        for name, amount in zip(args[1 + 2 * sets :: 2], args[2 + 2 * sets :: 2], strict=True):
            self.hincrby(key, str(name), int(amount))

    def queue(self, pipe: Pipeline) -> None:
        for key in {**self.increments, **self.values}:
            stats.add_counters(pipe, key, self.increments.get(key, {}), self.values.get(key, {}))


class StatsWriter:
    """Writes statistics through ``redis``, one pipeline at a time (see the module doc)."""

    def __init__(self, redis: aioredis.Redis):
        self.redis = redis
        self._adds: list[Add] = []
        self._done: asyncio.Future[None] | None = None  # resolved when ``_adds`` is written
        self._writer: asyncio.Task[None] | None = None

    async def record(self, add: Add) -> None:
        """Queue ``add`` and wait until it is written. Raises RedisError when that write
        failed. A cancelled caller does not cancel the write (others wait on it)."""
        if self._done is None:
            self._done = asyncio.get_running_loop().create_future()
        self._adds.append(add)
        done = self._done
        if self._writer is None:
            self._writer = asyncio.create_task(self._write())
        await asyncio.shield(done)

    async def _write(self) -> None:
        try:
            while self._adds:
                adds, done = self._adds, self._done
                self._adds, self._done = [], None
                assert done is not None
                counters = Counters()
                for add in adds:
                    add(counters)  # type: ignore[arg-type]
                try:
                    async with self.redis.pipeline(transaction=False) as pipe:
                        counters.queue(pipe)
                        await pipe.execute()
                except asyncio.CancelledError:
                    for waiting in (done, self._done):
                        if waiting is not None:
                            waiting.cancel()
                    self._adds, self._done = [], None
                    raise
                except Exception as exc:  # every waiter of this write sees its failure
                    done.set_exception(exc)
                    done.exception()  # retrieved here too: a lone cancelled waiter may not
                else:
                    if not done.done():
                        done.set_result(None)
        finally:
            self._writer = None
