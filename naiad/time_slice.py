"""A short CPU time slice for Naiad's processes (Linux's EEVDF scheduler).

Since Linux 6.6 the fair scheduler is EEVDF: each task runs for a *slice* (the base slice
scaled by the CPU count: 1.4 ms on a 2-CPU guest seen here), and since 6.12 a task may ask
for its own slice with ``sched_setattr(2)``'s ``sched_runtime`` under ``SCHED_OTHER``
(kernel ``Documentation/scheduler/sched-eevdf.rst``: "a latency-sensitive task may request
a shorter slice"). The kernel clamps it to 0.1–100 ms; 0 restores the default. A task with a
shorter slice gets earlier virtual deadlines, so when it wakes (an answer from a worker, a
request handed to a worker) it runs sooner, and it yields its CPU sooner to others.

Naiad's processes hand every request along a chain (client, gateway, worker and back); on a
machine where they share few CPUs with each other and with their clients, each wait for a
CPU delays the whole chain. With 0.1 ms slices (the default, ``--sched-slice-us``),
``digits`` JSON at c32 on the benchmark's 2-CPU VM ran 1.13× the requests a second at 13 %
less CPU a request, ``digits_python`` 1.10× (``python -m bench.perf.ab``, 3 of 3 rounds
each; docs/benchmarks.md "Stop 37").

The slice is set for the calling thread; threads and processes it starts afterwards inherit
it (``fork``, ``clone`` and ``execve`` keep it), so one call first thing in ``main()`` covers
a gateway's siblings, the scaler's workers and the embedded ``redis-server``. A process run
under another policy (``chrt --batch``, ``SCHED_IDLE``, a real-time one) is left as it is,
and so is its nice value. On other systems, on kernels before 6.12 (which ignore the field)
and where the call is refused (a seccomp filter), nothing changes.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import struct
import sys

logger = logging.getLogger(__name__)

#: ``sched_setattr``'s system call number by machine (``asm/unistd_64.h``; the generic table
#: ``asm-generic/unistd.h`` for arm64).
SYSCALL_NUMBERS = {"x86_64": 314, "aarch64": 274}
#: ``struct sched_attr`` as of its first version (``SCHED_ATTR_SIZE_VER0``, 48 bytes):
#: size, policy, flags, nice, priority, runtime (ns), deadline (ns), period (ns).
SCHED_ATTR = struct.Struct("IIQiIQQQ")
#: The slices the kernel accepts (µs; ``kernel/sched/syscalls.c`` clamps to these).
MIN_SLICE_US, MAX_SLICE_US = 100, 100_000


def request_slice(slice_us: int) -> bool:
    """Ask for a time slice of ``slice_us`` µs (clamped by the kernel to 100..100,000) for
    this thread and what it starts afterwards; 0 restores the kernel's default. True when
    the kernel took the request (a kernel before 6.12 takes it and ignores the slice).
    Never raises: a process under a policy other than ``SCHED_OTHER``, another system, or a
    refused call leaves everything as it is (logged at debug level)."""
    number = SYSCALL_NUMBERS.get(platform.machine())
    if not sys.platform.startswith("linux") or number is None:
        return False
    if os.sched_getscheduler(0) != os.SCHED_OTHER:
        logger.debug("time slice left alone: this process runs under another scheduling policy")
        return False
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    attr = ctypes.create_string_buffer(SCHED_ATTR.pack(SCHED_ATTR.size, os.SCHED_OTHER, 0, nice, 0,
                                                       slice_us * 1000, 0, 0))  # fmt: skip
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, 0, attr, 0) != 0:
        logger.debug("time slice of %d µs refused: %s", slice_us, os.strerror(ctypes.get_errno()))
        return False
    logger.debug("time slice of %d µs requested", slice_us)
    return True


def current_slice_ns(pid: int | str = "self") -> int | None:
    """The slice the kernel gives ``pid`` now (ns; ``se.slice`` of ``/proc/PID/sched``),
    or None where that file or field is absent (kernels without ``CONFIG_SCHED_DEBUG``)."""
    try:
        with open(f"/proc/{pid}/sched") as file:
            for line in file:
                name, _, value = line.partition(":")
                if name.strip() == "se.slice":
                    return int(value)
    except (OSError, ValueError):
        return None
    return None
