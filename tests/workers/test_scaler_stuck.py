"""A worker that never heartbeats (hung before it could serve) must not block its model:
the scaler kills it after ``START_TIMEOUT_S`` and starts another."""

from __future__ import annotations

import asyncio

import psutil
import redis

from naiad import keys, tasks
from naiad.registry import ModelEntry
from naiad.settings import Settings
from repository_store import parse_config
from workers import scaler as scaler_module
from workers.scaler import LocalScaler


class HangingScaler(LocalScaler):
    """Starts ``sleep`` instead of ``naiad worker``: a process that never heartbeats."""

    def worker_command(self, model: str) -> list[str]:
        return ["sleep", "300"]


def test_a_worker_that_never_becomes_live_is_replaced(redis_url, tmp_path, monkeypatch):
    monkeypatch.setattr(scaler_module, "START_TIMEOUT_S", 1.0)
    client = redis.Redis.from_url(redis_url)
    config = parse_config('name: "m" backend: "onnxruntime" max_batch_size: 0', "m")
    client.hset(keys.REGISTRY, "m", ModelEntry("m", config, [1], "READY").to_bytes())
    client.xadd(keys.request_stream("m"), {b"h": b"x"})  # a backlog nobody serves
    settings = Settings(
        model_repository=str(tmp_path), warm_pool_size=0, scaler_tick_s=0.2, cache_dir=tmp_path
    )
    started: list[int] = []

    async def scale_for(seconds: float) -> None:
        scaler = HangingScaler(settings, redis_url)
        original = scaler.start_worker

        def record(model: str):
            process = original(model)
            started.append(process.pid)
            return process

        scaler.start_worker = record
        task = asyncio.create_task(scaler.run())
        await asyncio.sleep(seconds)
        await tasks.cancel_and_wait(task)  # a plain cancel may be lost (naiad.tasks)

    asyncio.run(scale_for(3.0))
    assert len(started) >= 2, "the hung worker was never replaced"
    first = started[0]
    assert not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE
