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

#: List the gateways push model names onto when a request finds no worker; the scaler
#: blocks on it (BLPOP), so a cold start begins within one round trip.
SCALER_WAKE = f"{PREFIX}:scaler:wake"

#: Seconds a reply list of a gateway outlives its last reply (a dead gateway's replies vanish).
REPLY_TTL_S = 60


def request_stream(model: str) -> str:
    """Stream of inference requests for ``model``, read by its workers' consumer group."""
    return f"{PREFIX}:{{{model}}}:requests"


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
