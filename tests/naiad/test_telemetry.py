"""naiad.telemetry and the failure reasons of naiad.stats against a real redis-server:
lifecycle counters recorded in pipelines, read back in one snapshot for every model."""

from __future__ import annotations

import asyncio
import math

from naiad import keys, stats, telemetry
from naiad.errors import DeadlineExceeded, InferenceFailed, ModelNotReady, Unavailable
from naiad.redis_client import connect


async def _record_and_read(url: str, models) -> list[telemetry.ModelTelemetry]:
    redis = connect(url)
    try:
        async with redis.pipeline(transaction=False) as pipe:
            for seconds in (0.05, 0.3, 0.3, 7.0, 45.0):
                telemetry.add_cold_start(pipe, "m", seconds)
            telemetry.add_download(pipe, "m", 1000, 0.25)
            telemetry.add_download(pipe, "m", 500, 0.5)
            telemetry.add_scaler_decision(pipe, "m", "start")
            telemetry.add_scaler_decision(pipe, "m", "start")
            stats.add_requests(pipe, "m", 1, True, [1000], 1)
            stats.add_requests(pipe, "m", 1, False, [10], 2, "REJECTED")
            stats.add_requests(pipe, "m", 1, False, [20], 3, "BACKEND")
            stats.add_requests(pipe, "m", 1, False, [30], 4, "no such reason")
            pipe.xadd(keys.request_stream("m"), {"h": b"x"})
            pipe.zadd(keys.workers("m"), {"w1": 2e9, "dead": 1.0})
            await pipe.execute()
        return await telemetry.snapshot(redis, models)
    finally:
        await redis.aclose()


def test_snapshot_reads_every_counter_of_every_model(redis_url):
    m, never = asyncio.run(_record_and_read(redis_url, [("m", [1]), ("never", [2, 3])]))
    assert m.name == "m" and m.workers == 1 and m.queue_depth == 1
    bounds = [b for b, _ in m.cold_starts.buckets]
    assert bounds == [*telemetry.COLD_START_BUCKETS_S, math.inf]
    cumulative = dict(m.cold_starts.buckets)
    assert [cumulative[b] for b in (0.1, 0.25, 0.5, 5.0, 10.0, 30.0)] == [1, 1, 3, 3, 4, 4]
    assert cumulative[math.inf] == m.cold_starts.count == 5
    assert math.isclose(m.cold_starts.sum, 52.65)
    assert m.download_bytes == 1500 and math.isclose(m.download_seconds, 0.75)
    assert m.scaler_decisions == {"start": 2}
    assert m.failures == {1: {"REJECTED": 1, "CANCELED": 0, "BACKEND": 1, "OTHER": 1}}
    # The statistics extension's "fail" is the sum over the reasons: one count, two views.
    (stat,) = m.stats
    assert stat["inference_stats"]["fail"] == {"count": 3, "ns": 60}
    assert stat["inference_stats"]["success"] == {"count": 1, "ns": 1000}
    assert never.workers == never.queue_depth == never.cold_starts.count == never.download_bytes == 0
    assert [s["version"] for s in never.stats] == ["2", "3"] and never.scaler_decisions == {}


def test_lifecycle_is_one_hash_per_model_with_hash_tag(redis_url):
    asyncio.run(_record_and_read(redis_url, [("m", [1])]))

    async def fields() -> set[str]:
        redis = connect(redis_url)
        try:
            return {f.decode() for f in await redis.hkeys(keys.lifecycle("m"))}
        finally:
            await redis.aclose()

    assert keys.lifecycle("m") == "naiad:{m}:lifecycle"
    assert {"cold_start_count", "cold_start_us", "cold_start_bucket:0.5", "cold_start_bucket:+Inf",
            "download_bytes", "download_us", "scaler:start"} <= asyncio.run(fields())  # fmt: skip


def test_failure_reasons_follow_triton():
    assert stats.failure_reason(DeadlineExceeded("timeout")) == "REJECTED"
    assert stats.failure_reason(asyncio.CancelledError()) == "CANCELED"
    assert stats.failure_reason(InferenceFailed("backend raised")) == "BACKEND"
    for other in (Unavailable("redis"), ModelNotReady("broken"), RuntimeError("?")):
        assert stats.failure_reason(other) == "OTHER"


def test_loads_and_warm_pool_claims_are_counted(redis_url):
    async def record_and_read() -> telemetry.ModelTelemetry:
        redis = connect(redis_url)
        try:
            async with redis.pipeline(transaction=False) as pipe:
                telemetry.add_cold_start(pipe, "w", 0.02, warm_pool=True)
                telemetry.add_cold_start(pipe, "w", 0.6)
                telemetry.add_load(pipe, "w", 0.004)
                telemetry.add_load(pipe, "w", 0.05)
                await pipe.execute()
            (found,) = await telemetry.snapshot(redis, [("w", [1])])
            return found
        finally:
            await redis.aclose()

    found = asyncio.run(record_and_read())
    assert found.cold_starts.count == 2 and found.warm_pool_claims == 1
    assert dict(found.cold_starts.buckets)[0.025] == 1  # a warm-pool claim has its own buckets
    assert found.loads == 2 and math.isclose(found.load_seconds, 0.054)
