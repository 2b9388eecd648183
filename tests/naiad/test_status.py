"""gateway/status.py: each model's state from Redis, and ``naiad status --once`` against a real
server after real traffic."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import numpy as np
import tritonclient.http as httpclient
from naiad_harness import ROOT, wait_for

from gateway.status import status_snapshot
from naiad import keys, stats, telemetry
from naiad.redis_client import connect
from naiad.registry import READY, UNAVAILABLE, ModelEntry
from repository_store import parse_config

CONFIG = 'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 8\n' \
         'input [{{name: "x", data_type: TYPE_FP32, dims: [4]}}]\n' \
         'output [{{name: "y", data_type: TYPE_FP32, dims: [4]}}]\n'  # fmt: skip


def _entry(name: str, state: str = READY, reason: str = "") -> ModelEntry:
    return ModelEntry(name, parse_config(CONFIG.format(name=name), name), [1, 3], state, reason)


async def _arrange_and_read(redis_url: str) -> dict:
    redis = connect(redis_url)
    try:
        now = time.time()
        for entry in (_entry("asleep"), _entry("waking"), _entry("busy"), _entry("idle"), _entry("recent"),
                      _entry("broken", UNAVAILABLE, "no <model> file")):  # fmt: skip
            await redis.hset(keys.REGISTRY, entry.name, entry.to_bytes())
        for name in ("waking", "busy"):
            await redis.xadd(keys.request_stream(name), {b"h": b"x"})
            await redis.xadd(keys.request_stream(name), {b"h": b"x"})
        for name in ("busy", "idle", "recent"):
            await redis.zadd(keys.workers(name), {f"{name}-w1": now + 30})
        await redis.zadd(keys.workers("asleep"), {"dead": now - 1})  # a heartbeat that ran out
        await redis.hset(keys.stats("idle"), "1:last_inference_ms", int((now - 60) * 1000))
        await redis.hset(keys.stats("recent"), "1:last_inference_ms", int((now - 1) * 1000))
        # "busy" has one request claimed by its worker (pending) and one waiting.
        await redis.xgroup_create(keys.request_stream("busy"), keys.WORKER_GROUP, id="0")
        await redis.xreadgroup(keys.WORKER_GROUP, "busy-w1", {keys.request_stream("busy"): ">"}, count=1)
        async with redis.pipeline(transaction=False) as pipe:
            telemetry.add_cold_start(pipe, "busy", 0.5)
            telemetry.add_cold_start(pipe, "busy", 1.5)
            for _ in range(4):  # four successes of 10 ms each
                stats.add_requests(pipe, "busy", 3, True, [10_000_000], int(now * 1000))
            pipe.hincrby(keys.stats("busy"), "3:cache_hit_count", 1)
            pipe.hincrby(keys.stats("busy"), "3:cache_miss_count", 3)
            await pipe.execute()
        return await status_snapshot(redis)
    finally:
        await redis.aclose()


def test_states_and_numbers(redis_url):
    snapshot = asyncio.run(_arrange_and_read(redis_url))
    rows = {row["name"]: row for row in snapshot["models"]}
    assert [row["name"] for row in snapshot["models"]] == sorted(rows)
    assert {name: row["state"] for name, row in rows.items()} == {
        "asleep": "asleep", "waking": "waking", "busy": "busy", "idle": "idle", "broken": "unavailable",
        "recent": "busy",  # nothing queued, but answered a second ago
    }  # fmt: skip
    assert snapshot["counts"] == {"asleep": 1, "waking": 1, "busy": 2, "idle": 1, "unavailable": 1}
    busy = rows["busy"]
    assert (busy["workers"], busy["queue"], busy["in_flight"]) == (1, 2, 1)
    assert busy["versions"] == ["1", "3"] and busy["success"] == 4
    assert busy["avg_latency_ms"] == 10.0
    assert 5.0 < busy["p50_ms"] <= 10.0 and busy["p50_ms"] <= busy["p99_ms"] <= 10.0  # 10 ms bucket
    assert busy["cache_hit_ratio"] == 0.25 and busy["cold_starts"] == 2 and busy["cold_start_avg_s"] == 1.0
    assert rows["asleep"]["workers"] == 0 and rows["asleep"]["avg_latency_ms"] is None
    assert rows["waking"]["in_flight"] == 0  # no consumer group yet: nothing claimed
    assert rows["broken"]["reason"] == "no <model> file"


def test_empty_registry(redis_url):
    async def read() -> dict:
        redis = connect(redis_url)
        try:
            return await status_snapshot(redis)
        finally:
            await redis.aclose()

    assert asyncio.run(read())["models"] == []


def _status_once(redis_url: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "naiad_cli", "status", "--redis-url", redis_url, "--once"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )
    return result.stdout


def _line(output: str, model: str) -> list[str]:
    line = next(line for line in output.splitlines() if f" {model} " in line)
    return [cell.strip() for cell in line.strip("│ ").split("│")]


def test_status_once_after_traffic(naiad_server, redis_url):
    server = naiad_server(redis_url=redis_url)
    assert "asleep" in _line(_status_once(redis_url), "digits")
    client = httpclient.InferenceServerClient(server.url)
    batch = httpclient.InferInput("input", [2, 64], "FP32")
    batch.set_data_from_numpy(np.ones((2, 64), np.float32))
    for _ in range(3):
        client.infer("digits", [batch])
    client.close()
    assert "busy" in _line(_status_once(redis_url), "digits")  # answered less than 5 s ago
    wait_for(lambda: "idle" in _line(_status_once(redis_url), "digits"), 15, "digits idle")
    output = _status_once(redis_url)
    model, state, versions, workers, queue, in_flight, ok, failed, p50, p99, _, cold, cold_avg, *rest = _line(
        output, "digits"
    )
    assert rest == ["0", "-"]  # no load failures, no problem
    assert (model, state, versions, workers, queue, in_flight, ok, failed) == (
        "digits", "idle", "1", "1", "0", "0", "3", "0"
    )
    assert p50.endswith(" ms") and p99.endswith(" ms") and cold == "1" and cold_avg.endswith(" s")
    assert float(p50.split()[0]) <= float(p99.split()[0])
    assert _line(output, "silero_vad")[1:4] == ["asleep", "1", "0"]
    assert "1 asleep, 1 idle" in output
