"""``naiad.deadlines``: calls made at their loop times by one timer, a call skipped once its
future is done, the heap swept of done entries, a failing call not stopping the rest."""

from __future__ import annotations

import asyncio
import logging
import weakref

import pytest

from naiad.deadlines import SWEEP_AT, Deadlines


def test_calls_come_at_their_times_in_order_and_a_done_future_skips_its_call():
    async def run():
        loop, deadlines, calls = asyncio.get_running_loop(), Deadlines(), []
        start = loop.time()
        futures = [loop.create_future() for _ in range(4)]
        for i, delay in enumerate((0.15, 0.05, 0.10, 0.02)):
            deadlines.add(start + delay, futures[i], lambda _, i=i: calls.append((i, loop.time() - start)))
        futures[3].set_result(None)  # answered before its time: no call
        await asyncio.sleep(0.3)
        assert [i for i, _ in calls] == [1, 2, 0]
        for (i, at), want in zip(calls, (0.05, 0.10, 0.15), strict=True):
            assert want <= at < want + 0.5, (i, at)  # never early; late only by the load
        assert len(deadlines) == 0

    asyncio.run(run())


def test_an_earlier_deadline_added_later_is_not_held_back_by_the_armed_one():
    async def run():
        loop, deadlines, calls = asyncio.get_running_loop(), Deadlines(), []
        late = loop.create_future()
        deadlines.add(loop.time() + 30, late, lambda _: calls.append("late"))
        soon = loop.create_future()
        deadlines.add(loop.time() + 0.02, soon, lambda _: calls.append("soon"))
        await asyncio.sleep(0.1)
        assert calls == ["soon"] and len(deadlines) == 1

    asyncio.run(run())


def test_done_entries_are_swept_so_the_heap_stays_near_the_pending_count():
    async def run():
        loop, deadlines = asyncio.get_running_loop(), Deadlines()
        pending = [loop.create_future() for _ in range(10)]
        for future in pending:
            deadlines.add(loop.time() + 60, future, lambda _: None)
        most = 0
        for _ in range(20 * SWEEP_AT):  # answered requests: their futures are done at once
            future = loop.create_future()
            deadlines.add(loop.time() + 60, future, lambda _: None)
            future.set_result(None)
            most = max(most, len(deadlines))
        assert most <= SWEEP_AT
        for future in pending:
            future.cancel()

    asyncio.run(run())


def test_a_failing_call_is_logged_and_the_others_still_come(caplog: pytest.LogCaptureFixture):
    def fail(_: asyncio.Future) -> None:
        raise ValueError("broken")

    async def run():
        loop, deadlines, calls = asyncio.get_running_loop(), Deadlines(), []
        futures = [loop.create_future() for _ in range(3)]
        deadlines.add(loop.time() + 0.01, futures[0], fail)
        deadlines.add(loop.time() + 0.01, futures[1], lambda _: calls.append("first"))
        deadlines.add(loop.time() + 0.05, futures[2], lambda _: calls.append("second"))
        await asyncio.sleep(0.15)
        return calls

    with caplog.at_level(logging.ERROR, logger="naiad.deadlines"):
        assert asyncio.run(run()) == ["first", "second"]
    assert "a deadline's call failed" in caplog.text


def test_an_entry_does_not_keep_its_future_alive_and_a_gone_one_is_skipped():
    async def run():
        loop, deadlines, calls = asyncio.get_running_loop(), Deadlines(), []
        future = loop.create_future()
        ref = weakref.ref(future)
        deadlines.add(loop.time() + 0.02, future, lambda _: calls.append("gone"))
        del future  # its caller finished with it (an answered request)
        assert ref() is None
        await asyncio.sleep(0.1)
        assert calls == [] and len(deadlines) == 0

    asyncio.run(run())
