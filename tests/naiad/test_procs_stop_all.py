"""``naiad.procs.stop_all``: children that ignore SIGTERM (a worker hung in ``finalize()``)
are waited for under one shared deadline, then killed; the others go at SIGTERM. Real child
processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from naiad import procs

#: A child that says it is ready only once SIGTERM is ignored (so the signal cannot come first).
DEAF = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(120)")  # fmt: skip
POLITE = "import sys, time; print('ready', flush=True); time.sleep(120)"


def spawn(code: str) -> subprocess.Popen:
    process = procs.spawn_python([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert process.stdout is not None
    with process.stdout:  # nothing more is printed
        assert process.stdout.readline() == b"ready\n"
    return process


def test_children_deaf_to_sigterm_share_one_deadline_and_are_killed():
    deaf = [spawn(DEAF) for _ in range(4)]
    polite = spawn(POLITE)
    started = time.monotonic()
    procs.stop_all([*deaf, polite], timeout_s=1.5)
    took = time.monotonic() - started
    # one after another, each deaf child would have had its own 1.5 s: 6 s or more
    assert 1.4 <= took < 4.5, took
    assert [p.returncode for p in deaf] == [-9] * 4  # SIGKILL
    assert polite.returncode == -15  # went at SIGTERM
    assert not any(psutil.pid_exists(p.pid) for p in [*deaf, polite])  # reaped, not zombies
    assert all(procs.became_ready(p) is False for p in [*deaf, polite])  # pipes closed


def test_children_that_exit_at_sigterm_are_not_waited_for():
    children = [spawn(POLITE) for _ in range(3)]
    started = time.monotonic()
    procs.stop_all(children, timeout_s=30)
    assert time.monotonic() - started < 10
    assert [p.returncode for p in children] == [-15] * 3


def test_children_gone_already_are_only_reaped():
    child = spawn(POLITE)
    child.kill()
    child.wait()
    procs.stop_all([child], timeout_s=30)
    assert child.returncode == -9


def test_one_child_that_cannot_be_closed_does_not_keep_the_others(caplog):
    broken, deaf = spawn(POLITE), spawn(DEAF)
    os.close(broken.naiad_ready[0])  # its readiness pipe: reading it now fails (EBADF)
    procs.stop_all([broken, deaf], timeout_s=0.5)
    assert broken.returncode == -15 and deaf.returncode == -9  # the second one still killed
    assert f"stopping pid {broken.pid}" in caplog.text
    assert f"pid {deaf.pid} still running after SIGTERM: SIGKILL" in caplog.text
