"""Every Redis key and consumer-group name Naiad uses, in one place.

Per-model keys carry the model name as a hash tag (``{model}``) so that a Redis Cluster keeps
all of one model's keys in one slot (https://redis.io/docs/latest/operate/oss_and_stack/
reference/cluster-spec/#hash-tags). Model names never contain braces (the repository
rejects them), so the tag is always the whole name.
"""

from __future__ import annotations

PREFIX = "naiad"

#: Consumer group that all workers of a model read its request stream with.
WORKER_GROUP = "workers"

#: Hash: model name -> msgpack-encoded registry entry (config, versions, state).
REGISTRY = f"{PREFIX}:registry"

#: Counter bumped on every change to :data:`REGISTRY`; a reader whose copy was taken at the
#: same value needs no reload (gateways check it at most once a second, workers per heartbeat).
REGISTRY_GENERATION = f"{REGISTRY}:generation"

#: Hash: ``<model>/<version>`` -> ``"<config digest> <reason>"``: the automatic rollbacks of
#: canary versions (:mod:`naiad.rollout`, ``gateway/rollouts.py``). Written once per decision by
#: the gateway that took it (one Lua script, which also bumps :data:`REGISTRY_GENERATION`, so
#: every gateway reloads it with the registry); a decision holds while the model's config
#: digest is the one it names (a changed config ends it). No TTL: it survives gateway restarts.
ROLLBACKS = f"{PREFIX}:rollbacks"

#: List the gateways push model names onto when a request finds no worker; the scaler
#: blocks on it (BLPOP), so a cold start begins within one round trip.
SCALER_WAKE = f"{PREFIX}:scaler:wake"

#: Most wake-ups kept in :data:`SCALER_WAKE` (older ones are trimmed: they are duplicates).
SCALER_WAKE_MAX = 1000

#: Seconds a reply list of a gateway outlives its last reply (a dead gateway's replies vanish).
REPLY_TTL_S = 60


def request_stream(model: str, level: int = 0) -> str:
    """Stream of inference requests for ``model`` at priority ``level``, read by its workers'
    consumer group. A model without priority levels (``level`` 0) and level 1, the highest,
    share the plain key; level ``L`` >= 2 has its own stream ``...:requests:L``
    (:mod:`naiad.queue_policy`)."""
    base = f"{PREFIX}:{{{model}}}:requests"
    return base if level <= 1 else f"{base}:{level}"


def request_streams(model: str, levels: int) -> list[str]:
    """Every request stream of ``model`` when its config has ``levels`` priority levels (0:
    none), highest priority first: what queue depths and scaling signals sum over."""
    return [request_stream(model, level) for level in range(1, max(levels, 1) + 1)]


def workers(model: str) -> str:
    """Sorted set of live workers of ``model``: member = worker id, score = heartbeat
    deadline (Unix seconds). Members whose score is past are dead."""
    return f"{PREFIX}:{{{model}}}:workers"


def reply_list(gateway_id: str) -> str:
    """List a gateway BLPOPs for its replies; workers RPUSH there (per-gateway path)."""
    return f"{PREFIX}:reply:{gateway_id}"


def stats(model: str) -> str:
    """Hash of ``model``'s statistics counters (Triton's statistics extension), shared by
    every gateway and worker: fields ``<version>:<counter>`` (see :mod:`naiad.stats`)."""
    return f"{PREFIX}:{{{model}}}:stats"


def lifecycle(model: str) -> str:
    """Hash of ``model``'s lifecycle counters, what Triton has no statistic for: cold starts
    (count, duration sum, histogram buckets), downloads of its versions (bytes, seconds) and
    the scaler's decisions, failed loads, rollbacks and shadow copies, integer fields (see
    :mod:`naiad.telemetry`)."""
    return f"{PREFIX}:{{{model}}}:lifecycle"


# --- response cache (gateway/response_cache.py) ----------------------------------------------
# Entries carry their model's hash tag; the size index is one set of keys for the whole server
# (the cap is server-wide, as Triton's cache size is), touched only by its own Lua script.

#: Sorted set of every cached entry's key, score = last use (Unix ms): the LRU order.
RESPONSE_CACHE_LRU = f"{PREFIX}:response_cache:lru"

#: Hash: entry key -> stored bytes, so an eviction knows what it frees.
RESPONSE_CACHE_SIZES = f"{PREFIX}:response_cache:sizes"

#: Integer: bytes of all indexed entries (never above the cache's ``max_bytes``).
RESPONSE_CACHE_BYTES = f"{PREFIX}:response_cache:bytes"


def response_cache_entry(model: str, digest: str) -> str:
    """String holding the cached outputs (codec-encoded) of request ``digest`` (hex SHA-256
    of its canonical encoding) to ``model``, with the cache's TTL."""
    return f"{PREFIX}:{{{model}}}:cache:{digest}"


def response_cache_inflight(model: str, digest: str) -> str:
    """String: the token of the leader running request ``digest`` now (a lease, PX)."""
    return f"{response_cache_entry(model, digest)}:inflight"


def response_cache_waiters(model: str, digest: str, token: str) -> str:
    """Counter of the followers waiting for leader ``token``'s answer."""
    return f"{response_cache_entry(model, digest)}:waiters:{token}"


def response_cache_done(model: str, digest: str, token: str) -> str:
    """List leader ``token`` pushes one notification per counted follower onto (BLPOP)."""
    return f"{response_cache_entry(model, digest)}:done:{token}"


def response_cache_result(model: str, digest: str, token: str) -> str:
    """Leader ``token``'s encoded outputs, kept briefly for its followers (even when the
    entry itself is too large for the cache or already evicted)."""
    return f"{response_cache_entry(model, digest)}:result:{token}"


# --- rate limiter (workers/rate_limiter.py) ---------------------------------------------------
# One set of keys per machine (``host``: a host or node name, never with braces), hash-tagged
# by it, touched only by the limiter's Lua scripts. A resource is ``<device>/<name>`` or
# ``global/<name>``; a worker id names a holder or a waiter.


def _rate_limit(host: str, what: str) -> str:
    return f"{PREFIX}:{{ratelimit:{host}}}:{what}"


def rate_limit_used(host: str) -> str:
    """Hash: resource -> copies allocated now on ``host``."""
    return _rate_limit(host, "used")


def rate_limit_holders(host: str) -> str:
    """Hash: worker id -> JSON list of the ``[resource, count, capacity]`` it holds."""
    return _rate_limit(host, "holders")


def rate_limit_leases(host: str) -> str:
    """Sorted set: worker id (holder or waiter) -> lease deadline (Redis time, ms); a holder
    or waiter past it is gone (its copies are freed, its place in line dropped)."""
    return _rate_limit(host, "leases")


def rate_limit_waiting(host: str) -> str:
    """Sorted set of waiting workers: member ``<20-digit arrival number>:<worker id>``,
    score = Triton's scaled priority (executions so far x priority): lowest goes first."""
    return _rate_limit(host, "waiting")


def rate_limit_requests(host: str) -> str:
    """Hash: waiting worker id -> JSON ``{member, needs}`` (what it waits for)."""
    return _rate_limit(host, "requests")


def rate_limit_arrivals(host: str) -> str:
    """Counter numbering the waiters of ``host`` in arrival order (ties of priority)."""
    return _rate_limit(host, "arrivals")


def rate_limit_wake(host: str, worker_id: str) -> str:
    """List a waiting worker BLPOPs; the script that grants it its copies pushes one element
    (with the lease as TTL)."""
    return _rate_limit(host, f"wake:{worker_id}")
