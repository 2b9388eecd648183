"""The queue protocol's client side: a remote model that looks local.

Used by the gateway and by workers whose Python
models call other models (BLS, :mod:`workers.backends.python`): one place for how a request
is enqueued and its reply awaited.

:meth:`QueueDispatcher.infer` appends the request to the model's Redis stream (its priority
level's, :mod:`naiad.queue_policy`) and awaits its
reply, which a single background reader takes off this client's reply list with BLPOP and
hands to the waiting future by queue id (no polling). When the model has no live worker the
scaler is woken through :data:`naiad.keys.SCALER_WAKE`; the request waits in the stream
meanwhile, bounded by its deadline.

Direct hand-off (the gateway's client, :attr:`QueueDispatcher.direct`): when an idle worker
on this machine has offered to take requests of the model and version (up to one batch), and
none of this client's requests of that model is in the stream (:meth:`QueueDispatcher._streams`),
the request goes to that worker by its socket instead (:mod:`naiad.reply_channel`; a
burst's requests in one write, after the enqueues' group-commit wait), and back to the
stream if the worker goes away or its heartbeat lapses before it answers
(:meth:`QueueDispatcher._hand`). A handed request never overtakes one of this client's in
the stream; a burst is handed up to the offer (one batch) and the rest of it queued.

Backpressure: the XADD is a script that first counts the requests waiting in the stream
against the model's maximum queue size, atomically, so a full queue answers
:class:`Overloaded` at once and never grows past its bound (per level). As Triton's
``max_queue_size`` it counts waiting requests, not executing ones (docs/protocol.md,
"Maximum queue size").

Queue timeout (Triton's ``timeout_action: REJECT``): when it passes before a worker claimed
the entry, a script deletes the unclaimed entry and the request fails with
:class:`QueueTimeout` at once; a claimed one is judged by its worker when it forms a batch.
``preserve_ordering``: this client releases a model's answers in the order Redis accepted
its requests (:class:`naiad.reply_order.ReplyOrder`).

Cancellation: a caller that goes away (its task cancelled: an HTTP client that disconnected,
a cancelled gRPC call) or whose deadline passes *withdraws* its entry: ``XACK`` + ``XDEL``.
Unclaimed, the entry is gone before any worker reads it; claimed but not yet run, it is no
longer pending for its worker, which checks that right before running a batch
(:meth:`workers.queue_reader.QueueReader.still_ours`) and skips it. Only a request already running is
executed anyway; its late reply, like any reply whose caller is gone, is dropped here.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, RedisError

from naiad import group_commit, keys, logs, stats, tasks, tracing
from naiad.busy_poll import BusyPoll
from naiad.codec import DATA, HEADER, Reply, decode_replies, encode_request
from naiad.deadlines import Deadlines
from naiad.errors import DeadlineExceeded, InvalidInput, Overloaded, QueueTimeout, Unavailable
from naiad.ids import fresh_id
from naiad.inference import InferRequest, InferResponse
from naiad.queue_policy import Placement
from naiad.redis_client import CommandBatch, HeldConnection, send_batch
from naiad.reply_channel import ReplyServer, WorkerLink, decode_executions
from naiad.reply_order import ReplyOrder

logger = logging.getLogger(__name__)

#: Seconds one BLPOP of the reply reader blocks before it loops (to notice shutdown).
READER_BLOCK_S = 5

#: XADD each entry of ARGV[6..] unless ``ARGV[1]`` requests or more already wait in the stream
#: (0: no bound), in order (each added one counts for the next); returns ``{live workers,
#: id or false, ...}``, one id (false: the queue was full) per entry. Live workers: members
#: of the workers set KEYS[2] whose heartbeat deadline is at or after ``ARGV[2]``, Unix
#: seconds. Waiting: the stream's entries (answered ones are deleted) less those executing,
#: taken as the entries claimed by group ARGV[3] (the XPENDING summary, O(1)) up to
#: ``ARGV[4]`` (requests one worker runs at once) per live worker. ``ARGV[5]``: fields per
#: entry (name, value pairs). KEYS[1]: the stream. One call carries every enqueue of one
#: flush to one stream: the counts are read once, not per request.
BOUNDED_XADD = """
local limit, width = tonumber(ARGV[1]), tonumber(ARGV[5])
local live = redis.call('ZCOUNT', KEYS[2], ARGV[2], '+inf')
local waiting = 0
if limit > 0 then
  waiting = redis.call('XLEN', KEYS[1])
  local claimed = redis.pcall('XPENDING', KEYS[1], ARGV[3])
  if type(claimed) == 'table' and claimed.err == nil then
    waiting = waiting - math.min(claimed[1], live * tonumber(ARGV[4]))
  end
end
local out = {live}
for first = 6, #ARGV, width do
  if limit > 0 and waiting >= limit then
    out[#out + 1] = false
  else
    out[#out + 1] = redis.call('XADD', KEYS[1], '*', unpack(ARGV, first, first + width - 1))
    waiting = waiting + 1
  end
end
return out
"""
#: Delete entry ARGV[2] of stream KEYS[1] unless a consumer of group ARGV[1] has claimed it
#: (it is in the group's pending entries; no group yet: nobody has); 1 when deleted, 0 when
#: claimed or already gone (answered: its reply is on its way).
REJECT_UNCLAIMED = """
local pending = redis.pcall('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if type(pending) == 'table' and pending.err == nil and #pending > 0 then
  return 0
end
return redis.call('XDEL', KEYS[1], ARGV[2])
"""
#: Seconds a withdrawal (XACK + XDEL of a cancelled request's entry) may take.
WITHDRAW_TIMEOUT_S = 2.0


class _Add(NamedTuple):
    """One enqueue waiting for the next write."""

    script_keys: tuple[str, str]  # the stream, the model's workers set
    head: tuple[int, str, int]  # the script's head arguments: max queue, group, batch
    fields: list[Any]  # the entry's fields: name, value, ...
    future: asyncio.Future[bytes | None]  # its caller's
    model: str


class _Orphaned(Exception):
    """The worker a request was handed to went away before answering it."""


def _timed_out(request: InferRequest, timeout_s: float) -> DeadlineExceeded:
    return DeadlineExceeded(f"request to model '{request.model}' timed out after {timeout_s:g} s")


def _expire(future: asyncio.Future[Any]) -> None:
    """A reply's deadline passed: its waiter gets TimeoutError (unless it was answered)."""
    if not future.done():
        future.set_exception(TimeoutError())


class QueueDispatcher:
    """Sends requests through Redis and matches replies to waiting callers.

    ``redis`` sends commands; ``reader`` (a client whose socket timeout exceeds
    :data:`READER_BLOCK_S`, see :func:`naiad.redis_client.connect`) blocks on replies.
    """

    def __init__(
        self, redis: aioredis.Redis, reader: aioredis.Redis, gateway_id: str | None = None
    ):
        self.redis = redis
        self.reader = reader
        self._adds_connection = HeldConnection(redis)  # one write of enqueues at a time
        self._deadlines = Deadlines()  # replies' deadlines, handed requests' checks: one timer
        self.gateway_id = gateway_id or uuid.uuid4().hex
        self.reply_key = keys.reply_list(self.gateway_id)
        self._pending: dict[str, asyncio.Future[Reply]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._closing = False
        self._reject = redis.register_script(REJECT_UNCLAIMED)
        self._xadd = redis.register_script(BOUNDED_XADD)
        self._order = ReplyOrder()
        self._withdrawals: list[tuple[str, bytes]] = []  # (stream, entry id) to withdraw
        self._wakes: set[str] = set()  # models to wake
        self._chores: asyncio.Task[None] | None = None  # sends the two above
        self._adding = False  # an XADD (or a pipeline of them) is in flight
        self._next_adds: list[_Add] = []
        #: This client's direct reply channel, named in its requests (naiad.reply_channel).
        self.reply_address: tuple[str, str] | None = None
        #: Hands requests to idle workers on this machine (naiad.reply_channel), when set.
        self.direct: ReplyServer | None = None
        #: Seconds after which an unanswered handed request's worker is checked (heartbeat period).
        self.liveness_s = 2.0
        #: Polls for the answer to this gateway's only request, handed off (naiad.busy_poll), when set.
        self.busy_poll: BusyPoll | None = None
        #: Model -> this client's requests of it in the stream (enqueued or being enqueued,
        #: unanswered): none may be handed off meanwhile (_streams).
        self._in_stream: dict[str, int] = {}
        self._checks: set[asyncio.Task[None]] = set()
        #: Takes the statistics that come with replies (StatsWriter.add): see record_executions.
        self.stats_sink: Callable[[Callable[[Any], None]], object] | None = None

    async def start(self) -> None:
        self._reader = asyncio.create_task(self._read_replies(), name="reply-reader")

    async def stop(self) -> None:
        """Stop the reply reader and cancel every waiting caller.

        redis-py may turn the reader's cancellation into a ConnectionError, which the
        reader's retry loop would swallow, or lose it (:mod:`naiad.tasks`); ``_closing``
        makes that loop end instead, and the cancellation is repeated until it does.
        """
        self._closing = True
        with contextlib.suppress(RedisError):
            await tasks.cancel_and_wait(self._reader)
        for future in self._pending.values():
            future.cancel()
        if self._chores is not None:
            await asyncio.wait([self._chores], timeout=2 * WITHDRAW_TIMEOUT_S)

    async def infer(
        self, request: InferRequest, timeout_s: float, max_queue: int = 0, placement: Placement | None = None
    ) -> InferResponse:
        """Queue ``request`` and wait at most ``timeout_s`` seconds for its answer.

        ``placement`` (:func:`naiad.queue_policy.place`): its priority level's stream and
        bound, its queue timeout and the model's ``preserve_ordering``; without one, the
        model's plain stream bounded by ``max_queue`` (0: no bound). Raises
        :class:`Overloaded` when the queue is full, :class:`QueueTimeout` when it waited
        unclaimed past a REJECT queue timeout, :class:`DeadlineExceeded` on timeout,
        :class:`Unavailable` when Redis cannot be reached, or the error the worker sent back.
        A timed-out or cancelled request withdraws its entry (see the module doc). A request
        handed to an idle worker (module doc) that went away unanswered is queued with the
        time left of ``timeout_s``.
        """
        placement = placement or Placement(0, keys.request_stream(request.model), max_queue, 0.0, True, False)
        queue_id = fresh_id()
        link = None
        if self.direct is not None and not placement.ordered and not self._in_stream.get(request.model):
            link = self.direct.take(request.model, request.version)
        reply = None
        if link is not None:  # a worker on this machine waits idle for it
            started = asyncio.get_running_loop().time()
            reply = await self._hand(link, queue_id, request, timeout_s, placement)
            if reply is None:  # that worker went away: the stream, with the time left
                left_s = timeout_s - (asyncio.get_running_loop().time() - started)
                try:
                    with self._streams(request.model):
                        reply = await self._queued(queue_id, request, left_s, placement)
                except DeadlineExceeded:
                    raise _timed_out(request, timeout_s) from None
        if reply is None:
            with self._streams(request.model):
                reply = await self._queued(queue_id, request, timeout_s, placement)
        if reply.error is not None:
            raise reply.error
        return InferResponse(request.model, request.version, reply.outputs, request.id)

    @contextlib.contextmanager
    def _streams(self, model: str) -> Iterator[None]:
        """Count a request of ``model`` in the stream while the block runs: meanwhile no
        request of ``model`` is handed off (a handed one would overtake it, and run as a
        batch of its own beside the stream's: docs/benchmarks.md, "Stop 18")."""
        self._in_stream[model] = self._in_stream.get(model, 0) + 1
        try:
            yield
        finally:
            self._in_stream[model] -= 1

    async def _hand(
        self, link: WorkerLink, queue_id: str, request: InferRequest, timeout_s: float, placement: Placement
    ) -> Reply | None:  # fmt: skip
        """Hand ``request`` to the idle worker behind ``link`` (:mod:`naiad.reply_channel`)
        and wait at most ``timeout_s`` for its reply; None when the worker went away first
        (the caller queues it through Redis). Raises :class:`DeadlineExceeded` on timeout. A
        timed-out or cancelled request is withdrawn (:meth:`WorkerLink.withdraw`)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Reply] = loop.create_future()
        self._pending[queue_id] = future
        now, poll, polled = loop.time(), self.busy_poll, 0.0  # polled: the wait's start (naiad.busy_poll)
        try:
            with tracing.span("naiad.enqueue", kind="producer"):
                fields = self._fields(queue_id, request, timeout_s)
                if not link.hand(queue_id, placement.level, fields[HEADER], fields[DATA]):
                    return None
            # after the write (a lone request goes at once): the worker runs meanwhile
            self._deadlines.add(now + timeout_s, future, _expire)
            check = (self._check_worker, link, queue_id, request.model)
            self._deadlines.add(now + self.liveness_s, future, *check)
            if poll is not None and poll.alone():  # the server's only request: awake for it
                polled = poll.begin(loop, future, request.model)
            return await future
        except _Orphaned:
            return None
        except TimeoutError:
            link.withdraw(queue_id)
            raise _timed_out(request, timeout_s) from None
        except asyncio.CancelledError:
            link.withdraw(queue_id)
            raise
        finally:
            if poll is not None and polled:
                poll.end(request.model, polled)
            if not future.done():
                future.cancel()  # its deadline and check are dropped (naiad.deadlines)
            self._pending.pop(queue_id, None)
            link.forget(queue_id)

    def _check_worker(
        self, future: asyncio.Future[Reply], link: WorkerLink, queue_id: str, model: str
    ) -> None:  # fmt: skip
        """A request handed to a worker (its caller awaiting ``future``) is not answered after
        :attr:`liveness_s` (a call of :attr:`_deadlines`): when that worker's heartbeat
        lapsed (frozen, hung: its connection stays open), its caller queues it through
        Redis, as a reclaim would take a claimed entry (:mod:`workers.reclaim`); else look
        again after as long."""
        if queue_id in link.handed:  # not answered, nor queued through Redis already
            task = asyncio.get_running_loop().create_task(self._worker_alive(future, link, queue_id, model))
            self._checks.add(task)
            task.add_done_callback(self._checks.discard)

    async def _worker_alive(
        self, future: asyncio.Future[Reply], link: WorkerLink, queue_id: str, model: str
    ) -> None:  # fmt: skip
        try:
            deadline = await self.redis.zscore(keys.workers(model), link.worker_id)
        except RedisError as exc:
            logger.warning("could not check the heartbeat of worker %s: %s", link.worker_id, exc)
            deadline = float("inf")
        if queue_id not in link.handed:
            return
        if deadline is None or deadline < time.time():
            logger.warning("worker %s of '%s' holds a request without a heartbeat: queueing it again",
                           link.worker_id, model)  # fmt: skip
            link.withdraw(queue_id)  # should it resume, it skips it
            self.orphaned(queue_id)
        else:
            again = asyncio.get_running_loop().time() + self.liveness_s
            self._deadlines.add(again, future, self._check_worker, link, queue_id, model)

    def orphaned(self, queue_id: str) -> None:
        """The worker ``queue_id`` was handed to went away unanswered: its caller queues it."""
        future = self._pending.get(queue_id)
        if future is not None and not future.done():
            future.set_exception(_Orphaned())

    async def _queued(
        self, queue_id: str, request: InferRequest, timeout_s: float, placement: Placement
    ) -> Reply:  # fmt: skip
        """:meth:`infer` through the model's stream: enqueue, await the reply, withdraw on a
        timeout or a cancellation."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Reply] = loop.create_future()
        self._pending[queue_id] = future
        slot = self._order.open(placement.stream) if placement.ordered else None
        entry_id: bytes | None = None
        try:
            if timeout_s <= 0:
                raise TimeoutError
            entry_id = await self._enqueue(queue_id, request, timeout_s, placement)
            entry_at = loop.time()
            deadline = entry_at + timeout_s
            if slot is not None:
                self._order.place(slot, entry_id)
            reply = await self._await_reply(future, placement, entry_id, entry_at, deadline)
            if slot is not None:
                await asyncio.wait_for(self._order.turn(placement.stream, slot), deadline - loop.time())
        except TimeoutError:
            self._withdraw(placement.stream, entry_id)
            raise _timed_out(request, timeout_s) from None
        except asyncio.CancelledError:  # before the entry id came back: _add_many withdraws it
            self._withdraw(placement.stream, entry_id)
            raise
        finally:
            if not future.done():
                future.cancel()  # its deadline is dropped (naiad.deadlines)
            self._pending.pop(queue_id, None)
            if slot is not None:
                self._order.close(placement.stream, slot)
        return reply

    async def _await_reply(
        self, future: asyncio.Future[Reply], placement: Placement, entry_id: bytes, entry_at: float,
        deadline: float,
    ) -> Reply:  # fmt: skip
        """The reply by ``deadline`` (loop time, as ``entry_at``, when the entry was added;
        TimeoutError after it). Under a REJECT queue timeout that ends no later, an entry
        still unclaimed when it passes is deleted and the request refused
        (:class:`QueueTimeout`); a claimed one is the worker's to judge."""
        loop = asyncio.get_running_loop()
        reject_at = entry_at + placement.timeout_s
        if placement.reject and placement.timeout_s and reject_at <= deadline:
            await asyncio.wait([future], timeout=max(reject_at - loop.time(), 0))
            if not future.done() and await self._reject_unclaimed(placement.stream, entry_id):
                raise QueueTimeout("Request timeout expired")
        self._deadlines.add(deadline, future, _expire)  # no wait_for, no timer of its own
        return await future

    async def _reject_unclaimed(self, stream: str, entry_id: bytes) -> bool:
        """Delete ``entry_id`` if no worker has claimed it (:data:`REJECT_UNCLAIMED`)."""
        try:
            return bool(await self._reject(keys=[stream], args=[keys.WORKER_GROUP, entry_id]))
        except RedisError as exc:
            logger.warning("queue timeout of an entry of %s not applied: %s", stream, exc)
            return False

    async def _enqueue(
        self, queue_id: str, request: InferRequest, timeout_s: float, placement: Placement
    ) -> bytes:
        """The bounded XADD of ``request`` (:data:`BOUNDED_XADD`): the new entry's id. Raises
        :class:`Overloaded` when the queue is full, :class:`Unavailable` when Redis cannot be
        reached."""
        with tracing.span("naiad.enqueue", kind="producer"):
            fields = self._fields(queue_id, request, timeout_s)
            flat = [item for pair in fields.items() for item in pair]
            max_queue, script_keys = placement.max_queue, (placement.stream, keys.workers(request.model))
            head = (max_queue, keys.WORKER_GROUP, placement.batch)
            entry_id = await self._add(script_keys, head, flat, request.model)
        if entry_id is None:
            level = f" at priority level {placement.level}" if placement.level else ""
            raise Overloaded(f"Exceeds maximum queue size: the queue of model '{request.model}'"
                             f"{level} is full ({max_queue} requests)")  # fmt: skip
        return entry_id

    def _fields(self, queue_id: str, request: InferRequest, timeout_s: float) -> dict[bytes, bytes]:
        """The stream entry's fields of ``request`` (:func:`naiad.codec.encode_request`),
        inside the caller's enqueue span (the worker's spans are its children)."""
        now = time.time()
        return encode_request(
            queue_id, request, self.reply_key, now + timeout_s, now,
            traceparent=tracing.traceparent(), log_id=logs.REQUEST_ID.get(), reply_address=self.reply_address,
        )  # fmt: skip

    async def _add(
        self, script_keys: tuple[str, str], head: tuple[int, str, int], fields: list[Any], model: str
    ) -> bytes | None:  # fmt: skip
        """One entry's :data:`BOUNDED_XADD` for ``model``, group-committed: the entry's id,
        or None when the queue was full. A model found with no live worker is woken once a
        write (:meth:`_chore`), in the background: its requests wait in the stream. The
        enqueues made in one turn of the loop, those made while a write is in flight, and
        those that keep arriving turn after turn (:mod:`naiad.group_commit`) go together:
        one script call per stream (``script_keys``) and bound (``head``: max queue, group,
        batch), every call of a write in one batch (:meth:`_send_adds`), so under load one
        round trip (one write, one wake-up of Redis) and one script run carry many.

        No task or shield per request: a caller cancelled while its enqueue is in flight
        leaves a cancelled future, and :meth:`_add_many` withdraws the entry it gets back."""
        future: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        self._next_adds.append(_Add(script_keys, head, fields, future, model))
        if not self._adding:
            self._send_next_adds()
        try:
            return await future
        except asyncio.CancelledError:  # its answer came, but the caller was cancelled first
            if future.done() and not future.cancelled() and future.exception() is None:
                self._withdraw(script_keys[0], future.result())
            raise
        except RedisError as exc:
            raise Unavailable(f"queue unavailable: {exc}") from None

    def _send_next_adds(self) -> None:
        """Send what waits for the next write (or go idle, when nothing does): a task that
        takes the waiting enqueues once :func:`naiad.group_commit.gathered` lets it."""
        self._adding = bool(self._next_adds)
        if self._adding:  # in a context of its own: its log records belong to no request
            task = asyncio.get_running_loop().create_task(self._add_many(), context=contextvars.Context())
            task.add_done_callback(self._added)

    def _added(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():  # the client is closing: nothing more is sent
            for add in self._next_adds:
                add.future.cancel()
            self._next_adds = []
        self._send_next_adds()

    async def _add_many(self) -> None:
        await group_commit.gathered(lambda: len(self._next_adds))
        groups: dict[tuple[Any, ...], list[_Add]] = {}
        for add in self._next_adds:
            if not add.future.cancelled():
                groups.setdefault((add.script_keys, add.head, len(add.fields)), []).append(add)
        self._next_adds = []
        if not groups:
            return
        now = time.time()
        calls = [
            (script_keys, [max_queue, now, group, batch, width, *(f for add in adds for f in add.fields)])
            for ((script_keys, (max_queue, group, batch), width), adds) in groups.items()
        ]  # fmt: skip
        try:
            results = await self._send_adds(calls)
        except Exception as exc:  # each waiting caller sees it (RedisError: Unavailable)
            results = [exc] * len(calls)
        except asyncio.CancelledError:  # the client is closing
            for adds in groups.values():
                for add in adds:
                    add.future.cancel()
            raise
        for adds, result in zip(groups.values(), results, strict=True):
            if not isinstance(result, Exception) and result[0] == 0 and any(result[1:]):
                self._chore(wake=adds[0].model)  # no live worker: one wake for the whole write
            for i, add in enumerate(adds):
                entry_id = None if isinstance(result, Exception) else result[1 + i]
                if add.future.cancelled():  # its caller went away meanwhile: take the entry back
                    self._withdraw(add.script_keys[0], entry_id)
                elif isinstance(result, Exception):
                    add.future.set_exception(result)
                else:
                    add.future.set_result(entry_id)

    async def _send_adds(self, calls: list[tuple[tuple[str, str], list[Any]]]) -> list[Any]:
        """One :data:`BOUNDED_XADD` per ``(keys, args)``, by ``EVALSHA``, all in one write on
        this client's held connection (:class:`naiad.redis_client.HeldConnection`); a call
        answered NOSCRIPT (Redis lost its script cache) is made again through redis-py's
        script object, which loads it. Each result, or its error in its place."""
        batch = CommandBatch()
        for script_keys, args in calls:
            batch.evalsha(self._xadd.sha, len(script_keys), *script_keys, *args)
        results = await self._adds_connection.send(batch)
        for i, (script_keys, args) in enumerate(calls):
            if isinstance(results[i], NoScriptError):
                try:
                    results[i] = await self._xadd(keys=script_keys, args=args)
                except Exception as exc:  # its own callers see it, not the others'
                    results[i] = exc
        return results

    def _withdraw(self, stream: str, entry_id: bytes | None) -> None:
        """XACK + XDEL ``entry_id`` in the background (the caller is being cancelled, and a
        second cancellation must not interrupt it), with the other withdrawals and wakes
        waiting then (:meth:`_chore`); errors are logged, never raised."""
        if entry_id is not None:
            self._chore(withdraw=(stream, entry_id))

    def _chore(self, withdraw: tuple[str, bytes] | None = None, wake: str | None = None) -> None:
        """Queue a withdrawal or a scaler wake for the chores writer: one task at a time
        sends every chore waiting (:func:`naiad.group_commit.gathered`) in one transaction,
        so a burst of cancellations or of requests to a model at zero costs one round trip
        and one connection, not one each (a pool of connections has a bound)."""
        if withdraw is not None:
            self._withdrawals.append(withdraw)
        if wake is not None:
            self._wakes.add(wake)
        if self._chores is None:
            self._chores = asyncio.get_running_loop().create_task(
                self._send_chores(), context=contextvars.Context()
            )  # fmt: skip

    async def _send_chores(self) -> None:
        try:
            await group_commit.gathered(lambda: len(self._withdrawals) + len(self._wakes))
            while self._withdrawals or self._wakes:
                withdrawals, self._withdrawals = self._withdrawals, []
                wakes, self._wakes = self._wakes, set()
                await self._send_chores_once(withdrawals, wakes)
        finally:
            self._chores = None

    async def _send_chores_once(self, withdrawals: list[tuple[str, bytes]], wakes: set[str]) -> None:
        """XACK + XDEL of ``withdrawals`` (per stream) and a wake of each of ``wakes`` (the
        wake list is capped with LTRIM: under KEDA no local scaler pops it, and one wake per
        model is all a scaler needs anyway), within :data:`WITHDRAW_TIMEOUT_S`. A wake that
        fails is not retried: the scaler's tick finds the model's backlog itself."""
        by_stream: dict[str, list[bytes]] = {}
        for stream, entry_id in withdrawals:
            by_stream.setdefault(stream, []).append(entry_id)
        try:
            async with asyncio.timeout(WITHDRAW_TIMEOUT_S):
                async with self.redis.pipeline(transaction=True) as pipe:
                    for stream, ids in by_stream.items():
                        pipe.xack(stream, keys.WORKER_GROUP, *ids)
                        pipe.xdel(stream, *ids)  # runs even when XACK finds no group
                    if wakes:
                        pipe.rpush(keys.SCALER_WAKE, *sorted(wakes))
                        pipe.ltrim(keys.SCALER_WAKE, -keys.SCALER_WAKE_MAX, -1)
                    await pipe.execute(raise_on_error=False)
        except (RedisError, TimeoutError) as exc:
            logger.warning("could not withdraw %d cancelled requests nor wake %s: %s",
                           len(withdrawals), sorted(wakes) or "no model", exc)  # fmt: skip
            return
        if withdrawals:
            logger.debug("withdrew %d entries", len(withdrawals))

    async def _read_replies(self) -> None:
        backoff = 0.1
        while not self._closing:
            try:
                (item,) = await send_batch(
                    self.reader, CommandBatch().blpop([self.reply_key], READER_BLOCK_S)
                )
                if isinstance(item, Exception):
                    raise item
                backoff = 0.1
            except RedisError as exc:
                if self._closing:
                    return
                logger.warning("reply reader: %s; retrying in %.1f s", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            if item is not None:
                self.deliver(item[1])
                # the callers answered run first: the next BLPOP's write (~40-100 us of CPU
                # on a 2-core VM) is then off their answers' path (docs/benchmarks.md "Stop 17")
                await asyncio.sleep(0)

    def record_executions(self, raw: bytes) -> None:
        """Record the statistics of the batches that came with replies on the direct reply
        channel (:func:`naiad.reply_channel.encode_executions`' bytes) with this client's own
        (``stats_sink``): a reader of this gateway's statistics flushes them first, as its
        own. They are decoded when they are written, not here, off the answer's path
        (docs/benchmarks.md, "Stop 39"); a malformed one is logged then, and dropped."""
        if self.stats_sink is not None:
            self.stats_sink(lambda pipe: _add_executions(pipe, raw))
        else:
            logger.warning("statistics of a batch dropped: this client records none")

    def deliver(self, payload: bytes) -> None:
        """Resolve the futures of the replies in ``payload`` (every reply of one batch for
        this client: :func:`naiad.codec.decode_replies`), from the reply list or the direct
        reply channel; a reply whose caller is gone or already answered is dropped."""
        try:
            replies = decode_replies(payload)
        except InvalidInput as exc:
            logger.warning("dropping a malformed reply: %s", exc.message)
            return
        for reply in replies:
            future = self._pending.get(reply.queue_id)
            if future is not None and not future.done():
                future.set_result(reply)


def _add_executions(pipe: Any, raw: bytes) -> None:
    """The executions in ``raw`` (a reply frame's statistics) added to ``pipe``; a malformed
    frame is logged and adds nothing."""
    try:
        model, runs = decode_executions(raw)
    except ValueError as exc:
        logger.warning("%s", exc)
        return
    for run in runs:
        stats.add_execution(pipe, model, run)
