"""Stalls of this process's event loop: code run on the loop's own thread that blocks it.

A worker runs a Python model's ``initialize``, ``execute`` and ``finalize`` on its event
loop's thread (:mod:`workers.model_thread`): no thread hand-off per batch, but while a call
runs nothing else on the loop does. What waits on the loop meanwhile must not take that
time for a dead peer, so each such call is a *stall* (:func:`stalled`), timed here:

- a Redis reply's socket timeout counts only the time the loop was free to read it
  (:class:`Timeout`, used by :mod:`naiad.redis_client`): the reply of a claim sent before a
  long ``execute`` waits in the socket, and uvloop runs an expired timer before it polls the
  socket, so a plain timeout would fire first and drop a healthy connection;
- the worker's heartbeat is beaten by a thread while the loop is stalled
  (:func:`while_stalled`, :mod:`workers.stand_in`), so its claimed requests are not taken
  for a dead worker's and run twice.

Inside a stall the thread has no running event loop (``asyncio.get_running_loop`` raises,
as in any plain thread): the model may run a loop of its own (``asyncio.run``, an ``async
def execute`` on its backend's loop), as it may in Triton's stub. Such a loop, uvloop's, run
on the main thread takes the process's signal wake-up file while it runs, and a signal the
stalled loop handles would be lost with it: :func:`keep_signals` notes those that arrive
during a stall and hands them to their handler when it ends. Stalls do not nest.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

_started: float | None = None  # time.monotonic() when the stall under way began
_total = 0.0  # seconds of the stalls that ended
_lock = threading.Lock()  # a stall's end against a thread acting for the stalled loop
_missed = False  # a signal came during the stall under way (keep_signals)
_on_missed: Callable[[], None] | None = None


@contextmanager
def stalled() -> Iterator[None]:
    """Time the block as a stall of the loop running in this thread, with no running loop
    set for it (module docstring); the running loop is set back at its end."""
    global _started, _total, _missed
    loop = asyncio._get_running_loop()  # noqa: SLF001 - asyncio's documented low-level API
    asyncio._set_running_loop(None)  # noqa: SLF001
    _started = started = time.monotonic()
    try:
        yield
    finally:
        with _lock:  # a stand-in acting now finishes first: nothing acts after the stall
            _started = None
            _total += time.monotonic() - started
        asyncio._set_running_loop(loop)  # noqa: SLF001
        if _missed and loop is not None and _on_missed is not None:
            loop.call_soon(_on_missed)  # idempotent: once for all the stall's signals
            _missed = False


def keep_signals(signals: tuple[int, ...], handler: Callable[[], None]) -> None:
    """Run ``handler`` (no argument) on the loop when a stall during which any of
    ``signals`` arrived ends (module doc). Call in the main thread after the loop's
    ``add_signal_handler`` for them, with the same idempotent handler: a signal the loop
    also got runs it twice. The Python-level handler set here only notes the signal; the
    loop's own dispatch (through the wake-up file) is unchanged."""
    global _on_missed
    _on_missed = handler
    for signum in signals:
        signal.signal(signum, _note)


def _note(signum: int, frame: Any) -> None:
    global _missed
    if _started is not None:
        _missed = True


def clock() -> float:
    """Seconds this process's loop has spent stalled so far, the stall under way included."""
    started = _started
    return _total + (time.monotonic() - started if started is not None else 0.0)


def while_stalled(longer_than_s: float, action: Callable[[], T]) -> T | None:
    """Run ``action`` (in the calling thread, not the loop's) when a stall under way has lasted
    ``longer_than_s`` seconds, and return its result; None otherwise. The stall does not end
    while ``action`` runs: once :func:`stalled`'s block is left, no action runs for it."""
    with _lock:
        started = _started
        if started is None or time.monotonic() - started < longer_than_s:
            return None
        return action()


class Timeout:
    """``async with Timeout(seconds)``: asyncio's timeout (raises :class:`TimeoutError` at
    the block's end when it expired) whose ``seconds`` do not count the loop's stalls that
    happened meanwhile: when it comes due, the stalled time since it started (or was last
    extended) is granted again, until none was."""

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._timeout = asyncio.timeout(None)
        self._mark = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __aenter__(self) -> Timeout:
        await self._timeout.__aenter__()
        self._loop, self._mark = asyncio.get_running_loop(), clock()
        self._handle = self._loop.call_later(self._seconds, self._due)
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        if self._handle is not None:
            self._handle.cancel()
        return await self._timeout.__aexit__(*exc)

    def _due(self) -> None:
        assert self._loop is not None
        now = clock()
        granted, self._mark = now - self._mark, now
        if granted > 0:
            self._handle = self._loop.call_later(granted, self._due)
        else:
            self._handle = None
            self._timeout.reschedule(self._loop.time())
