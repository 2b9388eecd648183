"""``naiad.group_commit.gathered``: a write waits while callers keep arriving turn after
turn, one turn for a lone caller, and never past its bounds."""

from __future__ import annotations

import asyncio

from naiad import group_commit


async def _turns_waited(arrivals: list[int]) -> tuple[int, int]:
    """Run ``gathered`` while ``arrivals[i]`` callers join in turn i; (turns it took, callers)."""
    waiting = [1]
    turns = 0

    async def arrive() -> None:
        nonlocal turns
        for count in arrivals:
            await asyncio.sleep(0)
            turns += 1
            waiting[0] += count

    feeder = asyncio.get_running_loop().create_task(arrive())
    await asyncio.sleep(0)  # the feeder starts first, as callers do before the write's task
    done_at = turns
    await group_commit.gathered(lambda: waiting[0])
    done_at, seen = turns - done_at, waiting[0]
    feeder.cancel()
    return done_at, seen


def test_a_lone_caller_waits_one_turn():
    turns, callers = asyncio.run(_turns_waited([0, 5, 5]))
    assert (turns, callers) == (1, 1)


def test_callers_arriving_turn_after_turn_are_waited_for_until_they_stop():
    turns, callers = asyncio.run(_turns_waited([1, 1, 1, 0, 1, 1]))
    assert callers == 4 and turns == 4  # the fourth turn brought nobody: the write goes


def test_the_wait_ends_at_the_most_callers():
    turns, callers = asyncio.run(_turns_waited([20] * 10))
    assert callers >= group_commit.GATHER_MOST and callers < group_commit.GATHER_MOST + 20


def test_the_wait_ends_after_gather_s(monkeypatch):
    monkeypatch.setattr(group_commit, "GATHER_S", 0.0)
    turns, callers = asyncio.run(_turns_waited([1] * 10))
    assert turns == 1 and callers == 2


async def _both_ways(arrivals: list[int]) -> dict[str, tuple[int, int]]:
    """(turns, callers) where a task started now returns from ``gathered`` and where
    ``after_gathering`` called now calls back, while ``arrivals[i]`` callers join in turn i."""
    waiting, turns, seen = [1], [0], {}

    async def arrive() -> None:
        for count in arrivals:
            await asyncio.sleep(0)
            turns[0] += 1
            waiting[0] += count

    async def task_way() -> None:
        await group_commit.gathered(lambda: waiting[0])
        seen["task"] = (turns[0], waiting[0])

    loop = asyncio.get_running_loop()
    feeder = loop.create_task(arrive())
    await asyncio.sleep(0)
    loop.create_task(task_way())
    group_commit.after_gathering(lambda: waiting[0], lambda: seen.setdefault("call", (turns[0], waiting[0])))
    while len(seen) < 2:
        await asyncio.sleep(0)
    feeder.cancel()
    return seen


def test_after_gathering_calls_back_where_a_task_would_return_from_gathered():
    for arrivals in ([0, 5, 5], [1, 1, 1, 0, 1, 1], [20] * 10, [3, 0, 3]):
        seen = asyncio.run(asyncio.wait_for(_both_ways(arrivals), 5))
        assert seen["call"] == seen["task"], (arrivals, seen)
