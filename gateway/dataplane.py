"""The transport-free core of every KServe v2 operation the gateway serves.

HTTP handlers (and later the gRPC servicer) only convert and call this; it knows nothing
about aiohttp, grpc or Redis queues (inference goes through :class:`QueueDispatcher`, a remote
model that looks local). Response shapes follow the KServe v2 protocol's "Server Metadata",
"Model Metadata" objects, and Triton's model configuration extension.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

from gateway.classification import classify
from gateway.ensemble import EnsembleScheduler
from gateway.inflight import SharedInflight
from gateway.registry import ModelRegistry
from gateway.response_cache import CacheTrace, ResponseCache
from gateway.rollouts import Rollouts
from gateway.shared_memory import SystemSharedMemory
from gateway.siblings import Siblings
from naiad import __version__, logs, stats, telemetry, tracing
from naiad.errors import (
    InvalidInput,
    ModelControlDisabled,
    ModelNotFound,
    ModelNotReady,
    NaiadError,
    Overloaded,
    Unavailable,
    Unsupported,
)
from naiad.ids import fresh_id
from naiad.inference import InferRequest, InferResponse
from naiad.model_client import ModelClient
from naiad.queue_client import QueueDispatcher
from naiad.registry import UNLOADED, ModelEntry, parse_version, select_version
from naiad.stats_writer import StatsWriter
from naiad.validation import client_shape, validate_request, wire_datatype
from repository_store import (
    ModelConfig,
    backend_of,
    completed_config,
    config_to_triton_json,
    parse_config_json,
)
from repository_store.ensemble import is_ensemble

logger = logging.getLogger(__name__)

#: Extensions of the v2 protocol this server implements (GET /v2 lists exactly these).
EXTENSIONS = [
    "classification", "binary_tensor_data", "model_configuration", "statistics", "model_repository",
    "system_shared_memory",
]  # fmt: skip

#: Largest input read from one shared memory region when the server sets no limit, in bytes.
MAX_SHM_READ_BYTES = 2**31 - 1

#: Most shadow copies (``naiad.shadow_version``) one gateway has in flight at once.
MAX_SHADOW_INFLIGHT = 256

#: Triton's platform string per normalised backend name (model metadata's ``platform``).
PLATFORMS = {
    "onnxruntime": "onnxruntime_onnx",
    "pytorch": "pytorch_libtorch",
    "tensorflow": "tensorflow_savedmodel",
    "python": "python",
    "ensemble": "ensemble",
}


def index_rows(entry: ModelEntry, rolled_back: dict[int, str] | None = None) -> list[dict[str, str]]:
    """Triton's repository index rows of one model: one ``{name, version, state, reason}``
    per version it serves or failed to load (ascending), a failed one UNAVAILABLE with its
    own reason; ``version`` absent when none is known. A model that keeps serving after a
    failed change has READY rows whose ``reason`` says what failed; a version rolled back
    automatically (``rolled_back``: version -> why) stays READY (a request naming it gets
    it) with that reason."""
    versions = sorted({*entry.versions, *entry.failed})
    if not versions:
        return [{"name": entry.name, "state": entry.state, "reason": entry.reason}]
    rows = []
    for version in versions:
        state, reason = entry.state, entry.reason
        if version in entry.failed:
            state, reason = "UNAVAILABLE", entry.failed[version]
        elif rolled_back and version in rolled_back:
            reason = rolled_back[version]
        rows.append({"name": entry.name, "version": str(version), "state": state, "reason": reason})
    return rows


class _Admission:
    """One request counted in :attr:`DataPlane._inflight` while its block runs."""

    __slots__ = ("_dataplane",)

    def __init__(self, dataplane: DataPlane):
        self._dataplane = dataplane

    def __enter__(self) -> None:
        dataplane = self._dataplane
        dataplane._inflight += 1
        if dataplane.shared_inflight is not None:
            dataplane.shared_inflight.set(dataplane._inflight)

    def __exit__(self, *exc: object) -> None:
        dataplane = self._dataplane
        dataplane._inflight -= 1
        if dataplane.shared_inflight is not None:
            dataplane.shared_inflight.set(dataplane._inflight)


class DataPlane:
    """Server and model operations; raises :class:`NaiadError` subclasses for clients."""

    def __init__(
        self,
        redis: aioredis.Redis,
        registry: ModelRegistry,
        dispatcher: QueueDispatcher,
        request_timeout_s: float,
        model_control_mode: str = "none",
        cache: ResponseCache | None = None,
        max_queue_size: int = 1000,
        max_inflight: int = 4096,
        shared_memory: SystemSharedMemory | None = None,
    ):
        self.max_inflight = max_inflight
        self._inflight = 0
        self.liveness: Callable[[], bool] | None = None  # gateway.liveness.RedisLiveness.live
        self.redis = redis
        self.cache = cache  # None: the server-side response cache is off
        self.registry = registry
        self.request_timeout_s = request_timeout_s
        self.model_control_mode = model_control_mode
        self.stats_writer = StatsWriter(redis)
        # max_queue_size: per model, unless its config sets one
        self.client = ModelClient(dispatcher, self.stats_writer, request_timeout_s, max_queue_size)
        self.ensembles = EnsembleScheduler(self.resolve, self._serve, self.stats_writer)  # steps: _serve
        self.rollouts = Rollouts(redis, registry)
        self._shadows: set[asyncio.Task] = set()
        # Triton's system shared memory regions, registered with this gateway process.
        self.shared_memory = shared_memory or SystemSharedMemory(MAX_SHM_READ_BYTES)
        #: The other gateway processes on this server's ports (None: this one alone).
        self.siblings: Siblings | None = None
        #: The requests in flight in each of them (gateway.inflight; None: this one alone).
        self.shared_inflight: SharedInflight | None = None
        self.siblings_starting = False  # not ready until they serve too

    def sibling_handlers(self) -> dict[str, Callable[..., Awaitable[None]]]:
        """What another gateway process of this server may ask of this one (:mod:`gateway.siblings`)."""

        async def expire() -> None:
            self.registry.expire()

        async def shm_register(name: str, key: str, offset: int, byte_size: int) -> None:
            self.shared_memory.register(name, key, offset, byte_size)

        async def shm_busy(name: str) -> list[str]:
            return self.shared_memory.busy(name)

        async def shm_unregister(name: str, busy_elsewhere: list[str]) -> None:
            self.shared_memory.unregister(name, busy_elsewhere)

        return {"flush": self.stats_writer.flush, "expire": expire, "shm_register": shm_register,
                "shm_busy": shm_busy, "shm_unregister": shm_unregister}  # fmt: skip

    async def _tell_siblings(self, op: str, *args: object) -> list[str]:
        return await self.siblings.tell(op, *args) if self.siblings is not None else []

    async def flush_statistics(self) -> None:
        """Write the statistics this process and its siblings hold (before any read of them)."""
        await self.stats_writer.flush()
        await self._tell_siblings("flush")

    async def register_shared_memory(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """:meth:`SystemSharedMemory.register` here and in every sibling; a region one of
        them cannot map is unregistered everywhere and :class:`InvalidInput` says why."""
        self.shared_memory.register(name, key, offset, byte_size)
        errors = await self._tell_siblings("shm_register", name, key, offset, byte_size)
        if errors:
            with contextlib.suppress(NaiadError):
                self.shared_memory.unregister(name)
            await self._tell_siblings("shm_unregister", name, [])
            raise InvalidInput(errors[0])

    async def unregister_shared_memory(self, name: str = "") -> None:
        """:meth:`SystemSharedMemory.unregister` here and in every sibling, each keeping the
        regions a request uses in any of them (so all keep the same regions); raises
        :class:`InvalidInput` naming those, as one process does."""
        busy = set(self.shared_memory.busy(name))
        if self.siblings is not None:
            for error, names in await self.siblings.ask("shm_busy", name):
                busy.update(names if error is None else ())
        try:
            self.shared_memory.unregister(name, busy)
        finally:
            await self._tell_siblings("shm_unregister", name, sorted(busy))

    def admit(self) -> _Admission:
        """One inference request carried by this gateway, from its first byte read to its
        answer (a context manager); raises :class:`Overloaded` at once when ``max_inflight``
        are already (the transports wrap their whole infer handler, body reading included,
        in it)."""
        if self._inflight >= self.max_inflight:
            raise Overloaded(f"the gateway carries {self.max_inflight} requests already; retry later")
        return _Admission(self)

    def alone(self) -> bool:
        """True while this gateway carries one inference request at most (:meth:`admit`): a
        request handed to a worker now has no other to wait for (as Nagle's algorithm sends at
        once when nothing is unacknowledged, RFC 896; :meth:`naiad.reply_channel.WorkerLink._send`)."""
        return self._inflight <= 1

    def alone_in_server(self) -> bool:
        """True while the whole server (every gateway process of it: :mod:`gateway.inflight`)
        carries one inference request at most; False with siblings whose counts it cannot read."""
        if self._inflight > 1:
            return False
        if self.shared_inflight is not None:
            return self.shared_inflight.total() <= 1
        return self.siblings is None

    async def close(self) -> None:
        """After the endpoints closed: cancel the shadow copies still waiting (their answers
        would be discarded anyway), finish writing rollback decisions, flush statistics."""
        for task in list(self._shadows):
            task.cancel()
        await asyncio.gather(*self._shadows, return_exceptions=True)
        await self.rollouts.close()
        await self.stats_writer.flush()

    def live(self) -> bool:
        """Liveness (:mod:`gateway.liveness` when set in ``liveness``): not live once Redis
        has been unreachable longer than its grace period."""
        return self.liveness() if self.liveness is not None else True

    async def ready(self) -> bool:
        """Ready when Redis answers and the repository is reachable (models may be at zero),
        and the server's other gateway processes started (or gave up: :mod:`gateway.siblings`)."""
        if self.siblings_starting:
            return False
        try:
            await self.redis.ping()
            await asyncio.to_thread(self.registry.store.check)
        except (RedisError, NaiadError, OSError):
            return False
        return True

    @staticmethod
    def server_metadata() -> dict[str, Any]:
        return {"name": "naiad", "version": __version__, "extensions": EXTENSIONS}

    async def resolve(self, name: str, version: str = "") -> tuple[ModelEntry, int]:
        """The registry entry and the version number a request addresses.

        An empty ``version`` means the newest version the policy serves. Raises
        :class:`ModelNotFound` (unknown model or version, or a model unloaded in explicit
        mode: Triton answers NOT_FOUND to those), :class:`InvalidInput` (non-numeric
        version), :class:`ModelNotReady` (broken config or files).
        """
        entry = await self.registry.get(name)
        return entry, select_version(entry, parse_version(version))

    async def route(
        self, name: str, version: str = "", route_key: str | None = None
    ) -> tuple[ModelEntry, int]:
        """:meth:`resolve` for an inference: a request that names no version goes to one by
        the model's ``naiad.traffic_split`` (less the versions rolled back; ``route_key``:
        sticky, :mod:`naiad.rollout`), else to the newest."""
        entry, number = await self.resolve(name, version)
        if version:
            return entry, number
        return entry, self.rollouts.route(entry, route_key)

    async def model_ready(self, name: str, version: str = "") -> bool:
        return not await self.model_readiness(name, version)

    async def model_readiness(self, name: str, version: str = "") -> str:
        """"" when model ``name`` (``version``: that one) can serve, else why not: the
        reason metadata and the repository index give. Raises :class:`ModelNotFound` for a
        model the repository does not hold, :class:`InvalidInput` for a malformed version."""
        try:
            await self.resolve(name, version)
        except ModelNotReady as exc:
            return exc.message
        except ModelNotFound as exc:
            entry = await self.registry.get(name)  # unknown model: raises again
            if entry.reason == UNLOADED and not entry.ready:
                return f"model '{name}' is not ready: {UNLOADED}"
            raise exc from None
        return ""

    async def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        """KServe v2 model metadata; ``versions`` lists the served versions, or only the one
        asked for (Triton's answer to ``.../versions/N``)."""
        entry, resolved = await self.resolve(name, version)
        config = entry.config

        def tensors(specs: Any) -> list[dict[str, Any]]:
            return [
                {
                    "name": spec.name,
                    "datatype": wire_datatype(spec.data_type),
                    "shape": client_shape(config, list(spec.dims)),
                }
                for spec in specs
            ]

        return {
            "name": name,
            "versions": [str(v) for v in (entry.versions if not version else [resolved])],
            "platform": PLATFORMS[backend_of(config)],
            "inputs": tensors(config.input),
            "outputs": tensors(config.output),
        }

    async def model_config(self, name: str, version: str = "") -> ModelConfig:
        """The completed config Triton's model configuration extension returns
        (:func:`repository_store.completed_config`)."""
        entry, _ = await self.resolve(name, version)
        return completed_config(entry.config)

    async def model_config_json(self, name: str, version: str = "") -> dict[str, Any]:
        """:meth:`model_config` as Triton's HTTP ``GET v2/models/<name>/config`` writes it
        (:func:`repository_store.config_to_triton_json`: 64-bit integers as JSON numbers)."""
        return config_to_triton_json(await self.model_config(name, version))

    async def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Triton's repository index (:func:`index_rows`), of every model or the READY rows."""
        await self.registry.sync()
        rows = [row for entry in self.registry.entries()
                for row in index_rows(entry, self.registry.rolled_back(entry.name))]  # fmt: skip
        return [row for row in rows if row["state"] == "READY"] if ready_only else rows

    def _check_model_control(self) -> None:
        if self.model_control_mode == "poll":
            raise ModelControlDisabled("explicit model load / unload is not allowed if polling is enabled")
        if self.model_control_mode != "explicit":
            raise ModelControlDisabled(
                "explicit model load / unload is not allowed in model control mode 'none' "
                "(start the server with --model-control-mode=explicit)"
            )

    async def load_model(self, name: str, parameters: dict[str, Any]) -> None:
        """Load (or reload) ``name`` from the repository; parameter ``config`` (a JSON model
        config) replaces its config.pbtxt. Raises ModelNotReady with the reason when the
        model does not load; the other models are unaffected."""
        self._check_model_control()
        files = sorted(key for key in parameters if key.startswith("file:"))
        if files:
            raise Unsupported(f"loading model files sent with the request is not supported: {files[0]}")
        config = parameters.get("config")
        if config is not None and not isinstance(config, str):
            raise InvalidInput("load parameter 'config' must be a string holding a JSON model config")
        override = parse_config_json(config, name) if config else None
        try:
            entry = await self.registry.load(name, override)
        finally:
            await self._tell_siblings("expire")
        if entry.problem:  # not loaded, or a version failed: what served before still serves
            raise ModelNotReady(f"failed to load '{name}': {entry.problem}")

    async def unload_model(self, name: str, parameters: dict[str, Any]) -> None:
        """Unload ``name``: not ready, requests refused, its workers drain and exit.
        ``unload_dependents`` is accepted; ensembles are not tracked as dependents."""
        self._check_model_control()
        if not isinstance(parameters.get("unload_dependents", False), bool):
            raise InvalidInput("unload parameter 'unload_dependents' must be a boolean")
        try:
            await self.registry.unload(name)
        finally:
            await self._tell_siblings("expire")

    async def infer(self, request: InferRequest, entry: ModelEntry | None = None) -> InferResponse:
        """:meth:`_infer` with the request's log context (request id: the client's ``id``, or
        a fresh one) and, when tracing is on, the ``naiad.infer`` span around it. ``entry``:
        the model's registry entry when the caller has it already (:meth:`route`)."""
        request_id = request.id or fresh_id()
        attributes = (
            {"naiad.model": request.model, "naiad.version": request.version, "naiad.request_id": request_id}
            if tracing.enabled() else None
        )  # fmt: skip
        started_ns = time.perf_counter_ns()
        with logs.request_context(request_id, request.model, request.version), \
                tracing.span("naiad.infer", attributes, kind="server"):
            try:
                with self.shared_memory.hold(request):  # output regions: checked, kept
                    response = await self._infer(request, entry)
                    self.shared_memory.write_outputs(request, response)  # cache hits too
            except Exception as exc:
                logger.debug("infer failed: %s", exc)
                raise
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("infer done in %.2f ms", (time.perf_counter_ns() - started_ns) / 1e6)
            return response

    async def _infer(self, request: InferRequest, entry: ModelEntry | None = None) -> InferResponse:
        """Validate ``request`` (already resolved to a version) and run it on a worker.

        A request that passes validation counts in the model's statistics as a success or a
        failure, with its duration here (Triton counts only requests that reach the model).
        """
        if entry is None:
            entry = await self.registry.get(request.model)
        self._shadow(entry, request)
        return await self._serve(entry, request)

    def _shadow(self, entry: ModelEntry, request: InferRequest) -> None:
        """Send a copy of ``request`` to the model's shadow version when its share draws it
        (``naiad.shadow_version``), in the background: its answer is discarded, it never
        delays the caller, and it is counted apart (``naiad_shadow_requests_total``). At most
        :data:`MAX_SHADOW_INFLIGHT` copies wait at once; more are not sent."""
        version = self.rollouts.shadow(entry, request.version)
        if version is None or is_ensemble(entry.config) or len(self._shadows) >= MAX_SHADOW_INFLIGHT:
            return
        copy = dataclasses.replace(request, version=version, id=f"shadow-{request.id}" if request.id else "")
        task = asyncio.get_running_loop().create_task(self._run_shadow(entry, copy))
        self._shadows.add(task)
        task.add_done_callback(self._shadows.discard)

    async def _run_shadow(self, entry: ModelEntry, copy: InferRequest) -> None:
        try:
            validate_request(entry.config, copy)
            await self.client.queue(entry, copy, self.client.timeout_s(copy))
            ok = True
        except Exception as exc:  # noqa: BLE001 - a shadow's failure is only counted
            logger.debug("shadow copy to version %d failed: %s", copy.version, exc)
            ok = False
        self.stats_writer.add(lambda pipe: telemetry.add_shadow(pipe, copy.model, copy.version, ok))

    async def _serve(
        self, entry: ModelEntry, request: InferRequest, timeout_s: float | None = None
    ) -> InferResponse:
        """Validate ``request`` against ``entry`` and answer it within ``timeout_s`` (None:
        the request's own timeout), recording its outcome (:class:`ModelClient`): a client's
        request, or one step of an ensemble (:mod:`gateway.ensemble`), which counts as a
        request of its model."""
        if self.cache is None or not entry.config.response_cache.enable:
            answer, cache_counters = self._run, None  # no cache: no trace, no closures
        else:
            cache, trace = self.cache, CacheTrace()

            async def answer(entry: ModelEntry, request: InferRequest, timeout_s: float) -> InferResponse:
                run = functools.partial(self._run, entry, request)
                return await cache.infer(request, timeout_s, run, trace)

            def cache_counters(pipe: Pipeline) -> None:
                if trace.used:
                    stats.add_cache(pipe, request.model, request.version, trace.hit, trace.ns)

        try:
            response = await self.client.infer(entry, request, timeout_s, answer, cache_counters)
        except (Exception, asyncio.CancelledError) as exc:  # cancelled: the client went away
            if isinstance(exc, ModelNotReady):  # its load failed in a worker, now in the registry
                self.registry.expire()
            self.rollouts.observe(entry, request.version, exc)
            raise
        self.rollouts.observe(entry, request.version, None)
        return response

    async def _run(self, entry: ModelEntry, request: InferRequest, timeout_s: float) -> InferResponse:
        if is_ensemble(entry.config):  # steps through their models' queues (gateway/ensemble.py)
            response = await self.ensembles.infer(entry, request, timeout_s)
        else:
            response = await self.client.queue(entry, request, timeout_s)
        counts = {output.name: output.class_count for output in request.outputs if output.class_count}
        if counts:
            batched = entry.config.max_batch_size > 0
            response.outputs = [
                classify(t, counts[t.name], batched, entry.labels.get(t.name, []))
                if t.name in counts else t
                for t in response.outputs
            ]
        return response

    async def model_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """Triton's statistics extension: ``{"model_stats": [...]}`` for ``version`` of
        ``name``, every version it serves (no ``version``), or every ready model (no
        ``name``). Unknown model or version: :class:`ModelNotFound`."""
        if name:
            entry, number = await self.resolve(name, version)
            wanted = [(entry.name, [number] if version else sorted(entry.versions))]
        else:
            await self.registry.sync()
            wanted = [(e.name, sorted(e.versions)) for e in self.registry.entries() if e.state == "READY"]
        await self.flush_statistics()  # the requests this server answered count
        try:
            return {"model_stats": await stats.read(self.redis, wanted)}
        except RedisError as exc:
            raise Unavailable(f"statistics unavailable: {exc}") from None
