"""The event loop every Naiad process runs on: uvloop when installed, else asyncio's own.

uvloop (libuv) halves the loop's own cost per socket write and wake-up, which is most of a
small request's CPU in the gateway and the workers. ``NAIAD_EVENT_LOOP=asyncio`` forces the
standard loop (to compare, or to rule uvloop out when debugging).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

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


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the loop :func:`loop_factory` picks."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
