"""A worker's standing in the cluster: its heartbeat, what the registry says of its model,
retirement, and leaving.

- **Heartbeat**: the worker's id in the sorted set ``naiad:{m}:workers`` with a deadline of
  three heartbeat periods as its score; the scaler, the gateways and ``naiad_model_workers``
  count live workers from it, and a dead worker's claimed requests are reclaimed once its
  deadline passed (:mod:`workers.reclaim`). While the loop is stalled in a model's call, a
  thread beats instead (:mod:`workers.stand_in`).
- **Registry watch**: once a heartbeat, one ``GET`` of the registry generation; when it
  moved, the model's entry: unloaded, removed or reconfigured → drain and exit (the next
  request cold-starts a fresh worker); only its versions changed (poll mode's new version) →
  *superseded*: serve what is still queued for the loaded versions for at most
  :data:`RETIRE_S`, hand a request for a newer version back to the stream, then exit.
- **Leaving**: deregister, and wake the scaler when a superseded worker leaves a backlog
  behind; an idle worker leaves only if the model's ``min_workers`` allows it and no request
  raced the decision (:mod:`workers.scaling`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

from redis.asyncio import Redis
from redis.exceptions import RedisError

from naiad import keys
from naiad.codec import QueuedRequest
from naiad.errors import NaiadError
from naiad.registry import ModelEntry, RegistryReader
from naiad.settings import Settings
from workers import load_failure, scaling
from workers.loader import VersionLoader
from workers.queue_reader import QueueReader

logger = logging.getLogger(__name__)

#: Longest time a worker whose versions left the policy keeps serving what was queued for
#: them (it stops earlier at an empty queue or at the first request for a newer version).
RETIRE_S = 10.0

#: An idle worker's decision to leave, atomic in Redis: it counts the model's other live
#: workers (heartbeat deadlines from ARGV[1], Unix s, on; itself, ARGV[2], left out) and
#: removes its own heartbeat only when they are at least ARGV[3], the model's
#: ``min_workers`` (an idle worker never leaves fewer live). Returns 1 when it left, else 0.
#: One script, not ZREM then ZCOUNT: a worker that stays is never off the live count (the
#: scaler and ``naiad_model_workers`` read it any time), and of two deciding at once the
#: second counts the first gone and stays.
LEAVE_IF_OTHERS = """
local others = redis.call('ZCOUNT', KEYS[1], ARGV[1], '+inf')
local own = redis.call('ZSCORE', KEYS[1], ARGV[2])
if own and tonumber(own) >= tonumber(ARGV[1]) then others = others - 1 end
if others >= tonumber(ARGV[3]) then
  redis.call('ZREM', KEYS[1], ARGV[2])
  return 1
end
return 0
"""


class Lifecycle:
    """The standing of worker ``worker_id`` of ``model`` (module docstring). ``stopping`` is
    the worker's drain signal: set here when the registry no longer serves what it loaded."""

    def __init__(
        self, settings: Settings, redis: Redis, model: str, worker_id: str, queue: QueueReader,
        loader: VersionLoader, stopping: asyncio.Event,
    ):  # fmt: skip
        self.settings, self.redis, self.model, self.worker_id = settings, redis, model, worker_id
        self.queue, self.loader, self.stopping = queue, loader, stopping
        self.superseded = False  # the registry no longer serves what this worker loaded
        self._retire_by: float | None = None  # versions changed: serve the old queue until then
        self.registry = RegistryReader(redis)
        self._leave_if_others = redis.register_script(LEAVE_IF_OTHERS)
        self._generation: int | None = None
        self.registered_raw: bytes | None = None  # the registry entry as last read

    def deadline(self) -> float:
        """A heartbeat's score: three periods from now (Unix seconds)."""
        return time.time() + 3 * self.settings.heartbeat_s

    async def heartbeat(self) -> None:
        await self.redis.zadd(keys.workers(self.model), {self.worker_id: self.deadline()})

    async def heartbeat_loop(self) -> None:
        """Beat every heartbeat period, and drain when the registry moved on (:meth:`outdated`)."""
        while True:
            await asyncio.sleep(self.settings.heartbeat_s)
            with contextlib.suppress(Exception):
                await self.heartbeat()
                if await self.outdated():
                    self.stopping.set()  # drain: finish what is claimed, then exit

    async def registered(self) -> ModelEntry | None:
        """The model's registry entry (None if it has none), noting the generation first."""
        self._generation = await self.registry.generation()
        entry, self.registered_raw = await self.registry.read(self.model)
        return entry

    async def mark_unavailable(self, tried: bytes, error: NaiadError, version: int) -> None:
        """The load of ``version`` of registry entry ``tried`` failed in the model: mark that
        version failed (the model UNAVAILABLE when it was the only one) with the reason
        (:mod:`workers.load_failure`) before answering the backlog, so a gateway that gets the
        answer already resolves around it. A Redis failure is logged."""
        try:
            if await load_failure.mark_unavailable(self.redis, tried, error.message, version):
                logger.warning("model '%s' version %d marked UNAVAILABLE until it is loaded again",
                               self.model, version)  # fmt: skip
            else:
                logger.info("model '%s' changed in the registry meanwhile: not marked", self.model)
        except RedisError as exc:
            logger.warning("model '%s' not marked UNAVAILABLE: %s", self.model, exc)

    async def outdated(self) -> bool:
        """True when the registry changed (one GET per heartbeat when it did not) and no
        longer serves what this worker loaded: the model was unloaded or removed, or its
        config changed. When only its versions changed it is False but the worker retires
        (module docstring, :meth:`retired`)."""
        loaded = self.loader.entry
        generation = await self.registry.generation()
        if loaded is None or generation is None or generation == self._generation:
            return False  # None: a restarted, empty Redis; a gateway re-indexes, keep serving
        current = await self.registered()
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

    def retired(self) -> bool:
        """True once a superseded worker served the old queue for :data:`RETIRE_S`."""
        if self._retire_by is not None and time.monotonic() > self._retire_by:
            logger.info("model '%s': retiring after %g s", self.model, RETIRE_S)
            return True
        return False

    async def hand_over(self, requests: list[QueuedRequest]) -> list[QueuedRequest]:
        """The requests this worker serves. One for a version it did not load, claimed after
        the registry moved on (a new version raced this worker's drain), goes back to the
        stream (a copy added, the claimed entry acknowledged and deleted, atomically) for the
        successor; this worker drains. Without a registry change it stays (ModelNotFound)."""
        loaded = self.loader.entry
        foreign = [r for r in requests if loaded is not None and r.request.version not in loaded.versions]
        if foreign and not self.superseded:
            await self.outdated()  # marks this worker superseded if the registry moved on
        if not foreign or not self.superseded:
            return requests
        self.stopping.set()
        await self.queue.hand_back(foreign)
        logger.info("handed %d requests for a newer version back to the queue", len(foreign))
        handed = {id(r) for r in foreign}
        return [r for r in requests if id(r) not in handed]

    async def leave_if_idle(self, policy: scaling.ScalingPolicy) -> Sequence[QueuedRequest] | None:
        """Deregister when the model's ``min_workers`` allows (:data:`LEAVE_IF_OTHERS`, one
        atomic step), then look once more: None to leave; else the worker stays, with a
        request that raced the decision to serve (registered again), or none when
        ``min_workers`` needs it (never off the live count then)."""
        keys_, args = [keys.workers(self.model)], [time.time(), self.worker_id, policy.min_workers]
        if not await self._leave_if_others(keys=keys_, args=args):
            await self.heartbeat()  # min_workers needs it: counted live all along, renewed
            return []
        late = await self.queue.read(1, None)
        if not late:
            return None
        await self.heartbeat()
        return late

    async def deregister(self) -> None:
        """Leave the live workers and the consumer group; a superseded worker that leaves a
        backlog wakes the scaler for its successor."""
        with contextlib.suppress(Exception):
            await self.redis.zrem(keys.workers(self.model), self.worker_id)
            await self.queue.leave()
            if self.superseded and await self.queue.backlog():
                await self.redis.rpush(keys.SCALER_WAKE, self.model)  # start the successor now
