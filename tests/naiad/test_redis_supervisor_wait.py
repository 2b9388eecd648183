"""naiad.redis_server._wait: how the embedded Redis's supervisor thread learns that the
server exited, without polling (each poll would take the GIL from the gateway's loop)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time

import pytest

from naiad.redis_server import _wait

#: Descriptors the FD_SETSIZE test holds open: past select's 1,024.
HELD = 1100


def _voluntary_switches(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/status") as status:
        line = next(row for row in status if row.startswith("voluntary_ctxt_switches"))
    return int(line.split()[1])


def test_a_running_process_is_waited_for_without_polling():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        seen: dict[str, int | None] = {}

        def waiting() -> None:
            tid = threading.get_native_id()
            before = _voluntary_switches(tid)
            seen["status"] = _wait(process, 1.0)
            seen["switches"] = _voluntary_switches(tid) - before

        thread = threading.Thread(target=waiting)
        thread.start()
        thread.join(10)
        assert seen["status"] is None  # still running after the timeout
        assert seen["switches"] <= 3, seen  # Popen.wait(1.0) wakes ~25 times
    finally:
        process.kill()
        process.wait()


def test_an_exit_is_seen_at_once_and_a_reaped_process_gives_its_status():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3); raise SystemExit(3)"])
    started = time.monotonic()
    assert _wait(process, 20.0) == 3
    assert time.monotonic() - started < 10  # woken by the exit, not by the timeout
    assert _wait(process, 5.0) == 3  # reaped already: its status, no wait on a reused pid


def test_a_process_holding_descriptors_past_fd_setsize_is_waited_for():
    """A busy gateway holds more than 1,024 descriptors: the pidfd of a restarted server is
    numbered past ``select``'s ``FD_SETSIZE``; the wait must still work (helper-19's repro)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < HELD + 100:  # nor can a gateway pass FD_SETSIZE here
        pytest.skip(f"this process may hold {hard} descriptors at most")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, HELD + 100), hard))  # 1,024 is a common soft limit
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(HELD)]
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5); raise SystemExit(4)"])
    try:
        assert _wait(process, 0.1) is None
        assert _wait(process, 20.0) == 4
    finally:
        for fd in held:
            os.close(fd)
        process.kill()
        process.wait()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
