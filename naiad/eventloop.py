"""The event loop every Naiad process runs on: uvloop when installed, else asyncio's own.

uvloop (libuv) halves the loop's own cost per socket write and wake-up, which is most of a
small request's CPU in the gateway and the workers. ``NAIAD_EVENT_LOOP=asyncio`` forces the
standard loop (to compare, or to rule uvloop out when debugging).

Before the loop starts, :func:`tune_gc` sets the cyclic garbage collector for a server:
everything imported so far is frozen out of its scans and a young collection waits for
10,000 new container objects instead of CPython's 700 (:data:`GC_THRESHOLDS`) (a profile of the
gateway at 32 clients had ~12 % of its CPU in ``gc_collect_main`` and its visitors:
docs/benchmarks.md "Stop 19").
"""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

#: ``gc.set_threshold`` for Naiad's processes: a young collection after 10,000 net new
#: container objects (CPython's default 700: docs.python.org/3/library/gc.html), the older
#: generations at CPython's ratios. Requests free their objects by reference counting; what
#: the collector finds is the rare cycle (an exception's traceback), so it may wait longer.
GC_THRESHOLDS = (10_000, 10, 10)

#: Environment variable naming the loop: ``auto`` (default: uvloop when importable) or ``asyncio``.
ENV = "NAIAD_EVENT_LOOP"


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's ``new_event_loop`` when installed and not turned off by :data:`ENV`; None
    (asyncio's default loop) otherwise."""
    if os.environ.get(ENV, "auto").lower() == "asyncio":
        return None
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:
        return None
    return uvloop.new_event_loop


def tune_gc() -> None:
    """Freeze every object alive now (modules, classes, constants: never garbage) into the
    collector's permanent generation, so its scans skip them (``gc.freeze``, Python 3.7+),
    and set :data:`GC_THRESHOLDS`."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the loop :func:`loop_factory` picks, after :func:`tune_gc`."""
    tune_gc()
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
