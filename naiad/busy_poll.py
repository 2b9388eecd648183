"""Busy polling: a gateway waits for the answer to its only request awake, at ``SCHED_IDLE``.

A gateway carrying one request, handed to an idle worker on its machine
(:mod:`naiad.reply_channel`), has nothing else to do until the answer comes: ~0.2 ms later
for a small model. Asleep in ``epoll_wait`` meanwhile, its CPU goes idle, and the answer
pays a wake-up, then runs the gateway's next calls at a half or a third of their hot pace
(``python -m bench.perf.wake_penalty``: a step of the path 2.2× its hot time as the first
call after 0.5 ms asleep on the benchmark VM; docs/benchmarks.md, "Stop 41"). Polling
instead, the event loop turns without blocking (a call scheduled with ``call_soon`` each
turn, so ``epoll_wait`` returns at once and every other socket is served as usual) until
the answer is in. It is the trade Linux's busy polling of sockets makes (``SO_BUSY_POLL``,
``net.core.busy_poll`` in µs, ``socket(7)``): CPU for latency.

Two rules bound what it costs:

- the thread polls at ``SCHED_IDLE`` (:mod:`naiad.sched_policy`), so it uses only a CPU no
  other thread wants: the worker computing the answer, another gateway process and the
  client all preempt it (polled at the normal policy, two gateway processes each polling
  for one of two requests took the CPU their worker needed: 0.70× the throughput at c2,
  docs/benchmarks.md, "Stop 42"). A process that may not move back from ``SCHED_IDLE``
  (:func:`naiad.sched_policy.can_restore`) never polls;
- a wait polls for at most the budget (``--busy-poll-us``), and a model whose lone answer
  took more than twice the budget is slept for until one comes within the budget again (its
  waits are still timed), so a slow model's requests do not pay a budget each for nothing.
  An answer between the two keeps the model as it was: one that came just after the budget
  was missed by a little, and a wait slept through is itself slower than a polled one
  (the ``digits_python`` benchmark model's, from the hand-off's write to the answer's read
  in the c1 timelines: 0.35 ms polled, 0.47 ms asleep in a slower minute of the VM), so one
  rule at the budget could turn polling off for good.

The thread goes back to ``SCHED_OTHER`` as soon as the answer is in, the budget is spent,
or the server carries a second request (whose work must not run at the idle policy). The
``alone`` test given is the whole server's, every gateway process counted
(:meth:`gateway.dataplane.DataPlane.alone_in_server`, :mod:`gateway.inflight`): with two
processes each carrying one request, each polled, and two clients one request at a time ran
at 0.82× the throughput (docs/benchmarks.md, "Stop 42").
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

from naiad.sched_policy import can_restore, set_policy


class BusyPoll:
    """Polls the running loop while one awaited future is pending (module doc). One poll at
    a time: the gateway's only request's."""

    def __init__(self, budget_s: float, alone: Callable[[], bool]) -> None:
        """``budget_s``: the longest wait polled (seconds; 0: never poll); ``alone()``: True
        while the server carries one request at most."""
        self.budget_s = budget_s if budget_s > 0 and can_restore() else 0.0
        self.alone = alone
        self._slow: set[str] = set()  # models slept for: an answer took over twice the budget
        self._polling: object | None = None  # the wait polled now (the thread is at SCHED_IDLE)

    def begin(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], model: str) -> None:
        """Poll ``loop`` until ``future`` (the answer to a request of ``model``) is done, at
        most the budget, when the rules allow (module doc); :meth:`end` after it, always."""
        if not self.budget_s or self._polling is not None or model in self._slow:
            return
        if set_policy(0, os.SCHED_IDLE):
            self._polling = wait = object()
            self._poll(wait, loop, future, loop.time() + self.budget_s)

    def end(self, model: str, waited_s: float) -> None:
        """The wait that :meth:`begin` started is over after ``waited_s`` seconds: back at
        ``SCHED_OTHER``; ``model``'s next waits are slept through after one over twice the
        budget, polled again after one within it (module doc)."""
        if not self.budget_s:
            return
        self._stop()
        if waited_s > 2 * self.budget_s:
            self._slow.add(model)
        elif waited_s <= self.budget_s:
            self._slow.discard(model)

    def _poll(
        self, wait: object, loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], deadline: float
    ) -> None:  # fmt: skip
        if wait is not self._polling:  # that wait ended (and another may poll now)
            return
        if future.done() or loop.time() >= deadline or not self.alone():
            self._stop()
        else:
            loop.call_soon(self._poll, wait, loop, future, deadline)

    def _stop(self) -> None:
        if self._polling is not None:
            self._polling = None
            set_policy(0, os.SCHED_OTHER)
