"""The local scaler: starts ``naiad worker`` processes for models with a backlog, reaps them.

It blocks on :data:`naiad.keys.SCALER_WAKE` (a gateway pushes a model name there when a
request finds no live worker), so a cold start begins within one round trip; every
``scaler_tick_s`` it also checks each registered model's stream length, which catches
requests that raced a worker's idle exit. Workers leave by themselves after their idle
timeout (scale to zero). On Kubernetes KEDA takes this role; the worker code is the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import sys
import time

from redis.exceptions import RedisError

from naiad import keys, procs, telemetry
from naiad.redis_client import connect
from naiad.settings import Settings

logger = logging.getLogger(__name__)


class LocalScaler:
    """Worker processes on this machine, by model name."""

    def __init__(self, settings: Settings, redis_url: str):
        self.settings = settings
        self.redis_url = redis_url
        self.redis = connect(redis_url, longest_block_s=settings.scaler_tick_s)
        self.processes: dict[str, list[subprocess.Popen]] = {}

    def worker_command(self, model: str) -> list[str]:
        return [
            sys.executable, "-m", "naiad.cli", "worker",
            "--model", model,
            "--model-repository", self.settings.model_repository,
            "--redis-url", self.redis_url,
            "--idle-timeout", str(self.settings.idle_timeout_s),
            "--log-level", self.settings.log_level,
            "--cache-dir", str(self.settings.cache_dir),
            *self.log_flags(),
        ]  # fmt: skip

    def log_flags(self) -> list[str]:
        """The logging and tracing flags of this process, so its workers log alike."""
        s = self.settings
        flags = [
            "--log-format", s.log_format, "--log-verbose", str(s.log_verbose),
            "--log-info", str(s.log_info).lower(), "--log-warning", str(s.log_warning).lower(),
            "--log-error", str(s.log_error).lower(),
        ]  # fmt: skip
        return [*flags, "--trace"] if s.trace else flags

    async def run(self) -> None:
        """Scale until cancelled; then stop every worker it started (SIGTERM, drain)."""
        try:
            while True:
                woken = await self._wait_for_wake()
                await self._reconcile(woken)
        finally:
            await asyncio.to_thread(self.stop_all)
            await self.redis.aclose()

    async def _wait_for_wake(self) -> set[str]:
        try:
            item = await self.redis.blpop([keys.SCALER_WAKE], timeout=self.settings.scaler_tick_s)
        except RedisError as exc:
            logger.warning("scaler cannot reach redis: %s", exc)
            await asyncio.sleep(self.settings.scaler_tick_s)
            return set()
        return {item[1].decode()} if item else set()

    def _alive(self, model: str) -> int:
        running = [p for p in self.processes.get(model, []) if p.poll() is None]
        self.processes[model] = running
        return len(running)

    async def _reconcile(self, woken: set[str]) -> None:
        try:
            names = sorted({n.decode() for n in await self.redis.hkeys(keys.REGISTRY)} | woken)
            now = time.time()
            async with self.redis.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.xlen(keys.request_stream(name))
                    pipe.zcount(keys.workers(name), now, "+inf")
                counts = await pipe.execute()
        except RedisError as exc:
            logger.warning("scaler cannot reach redis: %s", exc)
            return
        started = []
        for index, name in enumerate(names):
            backlog, live = counts[2 * index], counts[2 * index + 1]
            if backlog > 0 and live == 0 and self._alive(name) == 0:
                self.start_worker(name)
                started.append(name)
        await self._record_decisions(started, "start")

    async def _record_decisions(self, models: list[str], action: str) -> None:
        if not models:
            return
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for model in models:
                    telemetry.add_scaler_decision(pipe, model, action)
                await pipe.execute()
        except RedisError as exc:
            logger.warning("scaler decisions not recorded: %s", exc)

    def start_worker(self, model: str) -> subprocess.Popen:
        process = procs.spawn(self.worker_command(model))
        self.processes.setdefault(model, []).append(process)
        logger.info("started worker pid %d for model '%s'", process.pid, model)
        return process

    def stop_all(self) -> None:
        """SIGTERM every worker at once (each drains), then wait for all of them."""
        everyone = [p for model in list(self.processes) for p in self.processes.pop(model)]
        for process in everyone:
            with contextlib.suppress(OSError):
                process.terminate()
        for process in everyone:
            with contextlib.suppress(OSError):
                procs.stop(process)
