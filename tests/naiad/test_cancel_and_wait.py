"""naiad.tasks.cancel_and_wait: a task that loses a cancellation (as redis-py's
``asyncio.wait_for`` does on Python 3.11, CPython gh-86296) is still stopped."""

from __future__ import annotations

import asyncio
import sys

import pytest

from naiad import tasks


def stubborn(lost: int, ended: list[str]):
    """A loop that loses its first ``lost`` cancellations, then ends on the next."""

    async def run() -> None:
        for _ in range(lost):
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                pass  # lost: what asyncio.wait_for may do on 3.11
        try:
            await asyncio.sleep(10)
        finally:
            ended.append("ended")

    return run()


@pytest.mark.parametrize("lost", [0, 1, 3])
def test_cancel_and_wait_ends_a_task_whatever_it_loses(lost):
    ended: list[str] = []

    async def main() -> None:
        task = asyncio.create_task(stubborn(lost, ended))
        await asyncio.sleep(0)
        await asyncio.wait_for(tasks.cancel_and_wait(task), 5)
        assert task.done()

    asyncio.run(main())
    assert ended == ["ended"]


def test_cancel_and_wait_raises_the_tasks_own_error_and_takes_none():
    async def failing() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    async def main() -> None:
        await tasks.cancel_and_wait(None)
        task = asyncio.create_task(failing())
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="cleanup failed"):
            await tasks.cancel_and_wait(task)

    asyncio.run(main())


def test_wait_for_loses_a_cancellation_landing_as_its_operation_finishes():
    """Why the helper exists (redis-py wraps each socket write in wait_for): cancelled
    at that moment, wait_for returns the result instead of raising (3.11; fixed in 3.12)."""

    async def main() -> bool:
        loop = asyncio.get_running_loop()
        inner = loop.create_future()

        async def waiter() -> str:
            return await asyncio.wait_for(inner, 10)

        task = asyncio.create_task(waiter())
        await asyncio.sleep(0)
        inner.set_result("done")
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return False
        return True

    lost = asyncio.run(main())
    assert lost is (sys.version_info < (3, 12))
