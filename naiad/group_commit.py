"""Group commit: how long a write shared by several callers waits for more of them.

The gateway's enqueues (:class:`naiad.queue_client.QueueDispatcher`) and statistics
(:class:`naiad.stats_writer.StatsWriter`) go to Redis in writes that carry whatever callers
are waiting when the write is sent, one write in flight at a time: under load, one round trip
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
    while seen < (now := waiting()) < GATHER_MOST and loop.time() < until:
        seen = now
        await asyncio.sleep(0)
