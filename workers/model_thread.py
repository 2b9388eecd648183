"""The thread a worker runs its model in: import, ``initialize``, warm-up, every batch that
leaves the event loop, and ``finalize``.

Triton's Python-backend stub calls ``initialize``, ``execute`` and ``finalize`` from one
thread, and models rely on it: state that belongs to the thread that made it (a
``threading.local``, an ``sqlite3`` connection, torch's grad mode set in ``initialize``) must
be there in ``execute``. A worker loads its model's versions and runs their batches one at a
time (:mod:`workers.loader`, :mod:`workers.worker`; a Python model one ``execute`` at a time,
:mod:`workers.backends.python`), so one thread, kept for the worker's life, serves them all
in order. That thread is either

- **the event loop's own** (:attr:`ModelThread.on_loop`, a Python model's worker,
  :func:`workers.loader.runs_on_loop`): each call runs at once, in the caller's turn, as a
  stall of the loop (:func:`naiad.loop_stall.stalled`: no running loop inside it, its time
  not counted by the worker's Redis timeouts, a thread beating the heartbeat meanwhile). No
  hand-off: a thread woken for a batch and the loop woken for its answer cost ~60 µs of a
  c1 request and a Python model's batch ran at half its hot pace in a just-woken thread
  (docs/benchmarks.md "Stop 43"); the loop does nothing else while the model runs, which a
  Python model's worker, one ``execute`` at a time under the GIL, loses little by. Or
- **a thread of its own**, started at the first call: it is handed each call through a
  :class:`queue.SimpleQueue` and answers through ``loop.call_soon_threadsafe``: one wake-up
  each way, without the executor's work item, its :class:`concurrent.futures.Future` (a lock
  and a condition) and the chaining of that future into the loop's, which
  ``asyncio.to_thread`` goes through (docs/benchmarks.md, "Stop 24": ~25 µs of CPU a round
  trip on this machine). A caller cancelled while its call runs gets
  :class:`asyncio.CancelledError` at once; the call itself runs to its end (a thread cannot
  be interrupted), and the next one waits for it.

The call runs in a copy of the caller's context (:mod:`contextvars`), as
``asyncio.to_thread`` runs it: its log records keep their request ids and its spans their
parent. Nothing of a call (its arguments, its result) is held once it has been answered.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from naiad import loop_stall

T = TypeVar("T")

#: The thread's name (``ps -L``, ``/proc/PID/task/TID/comm``, profiles).
THREAD_NAME = "naiad-model"


class ModelThread:
    """One thread that runs calls in order, each awaited from an event loop (module doc)."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        #: Calls run on the event loop's thread (module doc); set before the first call.
        self.on_loop = False
        #: Called once, before the first call on the loop's thread (the heartbeat's stand-in).
        self.before_first_call: Callable[[], None] | None = None

    async def run(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` in the thread, in a copy of the caller's context; its result,
        or what it raised (raised here)."""
        if self.on_loop:
            return self.call(function, *args)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if self._thread is None:  # set once started: a start that failed is tried again
            thread = threading.Thread(target=self._serve, name=THREAD_NAME, daemon=True)
            thread.start()
            self._thread = thread
        self._calls.put((loop, future, contextvars.copy_context(), function, args))
        return await future

    def call(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` now, on the loop's thread (:attr:`on_loop` only), as a stall of
        the loop, in a copy of the caller's context; its result, or what it raised."""
        assert self.on_loop, "a model's thread of its own is called through run()"
        if self.before_first_call is not None:
            first, self.before_first_call = self.before_first_call, None
            first()
        with loop_stall.stalled():
            return contextvars.copy_context().run(function, *args)

    def _serve(self) -> None:
        while True:
            _answer(*self._calls.get())


def _answer(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], context: contextvars.Context,
    function: Callable[..., Any], args: tuple[Any, ...],
) -> None:  # fmt: skip
    """Run one call and hand its outcome to its loop; its arguments and result are released
    when this returns (the thread then waits for the next call holding nothing of this one)."""
    try:
        result, error = context.run(function, *args), None
    except BaseException as exc:  # the caller's to raise, SystemExit included (as to_thread)
        result, error = None, exc
    try:
        loop.call_soon_threadsafe(_settle, future, result, error)
    except RuntimeError:  # the loop closed meanwhile: nobody waits
        pass


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
