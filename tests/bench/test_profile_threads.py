"""Per-thread CPU in the profile tool (:mod:`bench.perf.profile`): real threads of this process."""

from __future__ import annotations

import os
import threading
import time

import psutil
import pytest

from bench.perf.profile import thread_costs, thread_seconds


def test_a_busy_thread_is_found_and_charged_its_cpu() -> None:
    me = psutil.Process(os.getpid())
    spun, done = threading.Event(), threading.Event()

    def spin() -> None:
        until = time.thread_time() + 0.3
        while time.thread_time() < until:
            pass
        spun.set()
        done.wait()

    worker = threading.Thread(target=spin)
    before = {"me": thread_seconds(me)}
    started = time.perf_counter()
    worker.start()
    assert spun.wait(30)
    after = {"me": thread_seconds(me)}
    wall = time.perf_counter() - started
    done.set()
    worker.join()
    rows = thread_costs(before, after, requests=1_000, wall_s=wall)
    spinner = [row for row in rows if row[1].endswith(f"({worker.native_id})")]  # named by the OS (comm)
    assert len(spinner) == 1, rows
    _, _, us_a_request, cores = spinner[0]
    assert 290 <= us_a_request <= 400  # 0.3 s of CPU (and the thread's start) over 1,000 requests
    assert cores * wall == pytest.approx(us_a_request * 1_000 / 1e6)
    assert rows == sorted(rows, key=lambda row: -row[3])


def test_a_thread_that_ended_or_idled_is_left_out() -> None:
    before = {"p": {1: ("a", 1.0), 2: ("b", 2.0)}}
    after = {"p": {1: ("a", 1.001), 3: ("c", 0.5)}}
    rows = thread_costs(before, after, requests=100, wall_s=1.0)
    assert rows == [("p", "c (3)", 5000.0, 0.5)]  # a used 0.1 % of a core; b is gone
