"""Group commit: how long a write shared by several callers waits for more of them.

The gateway's enqueues (:class:`naiad.queue_client.QueueDispatcher`) and statistics
(:class:`naiad.stats_writer.StatsWriter`) go to Redis, and the requests it hands to an idle
worker down that worker's socket (:mod:`naiad.reply_channel`), in writes that carry
whatever callers are waiting when the write is sent, one write in flight at a time (a
socket's write is not in flight: :func:`after_gathering`): under load, one round trip
and one script call carry many requests, and the worker's batches grow with them. Callers
that arrive together (an HTTP front reads every ready socket in one loop turn) join at once;
callers that trickle in on successive loop turns are waited for while they keep coming, at
most :data:`GATHER_S` and up to :data:`GATHER_MOST`. A lone caller waits one turn: nothing
came in it. (grpc.aio's calls come further apart than a turn: they are not grouped; measured
in docs/benchmarks.md, "Stop 16".)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

#: Longest a write waits for more callers while they keep arriving turn after turn (s).
GATHER_S = 0.0005
#: Most callers a write waits for.
GATHER_MOST = 64


async def gathered(waiting: Callable[[], int]) -> None:
    """Return after one loop turn, or more while ``waiting()`` (the callers a write would
    carry) grew in the last turn, until :data:`GATHER_S` passed or :data:`GATHER_MOST` wait."""
    loop = asyncio.get_running_loop()
    until, seen = loop.time() + GATHER_S, waiting()
    await asyncio.sleep(0)
    while _growing(seen, now := waiting(), until, loop):
        seen = now
        await asyncio.sleep(0)


def _growing(seen: int, now: int, until: float, loop: asyncio.AbstractEventLoop) -> bool:
    """The rule both waits follow: callers came in the last turn (``seen`` → ``now``), fewer
    than :data:`GATHER_MOST` wait, and the loop time is before ``until``."""
    return seen < now < GATHER_MOST and loop.time() < until


def after_gathering(waiting: Callable[[], int], then: Callable[[], None]) -> None:
    """Call ``then()`` where a task started now would return from :func:`gathered` (its
    first step is a turn away), but without the task: for a write made from plain calls (the
    requests :class:`naiad.reply_channel.WorkerLink` hands to a worker), where a task per
    write cost a lone request ~10 % of its throughput at c1 (docs/benchmarks.md, "Stop 25")."""
    loop = asyncio.get_running_loop()
    until = loop.time() + GATHER_S

    def check(seen: int) -> None:
        now = waiting()
        if _growing(seen, now, until, loop):
            loop.call_soon(check, now)
        else:
            then()

    loop.call_soon(lambda: loop.call_soon(check, waiting()))  # what the task's first step sees
