"""What Triton has no statistic for, kept as counters in Redis, and the one reader of
everything a model's metrics show.

Recording: one hash per model, :func:`naiad.keys.lifecycle`, integer fields added with
HINCRBY in a pipeline the caller sends:

- ``cold_start_count``, ``cold_start_us`` (sum) and ``cold_start_bucket:<le>``: one per worker
  that became ready to read its queue (:func:`add_cold_start`, from the worker: process
  start → ready, or for a warm-pool process claim → ready), counted in the first bucket of
  :data:`COLD_START_BUCKETS_S` that holds it (``+Inf`` past the last), so a reader can build
  a Prometheus histogram; ``warm_pool_claims``: those served by a warm-pool process;
- ``download_bytes`` and ``download_us``: versions a worker pulled from the repository
  (:func:`add_download`; a version found in the local cache adds nothing);
- ``load_count`` and ``load_us``: versions a worker loaded into its backend from the local
  folder, after the pull (:func:`add_load`);
- ``scaler:<action>``: the local scaler's decisions (:func:`add_scaler_decision`; ``start``);
- ``rollbacks:<version>``: automatic rollbacks of a canary version (``gateway/rollouts.py``);
  ``shadow:<version>:success|failure``: shadow copies sent to a version (:func:`add_shadow`);
- ``load_failures``: changes of the model that failed to index or to load (a poll, an
  explicit load, a worker's load; :func:`add_load_failure`), whether or not an earlier
  version kept serving.

Reading: :func:`snapshot` returns, per model, its statistics counters (:mod:`naiad.stats`),
the lifecycle hash, its queue length and its live workers, from one Redis pipeline for all
models. The metrics endpoint renders it; status views can use it as it is (no transport here).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from naiad import histogram, keys, stats
from naiad.histogram import Histogram

#: Upper bounds (seconds) of the cold-start histogram's buckets.
COLD_START_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def add_cold_start(pipe: Pipeline, model: str, seconds: float, warm_pool: bool = False) -> None:
    """Queue one cold start of ``model`` that took ``seconds`` (process start → ready, or
    claim → ready when ``warm_pool``: a warm-pool process served it)."""
    key = keys.lifecycle(model)
    pipe.hincrby(key, "cold_start_count", 1)
    pipe.hincrby(key, "cold_start_us", max(0, round(seconds * 1e6)))
    pipe.hincrby(key, histogram.field("cold_start_bucket:", COLD_START_BUCKETS_S, seconds), 1)
    if warm_pool:
        pipe.hincrby(key, "warm_pool_claims", 1)


def add_download(pipe: Pipeline, model: str, nbytes: int, seconds: float) -> None:
    """Queue one download of a version of ``model`` from the repository."""
    key = keys.lifecycle(model)
    pipe.hincrby(key, "download_bytes", nbytes)
    pipe.hincrby(key, "download_us", max(0, round(seconds * 1e6)))


def add_load(pipe: Pipeline, model: str, seconds: float) -> None:
    """Queue one load of a version of ``model`` into its backend, from the local folder."""
    key = keys.lifecycle(model)
    pipe.hincrby(key, "load_count", 1)
    pipe.hincrby(key, "load_us", max(0, round(seconds * 1e6)))


def add_load_failure(pipe: Pipeline, model: str) -> None:
    """Queue one failed change of ``model`` (index or load; the reason is in the registry)."""
    pipe.hincrby(keys.lifecycle(model), "load_failures", 1)


def add_shadow(pipe: Pipeline, model: str, version: int, ok: bool) -> None:
    """Queue one shadow copy sent to ``version`` of ``model`` and its outcome."""
    pipe.hincrby(keys.lifecycle(model), f"shadow:{version}:{'success' if ok else 'failure'}", 1)


def add_scaler_decision(pipe: Pipeline, model: str, action: str) -> None:
    """Queue one decision of the scaler about ``model`` (``start``: it started a worker)."""
    pipe.hincrby(keys.lifecycle(model), f"scaler:{action}", 1)


@dataclass(frozen=True)
class ModelTelemetry:
    """Everything recorded about one model, read at one moment.

    ``stats``: one ``$model_stat`` per version (:func:`naiad.stats.model_stat`, the very
    objects the statistics extension returns); ``failures``: version → reason → failed
    requests; ``queue_depth``: entries in its request stream (answered ones are deleted, so
    this is the requests not yet answered: queued or running); ``workers``: live heartbeats.
    """

    name: str
    stats: list[dict[str, Any]]
    failures: dict[int, dict[str, int]]
    queue_depth: int
    workers: int
    cold_starts: Histogram
    request_durations: Histogram
    """Successful requests' durations (seconds) as the gateway saw them, all versions."""
    download_bytes: int
    download_seconds: float
    scaler_decisions: dict[str, int] = field(default_factory=dict)
    loads: int = 0
    load_seconds: float = 0.0
    warm_pool_claims: int = 0
    load_failures: int = 0
    rollbacks: dict[int, int] = field(default_factory=dict)
    """Automatic rollbacks per version."""
    shadows: dict[tuple[int, str], int] = field(default_factory=dict)
    """Shadow copies per (version, ``success``/``failure``)."""


def _decode(raw: dict[bytes, bytes]) -> dict[str, int]:
    return {name.decode(): int(value) for name, value in raw.items()}


def cold_starts(lifecycle: dict[str, int]) -> Histogram:
    """The cold-start histogram (seconds) from a decoded lifecycle hash."""
    total = lifecycle.get("cold_start_us", 0) / 1e6
    return histogram.read(lifecycle, "cold_start_bucket:", COLD_START_BUCKETS_S, total)


def model_telemetry(
    name: str, versions: Sequence[int], counters: dict[str, int], lifecycle: dict[str, int],
    queue_depth: int, workers: int,
) -> ModelTelemetry:
    """One model's :class:`ModelTelemetry` from its decoded hashes and queue/worker counts."""
    return ModelTelemetry(
        name=name,
        stats=[stats.model_stat(name, version, counters) for version in versions],
        failures={version: stats.failures(counters, version) for version in versions},
        queue_depth=queue_depth,
        workers=workers,
        cold_starts=cold_starts(lifecycle),
        request_durations=histogram.merge(
            [stats.request_durations(counters, version) for version in versions or [0]]
        ),
        download_bytes=lifecycle.get("download_bytes", 0),
        download_seconds=lifecycle.get("download_us", 0) / 1e6,
        loads=lifecycle.get("load_count", 0),
        load_seconds=lifecycle.get("load_us", 0) / 1e6,
        warm_pool_claims=lifecycle.get("warm_pool_claims", 0),
        load_failures=lifecycle.get("load_failures", 0),
        rollbacks={int(f.split(":")[1]): n for f, n in lifecycle.items() if f.startswith("rollbacks:")},
        shadows={(int(f.split(":")[1]), f.split(":")[2]): n for f, n in lifecycle.items()
                 if f.startswith("shadow:") and f.count(":") == 2},  # fmt: skip
        scaler_decisions={
            f.removeprefix("scaler:"): n for f, n in sorted(lifecycle.items()) if f.startswith("scaler:")
        },
    )


async def snapshot(
    redis: Redis, models: Sequence[tuple[str, Sequence[int]]], levels: Mapping[str, int] | None = None
) -> list[ModelTelemetry]:
    """:class:`ModelTelemetry` for each ``(model, versions)`` of ``models``, in that order,
    from one pipeline: HGETALL of both hashes, XLEN of each request stream (one per priority
    level: ``levels`` maps a model to its count, absent: one stream; the depth is their sum)
    and ZCOUNT of live heartbeats per model (zeros for what was never recorded)."""
    now, levels = time.time(), levels or {}
    streams = [keys.request_streams(name, levels.get(name, 0)) for name, _ in models]
    async with redis.pipeline(transaction=False) as pipe:
        for (name, _), names in zip(models, streams, strict=True):
            pipe.hgetall(keys.stats(name))
            pipe.hgetall(keys.lifecycle(name))
            for stream in names:
                pipe.xlen(stream)
            pipe.zcount(keys.workers(name), now, "+inf")
        replies = iter(await pipe.execute())
    result = []
    for (name, versions), names in zip(models, streams, strict=True):
        counters, lifecycle = _decode(next(replies)), _decode(next(replies))
        depth = sum(next(replies) for _ in names)
        result.append(model_telemetry(name, versions, counters, lifecycle, depth, next(replies)))
    return result
