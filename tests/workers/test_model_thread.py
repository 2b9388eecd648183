"""The worker's model thread (:mod:`workers.model_thread`): one thread, calls in order, the
caller's context, errors and cancellation as ``asyncio.to_thread`` has them."""

import asyncio
import contextvars
import threading
import time
import weakref

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


def test_system_exit_in_a_call_reaches_its_caller_and_the_thread_serves_on() -> None:
    """``sys.exit()`` in a model's ``execute`` fails that call, as with ``asyncio.to_thread``;
    the thread does not die with it (every later batch would wait forever)."""

    async def main() -> str:
        thread = ModelThread()

        def leave() -> None:
            raise SystemExit(3)

        with pytest.raises(SystemExit):
            async with asyncio.timeout(5):  # on the caller's task: no task of its own to stop the loop
                await thread.run(leave)
        return await asyncio.wait_for(thread.run(str, 4), 5)

    assert asyncio.run(main()) == "4"


def test_a_calls_arguments_are_released_once_it_is_answered() -> None:
    """An idle worker does not hold its last batch's inputs until the next batch."""

    class Inputs:
        pass

    async def main() -> bool:
        thread, inputs = ModelThread(), Inputs()
        gone = weakref.ref(inputs)
        await thread.run(id, inputs)
        del inputs
        for _ in range(50):  # the thread drops its references as the call returns
            if gone() is None:
                return True
            await asyncio.sleep(0.01)
        return False

    assert asyncio.run(main())


def test_a_thread_that_failed_to_start_is_started_by_the_next_call(monkeypatch) -> None:
    started = threading.Thread.start
    failures = iter([RuntimeError("can't start new thread")])

    def start_once_failing(self: threading.Thread) -> None:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        started(self)

    monkeypatch.setattr(threading.Thread, "start", start_once_failing)

    async def main() -> int:
        thread = ModelThread()
        with pytest.raises(RuntimeError, match="can't start new thread"):
            await thread.run(int, "1")
        return await asyncio.wait_for(thread.run(int, "2"), 5)

    assert asyncio.run(main()) == 2


def test_an_answer_for_a_cancelled_caller_or_a_closed_loop_is_dropped_quietly() -> None:
    thread, errors = ModelThread(), []

    async def cancel_while_running() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(context))
        caller = asyncio.create_task(thread.run(time.sleep, 0.1))
        await asyncio.sleep(0.02)
        caller.cancel()
        await asyncio.sleep(0.2)  # the answer comes to a cancelled future

    async def leave_a_call_running() -> None:
        asyncio.create_task(thread.run(time.sleep, 0.1))
        await asyncio.sleep(0.02)  # the loop closes with the call still running

    async def next_loop() -> int:
        return await asyncio.wait_for(thread.run(int, "5"), 5)

    asyncio.run(cancel_while_running())
    asyncio.run(leave_a_call_running())
    assert asyncio.run(next_loop()) == 5
    assert errors == []
