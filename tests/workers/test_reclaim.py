"""workers.reclaim: a request left by a dead worker runs again, alone, and is given up on
after :data:`MAX_CRASHES` lost deliveries. The decision without servers (which entries a
worker may take, in what order, when one runs alone or is answered instead; the batcher
running a reclaimed request alone), then the delivery counting against a real Redis, the
tests playing the workers that die."""

from __future__ import annotations

import asyncio
from http import HTTPStatus

import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from naiad import keys
from naiad.codec import QueuedRequest, encode_request
from naiad.errors import InferenceFailed
from naiad.inference import InferRequest, Tensor
from naiad.redis_client import connect
from workers import reclaim
from workers.batcher import Batcher, BatchPolicy
from workers.queue_reader import QueueReader

MODEL = "m"
STREAM = keys.request_stream(MODEL)


def pending(entry: int, consumer: str, delivered: int) -> dict:
    """One row of ``XPENDING``'s extended form, as redis-py gives it."""
    return {"message_id": f"{entry}-0".encode(), "consumer": consumer.encode(),
            "time_since_delivered": 5000, "times_delivered": delivered}  # fmt: skip


def test_orphans_are_dead_consumers_entries_and_own_unheld_ones_fewest_deliveries_first():
    rows = [
        pending(1, "dead", 2),
        pending(2, "alive", 1),  # a live worker's: never taken
        pending(3, "dead", 1),
        pending(4, "me", 1),  # held (claimed, not yet answered): not taken
        pending(5, "me", 3),  # its reply could not be sent: taken
        pending(6, "other-dead", 1),
    ]
    found = reclaim.orphans(rows, live={"alive", "me"}, consumer="me", held={b"4-0"})
    assert [p["message_id"] for p in found] == [b"3-0", b"6-0", b"1-0", b"5-0"]
    assert reclaim.orphans(rows, live={"alive", "me", "dead", "other-dead"}, consumer="me",
                           held={b"4-0", b"5-0"}) == []  # fmt: skip


def test_run_alone_then_give_up_after_max_crashes():
    assert reclaim.MAX_CRASHES >= 1
    assert not reclaim.runs_alone(1) and not reclaim.gives_up(1)  # read from the stream
    for deliveries in range(2, reclaim.MAX_CRASHES + 1):  # reclaimed: alone, still run
        assert reclaim.runs_alone(deliveries) and not reclaim.gives_up(deliveries)
    for deliveries in (reclaim.MAX_CRASHES + 1, reclaim.MAX_CRASHES + 5):
        assert reclaim.gives_up(deliveries)
        assert reclaim.lost_deliveries(deliveries) == deliveries - 1


def test_crash_error_is_a_500_naming_the_model_and_the_crashes():
    error = reclaim.crash_error("poison", 3)
    assert isinstance(error, InferenceFailed) and error.status == HTTPStatus.INTERNAL_SERVER_ERROR
    assert error.message == ("model 'poison': the worker running this request exited unexpectedly "
                             "2 times; not retried")  # fmt: skip


def queued(entry: int, deliveries: int = 1, value: float = 0.0) -> QueuedRequest:
    request = InferRequest(MODEL, 1, [Tensor("x", "FP32", [1, 2], np.full((1, 2), value, np.float32))])
    return QueuedRequest(f"q{entry}", request, "r", 1e12, 100.0, f"{entry}-0".encode(), deliveries=deliveries)


def test_the_batcher_runs_a_reclaimed_request_alone_first_without_waiting():
    config = text_format.Parse('name: "m" max_batch_size: 8 dynamic_batching { max_queue_delay_microseconds: '
                               "5000000 }", mc.ModelConfig())  # fmt: skip
    held = Batcher(MODEL, config, BatchPolicy.from_config(config))
    fresh = [queued(1), queued(2), queued(4)]
    again = queued(3, deliveries=2)
    held.add([*fresh, again])
    assert held.take(now=100.001) == ([again], 0.0)  # the others would wait out the 5 s delay
    assert held.take(now=100.001)[0] == []
    assert sorted(q.entry_id for q in held.requests()) == [b"1-0", b"2-0", b"4-0"]
    assert held.take(now=100.001, flush=True)[0] == fresh  # the rest batch together


def fields(value: float) -> dict[bytes, bytes]:
    request = InferRequest(MODEL, 1, [Tensor("x", "FP32", [1, 1], np.array([[value]], np.float32))])
    return encode_request(f"q{value}", request, "reply", 1e12, 0.0)


def value(queued: QueuedRequest) -> float:
    return float(queued.request.inputs[0].data[0, 0])


def run(redis_url: str, scenario) -> None:
    async def main() -> None:
        redis = connect(redis_url, longest_block_s=5)
        await redis.delete(STREAM, keys.workers(MODEL))
        try:
            await scenario(redis)
        finally:
            await redis.aclose()

    asyncio.run(asyncio.wait_for(main(), 60))


async def worker(redis, name: str) -> QueueReader:
    """A live worker: its reader, its heartbeat."""
    reader = QueueReader(redis, MODEL, name)
    await reader.ensure_groups()
    await redis.zadd(keys.workers(MODEL), {name: 1e12})
    return reader


async def dies(redis, name: str) -> None:
    await redis.zrem(keys.workers(MODEL), name)


def test_deliveries_count_only_the_claims_that_run_the_request(redis_url: str) -> None:
    """w1 reads a poison request with a good one and dies. w2 takes them one at a time: the
    poison one first (entry order), alone, and dies running it; the good one, never run by
    w2, is still at one lost delivery for w3, which takes it first; the poison one comes to
    w3 at its third delivery: given up."""

    async def scenario(redis) -> None:
        w1 = await worker(redis, "w1")
        poison = await redis.xadd(STREAM, fields(99))
        await redis.xadd(STREAM, fields(5))
        assert [value(q) for q in await w1.read(10, None)] == [99, 5]
        await dies(redis, "w1")
        w2 = await worker(redis, "w2")
        first = await w2.reclaim(0)
        assert (value(first), first.deliveries) == (99, 2) and not reclaim.gives_up(first.deliveries)
        await dies(redis, "w2")  # running it alone
        w3 = await worker(redis, "w3")
        good = await w3.reclaim(0)
        assert (value(good), good.deliveries) == (5, 2)  # fewest deliveries first
        again = await w3.reclaim(0, held=[good])
        assert (again.entry_id, again.deliveries) == (poison, 3) and reclaim.gives_up(again.deliveries)
        assert await w3.reclaim(0, held=[good, again]) is None
        consumers = await redis.xinfo_consumers(STREAM, keys.WORKER_GROUP)
        assert sorted(c["name"] for c in consumers) == [b"w3"]  # the dead ones left the group

    run(redis_url, scenario)


def test_young_taken_and_deleted_entries_are_not_reclaimed(redis_url: str) -> None:
    async def scenario(redis) -> None:
        w1 = await worker(redis, "w1")
        gone = await redis.xadd(STREAM, fields(1))
        await redis.xadd(STREAM, fields(2))
        await w1.read(10, None)
        await dies(redis, "w1")
        w2 = await worker(redis, "w2")
        assert await w2.reclaim(60_000) is None  # claimed under a minute ago: too young
        await redis.xdel(STREAM, gone)  # answered by w1 after all
        taken = await w2.reclaim(0)
        assert value(taken) == 2
        assert (await redis.xpending(STREAM, keys.WORKER_GROUP))["pending"] == 1  # the deleted one acked

    run(redis_url, scenario)


def test_a_worker_leaving_with_requests_pending_stays_in_the_group(redis_url: str) -> None:
    """Leaving the group would drop the consumer's pending entries: one left unanswered
    (a Redis failure during the drain) keeps it there for another worker's reclaim."""

    async def scenario(redis) -> None:
        w1 = await worker(redis, "w1")
        await redis.xadd(STREAM, fields(3))
        (held,) = await w1.read(1, None)
        await dies(redis, "w1")
        await w1.leave()
        assert [c["name"] for c in await redis.xinfo_consumers(STREAM, keys.WORKER_GROUP)] == [b"w1"]
        w2 = await worker(redis, "w2")
        taken = await w2.reclaim(0)
        assert (taken.entry_id, taken.deliveries) == (held.entry_id, 2)
        async with redis.pipeline(transaction=False) as pipe:
            w2.acknowledge(pipe, [taken])
            await pipe.execute()
        await w2.leave()  # nothing pending: it leaves (w1 left when w2 took its last entry)
        assert await redis.xinfo_consumers(STREAM, keys.WORKER_GROUP) == []

    run(redis_url, scenario)
