"""A worker's cold start: where its seconds went, recorded before its first request.

A cold start runs from its *origin* (the process's creation for a bare worker, the claim for
a warm-pool process, :mod:`workers.warm_pool`) to the worker being ready to read its queue:
``naiad_cold_start_seconds`` (:mod:`naiad.telemetry`) and one ``ready`` log record whose
``cold_start`` field splits it into :func:`cold_start_phases` (``bench/cold_start.py`` reads it).
"""

from __future__ import annotations

import logging
import os
import time

import psutil
from redis.asyncio import Redis
from redis.exceptions import RedisError

from naiad import telemetry
from workers.loader import VersionLoad
from workers.replies import ReplySender

logger = logging.getLogger(__name__)


async def record(
    redis: Redis, model: str, origin: float, warm_pool: bool, marks: dict[str, float],
    loads: list[VersionLoad], replies: ReplySender,
) -> None:  # fmt: skip
    """Record the cold start of ``model`` that began at ``origin`` (epoch s) and ends now,
    with what it pulled and loaded (``loads``), and log its phases (``marks``: phase name →
    epoch s at its end). A Redis failure is logged, never raised."""
    ready = time.time()
    try:
        async with redis.pipeline(transaction=False) as pipe:
            telemetry.add_cold_start(pipe, model, ready - origin, warm_pool=warm_pool)
            replies.add_downloads(pipe, loads)
            await pipe.execute()
    except RedisError as exc:
        logger.warning("cold start of model '%s' not recorded: %s", model, exc)
    phases = cold_start_phases(origin, marks, loads, ready)
    logger.info(
        "model '%s' ready %.3f s after the %s (%s)", model, ready - origin,
        "claim" if warm_pool else "process started", ", ".join(f"{k} {v:.3f} s" for k, v in phases.items()),
        extra={"cold_start": {"seconds": ready - origin, "warm_pool": warm_pool, "origin": origin, **phases}},
    )  # fmt: skip


def process_started_at() -> float:
    """Epoch seconds when this process was created, to the kernel's clock tick (10 ms): its
    age from ``/proc/self/stat`` against ``CLOCK_BOOTTIME``. (psutil's ``create_time`` adds
    the boot time, which Linux gives in whole seconds: up to 1 s off.)"""
    try:
        with open("/proc/self/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        started_s = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - started_s)
    except (OSError, ValueError, IndexError, AttributeError):  # not Linux
        return psutil.Process().create_time()


def cold_start_phases(
    origin: float, marks: dict[str, float], loads: list[VersionLoad], ready: float
) -> dict[str, float]:
    """Where a cold start's seconds went: ``start`` (origin → the worker runs: for a bare
    process the interpreter, imports and settings; for a warm-pool process the claim reaching
    it), ``registry`` (consumer group, heartbeat and registry entry: the first Redis round
    trips), ``open`` (opening the repository and the rest of the loader's work), ``pull``
    (local cache check, download when missing), ``load`` (the backend's load) and ``warmup``
    (the config's ``model_warmup`` samples, run before the first request is read)."""
    run, registry = marks.get("start", origin), marks.get("registry", origin)
    pull, load = sum(x.pull_s for x in loads), sum(x.load_s for x in loads)
    warmup = sum(x.warmup_s for x in loads)
    return {"start": run - origin, "registry": registry - run,
            "open": max(0.0, ready - registry - pull - load - warmup), "pull": pull, "load": load,
            "warmup": warmup}  # fmt: skip
