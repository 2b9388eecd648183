"""The transport-free core of every KServe v2 operation the gateway serves.

HTTP handlers (and later the gRPC servicer) only convert and call this; it knows nothing
about aiohttp, grpc or Redis queues (inference goes through :class:`QueueDispatcher`, a remote
model that looks local). Response shapes follow the KServe v2 protocol's "Server Metadata",
"Model Metadata" objects, and Triton's model configuration extension.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.classification import classify
from gateway.dispatcher import QueueDispatcher
from gateway.registry import ModelRegistry
from gateway.validation import client_shape, validate_request, wire_datatype
from naiad import __version__
from naiad.errors import InvalidInput, ModelNotFound, ModelNotReady, NaiadError
from naiad.inference import InferRequest, InferResponse
from repository_store import ModelEntry, backend_of, config_to_json

#: Extensions of the v2 protocol this server implements (GET /v2 lists exactly these).
EXTENSIONS = ["classification", "binary_tensor_data", "model_configuration"]

#: Triton's platform string per normalised backend name (model metadata's ``platform``).
PLATFORMS = {
    "onnxruntime": "onnxruntime_onnx",
    "pytorch": "pytorch_libtorch",
    "tensorflow": "tensorflow_savedmodel",
    "python": "python",
    "ensemble": "ensemble",
}


class DataPlane:
    """Server and model operations; raises :class:`NaiadError` subclasses for clients."""

    def __init__(
        self,
        redis: aioredis.Redis,
        registry: ModelRegistry,
        dispatcher: QueueDispatcher,
        request_timeout_s: float,
    ):
        self.redis = redis
        self.registry = registry
        self.dispatcher = dispatcher
        self.request_timeout_s = request_timeout_s

    @staticmethod
    def live() -> bool:
        return True

    async def ready(self) -> bool:
        """Ready when Redis answers and the repository is reachable (models may be at zero)."""
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
        :class:`ModelNotFound` (unknown model or version), :class:`InvalidInput`
        (non-numeric version), :class:`ModelNotReady` (broken config or files).
        """
        entry = await self.registry.get(name)
        if entry.state != "READY" or entry.config is None:
            raise ModelNotReady(f"model '{name}' is not ready: {entry.reason}")
        if not version:
            return entry, max(entry.versions)
        if not version.isdigit():
            raise InvalidInput(f"model version must be a positive integer, got '{version}'")
        if int(version) not in entry.versions:
            raise ModelNotFound(f"model '{name}' has no version {version}")
        return entry, int(version)

    async def model_ready(self, name: str, version: str = "") -> bool:
        try:
            await self.resolve(name, version)
        except ModelNotReady:
            return False
        return True

    async def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        entry, _ = await self.resolve(name, version)
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
            "versions": [str(v) for v in entry.versions],
            "platform": PLATFORMS[backend_of(config)],
            "inputs": tensors(config.input),
            "outputs": tensors(config.output),
        }

    async def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        entry, _ = await self.resolve(name, version)
        return config_to_json(entry.config)

    def _timeout_s(self, request: InferRequest) -> float:
        timeout_us = request.parameters.get("timeout")
        if timeout_us is None:
            return self.request_timeout_s
        if not isinstance(timeout_us, int) or isinstance(timeout_us, bool) or timeout_us <= 0:
            raise InvalidInput("parameter 'timeout' must be a positive integer (microseconds)")
        return timeout_us / 1e6

    async def infer(self, request: InferRequest) -> InferResponse:
        """Validate ``request`` (already resolved to a version) and run it on a worker."""
        entry = await self.registry.get(request.model)
        validate_request(entry.config, request)
        response = await self.dispatcher.infer(request, self._timeout_s(request))
        counts = {output.name: output.class_count for output in request.outputs if output.class_count}
        if counts:
            batched = entry.config.max_batch_size > 0
            response.outputs = [
                classify(t, counts[t.name], batched, entry.labels.get(t.name, []))
                if t.name in counts else t
                for t in response.outputs
            ]
        return response
