"""``naiad.guard``: the folder goes with the server, whatever thread of it started the guard."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil

PARENT = """
import sys, threading, time
from naiad import procs
def spawn():  # the guard's death signal is tied to this thread, which ends first
    guard = procs.spawn_guarded(["sleep", "60"], remove_when_orphaned=sys.argv[1])
    print(guard.pid, flush=True)
    time.sleep(1.0)  # the guard is up (its death signal asked for)
thread = threading.Thread(target=spawn)
thread.start(); thread.join()
print("thread gone", flush=True)
time.sleep(float(sys.argv[2]))  # the rest of the server lives on a while (its other threads)
"""


def start_parent(folder: Path, lives_on_s: float) -> tuple[subprocess.Popen, int]:
    folder.mkdir()
    (folder / "redis.conf").write_text("x")
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(folder), str(lives_on_s)],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    guard_pid = int(parent.stdout.readline())
    assert parent.stdout.readline().strip() == "thread gone"
    return parent, guard_pid


def ended(pid: int, timeout_s: float = 10.0) -> bool:
    """True once ``pid`` has exited (a zombie: its parent, the test's server, never reaps it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def wait_gone(path: Path, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not path.exists()


def test_the_folder_goes_when_the_server_dies_after_the_thread_that_started_the_guard(tmp_path):
    """The death signal comes when the starting thread ends while the process lives on (as in
    a kill -9, its threads exiting one by one): the guard's parent is still the server then,
    and only the lifeline's EOF tells it the server is gone (was: the folder left behind)."""
    parent, _ = start_parent(tmp_path / "soon", 0.2)
    with parent:
        parent.wait(30)
    assert wait_gone(tmp_path / "soon")


def test_the_folder_stays_while_the_server_lives_on(tmp_path):
    """A guard signalled while its server lives on past the lifeline wait keeps the folder
    (the server restarts Redis in it, or removes it when it stops)."""
    parent, guard_pid = start_parent(tmp_path / "kept", 5.0)
    with parent:
        try:
            assert ended(guard_pid)  # signalled, waited for the lifeline, gave up
            assert (tmp_path / "kept" / "redis.conf").exists() and parent.poll() is None
        finally:
            parent.kill()
