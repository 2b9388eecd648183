"""Ensembles run in the gateways: the scaler never starts a worker for one, whatever the
minimum, a backlog in its stream or a wake-up naming it says."""

from __future__ import annotations

import asyncio

import redis

from naiad import keys, tasks
from naiad.registry import ModelEntry
from naiad.settings import Settings
from repository_store import parse_config
from workers.scaler import LocalScaler

ENSEMBLE = """
name: "ens" platform: "ensemble" max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "m" model_version: -1
  input_map { key: "x" value: "x" } output_map { key: "y" value: "y" } } ] }
"""


class SleepingScaler(LocalScaler):
    """Starts ``sleep`` instead of ``naiad worker`` and records for which model."""

    started: list[str]

    def worker_command(self, model: str) -> list[str]:
        self.started.append(model)
        return ["sleep", "300"]


def test_the_scaler_never_starts_workers_for_an_ensemble(redis_url, tmp_path):
    client = redis.Redis.from_url(redis_url)
    model = parse_config('name: "m" backend: "onnxruntime" max_batch_size: 0', "m")
    ensemble = parse_config(ENSEMBLE, "ens")
    client.hset(keys.REGISTRY, "m", ModelEntry("m", model, [1], "READY").to_bytes())
    client.hset(keys.REGISTRY, "ens", ModelEntry("ens", ensemble, [1], "READY").to_bytes())
    client.xadd(keys.request_stream("ens"), {b"h": b"x"})  # a backlog, as a stray client could leave
    client.rpush(keys.SCALER_WAKE, "ens")
    settings = Settings(
        model_repository=str(tmp_path), warm_pool_size=0, scaler_tick_s=0.2, cache_dir=tmp_path, min_workers=1
    )
    scaler = SleepingScaler(settings, redis_url)
    scaler.started = []

    async def scale_for(seconds: float) -> None:
        task = asyncio.create_task(scaler.run())
        await asyncio.sleep(seconds)
        await tasks.cancel_and_wait(task)  # a plain cancel may be lost (naiad.tasks)

    asyncio.run(scale_for(1.5))
    client.close()
    # The plain model's minimum: its worker is started (again, should a loaded machine make
    # the scaler give up on a `sleep` that never becomes live); never one for the ensemble.
    assert scaler.started and set(scaler.started) == {"m"}
