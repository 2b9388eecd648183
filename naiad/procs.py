"""Child processes that die with their parent, and the secrets they are (not) given.

``PR_SET_PDEATHSIG`` (Linux ``prctl(2)``) makes the kernel signal a child when the thread
that started it dies, so a ``naiad serve`` killed with SIGKILL leaves no Redis or worker
behind. Two ways to set it, by the kind of child:

- :func:`spawn_python` (workers, warm-pool processes): the child sets it itself, first thing
  in ``naiad``'s ``main()`` (:func:`adopt_parent_death`), told its parent's pid through
  :data:`PARENT_PID_ENV`, with SIGKILL: a worker whose server died has no gateway to answer
  (its claimed requests stay pending in their stream for another worker to reclaim), so it
  must not drain for a minute as on SIGTERM. No Python runs between ``fork`` and ``exec``:
  that would be unsafe in the multi-threaded gateway (a lock held by another thread at fork
  time stays held forever in the child).
- :func:`spawn_guarded` (``redis-server``, not ours to change): started under
  :mod:`naiad.guard`, a small single-threaded Python process that sets the signal for itself
  and for the program, forwards SIGTERM/SIGINT to it and, when orphaned, removes the
  program's data folder.

Secrets: :func:`spawn_python` gives a child neither the API keys (:data:`SECRET_ENV`) nor the
Redis URL (it may hold a password) in its environment or on its command line: the URL is
written into a pipe whose read end the child inherits (its number in :data:`REDIS_URL_FD_ENV`);
the child reads and closes it at start (:func:`take_redis_url`), before any model code runs,
so neither ``ps`` (arguments or ``e``nvironment) nor a process the model starts sees it.

On other systems the children are stopped by the normal shutdown path only.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
PARENT_PID_ENV = "NAIAD_PARENT_PID"
REDIS_URL_ENV = "NAIAD_REDIS_URL"
#: The inherited file descriptor a child started by :func:`spawn_python` reads its Redis URL from.
REDIS_URL_FD_ENV = "NAIAD_REDIS_URL_FD"
#: The inherited file descriptor a child started by :func:`spawn_python` reads its whole
#: settings from (JSON; a gateway's sibling process: :mod:`gateway.siblings`).
SETTINGS_FD_ENV = "NAIAD_SETTINGS_FD"
#: The inherited pipe a child started by :func:`spawn_python` reports its readiness on.
READY_FD_ENV = "NAIAD_READY_FD"
_ready_fd: int | None = None
#: Variables never passed to a child: the gateway's API keys (workers run model code).
SECRET_ENV = ("NAIAD_HTTP_RESTRICTED_API", "NAIAD_GRPC_RESTRICTED_PROTOCOL", REDIS_URL_ENV)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel for ``sig`` when the parent (thread) of this process dies (Linux)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig)
    except OSError:
        pass


def child_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) without :data:`SECRET_ENV`."""
    return {k: v for k, v in (os.environ if base is None else base).items() if k not in SECRET_ENV}


def spawn_python(
    args: Sequence[str], *, redis_url: str | None = None, env: Mapping[str, str] | None = None,
    settings_json: str | None = None, **kwargs,
) -> subprocess.Popen:  # fmt: skip
    """Start a ``naiad`` command ``args``; it adopts death-with-parent itself at start and
    reads ``redis_url`` from an inherited pipe (:func:`take_redis_url`), ``settings_json``
    (all its settings, secrets included) from another (:func:`take_settings_json`). ``env``: its
    environment before the secrets are taken out (default: this process's). The child can
    tell it is ready (:func:`report_ready`); :func:`became_ready` reads that here.

    The child starts in its own session (unless ``start_new_session`` says otherwise): a
    terminal's Ctrl-C signals the whole foreground process group, and the server stops its
    workers itself, in order (the scaler's SIGTERM, then the drain); a warm-pool process hit
    by that SIGINT died at once and could still be claimed, dead, by the stopping scaler."""
    kwargs.setdefault("start_new_session", True)
    child = {**child_env(env), PARENT_PID_ENV: str(os.getpid())}
    inherited: list[int] = []
    ready_read, ready_write = os.pipe()
    os.set_blocking(ready_read, False)
    child[READY_FD_ENV] = str(ready_write)
    inherited.append(ready_write)
    for variable, text in ((REDIS_URL_FD_ENV, redis_url), (SETTINGS_FD_ENV, settings_json)):
        if text is not None:
            child[variable] = str(_pipe_holding(text.encode()))
            inherited.append(int(child[variable]))
    try:
        process = subprocess.Popen(list(args), env=child, pass_fds=tuple(inherited), **kwargs)
    except BaseException:
        os.close(ready_read)
        raise
    finally:
        for fd in inherited:
            os.close(fd)
    process.naiad_ready = [ready_read, None]  # type: ignore[attr-defined]  # fd, then the verdict
    return process


def _pipe_holding(data: bytes) -> int:
    """The read end of a new pipe that holds ``data`` (then its end: the write end is closed)."""
    if len(data) > 60_000:  # a pipe's buffer (64 KiB on Linux): a longer write would block
        raise ValueError(f"{len(data)} bytes are too many for a child's pipe")
    read_end, write_end = os.pipe()
    os.write(write_end, data)
    os.close(write_end)
    return read_end


def take_ready_fd() -> None:
    """In a child started by :func:`spawn_python`: keep the readiness pipe for
    :func:`report_ready` (and out of the environment)."""
    global _ready_fd
    fd = os.environ.pop(READY_FD_ENV, None)
    if fd is not None:
        _ready_fd = int(fd)
        os.set_inheritable(_ready_fd, False)  # not to the processes a model starts


def report_ready() -> None:
    """Tell the parent this process got as far as serving (once; no-op without a parent)."""
    global _ready_fd
    if _ready_fd is not None:
        try:
            os.write(_ready_fd, b"1")
            os.close(_ready_fd)
        except OSError:
            pass
        _ready_fd = None


def became_ready(process: subprocess.Popen) -> bool | None:
    """Whether the child ``process`` (from :func:`spawn_python`) reported ready: True, False
    when it closed the pipe without (it exited first), None while it says nothing yet (or for
    a process not started here). Closes the pipe once the answer is known."""
    state = getattr(process, "naiad_ready", None)
    if state is None:
        return None
    if state[1] is not None:
        return state[1]
    try:
        data = os.read(state[0], 1)
    except BlockingIOError:
        return None
    os.close(state[0])
    state[1] = bool(data)
    return state[1]


def spawn_guarded(args: Sequence[str], remove_when_orphaned: str | None = None, **kwargs) -> subprocess.Popen:
    """Start the foreign program ``args`` under :mod:`naiad.guard` (see the module doc);
    ``remove_when_orphaned``: a folder the guard deletes if this process dies first.
    Safe from any thread; the child dies when the calling thread does."""
    read_end, write_end = os.pipe()  # the guard's lifeline: EOF once this process is gone
    guard = [sys.executable, "-m", "naiad.guard", str(os.getpid()), str(read_end), remove_when_orphaned or "",
             *args]  # fmt: skip
    try:
        process = subprocess.Popen(guard, env=child_env(), pass_fds=(read_end,), **kwargs)
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    process.lifeline = write_end  # type: ignore[attr-defined]
    return process


def release_guard(process: subprocess.Popen) -> None:
    """Before stopping a guard on purpose: close its lifeline (:mod:`naiad.guard`), so it
    removes its folder at once instead of waiting for this process to die."""
    fd = getattr(process, "lifeline", None)
    if fd is not None:
        process.lifeline = None  # type: ignore[attr-defined]
        os.close(fd)


def adopt_parent_death() -> None:
    """In a child started by :func:`spawn_python`: ask for SIGKILL when the parent dies, and
    exit at once if it died already (between the fork and this call)."""
    parent = os.environ.pop(PARENT_PID_ENV, None)
    if parent is None or not sys.platform.startswith("linux"):
        return
    die_with_parent(signal.SIGKILL)
    if os.getppid() != int(parent):
        sys.exit(0)


def take_redis_url() -> str | None:
    """In a child started by :func:`spawn_python`: the Redis URL its parent wrote into the
    inherited pipe (then closed), or None when there is none."""
    return _take_pipe(REDIS_URL_FD_ENV)


def take_settings_json() -> str | None:
    """In a child started by :func:`spawn_python`: the settings (JSON) its parent wrote into
    the inherited pipe (then closed), or None when there is none."""
    return _take_pipe(SETTINGS_FD_ENV)


def _take_pipe(variable: str) -> str | None:
    fd = os.environ.pop(variable, None)
    if fd is None:
        return None
    with os.fdopen(int(fd), "rb") as pipe:
        return pipe.read().decode()


def forget_secrets() -> None:
    """Remove :data:`SECRET_ENV` from this process's environment once the settings hold
    them: model code (``os.environ``) and the processes it starts do not find them there."""
    for name in SECRET_ENV:
        os.environ.pop(name, None)


def stop(process: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """SIGTERM, wait up to ``timeout_s`` seconds, then SIGKILL."""
    stop_all([process], timeout_s)


def stop_all(processes: Sequence[subprocess.Popen], timeout_s: float = 10.0) -> None:
    """SIGTERM every one of ``processes`` at once, wait for them all until one deadline
    ``timeout_s`` seconds away, then SIGKILL those still running and reap them: N processes
    that ignore SIGTERM (a hung ``finalize()``) cost ``timeout_s`` together, not N times it.
    Each one's readiness pipe (:func:`spawn_python`) is closed."""
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(OSError):  # exited meanwhile
                process.terminate()
    deadline = time.monotonic() + timeout_s
    for process in processes:
        try:
            _reap(process, deadline)
        except OSError as exc:  # one that cannot be reaped or closed does not keep the others
            logger.warning("stopping pid %d: %s", process.pid, exc)


def _reap(process: subprocess.Popen, deadline: float) -> None:
    try:
        process.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        logger.warning("pid %d still running after SIGTERM: SIGKILL", process.pid)
        with contextlib.suppress(OSError):
            process.kill()
        process.wait()
    became_ready(process)  # closes its readiness pipe
