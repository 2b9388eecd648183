"""workers.queue_reader against a real Redis, the test playing the gateways: one stream per
priority level read highest first, a blocking read over all of them, entries withdrawn or
taken over, a dead worker's entries reclaimed per stream, groups re-created after a Redis
that lost them, requests handed back to their own level."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from redis.exceptions import ResponseError

from naiad import keys
from naiad.codec import encode_request
from naiad.inference import InferRequest, Tensor
from naiad.redis_client import connect
from workers.queue_reader import QueueReader

MODEL = "m"


def fields(value: float) -> dict[bytes, bytes]:
    request = InferRequest(MODEL, 1, [Tensor("x", "FP32", [1, 1], np.array([[value]], np.float32))])
    return encode_request(f"q{value}", request, "reply", 1e12, 0.0)


def value(queued) -> float:
    return float(queued.request.inputs[0].data[0, 0])


def run(redis_url: str, scenario) -> None:
    async def main() -> None:
        redis = connect(redis_url, longest_block_s=5)
        reader = QueueReader(redis, MODEL, "w1")
        reader.configure(3)
        await reader.ensure_groups()
        try:
            await scenario(reader, redis)
        finally:
            await redis.aclose()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_reads_the_highest_level_first(redis_url: str) -> None:
    async def scenario(reader: QueueReader, redis) -> None:
        for level, values in ((3, [30, 31]), (1, [10]), (2, [20, 21])):
            for v in values:
                await redis.xadd(keys.request_stream(MODEL, level), fields(v))
        first = await reader.read(3, None)
        assert [(value(q), q.level) for q in first] == [(10, 1), (20, 2), (21, 2)]
        rest = await reader.read(10, None)
        assert [(value(q), q.level) for q in rest] == [(30, 3), (31, 3)]
        assert await reader.read(10, None) == []
        assert await reader.backlog() == 5  # claimed, not yet answered

    run(redis_url, scenario)


def test_blocks_on_every_level_when_all_are_empty(redis_url: str) -> None:
    async def scenario(reader: QueueReader, redis) -> None:
        waiting = asyncio.create_task(reader.read(5, 3000))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await redis.xadd(keys.request_stream(MODEL, 3), fields(7))
        (got,) = await asyncio.wait_for(waiting, 5)
        assert (value(got), got.level) == (7, 3)

    run(redis_url, scenario)


def test_withdrawn_and_answered_entries(redis_url: str) -> None:
    async def scenario(reader: QueueReader, redis) -> None:
        low, high = keys.request_stream(MODEL, 2), keys.request_stream(MODEL, 1)
        withdrawn = await redis.xadd(low, fields(1))
        await redis.xadd(low, fields(2))
        await redis.xadd(high, fields(3))
        claimed = await reader.read(10, None)
        await redis.xack(low, keys.WORKER_GROUP, withdrawn)  # what a gateway does for a gone client
        await redis.xdel(low, withdrawn)
        ours = await reader.still_ours(claimed)
        assert sorted(value(q) for q in ours) == [2, 3]
        async with redis.pipeline(transaction=False) as pipe:
            reader.acknowledge(pipe, ours)
            await pipe.execute()
        assert await reader.backlog() == 0
        assert (await redis.xpending(low, keys.WORKER_GROUP))["pending"] == 0

    run(redis_url, scenario)


def test_reclaims_a_dead_workers_entries_on_every_level(redis_url: str) -> None:
    async def scenario(reader: QueueReader, redis) -> None:
        for level in (1, 3):
            stream = keys.request_stream(MODEL, level)
            await redis.xadd(stream, fields(level))
            await redis.xreadgroup(keys.WORKER_GROUP, "dead", {stream: ">"}, count=1)
        await redis.zadd(keys.workers(MODEL), {"w1": 1e12})  # only w1 has a live heartbeat
        first = await reader.reclaim(0)  # one at a time, highest level first
        second = await reader.reclaim(0, held=[first])
        assert (value(first), first.level, value(second), second.level) == (1, 1, 3, 3)
        assert first.deliveries == second.deliveries == 2
        assert await reader.reclaim(0, held=[first, second]) is None
        assert [value(q) for q in await reader.still_ours([first, second])] == [1, 3]
        consumers = await redis.xinfo_consumers(keys.request_stream(MODEL, 3), keys.WORKER_GROUP)
        assert [c["name"] for c in consumers] == [b"w1"]  # the dead one left the group

    run(redis_url, scenario)


def test_groups_come_back_after_redis_lost_them(redis_url: str) -> None:
    async def scenario(reader: QueueReader, redis) -> None:
        await redis.flushall()
        with pytest.raises(ResponseError, match="NOGROUP"):
            await reader.read(1, None)
        await reader.ensure_groups()
        await redis.xadd(keys.request_stream(MODEL, 2), fields(5))
        assert [value(q) for q in await reader.read(1, None)] == [5]

    run(redis_url, scenario)


def test_hand_back_keeps_the_level(redis_url: str) -> None:
    async def scenario(reader: QueueReader, redis) -> None:
        stream = keys.request_stream(MODEL, 3)
        await redis.xadd(stream, fields(4))
        (queued,) = await reader.read(1, None)
        await reader.hand_back([queued])
        assert (await redis.xpending(stream, keys.WORKER_GROUP))["pending"] == 0
        assert await redis.xlen(stream) == 1
        again = await reader.read(1, None)
        assert [(value(q), q.level) for q in again] == [(4, 3)]

    run(redis_url, scenario)


def test_fresh_claims_are_not_asked_about(redis_url: str) -> None:
    """With ``fresh_s``, entries claimed by a read sent less than that ago count as ours
    without a round trip (withdrawn or not); older claims are asked about again."""

    async def scenario(reader: QueueReader, redis) -> None:
        low = keys.request_stream(MODEL, 2)
        withdrawn = await redis.xadd(low, fields(1))
        await redis.xadd(low, fields(2))
        claimed = await reader.read(10, None)
        await redis.xack(low, keys.WORKER_GROUP, withdrawn)
        await redis.xdel(low, withdrawn)
        assert sorted(value(q) for q in await reader.still_ours(claimed, fresh_s=60)) == [1, 2]
        await asyncio.sleep(0.05)
        assert [value(q) for q in await reader.still_ours(claimed, fresh_s=0.01)] == [2]

    run(redis_url, scenario)
