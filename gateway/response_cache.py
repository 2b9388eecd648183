"""The response cache: Triton's ``response_cache`` kept in Redis, shared by every gateway.

Sources: Triton's docs/user_guide/response_cache.md (a model opts in with
``response_cache { enable: true }``; the server picks the cache with ``--cache-config``; only
successful responses are stored), docs/user_guide/metrics.md (``nv_cache_*``) and
docs/protocol/extension_statistics.md (``cache_hit`` / ``cache_miss``). Transport-free: the
data plane calls :meth:`ResponseCache.infer` for HTTP and gRPC alike.

- **Key** (:func:`request_digest`): SHA-256 of a msgpack list of the model, the resolved
  version, the inputs sorted by name (name, datatype, shape, the codec's raw little-endian
  bytes, so a JSON and a binary request carrying the same tensor share an entry), the
  requested outputs sorted by name with their classification count, and the request
  parameters except :data:`UNKEYED_PARAMETERS`.
- **Value**: :func:`naiad.codec.encode_tensors` of the outputs the client got (after
  classification); a hit rebuilds the response with the new request's ``id``. The binary
  or JSON rendering of outputs happens per request after the cache, so it is not keyed.
- **Eviction**: every entry is a Redis string with the TTL; one Lua script
  (:data:`INSERT_LUA`) keeps a server-wide LRU index (sorted set by last use, a size per
  entry, a byte total) and evicts least recently used entries until the new one fits under
  ``max_bytes``; the caller deletes the evicted keys. Works the same on an external Redis.
- **Coalescing**: on a miss, ``SET NX`` of an in-flight lease elects one leader (renewed
  while it runs, so a dead leader is noticed within :data:`LEASE_MS`); the others join its
  round (a counter per leader token) and BLPOP its notification list; the leader's release
  script pushes one notice per counted follower: the answer, the model's own error
  (:data:`FORWARDED_ERRORS`), or "retry" (its deadline, a lost Redis, a crash), after which
  the followers elect a new leader, each bounded by its own deadline.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgpack
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from naiad import keys
from naiad.codec import decode_tensors, encode_tensors, pack_request_values
from naiad.datatypes import to_bytes
from naiad.errors import DeadlineExceeded, InferenceFailed, InvalidInput, error_from_name
from naiad.inference import InferRequest, InferResponse, Tensor

logger = logging.getLogger(__name__)

#: Version of the key's canonical encoding (a change starts a fresh key space).
KEY_FORMAT = 1
#: Request parameters that never change the outputs (Triton's scheduling parameters and the
#: HTTP rendering choice); every other parameter is part of the key.
UNKEYED_PARAMETERS = frozenset({"timeout", "priority", "binary_data_output"})
#: Lease of a leader on its request, in ms; renewed every third of it while the run lasts.
LEASE_MS = 3000
#: Longest single BLPOP of a follower, in s (it then checks that its leader still holds).
WAIT_BLOCK_S = 1.0
#: Lifetime of a leader's notifications and result copy for its followers, in ms.
RESULT_TTL_MS = 10_000
#: Errors that are the model's answer to this very input: followers get them too. Any
#: other failure of a leader (its deadline, Redis, a crash) makes the followers run again.
FORWARDED_ERRORS = (InvalidInput, InferenceFailed)

Runner = Callable[[float], Awaitable[InferResponse]]

INSERT_LUA = """
-- KEYS: lru, sizes, total. ARGV: entry key, bytes, now (ms), ttl (ms), cap (bytes).
-- Index the entry; drop expired ones, then the least recently used until it fits.
local lru, sizes, total = KEYS[1], KEYS[2], KEYS[3]
local member, size = ARGV[1], tonumber(ARGV[2])
local now, ttl, cap = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local evicted = {}
local function drop(m)
  local s = tonumber(redis.call('HGET', sizes, m) or '0')
  redis.call('HDEL', sizes, m)
  redis.call('ZREM', lru, m)
  redis.call('DECRBY', total, s)
end
if redis.call('HEXISTS', sizes, member) == 1 then drop(member) end
for _, m in ipairs(redis.call('ZRANGEBYSCORE', lru, '-inf', '(' .. (now - ttl), 'LIMIT', 0, 256)) do
  drop(m)
  evicted[#evicted + 1] = m
end
while tonumber(redis.call('GET', total) or '0') + size > cap do
  local oldest = redis.call('ZRANGE', lru, 0, 0)
  if #oldest == 0 then break end
  drop(oldest[1])
  evicted[#evicted + 1] = oldest[1]
end
redis.call('ZADD', lru, now, member)
redis.call('HSET', sizes, member, size)
redis.call('INCRBY', total, size)
return evicted
"""

ELECT_LUA = """
-- KEYS: inflight. ARGV: token, lease (ms). The holder's token: ours if we lead now.
local holder = redis.call('GET', KEYS[1])
if holder then return holder end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ARGV[1]
"""

JOIN_LUA = """
-- KEYS: inflight, waiters. ARGV: token, lease (ms). Count a follower if token still leads.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
"""

RENEW_LUA = """
-- KEYS: inflight, waiters. ARGV: token, lease (ms). Extend the lease while token holds it.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
"""

RELEASE_LUA = """
-- KEYS: inflight, waiters, done, result. ARGV: token, notice, result payload, ttl (ms).
-- End token's round: one notice per counted follower, the result kept briefly for them.
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
local n = tonumber(redis.call('GET', KEYS[2]) or '0')
redis.call('DEL', KEYS[2])
if n == 0 then return 0 end
if ARGV[3] ~= '' then redis.call('SET', KEYS[4], ARGV[3], 'PX', ARGV[4]) end
for _ = 1, n do redis.call('RPUSH', KEYS[3], ARGV[2]) end
redis.call('PEXPIRE', KEYS[3], ARGV[4])
return n
"""


@dataclass(frozen=True)
class CacheConfig:
    """The server side of the cache (``--cache-config redis,...``)."""

    max_bytes: int = 256 * 1024**2
    """Cap on the stored bytes of every entry of every model together."""
    ttl_s: float = 3600.0
    """Seconds an entry lives after it was stored (a hit does not extend it)."""


@dataclass
class CacheTrace:
    """What the cache did for one request, for the statistics: ``hit`` or miss, and ``ns``
    spent in the cache (looking up, storing, waiting for a leader; never running)."""

    used: bool = False
    hit: bool = False
    ns: int = 0


def canonical_request(request: InferRequest) -> bytes:
    """The msgpack encoding of everything in ``request`` that decides its outputs. Raises
    :class:`InvalidInput` (400) for parameters msgpack cannot encode, as queueing does."""
    inputs = sorted(
        ([t.name, t.datatype, [int(d) for d in t.shape], to_bytes(t.data, t.datatype)]
         for t in request.inputs),
        key=lambda item: item[0],
    )
    outputs = sorted([o.name, o.class_count] for o in request.outputs)
    parameters = sorted(
        ([name, value] for name, value in request.parameters.items() if name not in UNKEYED_PARAMETERS),
        key=lambda item: item[0],
    )
    return pack_request_values([KEY_FORMAT, request.model, request.version, inputs, outputs, parameters])


def request_digest(request: InferRequest) -> str:
    """Hex SHA-256 of :func:`canonical_request`: the entry's name within its model."""
    return hashlib.sha256(canonical_request(request)).hexdigest()


@dataclass(frozen=True)
class _Round:
    """One leader's round on one request: who leads (``token``) and its Redis keys."""

    model: str
    digest: str
    token: str

    @property
    def inflight(self) -> str:
        return keys.response_cache_inflight(self.model, self.digest)

    @property
    def waiters(self) -> str:
        return keys.response_cache_waiters(self.model, self.digest, self.token)

    @property
    def done(self) -> str:
        return keys.response_cache_done(self.model, self.digest, self.token)

    @property
    def result(self) -> str:
        return keys.response_cache_result(self.model, self.digest, self.token)


def _notice(exc: BaseException | None) -> bytes:
    if exc is None:
        return msgpack.packb(["ok"])
    if isinstance(exc, FORWARDED_ERRORS):
        return msgpack.packb(["error", type(exc).__name__, exc.message])
    return msgpack.packb(["retry"])


def _respond(request: InferRequest, outputs: list[Tensor]) -> InferResponse:
    return InferResponse(request.model, request.version, outputs, request.id)


class ResponseCache:
    """Lookups, stores and coalescing for cached models. ``redis`` sends commands;
    ``blocking`` (a client whose socket timeout exceeds :data:`WAIT_BLOCK_S`) BLPOPs."""

    def __init__(self, redis: aioredis.Redis, blocking: aioredis.Redis, config: CacheConfig):
        self.redis = redis
        self.blocking = blocking
        self.config = config
        self._insert = redis.register_script(INSERT_LUA)
        self._elect = redis.register_script(ELECT_LUA)
        self._join = redis.register_script(JOIN_LUA)
        self._renew = redis.register_script(RENEW_LUA)
        self._release = redis.register_script(RELEASE_LUA)

    async def infer(
        self, request: InferRequest, timeout_s: float, run: Runner, trace: CacheTrace
    ) -> InferResponse:
        """The cached answer to ``request``, or its leader's, or ``run(seconds left)`` as the
        leader (a success is stored). Raises what the run raised, a leader's forwarded
        error, or :class:`DeadlineExceeded` once ``timeout_s`` (s) passed."""
        digest, deadline = request_digest(request), time.monotonic() + timeout_s
        trace.used = True
        while (left_s := deadline - time.monotonic()) > 0:
            started = time.perf_counter_ns()
            outputs = await self.lookup(request.model, digest)
            if outputs is None:
                names, leading = await self._elect_leader(request.model, digest)
                if leading:
                    trace.ns += time.perf_counter_ns() - started
                    return await self._lead(names, run, left_s, trace)
                outputs = await self._follow(names, deadline)
            trace.ns += time.perf_counter_ns() - started
            if outputs is not None:
                trace.hit = True
                return _respond(request, outputs)
        raise DeadlineExceeded(f"request to model '{request.model}' timed out after {timeout_s:g} s")

    async def lookup(self, model: str, digest: str) -> list[Tensor] | None:
        """The cached outputs of ``digest`` (refreshing its last use), or None."""
        entry = keys.response_cache_entry(model, digest)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.get(entry)
            pipe.zadd(keys.RESPONSE_CACHE_LRU, {entry: int(time.time() * 1000)}, xx=True)
            payload, _ = await pipe.execute()
        if payload is None:
            return None
        try:
            return decode_tensors(payload)
        except InvalidInput:
            logger.warning("ignoring a malformed cache entry %s", entry)
            return None

    async def store(self, model: str, digest: str, payload: bytes) -> bool:
        """Store ``payload`` (encoded outputs) under ``digest``, evicting least recently used
        entries past ``max_bytes``; False if it alone is over the cap (not stored)."""
        if len(payload) > self.config.max_bytes:
            return False
        entry, ttl_ms = keys.response_cache_entry(model, digest), int(self.config.ttl_s * 1000)
        await self.redis.set(entry, payload, px=ttl_ms)
        index = [keys.RESPONSE_CACHE_LRU, keys.RESPONSE_CACHE_SIZES, keys.RESPONSE_CACHE_BYTES]
        args = [entry, len(payload), int(time.time() * 1000), ttl_ms, self.config.max_bytes]
        evicted = await self._insert(keys=index, args=args)
        if evicted:
            await self.redis.delete(*evicted)
        return True

    async def _elect_leader(self, model: str, digest: str) -> tuple[_Round, bool]:
        """The round now running ``digest`` and whether we lead it (SET NX of the lease)."""
        token = uuid.uuid4().hex
        inflight = keys.response_cache_inflight(model, digest)
        holder = (await self._elect(keys=[inflight], args=[token, LEASE_MS])).decode()
        return _Round(model, digest, holder), holder == token

    async def _lead(self, names: _Round, run: Runner, left_s: float, trace: CacheTrace) -> InferResponse:
        """Run ``request`` as ``names``' leader, store a success, release the followers."""
        done = asyncio.Event()  # ends the holder even if it loses its cancellation (naiad.tasks)
        holding = asyncio.create_task(self._hold(names, done))
        try:
            response = await run(left_s)
        except BaseException as exc:
            done.set()
            holding.cancel()
            await self._finish(names, _notice(exc), b"")
            raise
        done.set()
        holding.cancel()
        started = time.perf_counter_ns()
        payload = encode_tensors(response.outputs)
        try:
            await self.store(names.model, names.digest, payload)
        except RedisError as exc:
            logger.warning("response of model '%s' not cached: %s", names.model, exc)
        await self._finish(names, _notice(None), payload)
        trace.ns += time.perf_counter_ns() - started
        return response

    async def _hold(self, names: _Round, done: asyncio.Event) -> None:
        """Renew the leader's lease every third of :data:`LEASE_MS` until cancelled or
        ``done`` is set."""
        while True:
            await asyncio.sleep(LEASE_MS / 3000)
            if done.is_set():
                return
            try:
                await self._renew(keys=[names.inflight, names.waiters], args=[names.token, LEASE_MS])
            except RedisError as exc:
                logger.warning("lease of a cached request not renewed: %s", exc)

    async def _finish(self, names: _Round, notice: bytes, payload: bytes) -> None:
        """End the round: one ``notice`` per follower; never fails (the lease expires)."""
        try:
            await self._release(
                keys=[names.inflight, names.waiters, names.done, names.result],
                args=[names.token, notice, payload, RESULT_TTL_MS],
            )
        except (RedisError, asyncio.CancelledError) as exc:
            logger.warning("followers of a cached request not notified: %r", exc)

    async def _follow(self, names: _Round, deadline: float) -> list[Tensor] | None:
        """Wait for ``names``' leader: its outputs, its error raised, or None to retry (it
        failed on its own account, or it is gone). Bounded by ``deadline`` (monotonic s)."""
        if not await self._join(keys=[names.inflight, names.waiters], args=[names.token, LEASE_MS]):
            return None  # it finished (or died) meanwhile: look up again
        while (left := deadline - time.monotonic()) > 0:
            # BLPOP 0 blocks forever: never ask for less than 10 ms.
            popped = await self.blocking.blpop([names.done], timeout=max(min(WAIT_BLOCK_S, left), 0.01))
            if popped is not None:
                return await self._answer(names, popped[1])
            if await self.redis.get(names.inflight) != names.token.encode():
                late = await self.redis.lpop(names.done)  # a notice that raced the check
                return None if late is None else await self._answer(names, late)
        return None

    async def _answer(self, names: _Round, notice: bytes) -> list[Tensor] | None:
        kind, *detail = msgpack.unpackb(notice)
        if kind == "error":
            raise error_from_name(*detail)
        if kind != "ok":
            return None
        payload = await self.redis.get(names.result)
        return None if payload is None else decode_tensors(payload)
