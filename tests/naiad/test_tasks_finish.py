"""``naiad.tasks.finish``: a cleanup runs to its end while its caller is cancelled again and
again (as ``cancel_and_wait`` does every 50 ms), and the caller's cancellation still comes
out after it. A scaler's ``finally`` closed the warm pool and then was cancelled before it
stopped any worker (helper-24)."""

from __future__ import annotations

import asyncio

import pytest

from naiad import tasks


async def _run_cancelled_during_cleanup(cleanup_s: float) -> tuple[list[str], asyncio.Task]:
    steps: list[str] = []

    async def cleanup() -> None:
        await asyncio.sleep(cleanup_s)  # the pool's close
        steps.append("pool closed")
        await asyncio.sleep(cleanup_s)  # the workers' drain
        steps.append("workers stopped")

    async def run() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await tasks.finish(cleanup())

    task = asyncio.create_task(run())
    await asyncio.sleep(0.01)
    await tasks.cancel_and_wait(task)  # cancels again every RECANCEL_S while the cleanup runs
    return steps, task


def test_a_cleanup_runs_to_its_end_under_repeated_cancellation():
    steps, task = asyncio.run(_run_cancelled_during_cleanup(cleanup_s=4 * tasks.RECANCEL_S))
    assert steps == ["pool closed", "workers stopped"]
    assert task.cancelled()  # the cancellation still ends the task


def test_finish_returns_the_result_and_raises_the_error():
    async def value() -> int:
        await asyncio.sleep(0)
        return 7

    async def broken() -> None:
        await asyncio.sleep(0)
        raise ValueError("no")

    assert asyncio.run(tasks.finish(value())) == 7
    with pytest.raises(ValueError, match="no"):
        asyncio.run(tasks.finish(broken()))
