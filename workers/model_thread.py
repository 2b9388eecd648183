"""The thread a worker runs its model's batches in, so its event loop keeps serving meanwhile.

A worker runs one batch at a time (:mod:`workers.worker`), and a Python model one
``execute`` at a time as Triton's stub does (:mod:`workers.backends.python`), so one thread,
started at the first batch and kept for the worker's life, serves every batch that does not
run on the loop (:mod:`workers.execution`). It is handed each call through a
:class:`queue.SimpleQueue` and answers through ``loop.call_soon_threadsafe``: one wake-up
each way, without the executor's work item, its :class:`concurrent.futures.Future` (a lock
and a condition) and the chaining of that future into the loop's, which
``asyncio.to_thread`` goes through (measured in docs/benchmarks.md, "Stop 24": ~25 µs of CPU
a round trip on this machine). The call runs in a copy of the caller's context
(:mod:`contextvars`), as ``asyncio.to_thread`` runs it: its log records keep their request
ids and its spans their parent.

A caller cancelled while its call runs gets :class:`asyncio.CancelledError` at once; the call
itself runs to its end (a thread cannot be interrupted), and the next one waits for it.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: The thread's name (``ps -L``, ``/proc/PID/task/TID/comm``, profiles).
THREAD_NAME = "naiad-model"


class ModelThread:
    """One thread that runs calls in order, each awaited from an event loop (module doc)."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    async def run(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` in the thread, in a copy of the caller's context; its result,
        or what it raised (raised here)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=THREAD_NAME, daemon=True)
            self._thread.start()
        self._calls.put((loop, future, contextvars.copy_context(), function, args))
        return await future

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            loop, future, context, function, args = call
            try:
                result, error = context.run(function, *args), None
            except BaseException as exc:  # the caller's to raise
                result, error = None, exc
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:  # the loop closed meanwhile: nobody waits
                pass
            del call, future, result, error


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
