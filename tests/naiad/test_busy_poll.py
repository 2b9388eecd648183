"""naiad.busy_poll: a wait polled while its future is pending, the loop still serving
everything else; the budget, the slow-model rule, a second request, a thread kept off its CPU."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from naiad import busy_poll
from naiad.busy_poll import BusyPoll


@pytest.fixture(autouse=True)
def never_judged_preempted(monkeypatch):
    """The tests but the one about it keep polling when the machine is busy (another test's
    servers): the rule that stops a poll whose thread lost its CPU is tested on its own."""
    monkeypatch.setattr(busy_poll, "PREEMPTED_S", float("inf"))


async def turns(count: int = 3) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


def test_a_pending_wait_is_polled_until_answered_and_the_thread_really_works_meanwhile():
    async def main():
        loop = asyncio.get_running_loop()
        poll = BusyPoll(1.0, lambda: True)
        future = loop.create_future()
        cpu = time.thread_time()
        started = poll.begin(loop, future, "m")
        await asyncio.sleep(0.05)  # a loop not polled would sleep in epoll_wait through it
        during, busy = poll.polling, time.thread_time() - cpu
        future.set_result(None)
        await turns()
        after = poll.polling
        poll.end("m", started)
        return during, busy, after

    during, busy, after = asyncio.run(main())
    assert during and not after
    assert busy > 0.002  # it turned the loop, not slept (at most 50 ms of CPU here)


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_the_loop_serves_other_sockets_while_it_polls(loop_kind):
    """Polling turns the loop (no blocking loop of its own): a socket's data is read while a
    wait is polled, long before the wait's budget runs out (on both event loops Naiad runs)."""

    async def main():
        loop = asyncio.get_running_loop()
        poll = BusyPoll(5.0, lambda: True)
        pending = loop.create_future()
        a, b = socket.socketpair()
        reader, writer = await asyncio.open_connection(sock=a)
        started = poll.begin(loop, pending, "m")
        threading.Timer(0.05, b.send, args=(b"x",)).start()
        data = await asyncio.wait_for(reader.read(1), 2.0)
        took = time.monotonic() - started
        pending.set_result(None)
        poll.end("m", started)
        writer.close()
        await writer.wait_closed()
        b.close()
        return data, took

    if loop_kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        data, took = uvloop.run(main())
    else:
        data, took = asyncio.run(main())
    assert data == b"x" and took < 1.0


def test_a_wait_polls_at_most_its_budget_and_a_slow_model_is_then_slept_for():
    """Budget 2 ms: a wait stops polling once it is spent; an answer after 50 ms makes its
    model slept for; one of 3 ms (between the budget and twice it) leaves a model as it
    was; one within the budget makes it polled again."""

    async def main():
        loop = asyncio.get_running_loop()
        poll = BusyPoll(0.002, lambda: True)
        seen = []

        async def wait(model: str, waited_s: float) -> None:
            started = poll.begin(loop, loop.create_future(), model)
            await turns()
            seen.append(poll.polling)
            poll.end(model, started - waited_s)  # as if it had waited that long

        started = poll.begin(loop, loop.create_future(), "slow")
        await asyncio.sleep(0.05)
        spent = poll.polling
        poll.end("slow", started)  # 50 ms: slow
        await wait("slow", 0.003)  # slept for; 3 ms: stays slow
        await wait("slow", 0.0)  # slept for; within the budget: polled again
        await wait("slow", 0.0)
        await wait("fast", 0.003)  # polled; 3 ms: stays polled
        await wait("fast", 0.0)
        return spent, seen

    spent, seen = asyncio.run(main())
    assert not spent
    assert seen == [False, False, True, True, True]


def test_a_second_request_in_the_server_stops_the_poll():
    alone = [True]

    async def main():
        loop = asyncio.get_running_loop()
        poll = BusyPoll(1.0, lambda: alone[0])
        future = loop.create_future()
        started = poll.begin(loop, future, "m")
        await turns()
        first = poll.polling
        alone[0] = False  # another request came in
        await turns()
        second = poll.polling
        future.set_result(None)
        poll.end("m", started)
        return first, second

    assert asyncio.run(main()) == (True, False)


def test_an_ended_waits_last_turn_does_not_stop_the_next_wait():
    async def main():
        loop = asyncio.get_running_loop()
        poll = BusyPoll(1.0, lambda: True)
        first = loop.create_future()
        started = poll.begin(loop, first, "m")
        first.set_result(None)
        poll.end("m", started)  # its poll's next turn is still scheduled
        second = loop.create_future()
        started = poll.begin(loop, second, "m")
        await turns()
        during = poll.polling
        second.set_result(None)
        poll.end("m", started)
        return during

    assert asyncio.run(main())


def test_a_thread_kept_off_its_cpu_between_turns_stops_polling(monkeypatch):
    """Between two turns 100 µs of wall time pass and no CPU time: another thread had the
    CPU, and the poll stops."""

    class Clock:
        wall = 1000.0

        def monotonic(self) -> float:
            self.wall += 100e-6
            return self.wall

        def thread_time(self) -> float:
            return 5.0

    monkeypatch.setattr(busy_poll, "time", Clock())
    monkeypatch.setattr(busy_poll, "PREEMPTED_S", 50e-6)

    async def main():
        loop = asyncio.get_running_loop()
        poll = BusyPoll(1.0, lambda: True)
        future = loop.create_future()
        poll.begin(loop, future, "m")
        await turns()
        return poll.polling

    assert asyncio.run(main()) is False


def test_no_budget_never_polls():
    async def main():
        loop = asyncio.get_running_loop()
        poll = BusyPoll(0.0, lambda: True)
        future = loop.create_future()
        started = poll.begin(loop, future, "m")
        await turns()
        during = poll.polling
        future.set_result(None)
        poll.end("m", started)
        return during

    assert asyncio.run(main()) is False
