"""The local scaler: starts and stops ``naiad worker`` processes per model, reaps them.

It blocks on :data:`naiad.keys.SCALER_WAKE` (a gateway pushes a model name there when a
request finds no live worker), so a cold start begins within one round trip; every
``scaler_tick_s`` it also reads each registered model's stream length and live workers and
applies the model's policy (:mod:`workers.scaling`: every missing worker started at once, one
stopped per ``scale_down_period_s`` at most, by SIGTERM, so it drains). Workers leave by
themselves after their idle timeout (scale to zero), never below the model's
``min_workers``. On Kubernetes KEDA takes this role; the worker code is the same.

Each worker it starts is placed on a device (:mod:`workers.placement`: the model's
``instance_group`` on this machine's GPUs, read through NVML): a GPU worker is a fresh process
with ``CUDA_VISIBLE_DEVICES`` naming its GPU (CUDA reads it once, at start: a warm-pool
process, its frameworks already imported, is never given a GPU); a CPU worker may be a
warm-pool process, and on a machine with GPUs sees none. Both learn their device from
``NAIAD_DEVICE`` (``Settings.device``). A ``KIND_GPU`` group on a machine without a usable GPU
runs on the CPU, with one warning per model.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import subprocess
import sys
import time
from dataclasses import replace

from redis.exceptions import RedisError

from naiad import ids, keys, procs, queue_policy, tasks, telemetry
from naiad.host import GpuDevice, GpuReader
from naiad.redis_client import connect
from naiad.registry import RegistryReader, RegistryView
from naiad.settings import Settings
from repository_store import ModelConfig, backend_of
from repository_store.ensemble import is_ensemble
from workers import load_failure, placement, scaling
from workers.start_failures import StartFailures, describe_exit, is_early_failure
from workers.warm_pool import WarmPool, pool_command

#: Seconds a worker this scaler started may go without any heartbeat of its model before it
#: counts as stuck and is killed (a worker heartbeats first thing, within a second).
START_TIMEOUT_S = 30.0

#: Wake-ups taken from the list in one go after the blocking pop (a burst of requests to a
#: model at zero pushes one each; one reconciliation answers them all).
WAKE_BATCH = 1000

logger = logging.getLogger(__name__)


class LocalScaler:
    """Worker processes on this machine, by model name."""

    def __init__(self, settings: Settings, redis_url: str):
        self.settings = settings
        self.redis_url = redis_url
        self.redis = connect(redis_url, longest_block_s=settings.scaler_tick_s)
        self.processes: dict[str, list[subprocess.Popen]] = {}
        self.draining: list[tuple[str, subprocess.Popen]] = []  # SIGTERMed, not yet reaped
        self._policies: dict[str, scaling.ScalingPolicy] = {}
        self._ensembles: set[str] = set()  # run by the gateways: never given workers
        self._streams: dict[str, list[str]] = {}  # model -> its request streams (priority levels)
        self._backends: dict[str, str] = {}  # model -> its backend (the warm pool it claims from)
        self.registry = RegistryReader(self.redis)
        self.registry_view = RegistryView(self.registry)  # every entry, re-read when it moved
        self._changed_at: dict[str, float] = {}  # monotonic time of the last start/stop
        self._started_at: dict[int, float] = {}  # pid -> monotonic time it was started
        self._live_seen: dict[str, float] = {}  # model -> monotonic time a worker was live
        self.gpu_reader = GpuReader()
        self._slots: dict[str, placement.Slots] = {}  # model -> its instances on this machine
        self._devices: dict[int, str] = {}  # pid -> the device its worker was placed on
        #: The workers started here, by process: (model, worker id) until its exit is seen.
        self._worker_ids: dict[subprocess.Popen, tuple[str, str]] = {}
        self._warned: set[tuple[str, str]] = set()  # (model, warning) already logged
        self.start_failures = StartFailures()  # workers that died before they could report
        self._to_mark: dict[str, str] = {}  # model -> reason, to mark UNAVAILABLE
        self.has_gpu = bool(self.gpus())
        self.pool = WarmPool(settings, pool_command(settings, self.log_flags()), redis_url,
                             env={**os.environ, **placement.worker_env(placement.CPU, self.has_gpu)})

    def worker_command(self, model: str) -> list[str]:
        """A worker's command line; never the Redis URL (it may hold a password): the
        worker reads it from an inherited pipe (:func:`naiad.procs.spawn_python`)."""
        return [
            sys.executable, "-m", "naiad_cli", "worker",
            "--model", model,
            "--model-repository", self.settings.model_repository,
            "--idle-timeout", str(self.settings.idle_timeout_s),
            "--min-workers", str(self.settings.min_workers),
            "--log-level", self.settings.log_level,
            "--cache-dir", str(self.settings.cache_dir),
            "--rate-limit", self.settings.rate_limit,
            *(f"--rate-limit-resource={value}" for value in self.settings.rate_limit_resource),
            *(["--rate-limit-host", self.settings.rate_limit_host] if self.settings.rate_limit_host else []),
            "--demote-spinning-threads", str(self.settings.demote_spinning_threads).lower(),
            "--python-on-loop", str(self.settings.python_on_loop).lower(),
            "--onnxruntime-spinning", str(self.settings.onnxruntime_spinning).lower(),
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
        self.pool.start()
        task = asyncio.current_task()
        try:
            # redis-py may swallow a cancellation that lands in a command (its BLPOP): stop
            # as soon as the task is being cancelled, whatever the command returned.
            while task is None or not task.cancelling():
                woken = await self._wait_for_wake()
                await self._reconcile(woken)
        finally:  # to its end, though cancel_and_wait cancels again every 50 ms meanwhile
            await tasks.finish(self._close())

    async def _close(self) -> None:
        """End the warm pool's idle processes, then stop every worker (they drain), then
        close the Redis client."""
        await self.pool.close()
        await asyncio.to_thread(self.stop_all)
        await self.redis.aclose()

    async def _wait_for_wake(self) -> set[str]:
        try:
            item = await self.redis.blpop([keys.SCALER_WAKE], timeout=self.settings.scaler_tick_s)
        except RedisError as exc:
            logger.warning("scaler cannot reach redis: %s", exc)
            await asyncio.sleep(self.settings.scaler_tick_s)
            return set()
        if not item:
            return set()
        try:
            more = await self.redis.lpop(keys.SCALER_WAKE, WAKE_BATCH) or []
        except RedisError:
            more = []
        return {item[1].decode(), *(name.decode() for name in more)}

    def _alive(self, model: str) -> int:
        running = [p for p in self.processes.get(model, []) if p.poll() is None]
        for gone in set(self.processes.get(model, [])) - set(running):
            ready = procs.became_ready(gone)
            if gone.returncode not in (0, 2):  # 2: it could not load the model, and said why
                logger.warning("worker pid %d of model '%s' exited unexpectedly (%s%s); its claimed "
                               "requests will be reclaimed", gone.pid, model, describe_exit(gone.returncode),
                               "" if ready else ", before it could serve")  # fmt: skip
            self._count_start(model, gone.returncode, ready)
            self._started_at.pop(gone.pid, None)
            self._devices.pop(gone.pid, None)
        self.processes[model] = running
        return len(running)

    async def _forget_exited(self) -> None:
        """Remove the heartbeats of the workers started here whose processes exited. One
        that exits cleanly has removed its own; a killed or crashed one's counts as a live
        worker until it expires (3 heartbeat periods), which would hold back its replacement
        and the reclaim of the requests it claimed (:mod:`workers.reclaim`) that long. Raises
        RedisError (the next pass tries again)."""
        gone: dict[str, list[subprocess.Popen]] = {}
        for process, (model, _) in self._worker_ids.items():
            if process.poll() is not None:
                gone.setdefault(model, []).append(process)
        for model, processes in gone.items():
            await self.redis.zrem(keys.workers(model), *(self._worker_ids[p][1] for p in processes))
            for process in processes:
                del self._worker_ids[process]

    def _count_start(self, model: str, returncode: int, ready: bool | None) -> None:
        if ready:
            self.start_failures.succeeded(model)
        elif is_early_failure(returncode, ready):
            if self.start_failures.failed(model, time.monotonic()):
                self._to_mark[model] = self.start_failures.reason(model, returncode)

    async def _mark_failed_starts(self) -> None:
        """Mark UNAVAILABLE the models whose workers died before reporting, twice in a row
        (:mod:`workers.start_failures`), against the READY entry the registry holds now."""
        for model, reason in list(self._to_mark.items()):
            try:
                entry, raw = await self.registry.read(model)
                ready = entry is not None and entry.ready
                if ready and await load_failure.mark_unavailable(self.redis, raw, reason):
                    logger.error("model '%s' marked UNAVAILABLE: %s", model, reason)
                self.registry_view.invalidate()  # re-read the policies: no minimum now
            except (RedisError, ValueError) as exc:
                logger.warning("model '%s' not marked UNAVAILABLE yet: %s", model, exc)
                continue
            self.start_failures.marked(model)
            del self._to_mark[model]

    async def _reconcile(self, woken: set[str]) -> None:
        try:
            await self._forget_exited()
            await self._refresh_policies()
            names = sorted((set(self._policies) | woken) - self._ensembles)
            now = time.time()
            async with self.redis.pipeline(transaction=False) as pipe:
                for name in names:
                    for stream in self._streams.get(name) or [keys.request_stream(name)]:
                        pipe.xlen(stream)
                    pipe.zcount(keys.workers(name), now, "+inf")
                replies = iter(await pipe.execute())
            counts = []  # per model: its demand (over its levels' streams), its live workers
            for name in names:
                counts += [sum(next(replies) for _ in self._streams.get(name) or [name]), next(replies)]
        except RedisError as exc:
            logger.warning("scaler cannot reach redis: %s", exc)
            return
        self._reap()
        started: list[str] = []
        stopped: list[str] = []
        for index, name in enumerate(names):
            demand, live = counts[2 * index], counts[2 * index + 1]
            decision = self._decide(name, demand, live)
            may_start = self.start_failures.may_start(name, time.monotonic())
            for _ in range(decision.start if may_start else 0):
                if self.start_worker(name) is None:
                    break  # every GPU slot of the model is taken
                started.append(name)
            for process in scaling.to_stop(self.processes.get(name, []), decision.stop):
                self.stop_worker(name, process)
                stopped.append(name)
            if decision.start or decision.stop:
                self._changed_at[name] = time.monotonic()
        await self._record_decisions(started, "start")
        await self._record_decisions(stopped, "stop")
        if self._to_mark:
            await self._mark_failed_starts()

    def _decide(self, name: str, demand: int, live: int) -> scaling.Decision:
        """The policy's decision; workers this scaler already told to stop still heartbeat
        while they drain, and count as neither live nor starting."""
        live = max(0, live - sum(1 for model, _ in self.draining if model == name))
        if live:
            self._live_seen[name] = time.monotonic()
        else:
            self._kill_stuck(name)
        local = self._alive(name)
        load = scaling.ModelLoad(demand, live, starting=max(0, local - live))
        since = time.monotonic() - self._changed_at.get(name, -math.inf)
        return scaling.decide(self.policy(name), load, since, self.settings.scale_down_period_s)

    def _kill_stuck(self, name: str) -> None:
        """SIGKILL this model's workers that never heartbeat within :data:`START_TIMEOUT_S`
        (hung before they could serve): left alone they would count as starting forever and
        block every new start. Their claimed requests, if any, are reclaimed."""
        now = time.monotonic()
        for process in list(self.processes.get(name, [])):
            since = max(self._started_at.get(process.pid, now), self._live_seen.get(name, -math.inf))
            if process.poll() is None and now - since > START_TIMEOUT_S:
                logger.warning("worker pid %d of '%s' never became live: killing it", process.pid, name)
                with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                    process.kill()
                    process.wait(1)
                self.processes[name].remove(process)
                self._started_at.pop(process.pid, None)

    def policy(self, name: str) -> scaling.ScalingPolicy:
        """The policy of model ``name`` as of the last registry read (server defaults, no
        minimum, for a model the registry does not know)."""
        default = self._policies.get(name)
        if default is None:
            return replace(scaling.default_policy(self.settings), min_workers=0)
        return default

    async def _refresh_policies(self) -> None:
        """Re-read the registry (one HGETALL) when its generation moved since the last tick."""
        if not await self.registry_view.refresh() and self._policies:
            return
        gpus, slots = self.gpus(), {}
        policies, ensembles = {}, set()
        for entry in self.registry_view.entries.values():
            if is_ensemble(entry.config):  # its steps run on their own models' workers
                ensembles.add(entry.name)
                continue
            slots[entry.name] = self._instance_slots(entry.name, entry.config, gpus)
            if entry.config is not None:  # demand: summed over its priority levels' streams
                self._streams[entry.name] = queue_policy.streams(entry.name, entry.config)
                self._backends[entry.name] = backend_of(entry.config)
            policy = scaling.policy_for(entry.config, self.settings, slots[entry.name].total)
            # a model that cannot be served gets workers only to answer its backlog
            policies[entry.name] = policy if entry.ready else replace(policy, min_workers=0)
        self._policies, self._ensembles = policies, ensembles
        self._slots = slots

    def gpus(self) -> list[GpuDevice]:
        """The GPUs this scaler's workers may use, with their free memory now."""
        return placement.visible_gpus(self.gpu_reader.devices(), os.environ.get("CUDA_VISIBLE_DEVICES"))

    def _instance_slots(
        self, name: str, config: ModelConfig | None, gpus: list[GpuDevice]
    ) -> placement.Slots:
        """The model's instances on this machine; a GPU group that falls back to the CPU (or
        loses a GPU) is logged once per model and warning."""
        slots = placement.instance_slots(config, gpus)
        if slots.warning and (name, slots.warning) not in self._warned:
            self._warned.add((name, slots.warning))
            why = f" ({self.gpu_reader.problem})" if not gpus and self.gpu_reader.problem else ""
            logger.warning("model '%s': %s%s", name, slots.warning, why)
        return slots

    def _place(self, model: str) -> str | None:
        """The device of the model's next worker here, None when its GPU slots are full."""
        slots = self._slots.get(model) or placement.instance_slots(None, self.gpus())
        gpus = self.gpus() if any(d != placement.CPU for d in slots.capacity) else []
        placed: dict[str, int] = {}
        for process in self.processes.get(model, []):
            device = self._devices.get(process.pid, placement.CPU)
            placed[device] = placed.get(device, 0) + 1
        return placement.choose(slots, gpus, placed)

    def _reap(self) -> None:
        for _, process in self.draining:
            if process.poll() is not None:
                procs.became_ready(process)  # closes its readiness pipe
        self.draining = [(model, p) for model, p in self.draining if p.poll() is None]

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

    def start_worker(self, model: str) -> subprocess.Popen | None:
        """Start one worker of ``model`` on the device :mod:`workers.placement` picks (a
        warm-pool process for the CPU if one is idle); None when every GPU slot of the
        model is taken, so none can start here."""
        device = self._place(model)
        if device is None:
            logger.debug("model '%s': every GPU slot is taken, no worker started", model)
            return None
        command, worker_id = self.worker_command(model), ids.worker_id(model)
        process = None
        if device == placement.CPU:
            process = self.pool.claim(command, self._backends.get(model), worker_id)
        if process is None:
            env = {**os.environ, **placement.worker_env(device, self.has_gpu), "NAIAD_WORKER_ID": worker_id}
            process = procs.spawn_python(command, redis_url=self.redis_url, env=env)
        self.processes.setdefault(model, []).append(process)
        self._worker_ids[process] = (model, worker_id)
        self._started_at[process.pid] = time.monotonic()
        self._devices[process.pid] = device
        logger.info("started worker pid %d for model '%s' on %s (id %s)",
                    process.pid, model, device, worker_id)  # fmt: skip
        return process

    def stop_worker(self, model: str, process: subprocess.Popen) -> None:
        """SIGTERM one worker (it stops claiming, finishes what it claimed, exits); it is
        reaped later, without waiting here."""
        self.processes[model].remove(process)
        with contextlib.suppress(OSError):
            process.terminate()
        self.draining.append((model, process))
        logger.info("stopping worker pid %d of model '%s' (scale down)", process.pid, model)

    def stop_all(self) -> None:
        """SIGTERM every worker at once (each drains), then wait for all of them, together at
        most :func:`naiad.procs.stop_all`'s bound (SIGKILL after it)."""
        everyone = [p for model in list(self.processes) for p in self.processes.pop(model)]
        everyone += [process for _, process in self.draining]
        self.draining = []
        procs.stop_all(everyone)
