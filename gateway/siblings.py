"""Gateway processes of one server on the same ports (``--gateway-processes N``).

One gateway process does the protocol work of a server on one core at most (its event loop).
With ``N > 1`` the first process (the one ``naiad serve`` or ``naiad gateway`` runs) binds
HTTP and gRPC with ``SO_REUSEPORT``, then starts ``N - 1`` *siblings* on the same ports
(:func:`start_siblings`); the kernel spreads new connections over the processes
(``socket(7)``: ``SO_REUSEPORT``). Each sibling is a whole gateway on the same Redis, as the
design's "any number of gateways" are, except that the first one alone indexes and polls the
repository and serves the metrics port; it gets its settings, secrets included, through an
inherited pipe (:func:`naiad.procs.spawn_python`) and dies with the first
(``PR_SET_PDEATHSIG``); one that exits is not started again (the others keep the ports).

A client must still see one server, whichever process each of its connections reaches. What
a gateway keeps in its own memory is made the same by a control socket per process, in a
private folder (``<pid>.sock``): before it answers, the process that serves a call asks every
other one (:meth:`Siblings.tell`) and waits for each answer:

- ``flush`` before a statistics read (statistics extension, ``/metrics``, status page): the
  counters a sibling holds for up to :data:`naiad.stats_writer.LINGER_S` are written first;
- ``expire`` after model control (load, unload): each re-reads the registry (it would within
  :data:`gateway.registry.SYNC_INTERVAL_S` by itself);
- ``shm_register`` / ``shm_unregister``: each process maps a system shared-memory region
  itself; a region one of them cannot map is unregistered everywhere and the call fails; an
  unregister first asks each which regions a request is using there (``shm_busy``), and every
  process keeps those (a region in use anywhere stays registered everywhere).

One connection a question: the asking process writes one msgpack message, ``[op,
[args...]]``, and ends its side; the answer, ``[error text or nil, value]``, ends the
connection (only the server's own processes reach the 0700 folder). A sibling that does not
answer within :data:`ANSWER_TIMEOUT_S` is logged and skipped; one that refuses the connection
died (SIGKILL leaves its socket file): its file is removed, once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack

from naiad import host, procs
from naiad.settings import Settings
from naiad.stale_folders import remove_stale_folders

logger = logging.getLogger(__name__)

#: Seconds a process waits for a sibling's answer before it goes on without it.
ANSWER_TIMEOUT_S = 5.0
#: Seconds the first process waits for its siblings to serve before it reports ready anyway.
START_TIMEOUT_S = 60.0
#: Seconds a stopping sibling may take beyond its in-flight grace before it is killed.
STOP_MARGIN_S = 10.0

Handler = Callable[..., Awaitable[Any]]


class Siblings:
    """This process's control socket in ``folder`` (serving ``handlers`` by op name) and the
    way to ask the others (:meth:`tell`)."""

    def __init__(self, folder: pathlib.Path, handlers: dict[str, Handler]):
        self.folder, self.handlers = folder, handlers
        self.path = folder / f"{os.getpid()}.sock"
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        with contextlib.suppress(OSError):
            self.path.unlink()

    async def tell(self, op: str, *args: object) -> list[str]:
        """Ask every other process to do ``op`` and wait for all: the errors they answered
        (empty when every one did it; one that did not answer is logged, not counted)."""
        return [error for error, _ in await self.ask(op, *args) if error]

    async def ask(self, op: str, *args: object) -> list[tuple[str | None, Any]]:
        """Ask every other process to do ``op`` and wait for all: ``(error, value)`` of each
        that answered (its handler's error text, or None and what it returned)."""
        others = [path for path in self.folder.glob("*.sock") if path != self.path]
        answers = await asyncio.gather(*(self._ask(path, op, args) for path in others))
        return [(answer[0], answer[1]) for answer in answers if answer is not None]

    async def _ask(self, path: pathlib.Path, op: str, args: tuple) -> Any:
        try:
            async with asyncio.timeout(ANSWER_TIMEOUT_S):
                reader, writer = await asyncio.open_unix_connection(str(path))
                try:
                    writer.write(msgpack.packb([op, list(args)]))
                    writer.write_eof()
                    return msgpack.unpackb(await reader.read())
                finally:
                    writer.close()
        except (ConnectionRefusedError, FileNotFoundError):  # it exited: its socket file is stale
            with contextlib.suppress(OSError):
                path.unlink()
            logger.warning("gateway process %s is gone (asked '%s'): its socket is removed", path.stem, op)
            return None
        except (OSError, TimeoutError, ValueError) as exc:  # ValueError: msgpack's, for a cut answer
            logger.warning("gateway process %s did not answer '%s': %r", path.stem, op, exc)
            return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            op, args = msgpack.unpackb(await reader.read())
            try:
                answer = [None, await self.handlers[op](*args)]
            except Exception as exc:  # answered to the asking process, which fails its call
                answer = [str(exc) or type(exc).__name__, None]
            writer.write(msgpack.packb(answer))
        except (ConnectionError, ValueError, TypeError):
            pass  # the asking process went away (or sent what no sibling sends)
        finally:
            writer.close()


#: The control folders' name prefix (in the temporary directory).
FOLDER_PREFIX = "naiad-gateways-"


def control_folder() -> pathlib.Path:
    """A new private folder for the processes' control sockets (mode 0700); first, the
    folders of servers killed with SIGKILL are removed (:mod:`naiad.stale_folders`)."""
    remove_stale_folders(FOLDER_PREFIX)
    return pathlib.Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX))


#: Most gateway processes ``--gateway-processes 0`` (the default) starts: two measured 1.10–1.19×
#: one's throughput at 32 clients over HTTP on a 2-core machine, where one process ran its core
#: full and the machine had a fifth idle (docs/benchmarks.md, "Stop 33"); more were not measured.
AUTO_MOST = 2


def process_count(settings: Settings) -> int:
    """The gateway processes of this server: ``settings.gateway_processes``, or for 0 one per
    CPU this process may use (:func:`naiad.host.usable_cpus`: affinity and cgroup CPU limit),
    at most :data:`AUTO_MOST`, and one when the HTTP or gRPC port is 0 (each process would
    get a port of its own from the kernel, not the first one's)."""
    if settings.gateway_processes:
        return settings.gateway_processes
    if not (settings.http_port and settings.grpc_port):
        return 1
    return min(host.usable_cpus(), AUTO_MOST)


def per_process(settings: Settings) -> Settings:
    """The first process's settings, each process's share of the server's limits: with
    :func:`process_count` N > 1, ``--max-inflight``, ``--http-max-connections`` and
    ``--max-buffered-bytes`` are split evenly (⌊limit / N⌋; at least 1, and a byte budget at
    least the largest request), so the server never holds more than them in all, whichever
    process the kernel gives each connection (an uneven spread can refuse before the total
    is reached). ``gateway_processes`` becomes N (resolved once: the rest of the server reads
    it). The siblings get these settings as they are."""
    count = process_count(settings)
    if count == 1:
        return settings.model_copy(update={"gateway_processes": 1})
    largest = max(settings.http_max_body_bytes, settings.grpc_max_message_bytes)
    return settings.model_copy(update={
        "gateway_processes": count,
        "max_inflight": max(1, settings.max_inflight // count),
        "http_max_connections": max(1, settings.http_max_connections // count),
        "max_buffered_bytes": max(largest, settings.max_buffered_bytes // count),
    })  # fmt: skip


def check_ports_free(host_name: str, ports: list[int]) -> None:
    """Raise ``OSError`` (EADDRINUSE) when another socket listens on one of ``ports`` at
    ``host_name``: the first process's test before it binds them with ``SO_REUSEPORT``, which
    would otherwise let it share the port with an unrelated server of the same user
    (``socket(7)``); a bind without that option fails where anything listens. Each address
    ``host_name`` resolves to is tried, as the server binds each."""
    for port in ports:
        infos = socket.getaddrinfo(host_name or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _, address in infos:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no listener
                if family == socket.AF_INET6:
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                probe.bind(address)


def start_siblings(settings: Settings, redis_url: str, folder: pathlib.Path) -> list[subprocess.Popen]:
    """Start ``settings.gateway_processes`` − 1 sibling gateways on the same ports (module doc),
    each told ``folder`` and given ``settings`` (:func:`per_process`'s); they die with this process."""
    sibling = settings.model_copy(update={"redis_url": redis_url, "gateway_sibling_of": str(folder)})
    text = sibling.model_dump_json()
    command = [sys.executable, "-m", "naiad_cli", "gateway"]
    return [procs.spawn_python(command, settings_json=text) for _ in range(settings.gateway_processes - 1)]


async def wait_started(processes: list[subprocess.Popen], timeout_s: float = START_TIMEOUT_S) -> None:
    """Until each sibling reports it serves (:func:`naiad.procs.report_ready`), exited, or
    ``timeout_s`` passed (those not serving by then are logged; the others keep the ports)."""
    deadline = time.monotonic() + timeout_s
    waiting = list(processes)
    while waiting and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        for process in list(waiting):
            verdict = procs.became_ready(process)
            if verdict is not None:
                waiting.remove(process)
                if not verdict:
                    code = process.poll()
                    logger.error("gateway process %d exited before it served (code %s)", process.pid, code)
    for process in waiting:
        logger.error("gateway process %d did not serve within %g s", process.pid, timeout_s)


async def watch_siblings(processes: list[subprocess.Popen], period_s: float = 1.0) -> None:
    """Log each sibling that exits while the server runs (and reap it); it is not started
    again: the others keep the ports (module doc)."""
    running = list(processes)
    while running:
        await asyncio.sleep(period_s)
        for process in [p for p in running if p.poll() is not None]:
            running.remove(process)
            logger.error("gateway process %d exited (code %s); the others serve its share", process.pid,
                         process.returncode)  # fmt: skip


def stop_siblings(processes: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM each sibling (they drain as a gateway does: ``grace_s`` for their in-flight
    requests) and wait for all; SIGKILL one still there :data:`STOP_MARGIN_S` after that."""
    procs.stop_all(processes, timeout_s=grace_s + STOP_MARGIN_S)
