"""Prometheus metrics endpoint of the gateway (the ``--metrics-port``).

Values that live in Redis are read at scrape time, so every gateway's scrape tells the same
truth: ``naiad_model_workers{model}`` counts the workers whose heartbeat is current (a series
per model in the registry, 0 when scaled to zero).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.registry import ModelRegistry
from naiad import keys

REGISTRY_KEY = web.AppKey("registry", ModelRegistry)


class SnapshotCollector(Collector):
    """Exposes values gathered asynchronously just before each scrape."""

    def __init__(self) -> None:
        self.workers: dict[str, int] = {}

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "naiad_model_workers",
            "Worker processes serving the model now (0 when scaled to zero).",
            labels=["model"],
        )
        for model, count in sorted(self.workers.items()):
            family.add_metric([model], count)
        yield family


SNAPSHOT = web.AppKey("snapshot", SnapshotCollector)
PROM = web.AppKey("prometheus", CollectorRegistry)


async def live_workers(registry: ModelRegistry, names: list[str]) -> dict[str, int]:
    """Live worker count per model, from the heartbeat sorted sets in one pipeline."""
    now = time.time()
    async with registry.redis.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.zcount(keys.workers(name), now, "+inf")
        counts = await pipe.execute()
    return dict(zip(names, counts, strict=True))


async def metrics(request: web.Request) -> web.Response:
    registry = request.app[REGISTRY_KEY]
    await registry.sync()
    names = [entry.name for entry in registry.entries()]
    request.app[SNAPSHOT].workers = await live_workers(registry, names)
    body = generate_latest(request.app[PROM])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def create_metrics_app(registry: ModelRegistry) -> web.Application:
    app = web.Application()
    snapshot = SnapshotCollector()
    prom = CollectorRegistry()
    prom.register(snapshot)
    app[REGISTRY_KEY], app[SNAPSHOT], app[PROM] = registry, snapshot, prom
    app.add_routes([web.get("/metrics", metrics)])
    return app
