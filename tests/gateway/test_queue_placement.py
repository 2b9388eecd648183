"""The queue client's side of Triton's queue policies against a real Redis, the test playing
the worker: a REJECT queue timeout refuses an unclaimed request at once and leaves a claimed
one to its worker, each priority level has its own bound, and ``preserve_ordering`` releases
answers in the order the requests entered the queue."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from naiad_harness import run_dispatcher_scenario

from naiad import keys
from naiad.codec import Reply, decode_request, encode_reply
from naiad.errors import Overloaded, QueueTimeout
from naiad.inference import InferRequest, Tensor
from naiad.queue_client import QueueDispatcher
from naiad.queue_policy import Placement

MODEL = "m"
HIGH, LOW = keys.request_stream(MODEL, 1), keys.request_stream(MODEL, 2)


def request(value: float) -> InferRequest:
    return InferRequest(MODEL, 1, [Tensor("x", "FP32", [1, 1], np.array([[value]], np.float32))])


def placement(stream: str = HIGH, max_queue: int = 0, timeout_s: float = 0.0, reject: bool = True,
              ordered: bool = False) -> Placement:  # fmt: skip
    return Placement(1 if stream == HIGH else 2, stream, max_queue, timeout_s, reject, ordered)


def run(redis_url: str, scenario) -> None:
    run_dispatcher_scenario(redis_url, scenario, [HIGH, LOW])


async def claim(redis, stream: str = HIGH, count: int = 10) -> list:
    got = await redis.xreadgroup(keys.WORKER_GROUP, "w", {stream: ">"}, count=count, block=2000)
    return [decode_request(MODEL, fields, entry_id) for _, entries in got for entry_id, fields in entries]


async def wait_queued(redis, stream: str, count: int, within_s: float = 10.0) -> None:
    """Wait until ``stream`` holds ``count`` entries (the dispatcher enqueued them)."""
    deadline = time.monotonic() + within_s
    while await redis.xlen(stream) < count:
        assert time.monotonic() < deadline, f"{stream} never held {count} entries"
        await asyncio.sleep(0.005)


async def answer(redis, queued) -> None:
    value = float(queued.request.inputs[0].data[0, 0])
    reply = Reply(queued.queue_id, [Tensor("y", "FP32", [1, 1], np.array([[value]], np.float32))])
    await redis.rpush(queued.reply_to, encode_reply(reply))


def test_a_reject_timeout_refuses_an_unclaimed_request_at_once(redis_url: str) -> None:
    async def scenario(dispatcher: QueueDispatcher, redis) -> None:
        started = time.monotonic()
        with pytest.raises(QueueTimeout, match="Request timeout expired"):
            await dispatcher.infer(request(1), 10, placement=placement(timeout_s=0.2))
        assert 0.2 <= time.monotonic() - started < 2
        assert await redis.xlen(HIGH) == 0  # no worker will ever see it

    run(redis_url, scenario)


def test_a_claimed_request_is_left_to_its_worker(redis_url: str) -> None:
    async def scenario(dispatcher: QueueDispatcher, redis) -> None:
        waiting = asyncio.create_task(dispatcher.infer(request(2), 10, placement=placement(timeout_s=0.2)))
        (queued,) = await claim(redis)
        await asyncio.sleep(0.4)  # past the queue timeout, but a worker holds it
        assert not waiting.done()
        await answer(redis, queued)
        assert (await waiting).outputs[0].data.tolist() == [[2.0]]
        # DELAY never refuses, claimed or not
        delayed = asyncio.create_task(
            dispatcher.infer(request(3), 10, placement=placement(timeout_s=0.1, reject=False))
        )
        await asyncio.sleep(0.3)
        assert not delayed.done()
        (queued,) = await claim(redis)
        await answer(redis, queued)
        assert (await delayed).outputs[0].data.tolist() == [[3.0]]

    run(redis_url, scenario)


def test_each_priority_level_has_its_own_bound(redis_url: str) -> None:
    async def scenario(dispatcher: QueueDispatcher, redis) -> None:
        waiting = asyncio.create_task(dispatcher.infer(request(1), 10, placement=placement(LOW, max_queue=1)))
        await wait_queued(redis, LOW, 1)
        with pytest.raises(Overloaded, match="Exceeds maximum queue size.* priority level 2"):
            await dispatcher.infer(request(2), 10, placement=placement(LOW, max_queue=1))
        high = asyncio.create_task(dispatcher.infer(request(3), 10, placement=placement(HIGH, max_queue=1)))
        (first,) = await claim(redis, HIGH)
        await answer(redis, first)
        assert (await high).outputs[0].data.tolist() == [[3.0]]
        (second,) = await claim(redis, LOW)
        await answer(redis, second)
        await waiting

    run(redis_url, scenario)


def test_preserve_ordering_releases_answers_in_queue_order(redis_url: str) -> None:
    async def scenario(dispatcher: QueueDispatcher, redis) -> None:
        done: list[float] = []

        async def send(value: float) -> None:
            response = await dispatcher.infer(request(value), 10, placement=placement(ordered=True))
            done.append(response.outputs[0].data[0, 0])

        tasks = []
        for value in (1, 2, 3):
            tasks.append(asyncio.create_task(send(value)))
            await wait_queued(redis, HIGH, len(tasks))  # enqueued in this order
        claimed = await claim(redis)
        assert [q.request.inputs[0].data[0, 0] for q in claimed] == [1, 2, 3]
        for queued in reversed(claimed):  # two workers finish out of order
            await answer(redis, queued)
            await asyncio.sleep(0.05)
        await asyncio.gather(*tasks)
        assert done == [1, 2, 3]

    run(redis_url, scenario)


def test_enqueues_of_one_turn_share_one_call_and_each_meets_the_bound(redis_url: str) -> None:
    """Six requests made in one loop turn, to two streams bounded at 2 and 3: one script call
    per stream adds exactly as many as fit, in order; the rest are refused, and each caller
    gets its own entry's answer."""

    async def scenario(dispatcher: QueueDispatcher, redis) -> None:
        to = [HIGH, LOW, HIGH, LOW, HIGH, LOW]
        calls = [asyncio.create_task(dispatcher.infer(request(i), 10, placement=placement(
            stream, max_queue=2 if stream == HIGH else 3))) for i, stream in enumerate(to)]  # fmt: skip
        await wait_queued(redis, HIGH, 2)
        await wait_queued(redis, LOW, 3)
        refused = calls[4]  # the third to HIGH
        with pytest.raises(Overloaded, match="is full \\(2 requests\\)"):
            await refused
        high, low = await claim(redis, HIGH), await claim(redis, LOW)
        assert [q.request.inputs[0].data[0, 0] for q in high] == [0, 2]
        assert [q.request.inputs[0].data[0, 0] for q in low] == [1, 3, 5]
        for queued in [*high, *low]:
            await answer(redis, queued)
        for i, call in enumerate(calls):
            if call is not refused:
                assert (await call).outputs[0].data.tolist() == [[float(i)]]

    run(redis_url, scenario)


def test_an_enqueue_after_redis_lost_its_scripts_loads_the_script_again(redis_url: str) -> None:
    """A restarted Redis knows no script (NOSCRIPT for EVALSHA): the enqueue loads it again
    and the request goes through, also when one write carries the calls of two streams."""

    async def scenario(dispatcher: QueueDispatcher, redis) -> None:
        for value in (1.0, 2.0):
            await redis.script_flush()
            waiting = asyncio.create_task(dispatcher.infer(request(value), 10, placement=placement()))
            (queued,) = await claim(redis)
            await answer(redis, queued)
            assert (await waiting).outputs[0].data.tolist() == [[value]]
        await redis.script_flush()
        both = [asyncio.create_task(dispatcher.infer(request(v), 10, placement=placement(stream)))
                for v, stream in ((3.0, HIGH), (4.0, LOW))]  # fmt: skip
        for stream in (HIGH, LOW):
            (queued,) = await claim(redis, stream)
            await answer(redis, queued)
        assert [(await w).outputs[0].data.tolist() for w in both] == [[[3.0]], [[4.0]]]

    run(redis_url, scenario)


BURST = 300  # more than one client's connections (naiad.redis_client.MAX_CONNECTIONS)


def test_a_burst_to_a_model_at_zero_is_queued_whole_and_wakes_it_once_a_write(redis_url: str) -> None:
    """300 requests at once to a model with no live worker: every one is queued (none is
    refused for want of a connection, as 300 wakes at once were), the scaler is woken once
    per write, not once per request, and each caller gets its own answer."""

    async def scenario(dispatcher: QueueDispatcher, redis) -> None:
        await redis.delete(keys.SCALER_WAKE)
        calls = [asyncio.create_task(dispatcher.infer(request(i), 20, placement=placement()))
                 for i in range(BURST)]  # fmt: skip
        await wait_queued(redis, HIGH, BURST)
        deadline = time.monotonic() + 10  # the wakes follow the entries, in the background
        while not (wakes := await redis.lrange(keys.SCALER_WAKE, 0, -1)) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.2)  # a wake a request would still be arriving now
        wakes = await redis.lrange(keys.SCALER_WAKE, 0, -1)
        assert wakes and set(wakes) == {MODEL.encode()} and len(wakes) <= 10, len(wakes)
        queued = await claim(redis, count=BURST)
        for q in queued:
            await answer(redis, q)
        results = await asyncio.gather(*calls)
        assert [r.outputs[0].data.item() for r in results] == list(range(BURST))

    run(redis_url, scenario)


def test_a_burst_of_cancelled_callers_withdraws_every_entry(redis_url: str) -> None:
    """300 queued callers that all go away at once (clients that disconnected) take every
    entry back: withdrawals go together, not one connection each."""

    async def scenario(dispatcher: QueueDispatcher, redis) -> None:
        calls = [asyncio.create_task(dispatcher.infer(request(i), 20, placement=placement()))
                 for i in range(BURST)]  # fmt: skip
        await wait_queued(redis, HIGH, BURST)
        await claim(redis, count=BURST // 3)  # some already claimed by a worker, not yet run
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        deadline = time.monotonic() + 10
        while await redis.xlen(HIGH) or (await redis.xpending(HIGH, keys.WORKER_GROUP))["pending"]:
            assert time.monotonic() < deadline, "entries left behind"
            await asyncio.sleep(0.01)

    run(redis_url, scenario)
