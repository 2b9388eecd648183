"""The worker's model thread (:mod:`workers.model_thread`): one thread, calls in order, the
caller's context, errors and cancellation as ``asyncio.to_thread`` has them."""

import asyncio
import contextvars
import threading
import time

import pytest

from workers.model_thread import THREAD_NAME, ModelThread

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


def test_calls_run_in_one_thread_of_their_own_in_order_with_their_results() -> None:
    async def main() -> tuple[list[int], set[int], int, list[str]]:
        thread, seen, names = ModelThread(), [], []

        def call(n: int) -> int:
            seen.append(threading.get_ident())
            names.append(threading.current_thread().name)
            time.sleep(0.002 * (3 - n))  # the first the slowest: order is still kept
            return n * 10

        results = await asyncio.gather(*(thread.run(call, n) for n in range(3)))
        return list(results), set(seen), threading.get_ident(), names

    results, threads, loop_thread, names = asyncio.run(main())
    assert results == [0, 10, 20]
    assert len(threads) == 1 and loop_thread not in threads
    assert names == [THREAD_NAME] * 3


def test_the_event_loop_keeps_running_while_a_call_runs() -> None:
    async def main() -> int:
        thread, ticks = ModelThread(), 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        ticker = asyncio.create_task(tick())
        await thread.run(time.sleep, 0.1)
        ticker.cancel()
        return ticks

    assert asyncio.run(main()) >= 10


def test_an_error_is_raised_to_the_caller_and_the_thread_serves_the_next_call() -> None:
    async def main() -> int:
        thread = ModelThread()

        def fail() -> None:
            raise ValueError("the model failed")

        with pytest.raises(ValueError, match="the model failed"):
            await thread.run(fail)
        return await thread.run(int, "7")

    assert asyncio.run(main()) == 7


def test_a_call_runs_in_a_copy_of_the_callers_context() -> None:
    async def main() -> tuple[str, str]:
        thread = ModelThread()
        REQUEST_ID.set("req-1")

        def read_and_change() -> str:
            seen = REQUEST_ID.get()
            REQUEST_ID.set("changed in the thread")
            return seen

        seen = await thread.run(read_and_change)
        return seen, REQUEST_ID.get()

    assert asyncio.run(main()) == ("req-1", "req-1")


def test_a_cancelled_caller_returns_at_once_and_the_next_call_waits_for_the_running_one() -> None:
    async def main() -> tuple[float, list[str]]:
        thread, order = ModelThread(), []

        def slow() -> None:
            time.sleep(0.2)
            order.append("slow done")

        def quick() -> None:
            order.append("quick")

        caller = asyncio.create_task(thread.run(slow))
        await asyncio.sleep(0.02)
        started = time.perf_counter()
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        cancelled_after = time.perf_counter() - started
        await thread.run(quick)
        return cancelled_after, order

    cancelled_after, order = asyncio.run(main())
    assert cancelled_after < 0.1
    assert order == ["slow done", "quick"]
