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
looks at every native thread of the worker process that is not a Python thread (the frameworks'
own pools; Python's threads — the event loop, the model thread, a ``model.py``'s own — are left
alone, and so are threads already at ``SCHED_IDLE``) and sums how long each was awake in that
gap (:func:`awake_ns`): all of it when the thread was runnable at both ends and did not sleep
between (its voluntary context switches, ``/proc/PID/task/TID/status``), else its CPU time. A
thread awake for at least :data:`SPIN_SHARE` of the gap never went to sleep: it is a *spinner*.
The gaps of consecutive batches are summed until they reach :data:`MIN_GAP_S`: under load a
worker runs its batches back to back, tens of µs apart. (Two rules before this one missed
spinners exactly where they hurt: its CPU time alone, with the gateway and the client on both
cores of the VM, was 0.35–0.47 of a gap it spun through, and a CI run judged none a spinner;
one gap alone, discarded when under :data:`MIN_GAP_S`, never judged anything at c32, where the
spinner of the benchmark's ``model.py`` then took 0.4 of a core: stop 34.) From then on it runs
at ``SCHED_IDLE`` (``sched(7)``: only on a CPU no other thread wants, and any thread waking
preempts it) except while a batch computes: the thread that computes it (the model's, or the
event loop for a batch run inline) moves it to ``SCHED_OTHER`` as the computation starts and
back as it returns (:meth:`SpinWatch.busy`, :meth:`SpinWatch.idle`), so it computes its share
of a batch at the normal policy, and neither the model's thread waiting to run a batch nor the
loop waiting to take its result waits behind it. Kept at ``SCHED_IDLE`` through the batches as
well, an OpenMP pool (static shares: every run waits for each thread's) ran a PyTorch matmul
20–30× slower with the cores busy, and ONNX Runtime's batches took 0.7–1.2 ms instead of ~0.5
(docs/benchmarks.md, "Stop 27"). A Python-backend ``model.py``'s ``execute`` is another
matter: its own Python runs around the framework's call (the benchmark's converts each
request in and out around one ONNX Runtime run), and a pool that spins 20–40 ms after a run
spins through all of it at the normal policy, holding a core the gateway and the clients want.
So the spinners stay at ``SCHED_IDLE`` through a Python model's ``execute``
(:func:`workers.execution.around_model_code`) unless the process has loaded a library whose
parallel runs wait for every pool thread's share (:func:`static_shares_loaded`,
:attr:`SpinWatch.static_shares`: an OpenMP region, TensorFlow's Eigen pool; a starved thread
stalls the run, as above); ONNX Runtime's pool gives a share no pool thread took to the
calling thread. Measured
(``digits_python`` at c32, 4 rounds each against the code before, docs/benchmarks.md "Stop
44"): gRPC 1.06× (4 of 4), HTTP binary 1.07× (3 of 4), JSON 1.12× (4 of 4); the worker's CPU
a JSON request 122–139 → 96–116 µs.
Moving a thread back from ``SCHED_IDLE`` needs root,
``CAP_SYS_NICE`` or an ``RLIMIT_NICE`` allowing nice 0; a process without it
(:func:`can_restore`) leaves its threads alone.

Linux only (``os.sched_setscheduler`` with ``SCHED_IDLE``, thread CPU clocks and ``/proc``); elsewhere,
or with ``--demote-spinning-threads false``, :func:`watch` returns None and nothing is read.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from typing import NamedTuple

logger = logging.getLogger(__name__)

#: Seconds between two judgments (each costs a listing of ``/proc/self/task``, then per native
#: thread two reads of its ``status`` and CPU clock for each gap summed: ~30 µs a read).
CHECK_S = 1.0
#: Share of the gaps between batches a thread must be awake (:func:`awake_ns`) to count as
#: busy-waiting.
SPIN_SHARE = 0.5
#: Time between batches a judgment needs (seconds): a shorter gap says too little, so the
#: gaps of consecutive batches are summed until they reach it (under load a worker runs its
#: batches back to back, tens of µs apart: the summing is what finds a spinner there).
MIN_GAP_S = 0.0005
#: Most gaps one judgment sums (then it is dropped, and the next comes a check period later).
MAX_GAPS = 64

_TASKS = "/proc/self/task"
#: A mapped library whose parallel runs wait for each pool thread's static share, in
#: ``/proc/self/maps`` (``proc(5)``: a mapping's file last on its line): an OpenMP runtime
#: (GNU's ``libgomp``, Intel's ``libiomp5``, LLVM's ``libomp``; PyTorch's and scikit-learn's
#: wheels bundle ``libgomp-<hash>.so.1``) or TensorFlow's (its Eigen pool's ``parallelFor``
#: waits on a barrier for every shard).
_STATIC_SHARES = re.compile(
    rb"/(?:lib(?:gomp|iomp5|omp)[-.]|libtensorflow_framework\.so)[^/\n]*$", re.MULTILINE
)


def static_shares_loaded(maps: str = "/proc/self/maps") -> bool:
    """Whether a library whose parallel runs wait for every pool thread's share (an OpenMP
    runtime, TensorFlow) is mapped into this process (``maps``: its memory map, ``proc(5)``);
    False when the map cannot be read."""
    try:
        with open(maps, "rb") as file:
            return _STATIC_SHARES.search(file.read()) is not None
    except OSError:
        return False


def thread_cpu_ns(tid: int) -> int:
    """CPU time (ns) of thread ``tid`` of this process, from its per-thread CPU clock (Linux's
    ``MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)``, ``include/linux/posix-timers.h``: the
    clock id ``(~tid << 3) | 6``; exact, where ``schedstat`` lags a running thread by up to a
    tick). Raises :class:`OSError` when the thread is gone."""
    return time.clock_gettime_ns(((~tid) << 3) | 6)


class Reading(NamedTuple):
    """One look at a thread."""

    cpu_ns: int  # its CPU clock
    sleeps: int  # voluntary context switches so far: each one a sleep (``sched(7)``, ``proc(5)``)
    runnable: bool  # state R: on a CPU or in a run queue


def read_thread(tid: int) -> Reading:
    """Thread ``tid`` of this process now: its CPU clock, and ``State`` and
    ``voluntary_ctxt_switches`` of ``/proc/self/task/TID/status`` (``proc(5)``). Raises
    :class:`OSError` when the thread is gone."""
    cpu_ns = thread_cpu_ns(tid)
    with open(f"{_TASKS}/{tid}/status", "rb") as file:
        status = file.read()
    try:
        state = status[status.index(b"\nState:") + 7:].lstrip()[:1]
        at = status.index(b"\nvoluntary_ctxt_switches:") + 25
        sleeps = int(status[at:status.index(b"\n", at)])
    except ValueError as exc:  # not Linux's layout
        raise OSError(f"unreadable status of thread {tid}") from exc
    return Reading(cpu_ns, sleeps, state == b"R")


def awake_ns(before: Reading, after: Reading, gap_ns: int) -> int:
    """Of ``gap_ns`` between two readings of a thread, how long it was awake: all of it when it
    was runnable at both and did not sleep between (no voluntary switch; on a busy machine its
    CPU time is a fraction of that: it waited in a run queue, never asleep), else its CPU time."""
    if before.runnable and after.runnable and before.sleeps == after.sleeps:
        return gap_ns
    return min(after.cpu_ns - before.cpu_ns, gap_ns)


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
    outside the batches' computations (module doc). The executor calls :meth:`batch_started`
    before each batch (its version's load included) and :meth:`batch_ended` after it; the
    thread that computes the batch (the model's, or the loop for a batch run inline) calls
    :meth:`busy` as the computation starts and :meth:`idle` as it returns."""

    def __init__(self, check_s: float = CHECK_S) -> None:
        self.check_s = check_s
        self.spinners: set[int] = set()  # threads found busy-waiting between batches
        self._next = 0.0  # monotonic: the next batch end that opens a judgment
        self._reading: dict[int, Reading] = {}  # tid -> its reading at the last batch end
        self._read_at: float | None = None
        self._awake: dict[int, int] = {}  # the judged threads -> ns awake summed over the gaps
        #: A library with static shares is loaded (:func:`static_shares_loaded`): a Python
        #: model's ``execute`` then runs with the spinners at ``SCHED_OTHER`` too (module doc).
        #: Looked at once a check period while spinners are known and it is False (a model may
        #: import one late).
        self.static_shares = False
        self._summed_s = 0.0  # the gaps' time so far
        self._gaps = 0
        self._policy = os.SCHED_OTHER  # where the spinners are now (a new one: SCHED_OTHER)
        #: The model's thread moves the spinners as a batch returns; a caller cancelled meanwhile
        #: (shutdown) lets the loop go on to the next batch, so both may move them at once.
        self._lock = threading.Lock()

    def busy(self) -> None:
        """The spinners to ``SCHED_OTHER`` now, for their share of the batch: called by the
        thread that computes it as the computation starts, not as the loop hands it over (on
        a busy machine the model's thread waits in a run queue first, where the spinners at
        the normal policy would hold a CPU others wait for)."""
        self._move(os.SCHED_OTHER)

    def idle(self) -> None:
        """The spinners to ``SCHED_IDLE`` now: called by the model's thread as a batch's
        computation returns, before the event loop that awaits it wakes (that wake-up, too,
        may wait in a run queue); :meth:`batch_ended` then has nothing left to move."""
        self._move(os.SCHED_IDLE)

    def batch_ended(self) -> None:
        """The spinners to ``SCHED_IDLE``; once a :attr:`check_s` (and at the ends after it,
        while its judgment sums gaps), a reading of the other native threads (:func:`read_thread`)."""
        self._move(os.SCHED_IDLE)
        if not self._gaps:
            now = time.monotonic()
            if now < self._next:
                return
            self._next = now + self.check_s
            self._awake = {tid: 0 for tid in self._candidates()}
            if self.spinners and not self.static_shares:
                self.static_shares = static_shares_loaded()
        self._reading = {}
        for tid in list(self._awake):
            try:
                self._reading[tid] = read_thread(tid)
            except OSError:
                del self._awake[tid]
        self._read_at = time.monotonic()

    def batch_started(self) -> None:
        """The gap since the last reading is summed; once the gaps reach :data:`MIN_GAP_S`,
        each thread awake for :data:`SPIN_SHARE` of them (:func:`awake_ns`) joins the spinners,
        moved at once to their policy (``SCHED_IDLE`` here, until :meth:`busy`: :meth:`_move`
        moves only on a change, so a batch that fails before it computes would leave it at
        ``SCHED_OTHER``)."""
        if self._read_at is None:
            return
        gap_s, self._read_at = time.monotonic() - self._read_at, None
        for tid, before in self._reading.items():
            try:
                self._awake[tid] += awake_ns(before, read_thread(tid), int(gap_s * 1e9))
            except OSError:
                self._awake.pop(tid, None)
        self._summed_s += gap_s
        self._gaps += 1
        if self._summed_s >= MIN_GAP_S:
            self._judge()
        if self._summed_s >= MIN_GAP_S or self._gaps >= MAX_GAPS:
            self._awake, self._reading, self._summed_s, self._gaps = {}, {}, 0.0, 0

    def _candidates(self) -> list[int]:
        """The native threads not yet spinners and not at ``SCHED_IDLE`` already. A spinner
        no longer among this process's threads is forgotten here: its thread id may be given
        to another thread, of any process, which must not be moved."""
        threads = native_threads()
        with self._lock:
            self.spinners.intersection_update(threads)
        found = []
        for tid in threads:
            try:
                if tid not in self.spinners and os.sched_getscheduler(tid) != os.SCHED_IDLE:
                    found.append(tid)
            except OSError:
                continue
        return found

    def _judge(self) -> None:
        for tid, awake in self._awake.items():
            share = awake / 1e9 / self._summed_s
            if share < SPIN_SHARE:
                continue
            with self._lock:
                if not set_policy(tid, self._policy):  # where the others are
                    continue
                self.spinners.add(tid)
                self.static_shares = self.static_shares or static_shares_loaded()
                logger.info("thread %d busy-waited between batches (awake %.0f %% of %.2f ms over %d "
                            "gaps): it runs at SCHED_IDLE outside batches from now", tid, share * 100,
                            self._summed_s * 1e3, self._gaps)

    def _move(self, policy: int) -> None:
        with self._lock:
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
        read_thread(threading.get_native_id())
    except OSError:
        return None
    if not can_restore():
        logger.info("spinning threads are left alone: this process may not move a thread back "
                    "from SCHED_IDLE (CAP_SYS_NICE or RLIMIT_NICE, sched(7))")
        return None
    return SpinWatch()
