"""naiad.busy_poll: a wait polled at SCHED_IDLE while its future is pending, the loop still
serving everything else, back at SCHED_OTHER when it ends; the budget and the slow-model rule."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

import pytest

from naiad import busy_poll, sched_policy
from naiad.busy_poll import BusyPoll

pytestmark = pytest.mark.skipif(
    not sched_policy.can_restore(), reason="needs SCHED_IDLE and the right to leave it"
)


@pytest.fixture(autouse=True)
def _restored():
    """A failed test leaves this thread at SCHED_OTHER, not idle for the rest of the suite."""
    yield
    sched_policy.set_policy(0, os.SCHED_OTHER)


def policy() -> int:
    return os.sched_getscheduler(0)  # the calling thread's


async def policy_soon() -> int:
    """The loop thread's policy as seen from a callback of a later loop turn."""
    await asyncio.sleep(0)
    return policy()


def test_a_pending_wait_polls_at_sched_idle_and_ends_at_sched_other_when_answered():
    async def main():
        loop = asyncio.get_running_loop()
        poll = BusyPoll(1.0, lambda: True)
        future = loop.create_future()
        poll.begin(loop, future, "m")
        during = await policy_soon()
        loop.call_later(0.01, future.set_result, None)
        await future
        await asyncio.sleep(0)  # the poll's next turn sees it done
        after = policy()
        poll.end("m", 0.01)
        return during, after, policy()

    during, after, ended = asyncio.run(main())
    assert during == os.SCHED_IDLE
    assert after == ended == os.SCHED_OTHER


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_the_loop_serves_other_sockets_while_it_polls(loop_kind):
    """Polling turns the loop (no blocking loop of its own): a socket's data is read while a
    wait is polled, long before the wait's budget runs out (on both event loops Naiad runs)."""
    if loop_kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")

    async def main():
        loop = asyncio.get_running_loop()
        poll = BusyPoll(5.0, lambda: True)
        pending = loop.create_future()
        a, b = socket.socketpair()
        reader, writer = await asyncio.open_connection(sock=a)
        poll.begin(loop, pending, "m")
        started = time.monotonic()
        threading.Timer(0.05, b.send, args=(b"x",)).start()
        data = await asyncio.wait_for(reader.read(1), 2.0)
        took, during = time.monotonic() - started, policy()
        pending.set_result(None)
        poll.end("m", took)
        writer.close()
        await writer.wait_closed()
        b.close()
        return data, took, during

    runner = uvloop.run if loop_kind == "uvloop" else asyncio.run
    data, took, during = runner(main())
    assert data == b"x" and took < 1.0
    assert during == os.SCHED_IDLE  # it was still polling then


def test_a_wait_polls_at_most_its_budget_and_a_slow_model_is_then_slept_for():
    """Budget 2 ms: a 50 ms answer makes its model slept for; one of 3 ms (between the
    budget and twice it) leaves a model as it was; one within the budget makes it polled."""
    async def main():
        loop = asyncio.get_running_loop()
        poll = BusyPoll(0.002, lambda: True)
        future = loop.create_future()
        poll.begin(loop, future, "slow")
        await asyncio.sleep(0.05)  # the budget is spent meanwhile
        spent = policy()
        future.set_result(None)
        poll.end("slow", 0.05)  # took longer than the budget
        again = loop.create_future()
        poll.begin(loop, again, "slow")
        slept = await policy_soon()
        other = loop.create_future()
        poll.end("slow", 0.05)
        poll.begin(loop, other, "fast")  # another model is polled
        fast = await policy_soon()
        other.set_result(None)
        poll.end("fast", 0.003)  # just over the budget: a model polled stays polled
        poll.begin(loop, loop.create_future(), "fast")
        still = await policy_soon()
        poll.end("fast", 0.001)
        poll.end("slow", 0.003)  # and one slept through stays slept through
        poll.begin(loop, loop.create_future(), "slow")
        still_slow = await policy_soon()
        poll.end("slow", 0.001)  # a slow model's answer came within the budget again
        third = loop.create_future()
        poll.begin(loop, third, "slow")
        back = await policy_soon()
        third.set_result(None)
        poll.end("slow", 0.001)
        return spent, slept, fast, still, still_slow, back, policy()

    spent, slept, fast, still, still_slow, back, ended = asyncio.run(main())
    assert spent == os.SCHED_OTHER
    assert slept == os.SCHED_OTHER
    assert fast == still == os.SCHED_IDLE
    assert still_slow == os.SCHED_OTHER
    assert back == os.SCHED_IDLE
    assert ended == os.SCHED_OTHER


def test_a_second_request_in_the_gateway_stops_the_poll():
    alone = [True]

    async def main():
        loop = asyncio.get_running_loop()
        poll = BusyPoll(1.0, lambda: alone[0])
        future = loop.create_future()
        poll.begin(loop, future, "m")
        first = await policy_soon()
        alone[0] = False  # another request came in
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        second = policy()
        future.set_result(None)
        poll.end("m", 0.001)
        return first, second

    first, second = asyncio.run(main())
    assert first == os.SCHED_IDLE
    assert second == os.SCHED_OTHER


def test_an_ended_waits_last_turn_does_not_stop_the_next_wait():
    async def main():
        loop = asyncio.get_running_loop()
        poll = BusyPoll(1.0, lambda: True)
        first = loop.create_future()
        poll.begin(loop, first, "m")
        first.set_result(None)
        poll.end("m", 0.0001)  # its poll's next turn is still scheduled
        second = loop.create_future()
        poll.begin(loop, second, "m")
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        during = policy()
        second.set_result(None)
        poll.end("m", 0.0001)
        return during

    assert asyncio.run(main()) == os.SCHED_IDLE


@pytest.mark.parametrize("budget_s, restorable", [(0.0, True), (1.0, False)])
def test_no_budget_or_no_right_to_leave_sched_idle_never_polls(monkeypatch, budget_s, restorable):
    monkeypatch.setattr(busy_poll, "can_restore", lambda: restorable)

    async def main():
        loop = asyncio.get_running_loop()
        poll = BusyPoll(budget_s, lambda: True)
        future = loop.create_future()
        poll.begin(loop, future, "m")
        during = await policy_soon()
        future.set_result(None)
        poll.end("m", 0.001)
        return poll.budget_s, during

    budget, during = asyncio.run(main())
    assert budget == 0.0
    assert during == os.SCHED_OTHER
