"""Framework threads that busy-wait between batches run at ``SCHED_IDLE`` between batches.

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
the start of the next (the version's load, when a batch needs one, counts as the batch's), it
reads how long every native thread of the worker process that is not a Python thread (the
frameworks' own pools; Python's threads — the event loop, the model thread, a ``model.py``'s
own — are left alone, and so are threads already at ``SCHED_IDLE``) has been runnable: on a CPU
or waiting in a run queue for one (``/proc/PID/task/TID/schedstat``'s first two fields,
``Documentation/scheduler/sched-stats.rst``). A thread runnable for at least :data:`SPIN_SHARE`
of that gap (at least :data:`MIN_GAP_S`) never went to sleep: it is a *spinner*. (Its CPU time
alone missed spinners exactly where they hurt: with the gateway and the client on both cores of
the VM, a pool thread that spun through the gap ran for 0.35–0.47 of it, and a CI run judged
none of its readings a spinner.) From then on it is moved to ``SCHED_IDLE`` at each batch's end
(by the model's thread as its call returns, when the batch ran there: :meth:`SpinWatch.idle`;
``sched(7)``: it runs only on a CPU no other thread wants, and any thread waking preempts it)
and back to ``SCHED_OTHER`` at each batch's start, so it computes its share of a batch at the
normal policy. Kept at ``SCHED_IDLE`` through the batches as well, an OpenMP pool (static
shares: every run waits for each thread's) ran a PyTorch matmul 20–30× slower with the cores
busy, and ONNX Runtime's batches took 0.7–1.2 ms instead of ~0.5 (docs/benchmarks.md, "Stop
27"). Moving a thread back from ``SCHED_IDLE`` needs root, ``CAP_SYS_NICE`` or an
``RLIMIT_NICE`` allowing nice 0; a process without it (:func:`can_restore`) leaves its threads
alone.

Linux only (``os.sched_setscheduler`` with ``SCHED_IDLE`` and per-thread ``schedstat``); elsewhere,
or with ``--demote-spinning-threads false``, :func:`watch` returns None and nothing is read.
"""

from __future__ import annotations

import logging
import os
import threading
import time

logger = logging.getLogger(__name__)

#: Seconds between two looks at the threads (each costs a listing of ``/proc/self/task`` and
#: one ``schedstat`` read per native thread, twice).
CHECK_S = 1.0
#: Share of the gap between two batches a thread must be runnable (on a CPU or in a run queue)
#: to count as busy-waiting.
SPIN_SHARE = 0.5
#: Shortest gap between batches that is judged (seconds): a shorter one says too little.
MIN_GAP_S = 0.0005

_TASKS = "/proc/self/task"


def runnable_ns(tid: int) -> int:
    """Nanoseconds thread ``tid`` of this process has been runnable: on a CPU plus waiting in a
    run queue (the first two fields of ``/proc/self/task/TID/schedstat``,
    ``Documentation/scheduler/sched-stats.rst``). Raises :class:`OSError` when the thread is gone
    (or the kernel keeps no such file: no ``CONFIG_SCHED_INFO``)."""
    with open(f"{_TASKS}/{tid}/schedstat", "rb") as file:
        on_cpu, waiting = file.read().split()[:2]
    return int(on_cpu) + int(waiting)


def native_threads() -> list[int]:
    """Thread ids of this process that Python's :mod:`threading` did not start."""
    python = {t.native_id for t in threading.enumerate()}
    try:
        tids = [int(name) for name in os.listdir(_TASKS)]
    except OSError:
        return []
    return [tid for tid in tids if tid not in python]


def set_policy(tid: int, policy: int) -> bool:
    """Put thread ``tid`` under ``policy`` (``os.SCHED_IDLE`` or ``os.SCHED_OTHER``, nice 0);
    False when it is gone or may not be moved."""
    try:
        os.sched_setscheduler(tid, policy, os.sched_param(0))
    except OSError:
        return False
    return True


def can_restore() -> bool:
    """Whether this process may move a thread back from ``SCHED_IDLE`` to ``SCHED_OTHER``
    (root, ``CAP_SYS_NICE``, or an ``RLIMIT_NICE`` that allows nice 0: ``sched(7)``), tried on
    a thread started for it."""
    result: list[bool] = []

    def probe() -> None:
        me = threading.get_native_id()
        result.append(set_policy(me, os.SCHED_IDLE) and set_policy(me, os.SCHED_OTHER))

    thread = threading.Thread(target=probe, name="naiad-sched-probe")
    thread.start()
    thread.join()
    return bool(result and result[0])


class SpinWatch:
    """Finds busy-waiting framework threads between batches and keeps them at ``SCHED_IDLE``
    between batches only (module doc). The executor calls :meth:`batch_started` before each
    batch (its version's load included) and :meth:`batch_ended` after it."""

    def __init__(self, check_s: float = CHECK_S) -> None:
        self.check_s = check_s
        self.spinners: set[int] = set()  # threads found busy-waiting between batches
        self._next = 0.0  # monotonic: the next batch end that takes a reading
        self._reading: dict[int, int] = {}  # tid -> CPU ns at the last batch end
        self._read_at: float | None = None
        self._policy = os.SCHED_OTHER  # where the spinners are now

    def idle(self) -> None:
        """The spinners to ``SCHED_IDLE`` now: called by the model's thread as a batch's
        computation returns, before the event loop that awaits it wakes (on a busy machine that
        wake-up waits in a run queue, where the spinners at the normal policy would hold a CPU
        the loop waits for); :meth:`batch_ended` then has nothing left to move."""
        self._move(os.SCHED_IDLE)

    def batch_ended(self) -> None:
        """The spinners to ``SCHED_IDLE``; once a :attr:`check_s`, a reading of how long the
        other native threads have been runnable."""
        self._move(os.SCHED_IDLE)
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.check_s
        self._reading = {}
        for tid in native_threads():
            try:
                if tid not in self.spinners and os.sched_getscheduler(tid) != os.SCHED_IDLE:
                    self._reading[tid] = runnable_ns(tid)
            except OSError:
                continue
        self._read_at = time.monotonic()

    def batch_started(self) -> None:
        """Each thread read at the last end that was runnable for :data:`SPIN_SHARE` of the
        time since joins the spinners; the spinners back to ``SCHED_OTHER`` for the batch."""
        if self._read_at is not None:
            self._judge(time.monotonic() - self._read_at)
        self._move(os.SCHED_OTHER)

    def _judge(self, gap_s: float) -> None:
        self._read_at, reading, self._reading = None, self._reading, {}
        if gap_s < MIN_GAP_S:
            return
        for tid, before in reading.items():
            try:
                share = (runnable_ns(tid) - before) / 1e9 / gap_s
            except OSError:
                continue
            if share >= SPIN_SHARE:
                self.spinners.add(tid)
                logger.info("thread %d busy-waited between batches (runnable %.0f %% of %.1f ms): it "
                            "runs at SCHED_IDLE between batches from now", tid, share * 100, gap_s * 1e3)

    def _move(self, policy: int) -> None:
        if policy == self._policy:
            return
        self._policy = policy
        gone = [tid for tid in self.spinners if not set_policy(tid, policy)]
        self.spinners.difference_update(gone)


def watch(enabled: bool) -> SpinWatch | None:
    """A :class:`SpinWatch` when ``enabled`` and this platform and process have what it needs
    (:func:`can_restore` among it), else None."""
    if not enabled or not hasattr(os, "SCHED_IDLE") or not os.path.isdir(_TASKS):
        return None
    try:
        runnable_ns(threading.get_native_id())
    except OSError:
        return None
    if not can_restore():
        logger.info("spinning threads are left alone: this process may not move a thread back "
                    "from SCHED_IDLE (CAP_SYS_NICE or RLIMIT_NICE, sched(7))")
        return None
    return SpinWatch()
