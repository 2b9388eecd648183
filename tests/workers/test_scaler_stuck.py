"""A worker that never heartbeats (hung before it could serve) must not block its model:
the scaler kills it after ``START_TIMEOUT_S`` and starts another. One that reported ready and
no longer heartbeats is leaving (its model's close may take long): the scaler neither waits
for it nor kills it."""

from __future__ import annotations

import asyncio
import contextlib
import sys

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


READY_THEN_SLEEP = "import os, time; os.write(int(os.environ['NAIAD_READY_FD']), b'1'); time.sleep(300)"


class LeavingScaler(LocalScaler):
    """Starts a process that reports ready (as a worker past its load) and then never
    heartbeats: a worker leaving, inside a long ``finalize()``."""

    def worker_command(self, model: str) -> list[str]:
        return [sys.executable, "-c", READY_THEN_SLEEP]


def scale_with_a_backlog(
    scaler_class, redis_url, tmp_path, seconds: float, **settings
) -> tuple[list[int], bool]:  # fmt: skip
    """Run ``scaler_class`` for ``seconds`` over model ``m`` with a request nobody serves;
    the pids it started, and whether the first was still running just before it stopped."""
    client = redis.Redis.from_url(redis_url)
    config = parse_config('name: "m" backend: "onnxruntime" max_batch_size: 0', "m")
    client.hset(keys.REGISTRY, "m", ModelEntry("m", config, [1], "READY").to_bytes())
    client.xadd(keys.request_stream("m"), {b"h": b"x"})  # a backlog nobody serves
    options = Settings(model_repository=str(tmp_path), warm_pool_size=0, scaler_tick_s=0.2,
                       cache_dir=tmp_path, **settings)  # fmt: skip
    started: list[int] = []
    first_running: list[bool] = []

    async def scale() -> None:
        scaler = scaler_class(options, redis_url)
        original = scaler.start_worker

        def record(model: str):
            process = original(model)
            started.append(process.pid)
            return process

        scaler.start_worker = record
        task = asyncio.create_task(scaler.run())
        await asyncio.sleep(seconds)
        with contextlib.suppress(psutil.Error):
            first = psutil.Process(started[0])
            first_running.append(first.is_running() and first.status() != psutil.STATUS_ZOMBIE)
        await tasks.cancel_and_wait(task)  # a plain cancel may be lost (naiad.tasks)

    asyncio.run(scale())
    return started, first_running == [True]


def test_a_worker_that_never_becomes_live_is_replaced(redis_url, tmp_path, monkeypatch):
    monkeypatch.setattr(scaler_module, "START_TIMEOUT_S", 1.0)
    started, first_running = scale_with_a_backlog(HangingScaler, redis_url, tmp_path, 3.0)
    assert len(started) >= 2, "the hung worker was never replaced"
    assert not first_running, "the hung worker was not killed"


def test_a_leaving_worker_is_neither_killed_nor_waited_for(redis_url, tmp_path, monkeypatch):
    monkeypatch.setattr(scaler_module, "START_TIMEOUT_S", 1.0)
    started: list[int] = []
    try:
        started, first_running = scale_with_a_backlog(LeavingScaler, redis_url, tmp_path, 3.0,
                                                      max_workers_per_model=1)  # fmt: skip
        assert len(started) >= 2, "the successor waited for the leaving worker"
        assert first_running, "the leaving worker was killed"
    finally:
        for pid in started:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
