"""Redis clients with the timeouts Naiad relies on, made in one place.

Commands fail within ``COMMAND_TIMEOUT_S`` when Redis is gone (so the gateway answers 503
quickly instead of hanging); a client used for blocking reads (BLPOP, XREADGROUP BLOCK)
gets that much more than its longest block, or redis-py would time the read out itself.

Commands are packed into RESP by hiredis's C ``pack_command`` (:class:`HiredisPacking`), as
redis-py's synchronous client does when hiredis is installed; its asyncio client packs in
Python, about 1 µs an argument (68 µs for a worker's reply pipeline of a batch of 6, 69
arguments; 29 µs with hiredis; docs/benchmarks.md). The bytes sent are the same. A command
whose write cannot wait is sent without redis-py's ``asyncio.wait_for`` around it
(:meth:`HiredisPacking.send_packed_command`).

A worker's clients (``connect(..., tolerate_stalls=True)``) read replies under a socket
timeout that does not count the time their event loop was stalled running a model
(:class:`StallTolerantReads`, :mod:`naiad.loop_stall`).
"""

from __future__ import annotations

import math
from typing import Any

import hiredis
import redis
import redis.asyncio as aioredis
from redis.commands import CoreCommands
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeout

from naiad import loop_stall

COMMAND_TIMEOUT_S = 2.0
CONNECT_TIMEOUT_S = 1.0
#: Connections one client opens at most. A command that finds them all busy waits for one,
#: at most :data:`COMMAND_TIMEOUT_S` (redis-py's plain pool would refuse it at once with
#: "Too many connections": a burst of a few hundred requests that each need a command of
#: their own, such as response-cache lookups, failed most of them).
MAX_CONNECTIONS = 100


#: An argument longer than this (bytes: a tensor's data) or any memoryview sends its command
#: through redis-py's own packer, which writes large values without copying them into one
#: buffer: hiredis would copy each into the packed command, doubling a large request's memory.
LARGE_ARG_BYTES = 64 * 1024


class HiredisPacking:
    """Mixed into a redis-py asyncio connection class: :meth:`pack_command` by hiredis (one
    buffer per command, as redis-py's synchronous client packs with hiredis), except for a
    command carrying a large value (:data:`LARGE_ARG_BYTES`). What hiredis refuses (a bool,
    None, a dict) goes to redis-py's own packer, which raises its usual
    :class:`redis.exceptions.DataError`."""

    def pack_command(self, *args: Any) -> list[bytes]:
        for arg in args:
            if type(arg) is memoryview or (type(arg) is bytes and len(arg) > LARGE_ARG_BYTES):
                return self._chunking_pack(*args)
        if isinstance(args[0], str):  # a command name with spaces ("CONFIG GET") goes as words
            args = (*args[0].encode().split(), *args[1:])
        elif b" " in args[0]:
            args = (*args[0].split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except TypeError:
            return super().pack_command(*args)  # type: ignore[misc]

    def _chunking_pack(self, *args: Any) -> list[bytes]:
        """redis-py's Python packer, which sends a value over its ``_buffer_cutoff`` as its own
        chunk, uncopied: ``_pack_command_python`` since redis-py 8.2, whose ``pack_command``
        packs with hiredis too (one buffer, every value copied in); ``pack_command`` before."""
        python_pack = getattr(super(), "_pack_command_python", None)
        if python_pack is not None:
            return python_pack(*args)
        return super().pack_command(*args)  # type: ignore[misc]

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        """redis-py's send, without its ``asyncio.wait_for`` (in Python 3.11 a task and a timer
        per command) when the write cannot wait: connected, no health check due, nothing left
        unsent from earlier writes. The bytes then go to the transport at once and ``drain``
        would return without waiting, so there is nothing for the socket timeout to bound; a
        write that leaves the buffer over its high-water mark makes the next command take
        redis-py's own path, which drains under the timeout. Replies are read under the
        socket timeout as before."""
        writer = self._writer  # type: ignore[attr-defined]
        if (
            writer is None
            or self._reader is None  # type: ignore[attr-defined]
            or (check_health and self.health_check_interval)  # type: ignore[attr-defined]
            or writer.transport.is_closing()
            or writer.transport.get_write_buffer_size()
        ):
            return await super().send_packed_command(command, check_health)  # type: ignore[misc]
        if isinstance(command, str):
            command = command.encode()
        try:
            writer.writelines([command] if isinstance(command, bytes) else command)
        except BaseException:  # as redis-py: a write cut midway leaves the connection unusable
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            raise


class StallTolerantReads:
    """Mixed into a redis-py asyncio connection class: a reply read under the socket timeout
    is read under :class:`naiad.loop_stall.Timeout` instead, which does not count the time
    the event loop was stalled (a model's call on a worker's loop): the reply of a command
    sent before the stall is read once the loop is free, not dropped as late. A timeout
    raises redis-py's :class:`redis.exceptions.TimeoutError` and drops the connection (with
    ``disconnect_on_error``), as redis-py's own; an explicit ``timeout`` is redis-py's."""

    async def read_response(self, disable_decoding: bool = False, timeout: float | None = None,
                            **options: Any) -> Any:  # fmt: skip
        socket_timeout = self.socket_timeout  # type: ignore[attr-defined]
        if timeout is not None or socket_timeout is None:
            return await super().read_response(disable_decoding, timeout, **options)  # type: ignore[misc]
        try:
            async with loop_stall.Timeout(socket_timeout):
                return await super().read_response(disable_decoding, math.inf, **options)  # type: ignore[misc]
        except TimeoutError:
            raise RedisTimeout(f"Timeout reading from {self._host_error()}") from None  # type: ignore[attr-defined]


_CLASSES: dict[tuple[type, bool], type] = {}


def _connection_class(base: type, tolerate_stalls: bool) -> type:
    """``base`` with :class:`HiredisPacking` (and :class:`StallTolerantReads`) mixed in."""
    key = (base, tolerate_stalls)
    if key not in _CLASSES:
        mixins = (StallTolerantReads, HiredisPacking) if tolerate_stalls else (HiredisPacking,)
        prefix = "StallTolerantHiredis" if tolerate_stalls else "Hiredis"
        _CLASSES[key] = type(f"{prefix}{base.__name__}", (*mixins, base), {})
    return _CLASSES[key]


def connect(url: str, longest_block_s: float = 0.0, tolerate_stalls: bool = False) -> aioredis.Redis:
    """An asyncio client for ``url`` (``redis://``, ``rediss://`` or ``unix://``), its pool
    bounded and waiting (:data:`MAX_CONNECTIONS`). ``tolerate_stalls``: for a process whose
    loop runs models (:class:`StallTolerantReads`)."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        socket_timeout=COMMAND_TIMEOUT_S + longest_block_s,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        max_connections=MAX_CONNECTIONS,
        timeout=COMMAND_TIMEOUT_S,
    )
    pool.connection_class = _connection_class(pool.connection_class, tolerate_stalls)
    client = aioredis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True  # as from_url: aclose() closes the pool too
    return client


def connect_sync(url: str) -> redis.Redis:
    """A synchronous client for ``url``, with the same command and connect timeouts, for a
    thread that acts while its process's event loop cannot (:mod:`workers.stand_in`)."""
    return redis.Redis.from_url(url, socket_timeout=COMMAND_TIMEOUT_S,
                                socket_connect_timeout=CONNECT_TIMEOUT_S)  # fmt: skip


class CommandBatch(CoreCommands):
    """Commands queued by redis-py's own command methods (``xack``, ``rpush``, ``eval``, ...:
    the same arguments a pipeline would send), for :func:`send_batch`. Stands in for a
    non-transactional pipeline where code only queues commands (``stats.add_*``,
    ``QueueReader.read_on``)."""

    def __init__(self) -> None:
        self.commands: list[tuple[Any, ...]] = []

    def execute_command(self, *args: Any, **options: Any) -> CommandBatch:
        self.commands.append(args)
        return self


async def send_batch(client: aioredis.Redis, batch: CommandBatch) -> list[Any]:
    """Send ``batch`` in one write on one connection of ``client``'s pool and read its
    replies in order: hiredis's raw values (no redis-py response callbacks: an XREADGROUP
    reply is ``[[stream, [[id, [field, value, ...]], ...]]]``, a map of the same under RESP3,
    or None), an error reply as its :class:`redis.exceptions.ResponseError` in its place.
    What a pipeline costs beyond that (its object, a retry wrapper, a shielded reset, a
    callback a reply): the worker's CPU a request at c1 went ~1,030 → ~760–850 µs without
    it (docs/benchmarks.md "Stop 17"). Replies are read under the
    client's socket timeout. Raises :class:`redis.exceptions.ConnectionError` /
    :class:`redis.exceptions.TimeoutError` with nothing retried: the connection is then
    dropped (its replies are unread), as it is when the caller is cancelled."""
    pool = client.connection_pool
    connection = await pool.get_connection()
    try:
        return await _exchange(connection, batch)
    finally:
        await pool.release(connection)


async def _exchange(connection: Any, batch: CommandBatch) -> list[Any]:
    """:func:`send_batch` on ``connection``: one write, the replies read in order; the
    connection is dropped on any failure or cancellation."""
    try:
        await connection.send_packed_command(connection.pack_commands(batch.commands))
        replies: list[Any] = []
        for _ in batch.commands:
            try:
                replies.append(await connection.read_response())
            except ResponseError as exc:
                replies.append(exc)
        return replies
    except BaseException:
        await connection.disconnect(nowait=True)
        raise


class HeldConnection:
    """One connection of ``client``'s pool kept by a writer that sends one batch at a time
    (the gateway's group-committed enqueues, its statistics writer, a worker's reply
    pipeline): :meth:`send` is
    :func:`send_batch` without the pool's checkout and release each time, which in redis-py
    8 cost ~15–30 µs of CPU a batch (a condition and a timeout, a poll of the socket for
    unread data, observability hooks; docs/benchmarks.md "Stop 21").

    The connection is taken from the pool at the first send (so the pool's bound and its
    ``aclose`` cover it) and given back, to be checked and reconnected by the pool, when a
    send fails or when Redis has closed it meanwhile (its reader at end of file: the check
    the pool makes, without a system call). A batch sent while another is in flight goes
    through the pool (:func:`send_batch`). Raises what :func:`send_batch` raises."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._client, self._pool = client, client.connection_pool
        self._connection: Any = None
        self._busy = False

    async def send(self, batch: CommandBatch) -> list[Any]:
        if self._busy:
            return await send_batch(self._client, batch)
        self._busy = True
        try:
            connection = self._connection
            if connection is None or _closed_by_peer(connection):
                await self.release()
                connection = self._connection = await self._pool.get_connection()
            try:
                return await _exchange(connection, batch)
            except BaseException:
                await self.release()
                raise
        finally:
            self._busy = False

    async def release(self) -> None:
        """Give the connection back to the pool (the next send takes one again)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            await self._pool.release(connection)


def _closed_by_peer(connection: Any) -> bool:
    reader = getattr(connection, "_reader", None)
    return reader is None or reader.at_eof()
