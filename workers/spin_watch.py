"""Framework threads that busy-wait between batches run at ``SCHED_IDLE``.

Thread pools of ML frameworks spin after a parallel run, waiting for the next one without
sleeping: ONNX Runtime's intra-op pool by default (``session.intra_op.allow_spinning`` 1;
ONNX Runtime 1.32 joins it from 16 rows of the benchmark MLP up and then spins 20–40 ms, so
under load without pause: ``bench/results/ort_spinning_rows.md``), OpenMP's pools (PyTorch,
``OMP_WAIT_POLICY``/``KMP_BLOCKTIME``). Naiad's own ONNX backend turns spinning off, but a
Python-backend ``model.py`` builds its sessions as it likes, and on a machine the gateway
shares, such a thread holds a core the gateway waits for: at c32 JSON on the 2-core VM the
gateway's thread spent 0.28–0.37 of its time runnable but not running with the benchmark
``model.py``'s pool thread spinning, 0.01 with Naiad's ONNX backend, and 0.09–0.15 once that
thread ran at ``SCHED_IDLE`` (``/proc/PID/task/TID/schedstat``; docs/benchmarks.md, "Stop 27").

:class:`SpinWatch` finds them: about once a :data:`CHECK_S`, between the end of one batch and
the start of the next (no model code runs then), it reads the CPU time of every native thread
of the worker process that is not a Python thread (the frameworks' own pools; Python's threads
— the event loop, the model thread, a ``model.py``'s own — are left alone, and so are threads
already at ``SCHED_IDLE``), and a thread that
used at least :data:`SPIN_SHARE` of a core over that gap (at least :data:`MIN_GAP_S`) is
moved to ``SCHED_IDLE`` (``sched(7)``: it runs only on a CPU no other thread wants, and any
other thread waking preempts it). It still joins the model's parallel runs: ONNX Runtime's
caller thread takes the work a helper has not started. A thread once moved stays there (a
process may lower its own threads' policy, not always raise it back).

Linux only (``os.sched_setscheduler`` with ``SCHED_IDLE`` and per-thread CPU clocks); elsewhere,
or with ``--demote-spinning-threads false``, :func:`watch` returns None and nothing is read.
"""

from __future__ import annotations

import logging
import os
import threading
import time

logger = logging.getLogger(__name__)

#: Seconds between two looks at the threads (each costs a listing of ``/proc/self/task`` and
#: one clock read per native thread, twice).
CHECK_S = 1.0
#: Share of one core a thread must use between two batches to count as busy-waiting.
SPIN_SHARE = 0.5
#: Shortest gap between batches that is judged (seconds): a shorter one says too little.
MIN_GAP_S = 0.0005

_TASKS = "/proc/self/task"


def thread_cpu_ns(tid: int) -> int:
    """CPU time (ns) of thread ``tid`` of this process, from its per-thread CPU clock (Linux's
    ``MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)``, ``include/linux/posix-timers.h``: the
    clock id ``(~tid << 3) | 6``). Raises :class:`OSError` when the thread is gone."""
    return time.clock_gettime_ns(((~tid) << 3) | 6)


def native_threads() -> list[int]:
    """Thread ids of this process that Python's :mod:`threading` did not start."""
    python = {t.native_id for t in threading.enumerate()}
    try:
        tids = [int(name) for name in os.listdir(_TASKS)]
    except OSError:
        return []
    return [tid for tid in tids if tid not in python]


def demote(tid: int) -> bool:
    """Move thread ``tid`` to ``SCHED_IDLE``; False when it is gone or may not be moved."""
    try:
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
    except OSError:
        return False
    return True


class SpinWatch:
    """Finds busy-waiting framework threads between batches (module doc). The executor calls
    :meth:`batch_started` before each batch and :meth:`batch_ended` after it."""

    def __init__(self, check_s: float = CHECK_S) -> None:
        self.check_s = check_s
        self.demoted: set[int] = set()
        self._next = 0.0  # monotonic: the next batch end that takes a reading
        self._reading: dict[int, int] = {}  # tid -> CPU ns at the last batch end
        self._read_at: float | None = None

    def batch_ended(self) -> None:
        """At a batch's end, once a :attr:`check_s`: read the native threads' CPU time."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.check_s
        self._reading = {}
        for tid in native_threads():
            try:
                if tid not in self.demoted and os.sched_getscheduler(tid) != os.SCHED_IDLE:
                    self._reading[tid] = thread_cpu_ns(tid)
            except OSError:
                continue
        self._read_at = time.monotonic()

    def batch_started(self) -> None:
        """At the next batch's start: each thread read at the last end that used
        :data:`SPIN_SHARE` of a core since is demoted."""
        if self._read_at is None:
            return
        gap_s, self._read_at = time.monotonic() - self._read_at, None
        if gap_s < MIN_GAP_S:
            return
        for tid, before in self._reading.items():
            try:
                share = (thread_cpu_ns(tid) - before) / 1e9 / gap_s
            except OSError:
                continue
            if share >= SPIN_SHARE and demote(tid):
                self.demoted.add(tid)
                logger.info("thread %d busy-waited between batches (%.0f %% of a core over %.1f ms): it "
                            "runs at SCHED_IDLE from now", tid, share * 100, gap_s * 1e3)
        self._reading = {}


def watch(enabled: bool) -> SpinWatch | None:
    """A :class:`SpinWatch` when ``enabled`` and this platform has what it needs, else None."""
    if not enabled or not hasattr(os, "SCHED_IDLE") or not os.path.isdir(_TASKS):
        return None
    return SpinWatch()
