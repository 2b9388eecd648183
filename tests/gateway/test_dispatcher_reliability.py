"""The queue client against a real Redis, the test playing the worker: a late duplicate
reply is dropped, a full queue refuses at once and atomically, a cancelled or timed-out
request withdraws its entry."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from naiad_harness import run_dispatcher_scenario

from naiad import keys
from naiad.codec import Reply, decode_request, encode_reply
from naiad.errors import DeadlineExceeded, Overloaded
from naiad.inference import InferRequest, Tensor
from naiad.queue_client import QueueDispatcher
from naiad.queue_policy import Placement

MODEL = "m"
STREAM = keys.request_stream(MODEL)


def request(value: float) -> InferRequest:
    return InferRequest(MODEL, 1, [Tensor("x", "FP32", [1, 1], np.array([[value]], np.float32))])


def answer(queue_id: str, value: float) -> bytes:
    return encode_reply(Reply(queue_id, [Tensor("y", "FP32", [1, 1], np.array([[value]], np.float32))]))


def run(redis_url: str, scenario) -> None:
    run_dispatcher_scenario(redis_url, scenario, [STREAM])


async def claim(redis, count: int = 10) -> list:
    """XREADGROUP as a worker would; the decoded requests."""
    got = await redis.xreadgroup(keys.WORKER_GROUP, "w", {STREAM: ">"}, count=count, block=2000)
    return [decode_request(MODEL, fields, entry_id) for _, entries in got for entry_id, fields in entries]


def test_a_late_duplicate_reply_is_dropped(redis_url: str) -> None:
    async def scenario(dispatcher: QueueDispatcher, redis) -> None:
        first = asyncio.create_task(dispatcher.infer(request(1), 10))
        (queued,) = await claim(redis)
        await redis.rpush(queued.reply_to, answer(queued.queue_id, 1.0))
        response = await first
        assert response.outputs[0].data.tolist() == [[1.0]]
        # the duplicate execution's reply, different, arrives late: nobody waits for it
        await redis.rpush(queued.reply_to, answer(queued.queue_id, 99.0))
        second = asyncio.create_task(dispatcher.infer(request(2), 10))
        (next_queued,) = await claim(redis)
        await redis.rpush(next_queued.reply_to, answer(next_queued.queue_id, 2.0))
        assert (await second).outputs[0].data.tolist() == [[2.0]]
        assert not dispatcher._pending  # noqa: SLF001 - nothing left waiting
        assert await redis.llen(queued.reply_to) == 0  # the late reply was read and dropped

    run(redis_url, scenario)


def test_a_full_queue_refuses_at_once_and_atomically(redis_url: str) -> None:
    async def scenario(dispatcher: QueueDispatcher, redis) -> None:
        waiting = [asyncio.create_task(dispatcher.infer(request(i), 10, max_queue=3)) for i in range(3)]
        while await redis.xlen(STREAM) < 3:
            await asyncio.sleep(0.01)
        with pytest.raises(Overloaded, match="is full"):
            await asyncio.wait_for(dispatcher.infer(request(9), 10, max_queue=3), 1)
        # 50 racing callers against room for 2: exactly 2 get in (the check is in the script)
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        while await redis.xlen(STREAM) > 0:  # withdrawn by the cancellations
            await asyncio.sleep(0.01)
        await redis.xadd(STREAM, {"h": b"x"})
        racers = [asyncio.create_task(dispatcher.infer(request(i), 1, max_queue=3)) for i in range(50)]
        results = await asyncio.gather(*racers, return_exceptions=True)
        refused = sum(isinstance(r, Overloaded) for r in results)
        timed_out = sum(isinstance(r, DeadlineExceeded) for r in results)
        assert (refused, timed_out) == (48, 2)

    run(redis_url, scenario)


def test_max_queue_counts_waiting_requests_not_executing_ones(redis_url: str) -> None:
    """Triton's ``max_queue_size`` bounds the scheduler's queue only: with a bound of 2 and
    ``max_batch_size`` 1, a live worker's claimed request is executing, so two more wait and
    the fourth is refused. Claims beyond one batch per live worker, and a dead worker's
    claims, still count as waiting."""

    async def scenario(dispatcher: QueueDispatcher, redis) -> None:
        placement = Placement(0, STREAM, 2, 0.0, True, False, batch=1)
        await redis.zadd(keys.workers(MODEL), {"w": time.time() + 60})  # "w" is live
        tasks = [asyncio.create_task(dispatcher.infer(request(0), 10, placement=placement))]
        assert len(await claim(redis, 1)) == 1  # executing
        tasks += [asyncio.create_task(dispatcher.infer(request(i), 10, placement=placement)) for i in (1, 2)]
        while await redis.xlen(STREAM) < 3:
            await asyncio.sleep(0.01)
        with pytest.raises(Overloaded, match="is full"):
            await asyncio.wait_for(dispatcher.infer(request(3), 10, placement=placement), 1)
        assert len(await claim(redis, 2)) == 2  # claimed past one batch: still waiting
        with pytest.raises(Overloaded):
            await asyncio.wait_for(dispatcher.infer(request(4), 10, placement=placement), 1)
        wider = Placement(0, STREAM, 2, 0.0, True, False, batch=2)  # two executing: one waits
        tasks.append(asyncio.create_task(dispatcher.infer(request(5), 10, placement=wider)))
        while await redis.xlen(STREAM) < 4:
            await asyncio.sleep(0.01)
        await redis.zadd(keys.workers(MODEL), {"w": time.time() - 1})  # "w" died: its claims wait
        with pytest.raises(Overloaded):
            await asyncio.wait_for(dispatcher.infer(request(6), 10, placement=wider), 1)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    run(redis_url, scenario)


def test_cancelled_and_timed_out_requests_withdraw_their_entries(redis_url: str) -> None:
    async def scenario(dispatcher: QueueDispatcher, redis) -> None:
        unclaimed = asyncio.create_task(dispatcher.infer(request(1), 10))
        while await redis.xlen(STREAM) < 1:
            await asyncio.sleep(0.01)
        unclaimed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await unclaimed
        claimed = asyncio.create_task(dispatcher.infer(request(2), 10))
        (queued,) = await claim(redis)
        claimed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await claimed
        with pytest.raises(DeadlineExceeded):
            await dispatcher.infer(request(3), 0.2)
        for _ in range(200):
            if await redis.xlen(STREAM) == 0:
                break
            await asyncio.sleep(0.01)
        assert await redis.xrange(STREAM) == []
        # the claimed one is no longer pending for its worker: it would skip it
        assert await redis.xpending_range(STREAM, keys.WORKER_GROUP, "-", "+", 10) == []
        assert queued.queue_id

    run(redis_url, scenario)


def test_a_caller_cancelled_while_its_enqueue_is_in_flight_withdraws_the_entry(redis_url: str) -> None:
    """No shield or task per request: the enqueue's future is cancelled with its caller, and
    the group-committed write that still adds the entry takes it back when its answer comes.
    ``CLIENT PAUSE WRITE`` holds the XADD script in Redis while the caller is cancelled."""

    async def scenario(dispatcher: QueueDispatcher, redis) -> None:
        await redis.execute_command("CLIENT", "PAUSE", 400, "WRITE")
        caller = asyncio.create_task(dispatcher.infer(request(1), 10))
        await asyncio.sleep(0.1)  # its pipeline is written and waits in Redis
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        for _ in range(300):  # unpaused after 0.4 s: the entry is added, then withdrawn
            info = await redis.xinfo_stream(STREAM)
            added = info["last-generated-id"] not in (b"0-0", "0-0")
            if added and info["length"] == 0:
                break
            await asyncio.sleep(0.01)
        assert added and info["length"] == 0
        assert not dispatcher._pending  # noqa: SLF001 - nothing left waiting
        # the next request is served as usual
        served = asyncio.create_task(dispatcher.infer(request(2), 10))
        (queued,) = await claim(redis)
        await redis.rpush(queued.reply_to, answer(queued.queue_id, 2.0))
        assert (await served).outputs[0].data.tolist() == [[2.0]]

    run(redis_url, scenario)
