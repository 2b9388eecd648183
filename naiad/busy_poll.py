"""Busy polling: a gateway waits for the answer to the server's only request awake.

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

Four rules bound what it costs:

- only while the *server* carries that one request, every gateway process counted (the
  ``alone`` test given: :meth:`gateway.dataplane.DataPlane.alone_in_server`,
  :mod:`gateway.inflight`): two processes each polling for one of two clients' requests
  took the CPU their worker needed, 0.82× the throughput at c2 (docs/benchmarks.md, "Stop
  42"); a second request anywhere ends the poll at its next turn;
- a wait polls for at most the budget (``--busy-poll-us``);
- a model whose answer took more than twice the budget is slept for until one comes within
  the budget again (its waits are still timed), so a slow model's requests do not pay a
  budget each for nothing. An answer between the two keeps the model as it was: one just
  after the budget was missed by a little, and a wait slept through is itself slower than a
  polled one (the ``digits_python`` benchmark model's, from the hand-off's write to the
  answer's read in the c1 timelines: 0.35 ms polled, 0.47 ms asleep in a slower minute of
  the VM), so one rule at the budget could turn polling off for good;
- a poll that finds its thread was kept off the CPU between two turns (its CPU time short
  of half the wall time, over :data:`PREEMPTED_S` or more: a budget over it set by hand)
  stops: another thread wants that CPU, and a sleeping gateway, woken by its answer, gets
  it back sooner than a polling one waits for its next slice.

The thread keeps the normal policy. (Polling at ``SCHED_IDLE`` measured the same at c1
and 0.95–0.98× at c2, but every thread and process started from the loop while it polled —
the scaler's workers, the warm pool's, an executor's threads — inherited that policy for
life, ``sched(7)``, and a busy neighbour on its CPU kept a polled answer waiting far past
the budget.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

#: A gap between two turns of a poll (seconds) long enough to judge the thread's share of it:
#: a turn takes a few µs, a scheduler's time slice with another thread on the CPU 0.75–3 ms
#: (CFS), while a virtual CPU the host holds back for tens of µs is no such thread (50 µs
#: here stopped most polls of an 80 ms wait on the benchmark VM with nothing else running).
PREEMPTED_S = 1e-3


class BusyPoll:
    """Polls the running loop while one awaited future is pending (module doc). One poll at
    a time: the server's only request's."""

    def __init__(self, budget_s: float, alone: Callable[[], bool]) -> None:
        """``budget_s``: the longest wait polled (seconds; 0: never poll); ``alone()``: True
        while the server carries one request at most."""
        self.budget_s = max(0.0, budget_s)
        self.alone = alone
        self._slow: set[str] = set()  # models slept for: an answer took over twice the budget
        self._polling: object | None = None  # the wait polled now

    @property
    def polling(self) -> bool:
        """True while a wait is polled."""
        return self._polling is not None

    def begin(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], model: str) -> float:
        """Poll ``loop`` until ``future`` (the answer to a request of ``model``) is done, at
        most the budget, when the rules allow (module doc); the wait's start
        (``time.monotonic()``), which :meth:`end` takes."""
        now = time.monotonic()
        if self.budget_s and self._polling is None and model not in self._slow:
            self._polling = wait = object()
            self._poll(wait, loop, future, now + self.budget_s, now, time.thread_time())
        return now

    def end(self, model: str, started: float) -> None:
        """The wait :meth:`begin` started at ``started`` is over: the poll, if any, stops;
        ``model``'s next waits are slept through after one over twice the budget, polled
        again after one within it (module doc)."""
        self._polling = None
        waited_s = time.monotonic() - started
        if waited_s > 2 * self.budget_s:
            self._slow.add(model)
        elif waited_s <= self.budget_s:
            self._slow.discard(model)

    def _poll(
        self, wait: object, loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any],
        deadline: float, last_wall: float, last_cpu: float,
    ) -> None:  # fmt: skip
        if wait is not self._polling:  # that wait ended (and another may poll now)
            return
        wall, cpu = time.monotonic(), time.thread_time()
        gap = wall - last_wall
        if (future.done() or wall >= deadline or not self.alone()
                or (gap >= PREEMPTED_S and cpu - last_cpu < gap / 2)):  # fmt: skip
            self._polling = None
        else:
            loop.call_soon(self._poll, wait, loop, future, deadline, wall, cpu)
