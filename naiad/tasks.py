"""Stopping a background task for certain, on Python 3.11.

On 3.11 ``asyncio.wait_for`` swallows a cancellation that arrives while the awaited
operation is finishing (CPython gh-86296; 3.12 rebuilt ``wait_for`` on ``asyncio.timeout``).
redis-py wraps every socket write in ``wait_for`` when the client has a ``socket_timeout``
(``redis.asyncio.connection.AbstractConnection.send_packed_command``), and Naiad's clients
all have one (:mod:`naiad.redis_client`, which skips it only for a write that cannot wait),
so a ``task.cancel()`` landing on a loop's Redis call can be lost: the task runs on, and an
``await task`` after it waits forever. Seen as a rate-limited worker that ran its batch but
never gave its resources back (its lease keeper, cancelled once, kept renewing) and a
shutdown stuck on the scaler.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

#: Seconds between cancellations of a task that has not ended yet.
RECANCEL_S = 0.05


async def cancel_and_wait(task: asyncio.Task | None) -> None:
    """Cancel ``task`` and wait until it has ended, cancelling it again every
    :data:`RECANCEL_S` while it runs on (module docstring). Raises what the task raised,
    other than its ``CancelledError``; a cancellation of the caller propagates (the task may
    then still run). None: nothing to do."""
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=RECANCEL_S)
    with contextlib.suppress(asyncio.CancelledError):
        task.result()


async def finish(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to its end even while the caller is being cancelled, once or again
    and again (a task's cleanup under :func:`cancel_and_wait`, which cancels every
    :data:`RECANCEL_S`): it runs as a task of its own, waited for; a cancellation of the
    caller is raised once it has ended. Returns its result, or raises what it raised."""
    task = asyncio.create_task(coroutine)
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait([task])  # a cancelled wait leaves the task running
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return task.result()
