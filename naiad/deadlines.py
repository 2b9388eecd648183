"""One timer for many deadlines: calls due at loop times, each dropped once its future is done.

A request waiting for its reply needs a call at its deadline (its waiter gets TimeoutError),
and a request handed to a worker a liveness check after a while. One ``loop.call_at`` each
and its ``cancel`` cost ~2.2 µs of CPU a request in uvloop (a handle and a libuv timer put
in and taken out of the loop's heap; ``timeit`` on the benchmark VM): issue 14's "no
per-request timers (one deadline structure)". :class:`Deadlines` keeps the calls in one
binary heap (``heapq``) with one loop timer, armed for the earliest; adding one costs a
push. Nothing is cancelled: an entry whose ``future`` is done (or gone) by its time is
skipped, and such entries are swept out whenever the heap doubles since the last sweep
(amortized O(1) an entry), so the heap holds about twice the calls still pending at most.
An entry refers to its future weakly: an answered request's reply is not kept alive by it
(held until a sweep, a thousand replies cost the gateway ~5 % more CPU a request at c32 in
an A/B, against ~1 % less with them let go).

The owner's contract: a future handed to :meth:`Deadlines.add` is made done (a result, an
exception, or cancelled) once nobody waits on it, so that its call is dropped.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import weakref
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

#: The heap is swept of done entries when it reaches this many, or twice its size after the
#: last sweep, whichever is larger.
SWEEP_AT = 256

_Ref = weakref.ref  # of an asyncio.Future


class Deadlines:
    """Calls made at loop times on the running loop (module doc). Single-threaded, one loop:
    a call from another loop starts the structure afresh (the old loop's futures are
    dropped with it)."""

    def __init__(self) -> None:
        self._reset(None)

    def _reset(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self._loop = loop
        self._heap: list[tuple[float, int, _Ref, Callable[..., None], tuple[Any, ...]]] = []
        self._order = itertools.count()  # ties in time keep their order; futures never compare
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._sweep_at = SWEEP_AT

    def add(
        self, when: float, future: asyncio.Future[Any], callback: Callable[..., None], *args: Any
    ) -> None:  # fmt: skip
        """At loop time ``when`` (``loop.time()`` seconds), call ``callback(future, *args)``
        unless ``future`` is done, or gone, by then (``args`` must not hold it: it would be
        kept alive)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._reset(loop)
        heapq.heappush(self._heap, (when, next(self._order), weakref.ref(future), callback, args))
        if when < self._timer_at:
            self._arm(when)
        if len(self._heap) >= self._sweep_at:
            self._sweep()

    def __len__(self) -> int:
        """Entries held, done ones not yet swept included."""
        return len(self._heap)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        assert self._loop is not None
        self._timer, self._timer_at = self._loop.call_at(when, self._fire), when

    def _fire(self) -> None:
        """Make every call due; drop the done entries that lead the heap; arm for the next."""
        self._timer, self._timer_at = None, math.inf
        assert self._loop is not None
        now, heap = self._loop.time(), self._heap
        while heap and (heap[0][0] <= now or _settled(heap[0][2])):
            _, _, ref, callback, args = heapq.heappop(heap)
            future = ref()
            if future is not None and not future.done():
                try:
                    callback(future, *args)
                except Exception:  # one failing call must not stop the others, nor the timer
                    logger.exception("a deadline's call failed")
        if heap:
            self._arm(heap[0][0])

    def _sweep(self) -> None:
        self._heap = [entry for entry in self._heap if not _settled(entry[2])]
        heapq.heapify(self._heap)
        self._sweep_at = max(SWEEP_AT, 2 * len(self._heap))


def _settled(ref: _Ref) -> bool:
    """Its future done, or gone (nobody held it any more)."""
    alive = ref()
    return alive is None or alive.done()
