"""The warm pool: generic worker processes started ahead of need, each claimed by one model.

A pool process is ``naiad worker --pool``: it starts the interpreter, imports what a worker
runs (numpy, redis, and one backend with its framework, warmed up once:
:func:`workers.backends.prepare`), connects to Redis and opens the repository, then blocks
reading one line from its stdin. Until then it has no heartbeat, so it is a worker of no
model (``naiad_model_workers`` stays 0).

The pool keeps one group of processes per backend named in ``warm_pool_backends`` (default
ONNX Runtime alone), ``warm_pool_size`` in each: a model at zero claims a process of its own
backend (a TorchScript model one that imported torch, so its cold start is the model's load),
else one of the default (first-listed) pool, which imports the framework after the claim
(still no interpreter start); never a process of another framework's pool.
Idle memory per process (RSS, 2-core CPU machine, docs/benchmarks.md): ONNX Runtime 125 MiB,
PyTorch 274 MiB, TensorFlow 628 MiB, the Python backend alone 89 MiB; hence only ONNX Runtime
by default.

The scaler claims it (:meth:`WarmPool.claim`) by writing one JSON line — the ``naiad worker
--model M ...`` command line it would otherwise have started, and the time of the claim —
and closing the pipe. The process then runs exactly that worker (:class:`workers.worker.Worker`
with the command's settings, so batching, idle exit, reclaim, statistics and any per-model
flag are those of a bare worker), retitled ``naiad worker --model M ...`` (``setproctitle``)
so that ``ps`` tells which model it serves, and its cold start is measured from the claim, so
``naiad_cold_start_seconds`` shows what the request waited for: the model's pull and load.

A pool process that reads the end of its stdin before a claim (the scaler closed the pipe)
exits 0; SIGTERM ends it at once; ``PR_SET_PDEATHSIG`` (:mod:`naiad.procs`) when the scaler
dies. Claimed, it is an ordinary worker of the scaler (stopped with the others).

:class:`WarmPool` lives in the scaler: it keeps ``warm_pool_size`` processes idle, refills
:data:`REFILL_DELAY_S` after a claim (so the refill's imports do not compete with the claimed
worker's load for the CPU), and with ``warm_pool_idle_timeout_s`` shrinks to zero after that
long without a cold start; the next cold start (then a bare process) refills it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from redis.exceptions import RedisError

from naiad import logs, procs, tasks
from naiad.redis_client import connect
from naiad.settings import Settings
from repository_store import RepositoryStore, open_store

logger = logging.getLogger(__name__)

#: Seconds after a claim before the pool starts its replacement.
REFILL_DELAY_S = 1.0
#: Seconds between the pool's checks that its idle processes are alive.
CHECK_S = 5.0
#: The variable that tells a pool process which backend to prepare (``Settings.warm_pool_backends``).
BACKENDS_ENV = "NAIAD_WARM_POOL_BACKENDS"


def pool_command(settings: Settings, log_flags: Sequence[str]) -> list[str]:
    """The command line of one pool process (what it prepares: its repository; its Redis
    URL comes through an inherited pipe, see :func:`naiad.procs.spawn_python`)."""
    return [
        sys.executable, "-m", "naiad_cli", "worker", "--pool",
        "--model-repository", settings.model_repository,
        "--cache-dir", str(settings.cache_dir),
        "--log-level", settings.log_level,
        *log_flags,
    ]  # fmt: skip


class WarmPool:
    """Idle pool processes of one scaler, ``warm_pool_size`` per backend of
    ``warm_pool_backends``; ``start()`` in its event loop, ``close()`` at the end. ``env``:
    their environment (the scaler's CPU placement: pool processes serve CPU workers only, see
    :mod:`workers.placement`); None: this process's."""

    def __init__(
        self, settings: Settings, command: Sequence[str], redis_url: str,
        env: Mapping[str, str] | None = None,
    ):  # fmt: skip
        self.size = settings.warm_pool_size
        self.backends = list(dict.fromkeys(settings.warm_pool_backends)) or ["onnxruntime"]
        self.redis_url = redis_url
        self.idle_timeout_s = settings.warm_pool_idle_timeout_s
        self.command = list(command)
        self.env = dict(os.environ if env is None else env)
        self.idle: dict[str, list[subprocess.Popen]] = {backend: [] for backend in self.backends}
        self._last_cold_start = time.monotonic()
        self._refill_at = 0.0
        self._changed = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Fill the pool and keep it filled, in a task of the running loop (none if size 0)."""
        if self.size > 0 and self._task is None:
            self._task = asyncio.create_task(self._keep())

    async def close(self) -> None:
        """Stop keeping the pool and end its idle processes."""
        if self._task is not None:
            await tasks.cancel_and_wait(self._task)
            self._task = None
        await asyncio.to_thread(_stop, self._take_all())

    def idle_processes(self) -> list[subprocess.Popen]:
        """Every idle pool process, of every backend."""
        return [process for group in self.idle.values() for process in group]

    def _take_all(self) -> list[subprocess.Popen]:
        idle = self.idle_processes()
        self.idle = {backend: [] for backend in self.backends}
        return idle

    def claim(
        self, command: Sequence[str], backend: str | None = None, worker_id: str = ""
    ) -> subprocess.Popen | None:  # fmt: skip
        """Hand ``command`` (a ``naiad worker --model M ...`` command line) to an idle pool
        process and return it, or None when none is idle (the caller starts ``command``
        itself): one that prepared ``backend`` (the model's, :func:`repository_store.backend_of`)
        if any, else one of the default (first-listed) pool; never one another framework's
        model would miss; ``worker_id``: the worker's id, when the caller names it
        (:attr:`naiad.settings.Settings.worker_id`). Either way a cold start happened: the
        pool refills and its idle timeout starts again."""
        now = time.monotonic()
        self._last_cold_start, self._refill_at = now, now + REFILL_DELAY_S
        self._changed.set()
        claim = {"command": list(command), "claimed_at": time.time(), "worker_id": worker_id}
        message = json.dumps(claim).encode() + b"\n"
        # Its own backend's pool, else the default (first) pool: never another framework's
        # process, which a model of that framework would then miss.
        order = list(dict.fromkeys(b for b in (backend, self.backends[0]) if b in self.idle))
        for group in (self.idle[b] for b in order):
            while group:
                process = group.pop(0)
                if _hand(process, message):
                    logger.debug("warm-pool process pid %d claimed: %s", process.pid, " ".join(command[3:]))
                    return process
        return None

    async def _keep(self) -> None:
        while True:
            self._changed.clear()  # before the step: a claim during it is not missed
            wait_s = await self._step()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), wait_s)

    async def _step(self) -> float | None:
        """Drop dead idle processes, shrink after the idle timeout, or refill; returns the
        seconds until the next step (None: on the next claim)."""
        for group in self.idle.values():
            for process in [p for p in group if p.poll() is not None]:
                logger.warning("warm-pool process pid %d exited with %s", process.pid, process.returncode)
                procs.became_ready(process)  # closes its readiness pipe
                group.remove(process)
        now = time.monotonic()
        if self.idle_timeout_s is not None:
            quiet_s = now - self._last_cold_start
            if quiet_s >= self.idle_timeout_s:
                if self.idle_processes():
                    logger.info("no cold start for %g s: warm pool shrinks to 0", self.idle_timeout_s)
                    await asyncio.to_thread(_stop, self._take_all())
                return None
        short = any(len(group) < self.size for group in self.idle.values())
        if short and now < self._refill_at:
            return self._refill_at - now
        for backend, group in self.idle.items():
            env = {**self.env, BACKENDS_ENV: json.dumps([backend])}
            while len(group) < self.size:
                group.append(procs.spawn_python(
                    self.command, redis_url=self.redis_url, stdin=subprocess.PIPE, env=env
                ))
        if self.idle_timeout_s is None:
            return CHECK_S
        return min(CHECK_S, self.idle_timeout_s - (now - self._last_cold_start))


def _hand(process: subprocess.Popen, message: bytes) -> bool:
    """Write the claim to an idle process and close its stdin; False if it is gone."""
    if process.poll() is not None or process.stdin is None:
        return False
    try:
        process.stdin.write(message)
        process.stdin.close()
    except (OSError, ValueError):  # a broken pipe: it died meanwhile
        return False
    return True


def _stop(processes: list[subprocess.Popen]) -> None:
    """End idle pool processes: close their stdin (they exit), SIGTERM, wait."""
    for process in processes:
        with contextlib.suppress(OSError, ValueError):
            if process.stdin is not None:
                process.stdin.close()
    procs.stop_all(processes, timeout_s=5.0)


# --- the pool process (`naiad worker --pool`) ---------------------------------------------------


async def serve_claim(settings: Settings, parse: Callable[[list[str]], tuple[Settings, str]]) -> int:
    """Prepare, wait for the claim on stdin, then run the claimed worker; its exit code.
    ``parse`` turns the claimed command's arguments into its settings and model. (The
    worker's modules are imported here: the scaler, which imports this module, needs none.)"""
    from workers import backends  # noqa: PLC0415
    from workers.cold_start import process_started_at  # noqa: PLC0415
    from workers.worker import Prepared, Worker  # noqa: PLC0415

    ready = backends.prepare(settings.warm_pool_backends)
    redis, store = await _connect(settings), await _open(settings)
    took_s = time.time() - process_started_at()
    logger.info("warm-pool process pid %d ready %.3f s after it started (backends: %s)",
                os.getpid(), took_s, ", ".join(ready), extra={"warm_pool_ready": True})  # fmt: skip
    line = await asyncio.to_thread(sys.stdin.buffer.readline)
    if not line:  # the scaler closed the pipe: not needed
        await _close(redis)
        return 0
    claim = json.loads(line)
    command = claim["command"]
    worker_args = command[command.index("worker"):]
    claimed, model = parse(worker_args)
    _retitle(worker_args)
    logs.configure(claimed)
    if claimed.redis_url is None:  # the URL came through this process's inherited pipe
        claimed = claimed.model_copy(update={"redis_url": settings.redis_url})
    if claim.get("worker_id"):  # the scaler's name for it (naiad.settings.Settings.worker_id)
        claimed = claimed.model_copy(update={"worker_id": claim["worker_id"]})
    if claimed.redis_url != settings.redis_url:
        redis = await _close(redis)
    if claimed.model_repository != settings.model_repository:
        store = None
    prepared = Prepared(float(claim["claimed_at"]), redis, store)
    assert claimed.redis_url is not None
    return await Worker(claimed, model, claimed.redis_url, prepared=prepared).run()


def _retitle(worker_args: list[str]) -> None:
    """Show the claimed process in ``ps`` (and ``/proc/<pid>/cmdline``) as the worker it now
    is, ``naiad worker --model M ...``, instead of its ``worker --pool`` start command. The
    title replaces the argument vector, so psutil's ``cmdline()`` is one string: split it."""
    import setproctitle  # noqa: PLC0415

    setproctitle.setproctitle(" ".join(["naiad", *worker_args]))


async def _connect(settings: Settings):
    assert settings.redis_url is not None
    redis = connect(settings.redis_url, longest_block_s=1.0, tolerate_stalls=True)
    try:
        await redis.ping()
    except RedisError as exc:  # the claimed worker retries on its own
        logger.warning("warm-pool process cannot reach redis yet: %s", exc)
    return redis


async def _open(settings: Settings) -> RepositoryStore | None:
    try:
        return await asyncio.to_thread(open_store, settings.model_repository)
    except Exception as exc:  # the claimed worker opens it again and reports the failure
        logger.warning("warm-pool process cannot open the repository yet: %s", exc)
        return None


async def _close(redis) -> None:
    with contextlib.suppress(RedisError, OSError):
        await redis.aclose()
