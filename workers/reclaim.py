"""Take over the requests a dead worker had claimed but never answered, one at a time.

A worker that dies (SIGKILL, OOM, a crash in native code, a lost machine) leaves its claimed
stream entries in the consumer group's pending entries list (PEL). A live worker of the same
model finds entries whose consumer no longer has a current heartbeat (:func:`naiad.keys.workers`)
and claims them with ``XCLAIM`` (https://redis.io/docs/latest/commands/xclaim/), so they run
again: nothing is lost (at-least-once execution). ``min_idle_ms`` keeps a just-started
consumer's entries safe, and ``XCLAIM``'s own idle check makes two reclaiming workers never
both win an entry.

The request may itself be what killed the worker (a poison request: an input that crashes
the backend). Redis counts each entry's deliveries: ``XREADGROUP`` delivers it once, each
``XCLAIM`` adds one (``XPENDING``'s extended form reports the count as ``times_delivered``),
so every delivery before the current one ended without an answer (:func:`lost_deliveries`).
A reclaimed entry therefore runs alone, never batched with others (:func:`runs_alone`), and
entries are claimed one at a time, just before they run, fewest deliveries first
(:func:`orphans`): only the delivery that runs an entry counts against it, the requests that
shared a poison request's batch are answered, and the poison one kills only the worker running
it alone. After :data:`MAX_CRASHES` lost deliveries an entry is not run again: it is answered
with :func:`crash_error` (:class:`InferenceFailed`, 500) and acknowledged.

The reclaiming worker's own pending entries are taken too, except those it holds (claimed,
not yet answered: ``held``): one pending for it otherwise is one whose reply could not be
sent (Redis was down past the batch's deadline). A worker that exits normally (drain on
SIGTERM, idle exit, retirement) has answered everything it claimed, so it leaves no entry
that counts as lost (:meth:`workers.queue_reader.QueueReader.leave`).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from naiad import keys
from naiad.codec import entry_order
from naiad.errors import InferenceFailed

#: Pending entries inspected per reclaim pass.
SCAN_COUNT = 100

#: Lost deliveries (workers that exited holding the request unanswered) after which a
#: reclaimed request is answered with :func:`crash_error` instead of run again. Two: the
#: first loss may be a batch-mate's fault, so the request gets one run alone; a worker dying
#: again while running nothing else marks the request itself (a crash in native code,
#: ``os._exit``, memory), and more runs would only kill more workers. (Triton fails the
#: requests of a crashed Python-backend stub at once, with no retry.)
MAX_CRASHES = 2


@dataclass(frozen=True)
class Reclaimed:
    """One entry taken over: its id, its fields, and its delivery count now (this one included)."""

    entry_id: bytes
    fields: dict
    deliveries: int


def lost_deliveries(deliveries: int) -> int:
    """Deliveries of an entry, now at ``deliveries``, that ended without an answer: all
    but the current one."""
    return max(0, deliveries - 1)


def runs_alone(deliveries: int) -> bool:
    """True for an entry delivered before (reclaimed): it runs in a batch of its own."""
    return lost_deliveries(deliveries) > 0


def gives_up(deliveries: int) -> bool:
    """True when an entry, now at ``deliveries``, is answered :func:`crash_error`, not run."""
    return lost_deliveries(deliveries) >= MAX_CRASHES


def crash_error(model: str, deliveries: int) -> InferenceFailed:
    """The answer to a request given up on (:func:`gives_up`): 500, naming the model."""
    return InferenceFailed(
        f"model '{model}': the worker running this request exited unexpectedly "
        f"{lost_deliveries(deliveries)} times; not retried"
    )


def orphans(
    pending: Sequence[dict[str, Any]], live: Collection[str], consumer: str, held: Collection[bytes] = ()
) -> list[dict[str, Any]]:
    """The entries of ``pending`` (``XPENDING`` extended form, in entry order) that
    ``consumer`` may take over: a consumer's not in ``live`` (no current heartbeat), and its
    own not in ``held``; fewest ``times_delivered`` first, then in entry order."""
    found = [
        p for p in pending
        if (p["consumer"].decode() == consumer and p["message_id"] not in held)
        or p["consumer"].decode() not in {*live, consumer}
    ]  # fmt: skip
    return sorted(found, key=lambda p: (p["times_delivered"], entry_order(p["message_id"])))


async def reclaim_one(
    redis: aioredis.Redis, model: str, consumer: str, min_idle_ms: int, stream: str | None = None,
    held: Collection[bytes] = (),
) -> Reclaimed | None:  # fmt: skip
    """Claim for ``consumer`` one pending entry of a dead consumer in ``stream`` (default:
    the model's plain request stream; one call per priority level's stream), or one of its
    own not in ``held`` (ids it holds claimed, unanswered); None when none can be taken.

    Entries deleted meanwhile (answered by their first worker after all, withdrawn) are
    acknowledged and skipped. Dead consumers left with nothing pending leave the group.
    """
    stream = stream or keys.request_stream(model)
    pending = await redis.xpending_range(stream, keys.WORKER_GROUP, "-", "+", SCAN_COUNT)
    if not pending:
        return None
    live = {m.decode() for m in await redis.zrangebyscore(keys.workers(model), time.time(), "+inf")}
    taken = None
    for entry in orphans(pending, live, consumer, held):
        if taken := await _claim(redis, stream, consumer, min_idle_ms, entry):
            break
    dead = {p["consumer"].decode() for p in pending} - live - {consumer}
    await _forget(redis, model, stream, dead)
    return taken


async def _claim(
    redis: aioredis.Redis, stream: str, consumer: str, min_idle_ms: int, entry: dict[str, Any]
) -> Reclaimed | None:
    entry_id = entry["message_id"]
    found = await redis.xclaim(stream, keys.WORKER_GROUP, consumer, min_idle_ms, [entry_id])
    if not found:
        return None  # another worker took it first, or it went (Redis 7 drops deleted entries)
    if not found[0][1]:  # deleted meanwhile: Redis 6.2 moves it to our PEL all the same
        await redis.xack(stream, keys.WORKER_GROUP, entry_id)
        return None
    return Reclaimed(entry_id, found[0][1], entry["times_delivered"] + 1)  # XCLAIM added one


async def _forget(redis: aioredis.Redis, model: str, stream: str, consumers: set[str]) -> None:
    for name in consumers:
        info = await redis.xpending_range(stream, keys.WORKER_GROUP, "-", "+", 1, consumername=name)
        if not info:
            await redis.xgroup_delconsumer(stream, keys.WORKER_GROUP, name)
            await redis.zrem(keys.workers(model), name)
