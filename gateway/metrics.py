"""Prometheus metrics endpoint of the gateway (the ``--metrics-port``), in Triton's names.

Everything per model is read at scrape time from Redis (:func:`naiad.telemetry.snapshot`,
one pipeline for all models), so every gateway's scrape tells the same truth, aggregated
over all gateways and workers. Per model and version (labels ``model``, ``version``), as
Triton exports them: the counters ``nv_inference_request_success``,
``nv_inference_request_failure`` (also ``reason``: REJECTED, CANCELED, BACKEND, OTHER),
``nv_inference_count``, ``nv_inference_exec_count``, and the cumulative microseconds
``nv_inference_request_duration_us`` (successful requests), ``nv_inference_queue_duration_us``,
``nv_inference_compute_{input,infer,output}_duration_us``, the response cache's
``nv_cache_num_{hits,misses}_per_model`` and ``nv_cache_{hit,miss}_duration_per_model``
(microseconds); the gauge
``nv_inference_pending_request_count`` (entries in the model's stream, unanswered: one stream
serves every version, so it is reported under the newest). Of this machine: ``nv_gpu_*``
(label ``gpu_uuid``; only where NVML finds a GPU) and ``nv_cpu_*``. Naiad's own, per model:
``naiad_model_workers``, ``naiad_queue_depth`` (the same reading as the pending count),
``naiad_cold_starts_total``, ``naiad_cold_start_seconds`` (histogram),
``naiad_warm_pool_claims_total``, ``naiad_model_download_bytes_total``,
``naiad_model_download_seconds_total``, ``naiad_model_loads_total``,
``naiad_model_load_seconds_total``, ``naiad_model_load_failures_total``,
``naiad_scaler_decisions_total`` (label ``action``), ``naiad_rollbacks_total`` (label
``version``) and ``naiad_shadow_requests_total`` (labels ``version``, ``outcome``); of the
gateway: ``naiad_redis_up`` (0 when this scrape could not read Redis: then only it and the
machine's gauges are there, with status 200).

prometheus_client's exposition names a counter's HELP/TYPE lines ``<name>_total``; Triton's
counters carry no such suffix, so :func:`render` writes a counter's lines under the name its
samples have. Build counters with :func:`counter` (samples named as the family).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from redis.exceptions import RedisError

from gateway.access import AccessPolicy
from gateway.registry import ModelRegistry
from naiad import queue_policy, stats, telemetry
from naiad.host import CpuReading, GpuReader, GpuReading, read_cpu

logger = logging.getLogger(__name__)

REGISTRY_KEY = web.AppKey("registry", ModelRegistry)

#: Triton's per-version counters: name -> (help, how to read it from a ``$model_stat``).
TRITON_COUNTERS: dict[str, tuple[str, Callable[[dict], float]]] = {
    "nv_inference_request_success": (
        "Number of successful inference requests, all batch sizes",
        lambda s: s["inference_stats"]["success"]["count"],
    ),
    "nv_inference_count": (
        "Number of inferences performed (does not include cached requests)",
        lambda s: s["inference_count"],
    ),
    "nv_inference_exec_count": (
        "Number of model executions performed (does not include cached requests)",
        lambda s: s["execution_count"],
    ),
    "nv_inference_request_duration_us": (
        "Cumulative inference request duration in microseconds (includes cached requests)",
        lambda s: s["inference_stats"]["success"]["ns"] // 1000,
    ),
    "nv_inference_queue_duration_us": (
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
        lambda s: s["inference_stats"]["queue"]["ns"] // 1000,
    ),
    "nv_inference_compute_input_duration_us": (
        "Cumulative compute input duration in microseconds (does not include cached requests)",
        lambda s: s["inference_stats"]["compute_input"]["ns"] // 1000,
    ),
    "nv_inference_compute_infer_duration_us": (
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
        lambda s: s["inference_stats"]["compute_infer"]["ns"] // 1000,
    ),
    "nv_inference_compute_output_duration_us": (
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
        lambda s: s["inference_stats"]["compute_output"]["ns"] // 1000,
    ),
    # The response cache (gateway/response_cache.py; 0 for a model without response_cache).
    "nv_cache_num_hits_per_model": (
        "Number of cache hits per model",
        lambda s: s["inference_stats"]["cache_hit"]["count"],
    ),
    "nv_cache_num_misses_per_model": (
        "Number of cache misses per model",
        lambda s: s["inference_stats"]["cache_miss"]["count"],
    ),
    "nv_cache_hit_duration_per_model": (
        "Total cache hit duration per model, in microseconds",
        lambda s: s["inference_stats"]["cache_hit"]["ns"] // 1000,
    ),
    "nv_cache_miss_duration_per_model": (
        "Total cache miss (lookup and insertion) duration per model, in microseconds",
        lambda s: s["inference_stats"]["cache_miss"]["ns"] // 1000,
    ),
}

#: This machine's GPU gauges (label ``gpu_uuid``): name -> (help, field of GpuReading).
GPU_GAUGES = {
    "nv_gpu_utilization": ("GPU utilization rate [0.0 - 1.0)", "utilization"),
    "nv_gpu_memory_total_bytes": ("GPU total memory, in bytes", "memory_total_bytes"),
    "nv_gpu_memory_used_bytes": ("GPU used memory, in bytes", "memory_used_bytes"),
    "nv_gpu_power_usage": ("GPU power usage in watts", "power_w"),
}

#: This machine's CPU gauges (no labels): name -> (help, field of CpuReading).
CPU_GAUGES = {
    "nv_cpu_utilization": ("CPU utilization rate [0.0 - 1.0]", "utilization"),
    "nv_cpu_memory_total_bytes": ("CPU total memory (RAM), in bytes", "memory_total_bytes"),
    "nv_cpu_memory_used_bytes": ("CPU used memory (RAM), in bytes", "memory_used_bytes"),
}


def counter(name: str, documentation: str) -> Metric:
    """An empty counter family whose samples are named ``name`` (add them with
    ``add_sample(name, labels, value)``): exposed exactly as Triton names its counters."""
    return Metric(name, documentation, "counter")


def _version_families(models: list[telemetry.ModelTelemetry]) -> Iterable[Metric]:
    for name, (documentation, read) in TRITON_COUNTERS.items():
        family = counter(name, documentation)
        for model in models:
            for stat in model.stats:
                family.add_sample(name, {"model": model.name, "version": stat["version"]}, read(stat))
        yield family
        if name == "nv_inference_request_success":
            yield _failures(models)
    pending = GaugeMetricFamily(
        "nv_inference_pending_request_count",
        "Instantaneous number of pending requests awaiting execution per-model.",
        labels=["model", "version"],
    )
    for model in models:
        if model.stats:  # one stream for all versions: reported under the newest
            pending.add_metric([model.name, model.stats[-1]["version"]], model.queue_depth)
    yield pending


def _failures(models: list[telemetry.ModelTelemetry]) -> Metric:
    name = "nv_inference_request_failure"
    family = counter(name, "Number of failed inference requests, all batch sizes")
    for model in models:
        for version, reasons in model.failures.items():
            for reason in stats.FAILURE_REASONS:
                labels = {"model": model.name, "version": str(version), "reason": reason}
                family.add_sample(name, labels, reasons[reason])
    return family


def _naiad_families(models: list[telemetry.ModelTelemetry]) -> Iterable[Metric]:
    gauges = {
        "naiad_model_workers": ("Worker processes serving the model now (0 when scaled to zero).",
                                "workers"),
        "naiad_queue_depth": ("Requests in the model's queue not yet answered (queued or running).",
                              "queue_depth"),
    }  # fmt: skip
    for name, (documentation, attribute) in gauges.items():
        gauge = GaugeMetricFamily(name, documentation, labels=["model"])
        for model in models:
            gauge.add_metric([model.name], getattr(model, attribute))
        yield gauge
    counters = {
        "naiad_cold_starts_total": ("Workers started for the model that became ready.",
                                    lambda m: m.cold_starts.count),
        "naiad_warm_pool_claims_total": ("Cold starts of the model served by a warm-pool process.",
                                         lambda m: m.warm_pool_claims),
        "naiad_model_download_bytes_total": ("Bytes of model versions pulled from the repository.",
                                             lambda m: m.download_bytes),
        "naiad_model_download_seconds_total": ("Seconds spent pulling model versions from the repository.",
                                               lambda m: m.download_seconds),
        "naiad_model_loads_total": ("Model versions loaded into a backend by the model's workers.",
                                    lambda m: m.loads),
        "naiad_model_load_seconds_total": ("Seconds spent loading model versions into a backend, "
                                           "after the pull.", lambda m: m.load_seconds),
        "naiad_model_load_failures_total": ("Changes of the model (poll, explicit load, worker load) that "
                                            "failed to index or load; what served before keeps serving.",
                                            lambda m: m.load_failures),
    }  # fmt: skip
    for name, (documentation, read) in counters.items():
        family = counter(name, documentation)
        for model in models:
            family.add_sample(name, {"model": model.name}, read(model))
        yield family
    histograms = {
        "naiad_cold_start_seconds": ("Worker process start (warm pool: its claim) to ready to read its "
                                     "queue, seconds.",
                                     lambda m: m.cold_starts),
        "naiad_request_duration_seconds": ("Successful requests, arrival to answer at the gateway, seconds.",
                                           lambda m: m.request_durations),
    }  # fmt: skip
    for name, (documentation, read) in histograms.items():
        family = HistogramMetricFamily(name, documentation, labels=["model"])
        for model in models:
            observed = read(model)
            buckets = [("+Inf" if b == float("inf") else format(b, "g"), n) for b, n in observed.buckets]
            family.add_metric([model.name], buckets, observed.sum)
        yield family
    rollbacks = counter("naiad_rollbacks_total",
                        "Automatic rollbacks of a canary version (naiad.rollback_error_rate).")
    shadows = counter("naiad_shadow_requests_total",
                      "Shadow copies sent to a version (naiad.shadow_version), by outcome.")
    for model in models:
        for version, count in sorted(model.rollbacks.items()):
            rollbacks.add_sample(rollbacks.name, {"model": model.name, "version": str(version)}, count)
        for (version, outcome), count in sorted(model.shadows.items()):
            labels = {"model": model.name, "version": str(version), "outcome": outcome}
            shadows.add_sample(shadows.name, labels, count)
    yield rollbacks
    yield shadows
    decisions = counter("naiad_scaler_decisions_total", "Decisions of the local scaler, by action.")
    for model in models:
        for action, count in model.scaler_decisions.items():
            decisions.add_sample(decisions.name, {"model": model.name, "action": action}, count)
    yield decisions


def host_families(gpus: list[GpuReading], cpu: CpuReading) -> Iterable[Metric]:
    """Triton's GPU gauges (none without a GPU) and CPU gauges of this machine."""
    if gpus:
        for name, (documentation, attribute) in GPU_GAUGES.items():
            gauge = GaugeMetricFamily(name, documentation, labels=["gpu_uuid"])
            for gpu in gpus:
                gauge.add_metric([gpu.uuid], getattr(gpu, attribute))
            yield gauge
    for name, (documentation, attribute) in CPU_GAUGES.items():
        yield GaugeMetricFamily(name, documentation, value=getattr(cpu, attribute))


class SnapshotCollector(Collector):
    """Exposes what :func:`metrics` read from Redis just before the scrape, and this
    machine's GPU and CPU read now (``read_gpus`` and ``read_cpu`` are injectable)."""

    def __init__(
        self,
        read_gpus: Callable[[], list[GpuReading]] | None = None,
        read_cpu: Callable[[], CpuReading] = read_cpu,
    ) -> None:
        self.models: list[telemetry.ModelTelemetry] = []
        self.redis_up = True
        self.read_gpus = read_gpus or GpuReader()
        self.read_cpu = read_cpu

    def collect(self) -> Iterable[Metric]:
        yield from _version_families(self.models)
        yield from _naiad_families(self.models)
        yield from host_families(self.read_gpus(), self.read_cpu())
        yield GaugeMetricFamily("naiad_redis_up", "1 when the last scrape could read Redis, else 0",
                                value=1 if self.redis_up else 0)


SNAPSHOT = web.AppKey("snapshot", SnapshotCollector)
PROM = web.AppKey("prometheus", CollectorRegistry)
#: Awaited before each scrape: :meth:`naiad.stats_writer.StatsWriter.flush` of the gateway's statistics.
FLUSH = web.AppKey("flush", Callable[[], Awaitable[None]])


class _One(Collector):
    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> Iterable[Metric]:
        yield self.metric


def render(registry: CollectorRegistry) -> bytes:
    """The Prometheus text format of ``registry``, a counter whose samples are all named as
    the family (Triton's style) under that name; everything else as prometheus_client writes it."""
    parts = []
    for metric in registry.collect():
        if metric.type == "counter" and all(s.name == metric.name for s in metric.samples):
            as_gauge = Metric(metric.name, metric.documentation, "gauge")
            as_gauge.samples = metric.samples
            typed = f"# TYPE {metric.name} gauge\n".encode(), f"# TYPE {metric.name} counter\n".encode()
            parts.append(generate_latest(_One(as_gauge)).replace(*typed))
        else:
            parts.append(generate_latest(_One(metric)))
    return b"".join(parts)


async def _read_models(
    registry: ModelRegistry, flush: Callable[[], Awaitable[None]]
) -> list[telemetry.ModelTelemetry]:
    await flush()
    await registry.sync()
    entries = registry.entries()
    models = [(entry.name, sorted(entry.versions)) for entry in entries]
    levels = {e.name: queue_policy.priority_levels(e.config) for e in entries if e.config is not None}
    return await telemetry.snapshot(registry.redis, models, levels)


async def _nothing() -> None:
    return None


async def metrics(request: web.Request) -> web.Response:
    """The scrape. Redis unreachable: still 200, with this machine's gauges and
    ``naiad_redis_up 0`` instead of the per-model series (read from Redis), and a warning."""
    snapshot = request.app[SNAPSHOT]
    try:
        snapshot.models = await _read_models(request.app[REGISTRY_KEY], request.app[FLUSH])
        snapshot.redis_up = True
    except (RedisError, OSError) as exc:
        logger.warning("metrics without per-model series: redis unreachable (%s)", exc)
        snapshot.models, snapshot.redis_up = [], False
    body = render(request.app[PROM])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def create_metrics_app(
    registry: ModelRegistry,
    access: AccessPolicy | None = None,
    flush: Callable[[], Awaitable[None]] | None = None,
) -> web.Application:
    """The metrics port's app; ``access`` restricts ``/metrics`` (API group ``metrics``),
    a refusal being a JSON 401 as on the HTTP port; ``flush``: awaited before each scrape
    (the gateway's pending statistics writes)."""
    from gateway.http import access_middleware, error_middleware  # noqa: PLC0415

    middlewares = [error_middleware, access_middleware(access)] if access else []
    app = web.Application(middlewares=middlewares)
    snapshot = SnapshotCollector()
    prom = CollectorRegistry()
    prom.register(snapshot)
    app[REGISTRY_KEY], app[SNAPSHOT], app[PROM] = registry, snapshot, prom
    app[FLUSH] = flush or _nothing
    app.add_routes([web.get("/metrics", metrics)])
    return app
