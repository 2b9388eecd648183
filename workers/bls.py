"""Business Logic Scripting: a worker's Python model calling another model.

``pb_utils.InferenceRequest(...).exec()`` / ``async_exec()`` (python_backend README, "Business
Logic Scripting") land in :meth:`BlsClient.submit`, called from the thread that runs the
model's ``execute``. The request travels exactly as a client's does through a gateway: resolved
against the registry by the same rules (:func:`naiad.registry.select_version`;
``model_version`` -1: the newest version served), then validated, timed, placed, queued and
counted in the target's statistics by the same :class:`naiad.model_client.ModelClient` (the
queue wakes the scaler when the target has no worker, so a model at zero starts). The
dispatcher lives on the worker's event loop with its own reply list (``naiad:reply:bls-<worker
id>``); ``exec`` blocks only the model's thread, so heartbeats and replies keep flowing. Every
failure comes back as the response's ``error()``, never raised, as Triton does; an unknown
model is NOT_FOUND with Triton's message. An ensemble target is UNSUPPORTED at once: ensembles
are scheduled by the gateway (:mod:`gateway.ensemble`), and no worker reads an ensemble's
queue.

The reply reader starts on the first BLS call, so a worker whose model never calls another
model holds no extra Redis connection.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging

from redis.asyncio import Redis
from redis.exceptions import RedisError

import triton_python_backend_utils as pb_utils
from naiad.datatypes import datatype_of
from naiad.errors import ModelNotFound, ModelNotReady, NaiadError, Unsupported
from naiad.inference import InferRequest, InferResponse, RequestedOutput, Tensor
from naiad.model_client import ModelClient
from naiad.queue_client import READER_BLOCK_S, QueueDispatcher
from naiad.redis_client import connect
from naiad.registry import ModelEntry, RegistryReader, select_version
from naiad.settings import Settings
from naiad.stats_writer import StatsWriter
from repository_store.ensemble import is_ensemble

logger = logging.getLogger(__name__)


def _failed(message: str) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, pb_utils.TritonError.INTERNAL))


def _before_run(error: NaiadError | RedisError, model: str) -> str:
    """What Triton 2.51 says of a BLS target it could not run: for a model or version it does
    not serve, python_backend's readiness check's text (``request_executor.cc``; asked of
    Triton for an unknown model), else Naiad's own message."""
    if isinstance(error, ModelNotFound | ModelNotReady):
        return f"Failed for execute the inference request. Model '{model}' is not ready."
    return _message(error)


def _message(error: NaiadError | RedisError) -> str:
    return error.message if isinstance(error, NaiadError) else f"Redis is unavailable: {error}"


class BlsClient:
    """Sends this worker's BLS requests through the target models' queues. Create it on the
    worker's event loop; :meth:`submit` may be called from any other thread."""

    def __init__(self, settings: Settings, redis: Redis, redis_url: str, worker_id: str):
        self.settings = settings
        self.redis = redis
        self.redis_url = redis_url
        self.registry = RegistryReader(redis)
        self.client_id = f"bls-{worker_id}"
        self.loop = asyncio.get_running_loop()
        self._client: ModelClient | None = None
        self._reader: Redis | None = None
        self._starting = asyncio.Lock()

    def submit(
        self, request: pb_utils.InferenceRequest
    ) -> concurrent.futures.Future[pb_utils.InferenceResponse]:
        """Send ``request`` from a model's thread; the future's result is its response."""
        return asyncio.run_coroutine_threadsafe(self.execute(request), self.loop)

    async def execute(self, request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse:
        """The response to ``request``: its outputs, or its ``error()``, always of code
        INTERNAL, as Triton 2.51's stub answers BLS errors (asked of it: an unknown model, a
        bad input and a target's own NOT_FOUND error alike). An error met before the target
        runs is worded as Triton's: ``Model <name> - Error when running inference: ...``."""
        try:
            entry, version = await self._target(request.model_name(), request.model_version())
        except (NaiadError, RedisError) as exc:
            model = request.model_name()
            return _failed(f"Model {model} - Error when running inference: {_before_run(exc, model)}")
        try:
            response = await self._infer(entry, version, request)
        except (NaiadError, RedisError) as exc:
            return _failed(_message(exc))
        return pb_utils.InferenceResponse([pb_utils.Tensor(t.name, t.data) for t in response.outputs])

    async def _target(self, model: str, version: int) -> tuple[ModelEntry, int]:
        """The target's entry and version; :class:`Unsupported` for an ensemble."""
        entry, version = await self._resolve(model, version)
        if is_ensemble(entry.config):  # its scheduler runs in the gateway (gateway/ensemble.py)
            raise Unsupported(
                "BLS requests to ensemble models are not supported in Naiad: "
                f"call the composing models of '{entry.name}'"
            )
        return entry, version

    async def _infer(
        self, entry: ModelEntry, version: int, request: pb_utils.InferenceRequest
    ) -> InferResponse:
        infer = InferRequest(
            model=entry.name, version=version, inputs=[_tensor(t) for t in request.inputs()],
            outputs=[RequestedOutput(name) for name in request._requested_output_names],  # caller's order
            id=request.request_id(), parameters=_parameters(request),
        )  # fmt: skip
        client = await self._started()
        return await client.infer(entry, infer, wait_recorded=True)

    async def _resolve(self, model: str, version: int) -> tuple[ModelEntry, int]:
        """The target's registry entry and version (-1: the newest it serves), by the rules a
        client's request meets at the gateway (:func:`naiad.registry.select_version`).
        Raises :class:`ModelNotFound` (Triton's message) or :class:`ModelNotReady`."""
        entry = await self.registry.get(model) if model else None
        if entry is None:
            raise ModelNotFound(f"Request for unknown model: '{model}' is not found")
        return entry, select_version(entry, None if version == -1 else version)

    async def _started(self) -> ModelClient:
        """The model client, its dispatcher's reply reader started on first use."""
        async with self._starting:
            if self._client is None:
                self._reader = connect(self.redis_url, longest_block_s=READER_BLOCK_S)
                dispatcher = QueueDispatcher(self.redis, self._reader, self.client_id)
                await dispatcher.start()
                bounds = (self.settings.request_timeout_s, self.settings.max_queue_size)
                self._client = ModelClient(dispatcher, StatsWriter(self.redis), *bounds)
        return self._client

    async def close(self) -> None:
        """Stop the reply reader, if it started."""
        if self._client is not None:
            await self._client.writer.flush()
            await self._client.dispatcher.stop()
        if self._reader is not None:
            await self._reader.aclose()


def _tensor(tensor: pb_utils.Tensor) -> Tensor:
    array = tensor.as_numpy()
    return Tensor(tensor.name(), datatype_of(array.dtype), list(array.shape), array)


def _parameters(request: pb_utils.InferenceRequest) -> dict:
    """The BLS request's parameters, with its ``timeout`` (µs) where it has one: the target's
    queue policy reads it there, as it does a client's."""
    parameters = json.loads(request.parameters())
    parameters = parameters if isinstance(parameters, dict) else {}
    if request.timeout() > 0:
        parameters["timeout"] = request.timeout()
    return parameters


def install(settings: Settings, redis: Redis, redis_url: str, worker_id: str) -> BlsClient:
    """A BLS client for this worker, reachable from ``pb_utils.InferenceRequest.exec``.
    Call on the worker's loop; close it (:meth:`BlsClient.close`) when the worker exits."""
    client = BlsClient(settings, redis, redis_url, worker_id)
    pb_utils._install_bls(client.submit)  # noqa: SLF001 - the module's hook for its host
    return client
