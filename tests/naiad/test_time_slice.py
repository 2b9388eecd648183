"""``naiad.time_slice``: a process asks Linux's scheduler for its own time slice (EEVDF,
kernel 6.12+); what it starts inherits it; another policy and the nice value are left alone.
Each case runs in a child process, so the test process keeps its own slice."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tritonclient.http as httpclient

from naiad import time_slice


def _kernel_takes_slices() -> bool:
    """Whether this kernel shows slices and honours a requested one (6.12+)."""
    out = _child("print(time_slice.request_slice(250), time_slice.current_slice_ns())")
    return out == "True 250000"


def _child(code: str, preexec=None) -> str:
    program = "from naiad import time_slice\n" + textwrap.dedent(code)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60,
                          preexec_fn=preexec, check=True)  # fmt: skip
    return done.stdout.strip()


pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not _kernel_takes_slices(),
    reason="needs Linux 6.12+ with /proc/PID/sched (EEVDF custom slices)",
)


def test_a_requested_slice_is_clamped_by_the_kernel_and_zero_restores_the_default():
    out = _child("""
        before = time_slice.current_slice_ns()
        time_slice.request_slice(50)
        short = time_slice.current_slice_ns()
        time_slice.request_slice(500_000)
        long = time_slice.current_slice_ns()
        time_slice.request_slice(0)
        print(before, short, long, time_slice.current_slice_ns())
    """)
    before, short, long, restored = map(int, out.split())
    assert short == time_slice.MIN_SLICE_US * 1000
    assert long == time_slice.MAX_SLICE_US * 1000
    assert restored == before


def test_threads_and_child_processes_inherit_the_slice():
    out = _child("""
        import subprocess, sys, threading
        time_slice.request_slice(300)
        seen = []
        thread = threading.Thread(target=lambda: seen.append(
            time_slice.current_slice_ns(f"self/task/{threading.get_native_id()}")))
        thread.start(); thread.join()
        child = subprocess.run([sys.executable, "-c",
                                "from naiad import time_slice; print(time_slice.current_slice_ns())"],
                               capture_output=True, text=True, check=True).stdout.strip()
        print(seen[0], child)
    """)
    assert out.split() == ["300000", "300000"]


def test_the_nice_value_is_kept_and_another_policy_is_left_alone():
    nice = _child("import os; print(time_slice.request_slice(100), os.getpriority(os.PRIO_PROCESS, 0))",
                  preexec=lambda: os.nice(3))  # fmt: skip
    assert nice == "True 3"

    def batch() -> None:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))

    default = int(_child("print(time_slice.current_slice_ns())"))
    out = _child("import os; print(time_slice.request_slice(100), "
                 "os.sched_getscheduler(0) == os.SCHED_BATCH, time_slice.current_slice_ns())",
                 preexec=batch)  # fmt: skip
    assert out == f"False True {default}"


@pytest.mark.parametrize("slice_us", [None, 0])
def test_naiad_serve_its_workers_and_its_redis_run_with_the_slice(naiad_server, slice_us):
    """The default (100 µs) reaches the server, the worker the scaler starts and the
    embedded redis-server; ``--sched-slice-us 0`` leaves all of them at the kernel's default."""
    default = int(_child("print(time_slice.current_slice_ns())"))
    extra = [] if slice_us is None else ["--sched-slice-us", str(slice_us)]
    server = naiad_server(extra_args=extra)
    client = httpclient.InferenceServerClient(server.url)
    x = np.zeros((1, 64), np.float32)
    tensor = httpclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    assert client.infer("digits", [tensor]).as_numpy("label").shape == (1, 1)
    expected = 100_000 if slice_us is None else default
    (worker,) = server.worker_processes("digits")
    redis = [p for p in server.children() if "redis-server" in " ".join(p.cmdline())]
    assert redis, "no embedded redis-server found"
    for process in [server.process, worker, *redis]:
        assert time_slice.current_slice_ns(process.pid) == expected, process
