"""Child processes that die with their parent.

``PR_SET_PDEATHSIG`` (Linux ``prctl(2)``) makes the kernel send SIGTERM to a child when the
process that started it dies, so a ``naiad serve`` killed with SIGKILL leaves no Redis or
worker behind. Two ways to set it, by the kind of child:

- :func:`spawn_python` (workers, warm-pool processes): the child sets it itself, first thing
  in ``naiad``'s ``main()`` (:func:`adopt_parent_death`), told its parent's pid through
  :data:`PARENT_PID_ENV`. No Python runs between ``fork`` and ``exec``: that would be unsafe
  in the multi-threaded gateway (a lock held by another thread at fork time, e.g. the
  dynamic loader's, stays held forever in the child, which then hangs before it starts).
- :func:`spawn` with a ``preexec_fn`` (``redis-server``, not ours to change): only safe while
  the parent has one thread, which is when ``naiad serve`` starts Redis.

On other systems the children are stopped by the normal shutdown path only.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Sequence

_PR_SET_PDEATHSIG = 1
PARENT_PID_ENV = "NAIAD_PARENT_PID"


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def spawn(args: Sequence[str], **kwargs) -> subprocess.Popen:
    """Start a foreign program ``args`` as a child that receives SIGTERM when this process
    dies. Call it only while this process has a single thread (see the module doc).

    ``start_new_session=True`` (a ``subprocess.Popen`` argument) keeps a terminal's Ctrl-C
    from reaching the child, for children this process stops itself, in order."""
    preexec = _die_with_parent if sys.platform.startswith("linux") else None
    return subprocess.Popen(list(args), preexec_fn=preexec, **kwargs)  # noqa: PLW1509


def spawn_python(args: Sequence[str], **kwargs) -> subprocess.Popen:
    """Start a ``naiad`` command ``args``; it adopts death-with-parent itself at start."""
    env = {**(kwargs.pop("env", None) or os.environ), PARENT_PID_ENV: str(os.getpid())}
    return subprocess.Popen(list(args), env=env, **kwargs)


def adopt_parent_death() -> None:
    """In a child started by :func:`spawn_python`: ask for SIGTERM when the parent dies, and
    exit at once if it died already (between the fork and this call)."""
    parent = os.environ.pop(PARENT_PID_ENV, None)
    if parent is None or not sys.platform.startswith("linux"):
        return
    _die_with_parent()
    if os.getppid() != int(parent):
        sys.exit(0)


def stop(process: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """SIGTERM, wait up to ``timeout_s`` seconds, then SIGKILL."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
