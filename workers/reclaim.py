"""Take over the requests a dead worker had claimed but never answered.

A worker that dies (SIGKILL, OOM, a lost machine) leaves its claimed stream entries in the
consumer group's pending entries list (PEL). A live worker of the same model finds entries
whose consumer no longer has a current heartbeat (:func:`naiad.keys.workers`) and claims
them with ``XCLAIM`` (https://redis.io/docs/latest/commands/xclaim/), so they run again:
at-least-once execution. ``min_idle_ms`` keeps a just-started consumer's entries safe, and
``XCLAIM``'s own idle check makes two reclaiming workers never both win an entry.

The reclaiming worker's own pending entries are taken too: a worker reclaims only between
batches, so an entry still pending for it then is one whose reply could not be sent (Redis
was down past the batch's deadline), never one it is running.
"""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from naiad import keys

#: Pending entries inspected per reclaim pass.
SCAN_COUNT = 100


async def reclaim_orphans(
    redis: aioredis.Redis, model: str, consumer: str, min_idle_ms: int, stream: str | None = None
) -> list[tuple[bytes, dict]]:
    """Claim for ``consumer`` the pending entries of dead consumers in ``stream`` (default:
    the model's plain request stream; one call per priority level's stream), and its own
    left over from a failed reply; returns ``(id, fields)``.

    Entries deleted meanwhile (answered by their first worker after all) are skipped.
    Dead consumers left with nothing pending are removed from the group.
    """
    stream = stream or keys.request_stream(model)
    pending = await redis.xpending_range(stream, keys.WORKER_GROUP, "-", "+", SCAN_COUNT)
    if not pending:
        return []
    live = {m.decode() for m in await redis.zrangebyscore(keys.workers(model), time.time(), "+inf")}
    orphans = [p["message_id"] for p in pending if p["consumer"].decode() not in live - {consumer}]
    if not orphans:
        return []
    claimed = await redis.xclaim(stream, keys.WORKER_GROUP, consumer, min_idle_ms, orphans)
    dead = {p["consumer"].decode() for p in pending} - live - {consumer}
    await _forget(redis, model, stream, dead)
    return [(entry_id, fields) for entry_id, fields in claimed if fields]


async def _forget(redis: aioredis.Redis, model: str, stream: str, consumers: set[str]) -> None:
    for name in consumers:
        info = await redis.xpending_range(stream, keys.WORKER_GROUP, "-", "+", 1, consumername=name)
        if not info:
            await redis.xgroup_delconsumer(stream, keys.WORKER_GROUP, name)
            await redis.zrem(keys.workers(model), name)
