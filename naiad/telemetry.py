"""What Triton has no statistic for, kept as counters in Redis, and the one reader of
everything a model's metrics show.

Recording: one hash per model, :func:`naiad.keys.lifecycle`, integer fields added with
HINCRBY in a pipeline the caller sends:

- ``cold_start_count``, ``cold_start_us`` (sum) and ``cold_start_bucket:<le>``: one per worker
  that became ready to read its queue (:func:`add_cold_start`, from the worker: process
  start → ready), counted in the first bucket of :data:`COLD_START_BUCKETS_S` that holds it
  (``+Inf`` past the last), so a reader can build a Prometheus histogram;
- ``download_bytes`` and ``download_us``: versions a worker pulled from the repository
  (:func:`add_download`; a version found in the local cache adds nothing);
- ``scaler:<action>``: the local scaler's decisions (:func:`add_scaler_decision`; ``start``).

Reading: :func:`snapshot` returns, per model, its statistics counters (:mod:`naiad.stats`),
the lifecycle hash, its queue length and its live workers, from one Redis pipeline for all
models. The metrics endpoint renders it; status views can use it as it is (no transport here).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from naiad import keys, stats

#: Upper bounds (seconds) of the cold-start histogram's buckets.
COLD_START_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def _bucket(seconds: float) -> str:
    bound = next((b for b in COLD_START_BUCKETS_S if seconds <= b), math.inf)
    return f"cold_start_bucket:{'+Inf' if bound == math.inf else format(bound, 'g')}"


def add_cold_start(pipe: Pipeline, model: str, seconds: float) -> None:
    """Queue one cold start of ``model`` that took ``seconds`` (process start → ready)."""
    key = keys.lifecycle(model)
    pipe.hincrby(key, "cold_start_count", 1)
    pipe.hincrby(key, "cold_start_us", max(0, round(seconds * 1e6)))
    pipe.hincrby(key, _bucket(seconds), 1)


def add_download(pipe: Pipeline, model: str, nbytes: int, seconds: float) -> None:
    """Queue one download of a version of ``model`` from the repository."""
    key = keys.lifecycle(model)
    pipe.hincrby(key, "download_bytes", nbytes)
    pipe.hincrby(key, "download_us", max(0, round(seconds * 1e6)))


def add_scaler_decision(pipe: Pipeline, model: str, action: str) -> None:
    """Queue one decision of the scaler about ``model`` (``start``: it started a worker)."""
    pipe.hincrby(keys.lifecycle(model), f"scaler:{action}", 1)


@dataclass(frozen=True)
class Histogram:
    """A cumulative histogram: ``buckets`` are (upper bound, observations <= bound), the last
    bound ``inf``; ``count`` (the last bucket's count) and ``sum`` of the observations."""

    buckets: list[tuple[float, int]]
    sum: float

    @property
    def count(self) -> int:
        return self.buckets[-1][1]


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
    download_bytes: int
    download_seconds: float
    scaler_decisions: dict[str, int] = field(default_factory=dict)


def _decode(raw: dict[bytes, bytes]) -> dict[str, int]:
    return {name.decode(): int(value) for name, value in raw.items()}


def cold_starts(lifecycle: dict[str, int]) -> Histogram:
    """The cold-start histogram from a decoded lifecycle hash."""
    bounds = [*COLD_START_BUCKETS_S, math.inf]
    running, buckets = 0, []
    for bound in bounds:
        running += lifecycle.get(_bucket(bound), 0)
        buckets.append((bound, running))
    return Histogram(buckets, lifecycle.get("cold_start_us", 0) / 1e6)


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
        download_bytes=lifecycle.get("download_bytes", 0),
        download_seconds=lifecycle.get("download_us", 0) / 1e6,
        scaler_decisions={
            f.removeprefix("scaler:"): n for f, n in sorted(lifecycle.items()) if f.startswith("scaler:")
        },
    )


async def snapshot(redis: Redis, models: Sequence[tuple[str, Sequence[int]]]) -> list[ModelTelemetry]:
    """:class:`ModelTelemetry` for each ``(model, versions)`` of ``models``, in that order,
    from one pipeline: HGETALL of both hashes, XLEN of the stream and ZCOUNT of live
    heartbeats per model (zeros for what was never recorded)."""
    now = time.time()
    async with redis.pipeline(transaction=False) as pipe:
        for name, _ in models:
            pipe.hgetall(keys.stats(name))
            pipe.hgetall(keys.lifecycle(name))
            pipe.xlen(keys.request_stream(name))
            pipe.zcount(keys.workers(name), now, "+inf")
        replies = await pipe.execute()
    return [
        model_telemetry(name, versions, _decode(counters), _decode(lifecycle), depth, workers)
        for (name, versions), (counters, lifecycle, depth, workers) in zip(
            models, zip(*[iter(replies)] * 4, strict=True), strict=True
        )
    ]
