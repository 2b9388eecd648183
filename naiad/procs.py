"""Child processes that die with their parent.

``PR_SET_PDEATHSIG`` (Linux ``prctl(2)``) makes the kernel send SIGTERM to a child when the
process that started it dies, so a ``naiad serve`` killed with SIGKILL leaves no Redis or
worker behind. On other systems the children are stopped by the normal shutdown path only.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
from collections.abc import Sequence

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def spawn(args: Sequence[str], **kwargs) -> subprocess.Popen:
    """Start ``args`` as a child that receives SIGTERM when this process dies.

    ``start_new_session=True`` (a ``subprocess.Popen`` argument) keeps a terminal's Ctrl-C
    from reaching the child, for children this process stops itself, in order."""
    preexec = _die_with_parent if sys.platform.startswith("linux") else None
    return subprocess.Popen(list(args), preexec_fn=preexec, **kwargs)  # noqa: PLW1509


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
