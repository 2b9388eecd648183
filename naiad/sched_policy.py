"""Moving a thread between Linux's ``SCHED_OTHER`` and ``SCHED_IDLE`` policies (``sched(7)``).

A thread at ``SCHED_IDLE`` runs only on a CPU no other thread wants, and any thread that
wakes preempts it. Two parts use it for waiting that must not take CPU from real work: a
worker's framework threads that spin between batches (:mod:`workers.spin_watch`) and a
gateway polling for the answer to its only request (:mod:`naiad.busy_poll`). Moving a
thread *to* ``SCHED_IDLE`` is always allowed; moving it *back* needs root, ``CAP_SYS_NICE``
or an ``RLIMIT_NICE`` that allows nice 0 (``sched_setscheduler(2)``, "EPERM"), which
:func:`can_restore` tries once.
"""

from __future__ import annotations

import os
import threading


def set_policy(tid: int, policy: int) -> bool:
    """Put thread ``tid`` (0: the calling thread) under ``policy`` (``os.SCHED_IDLE`` or
    ``os.SCHED_OTHER``, nice 0); False when it is gone or may not be moved."""
    try:
        os.sched_setscheduler(tid, policy, os.sched_param(0))
    except OSError:
        return False
    return True


def can_restore() -> bool:
    """Whether this process may move a thread back from ``SCHED_IDLE`` to ``SCHED_OTHER``
    (root, ``CAP_SYS_NICE``, or an ``RLIMIT_NICE`` that allows nice 0: ``sched(7)``), tried on
    a thread started for it; False where Linux's ``SCHED_IDLE`` does not exist."""
    if not hasattr(os, "SCHED_IDLE"):
        return False
    result: list[bool] = []

    def probe() -> None:
        me = threading.get_native_id()
        result.append(set_policy(me, os.SCHED_IDLE) and set_policy(me, os.SCHED_OTHER))

    thread = threading.Thread(target=probe, name="naiad-sched-probe")
    thread.start()
    thread.join()
    return bool(result and result[0])
