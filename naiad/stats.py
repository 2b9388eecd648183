"""Per-model statistics (Triton's statistics extension), kept as counters in Redis.

Every gateway and worker adds to one hash per model, :func:`naiad.keys.stats`, so any gateway
reports the same numbers. Fields are ``<version>:<counter>`` with integer values, added with
HINCRBY inside a pipeline the caller already sends (recording costs no extra round trip):

- ``<v>:inference_count``, ``<v>:execution_count``: rows inferred, batches executed;
- ``<v>:<kind>_count`` and ``<v>:<kind>_ns`` for each kind of :data:`DURATIONS` but ``fail``;
- ``<v>:fail:<reason>_count`` and ``..._ns`` per reason of :data:`FAILURE_REASONS` (the
  extension's ``fail`` is their sum; the metrics endpoint shows them by ``reason``);
- ``<v>:batch:<rows>:<phase>_count`` and ``..._ns`` for each phase of :data:`PHASES`;
- ``<v>:last_inference_ms``: Unix milliseconds of the last inference (HSET, not added);
- ``<v>:duration_bucket:<le>``: successful requests by duration, a histogram over
  :data:`REQUEST_BUCKETS_S` (:mod:`naiad.histogram`; Triton keeps no percentiles, Naiad's
  status views and ``naiad_request_duration_seconds`` need them).

Who records what follows Triton (docs/protocol/extension_statistics.md): a worker records
each batch it executed successfully (:func:`add_execution`: queue time per request, the
three compute phases once per request in ``inference_stats`` and once per batch in
``batch_stats``); the gateway records each request that reached the model's queue as a
success or a failure with its whole duration (:func:`add_requests`) and, for a model with
the response cache, its lookup as a ``cache_hit`` or ``cache_miss`` (:func:`add_cache`).
Nothing here does I/O except :func:`read`.
"""

from __future__ import annotations

import asyncio
import collections
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from naiad import histogram, keys
from naiad.errors import DeadlineExceeded, InferenceFailed, Overloaded, QueueTimeout
from naiad.histogram import Histogram

#: Phases a worker times per executed batch (``inference_stats`` and ``batch_stats``).
PHASES = ("compute_input", "compute_infer", "compute_output")

#: Upper bounds (seconds) of the request-duration histogram (``<v>:duration_bucket:<le>``),
#: from which status views estimate p50/p99 and the metrics port exports
#: ``naiad_request_duration_seconds``.
REQUEST_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: Every duration of Triton's ``inference_stats``, in its order.
DURATIONS = ("success", "fail", "queue", *PHASES, "cache_hit", "cache_miss")
#: Triton's failure reasons (label ``reason`` of ``nv_inference_request_failure``).
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


def failure_reason(exc: BaseException) -> str:
    """Triton's reason for a request that failed with ``exc``: its timeout expired before
    an answer came (Triton's scheduler rejects a request whose timeout expires in the
    queue; :class:`QueueTimeout`: its queue policy's timeout with REJECT), or a full queue
    refused it → REJECTED; the client went away (a cancelled
    task) → CANCELED; the backend raised while running the model → BACKEND; anything
    else (Redis, a model that cannot load, ...) → OTHER."""
    if isinstance(exc, DeadlineExceeded | Overloaded | QueueTimeout):  # expired, or refused
        return "REJECTED"
    if isinstance(exc, asyncio.CancelledError):
        return "CANCELED"
    if isinstance(exc, InferenceFailed):
        return "BACKEND"
    return "OTHER"


@dataclass(frozen=True)
class Execution:
    """One batch a worker ran: ``rows`` in the batch, each request's queue time, each
    phase's duration (keys of :data:`PHASES`), and when it finished (Unix ms)."""

    version: int
    rows: int
    queue_ns: Sequence[int]
    phases_ns: dict[str, int]
    finished_ms: int


#: On hash KEYS[1]: HSET the first ARGV[1] (field, value) pairs of ARGV[2..], then HINCRBY
#: each (field, increment) pair after them: many counters as one command (sent as EVAL,
#: which a pipeline sends as is, with no SCRIPT EXISTS first; Redis caches the script).
HINCRBY_MANY = """
local sets = tonumber(ARGV[1])
for i = 2, 2 * sets, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
for i = 2 * sets + 2, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
return 0
"""


def add_counters(pipe: Pipeline, key: str, increments: dict[str, int], values: dict[str, int]) -> None:
    """Queue on ``pipe`` one command (:data:`HINCRBY_MANY`) setting ``values`` and adding
    ``increments`` to fields of hash ``key``. A group commit's stand-in for a pipeline
    (:class:`naiad.stats_writer.Counters`) takes them as they are (``merge_counters``): no
    command to build and take apart again."""
    merge = getattr(pipe, "merge_counters", None)
    if merge is not None:
        merge(key, increments, values)
        return
    args: list[str | int] = [len(values)]
    for name, value in (*values.items(), *increments.items()):
        args += [name, value]
    pipe.eval(HINCRBY_MANY, 1, key, *args)


def _incr(pipe: Pipeline, key: str, prefix: str, kind: str, count: int, ns: int) -> None:
    pipe.hincrby(key, f"{prefix}{kind}_count", count)
    pipe.hincrby(key, f"{prefix}{kind}_ns", ns)


def add_execution(pipe: Pipeline, model: str, run: Execution) -> None:
    """Queue the counters of one executed batch on ``pipe`` (the caller executes it), as one
    command (:data:`HINCRBY_MANY`)."""
    requests, names = len(run.queue_ns), _execution_fields(run.version, run.rows)
    amounts = [1, run.rows, requests, sum(run.queue_ns)]
    for phase in PHASES:
        ns = run.phases_ns.get(phase, 0)
        amounts += (requests, ns * requests, 1, ns)
    add_counters(pipe, keys.stats(model), dict(zip(names[1:], amounts, strict=True)),
                 {names[0]: run.finished_ms})  # fmt: skip


@functools.lru_cache(maxsize=4096)
def _execution_fields(version: int, rows: int) -> tuple[str, ...]:
    """:func:`add_execution`'s field names for a batch of ``rows`` rows of ``version``:
    ``last_inference_ms``, then the counters in the order of its amounts."""
    v, batch = f"{version}:", f"{version}:batch:{rows}:"
    names = [f"{v}last_inference_ms", f"{v}execution_count", f"{v}inference_count", f"{v}queue_count",
             f"{v}queue_ns"]  # fmt: skip
    for phase in PHASES:
        names += (f"{v}{phase}_count", f"{v}{phase}_ns", f"{batch}{phase}_count", f"{batch}{phase}_ns")
    return tuple(names)


def add_requests(
    pipe: Pipeline, model: str, version: int, ok: bool, durations_ns: Sequence[int], now_ms: int,
    reason: str = "OTHER",
) -> None:  # fmt: skip
    """Queue the outcome of requests of one model version and one result on ``pipe``:
    ``success``, or ``fail`` with its ``reason`` (one of :data:`FAILURE_REASONS`: see
    :func:`failure_reason`), their durations (``durations_ns``: each one's) and, for a
    failure, ``now_ms`` (the last one's end) as the last inference; each counter added once
    (a gateway's statistics write adds those that finished while it lingered:
    :meth:`naiad.stats_writer.StatsWriter.add_request`)."""
    key, v, count, total = keys.stats(model), f"{version}:", len(durations_ns), sum(durations_ns)
    if ok:
        _incr(pipe, key, v, "success", count, total)
        prefix = f"{v}duration_bucket:"
        field = histogram.field
        buckets = collections.Counter(field(prefix, REQUEST_BUCKETS_S, ns / 1e9) for ns in durations_ns)
        for name, n in buckets.items():
            pipe.hincrby(key, name, n)
    else:  # a success's worker already stamped its last inference; a failure may never reach one
        _incr(pipe, key, f"{v}fail:", reason if reason in FAILURE_REASONS else "OTHER", count, total)
        pipe.hset(key, f"{v}last_inference_ms", now_ms)


def request_durations(counters: dict[str, int], version: int) -> Histogram:
    """Successful requests' durations (seconds) of ``version``, as a histogram."""
    total = counters.get(f"{version}:success_ns", 0) / 1e9
    return histogram.read(counters, f"{version}:duration_bucket:", REQUEST_BUCKETS_S, total)


def add_cache(pipe: Pipeline, model: str, version: int, hit: bool, duration_ns: int) -> None:
    """Queue one response-cache lookup on ``pipe``: a hit (duration: looking up and reading
    the entry, or waiting for a coalesced leader) or a miss (looking up and storing). A hit
    also counts in ``queue`` (the extension: its count "includes cache hits"), with no time:
    it never waited in a queue."""
    _incr(pipe, keys.stats(model), f"{version}:", "cache_hit" if hit else "cache_miss", 1, duration_ns)
    if hit:
        _incr(pipe, keys.stats(model), f"{version}:", "queue", 1, 0)


def _duration(counters: dict[str, int], prefix: str, kind: str) -> dict[str, int]:
    return {"count": counters.get(f"{prefix}{kind}_count", 0), "ns": counters.get(f"{prefix}{kind}_ns", 0)}


def failures(counters: dict[str, int], version: int) -> dict[str, int]:
    """Failed requests of ``version`` by reason (every reason of :data:`FAILURE_REASONS`)."""
    return {reason: counters.get(f"{version}:fail:{reason}_count", 0) for reason in FAILURE_REASONS}


def _failed(counters: dict[str, int], version: int) -> dict[str, int]:
    parts = [_duration(counters, f"{version}:fail:", reason) for reason in FAILURE_REASONS]
    return {"count": sum(p["count"] for p in parts), "ns": sum(p["ns"] for p in parts)}


def _batch_sizes(counters: dict[str, int], version: int) -> list[int]:
    prefix = f"{version}:batch:"
    return sorted({int(f.split(":")[2]) for f in counters if f.startswith(prefix)})


def model_stat(name: str, version: int, counters: dict[str, int]) -> dict[str, Any]:
    """One ``$model_stat`` object (Triton's JSON shape) for ``name`` ``version`` from the
    decoded hash ``counters`` (field -> int)."""
    v = f"{version}:"
    return {
        "name": name,
        "version": str(version),
        "last_inference": counters.get(f"{v}last_inference_ms", 0),
        "inference_count": counters.get(f"{v}inference_count", 0),
        "execution_count": counters.get(f"{v}execution_count", 0),
        "inference_stats": {
            kind: _failed(counters, version) if kind == "fail" else _duration(counters, v, kind)
            for kind in DURATIONS
        },
        "batch_stats": [
            {"batch_size": size, **{p: _duration(counters, f"{v}batch:{size}:", p) for p in PHASES}}
            for size in _batch_sizes(counters, version)
        ],
        # As Triton 2.51 writes them for a model that is not decoupled and reports no memory.
        "response_stats": {},
        "memory_usage": [],
    }


async def read(redis: Redis, wanted: Sequence[tuple[str, Sequence[int]]]) -> list[dict[str, Any]]:
    """``$model_stat`` objects for each ``(model, versions)`` in ``wanted``, in that order,
    read with one HGETALL per model in one pipeline (zeros for what was never recorded)."""
    async with redis.pipeline(transaction=False) as pipe:
        for name, _ in wanted:
            pipe.hgetall(keys.stats(name))
        hashes = await pipe.execute()
    result = []
    for (name, versions), raw in zip(wanted, hashes, strict=True):
        counters = {field.decode(): int(value) for field, value in raw.items()}
        result += [model_stat(name, version, counters) for version in versions]
    return result
