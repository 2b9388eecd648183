"""The KServe v2 gRPC adapter: ``inference.GRPCInferenceService``, served by the gateway's own
gRPC front (:mod:`gateway.grpc_front`, the default) or a ``grpc.aio`` server (``--grpc-front grpcio``).

The servicer only converts (:mod:`gateway.grpc_codec`) and calls the same :class:`DataPlane`
methods as the HTTP adapter. Errors are mapped once, by each handler's wrapper (:func:`_wrapped`), from
:data:`naiad.errors.GRPC_CODES`; an unknown exception becomes INTERNAL with a generic message
and its traceback goes to the log. Messages may be up to ``--grpc-max-message-size`` bytes
each way (64 MiB by default; Triton's 2 GiB - 1 at most), read within the limits of
:mod:`gateway.grpc_limits`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NamedTuple

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from gateway.access import AccessPolicy, grpc_group, grpc_headers
from gateway.dataplane import DataPlane
from gateway.grpc_codec import (
    from_infer_request,
    from_repository_parameters,
    to_infer_response,
    to_model_metadata,
    to_model_statistics,
    to_repository_index,
    to_server_metadata,
    to_shared_memory_status,
)
from gateway.grpc_front import GrpcFront, fitting
from gateway.grpc_limits import GrpcLimits, receive, reservation
from gateway.http2 import Http2Limits
from gateway.shared_memory import shared_memory_outputs, unsupported_cuda
from naiad import rollout
from naiad.errors import GRPC_CODES, InvalidInput, ModelNotFound, Unsupported, as_naiad_error

logger = logging.getLogger(__name__)

SERVICE = "inference.GRPCInferenceService"
#: Seconds in-flight RPCs get to finish when the server stops (default of :func:`grpc_server`).
STOP_GRACE_S = 5.0


def status_of(exc: Exception, method: str) -> tuple[grpc.StatusCode, str]:
    """The status code and message a client gets for ``exc`` (logged when unexpected); a
    message that would not fit gRPC's metadata limit is cut (:func:`gateway.grpc_front.fitting`)."""
    known = as_naiad_error(exc)
    if known is not None:
        code = next(GRPC_CODES[cls] for cls in type(known).__mro__ if cls in GRPC_CODES)
        return grpc.StatusCode[code], fitting(known.message)
    logger.error("unhandled error in %s", method, exc_info=exc)
    return grpc.StatusCode.INTERNAL, "internal server error"


def _guard(behavior: Callable[..., Awaitable[Any]], method: str) -> Callable[..., Awaitable[Any]]:
    """``behavior`` with every exception turned into a status by :func:`status_of`."""

    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await behavior(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await context.abort(*status_of(exc, method))

    return call


class _CallDetails(NamedTuple):
    """A :class:`grpc.HandlerCallDetails`: what a generic handler is asked for a method with."""

    method: str
    invocation_metadata: tuple = ()


def method_handlers(
    servicer: InferenceServicer, access: AccessPolicy | None = None, limits: GrpcLimits | None = None
) -> dict[str, grpc.RpcMethodHandler]:
    """The service's handlers by method name, each wrapped once here (:func:`_wrapped`)
    rather than by three interceptors run on every call (as fast in an A/B, docs/benchmarks.md
    "Stop 20", and one layer to read). The generated ``add_..._to_server`` hands its
    handlers to whatever it is given; they are asked for by method name, as grpc does."""
    generic: list[grpc.GenericRpcHandler] = []

    class Collect:
        def add_generic_rpc_handlers(self, handlers: tuple[grpc.GenericRpcHandler, ...]) -> None:
            generic.extend(handlers)

        def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
            pass

    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, Collect())
    found = {}
    for name in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name:
        method = f"/{SERVICE}/{name}"
        handler = next(h for g in generic if (h := g.service(_CallDetails(method))) is not None)
        found[name] = _wrapped(handler, method, access, limits)
    return found


def _wrapped(
    handler: grpc.RpcMethodHandler, method: str, access: AccessPolicy | None, limits: GrpcLimits | None
) -> grpc.RpcMethodHandler:
    """``handler`` answering errors as statuses (:func:`_guard`), checking the call's
    metadata against ``access`` (``--grpc-restricted-protocol``, by the method's API group)
    before it reads any message, and, for a unary request, reading that message itself
    within ``limits`` (:mod:`gateway.grpc_limits`: the method becomes request-streaming);
    a message that is not valid protobuf is INVALID_ARGUMENT (grpc itself would say UNKNOWN).
    ``ModelStreamInfer`` (request-streaming already) keeps grpc's reading: each message is
    bounded by the largest message size, its requests by ``--max-inflight``."""
    group = grpc_group(method)
    restricted = access is not None and access.groups.get(group or "") is not None

    def check(context: grpc.aio.ServicerContext) -> None:
        if restricted:  # an open group passes without its metadata read
            access.check(group, grpc_headers(context.invocation_metadata()), grpc=True)

    if handler.request_streaming:
        behavior = handler.stream_stream

        async def stream(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            check(context)
            return await behavior(requests, context)

        return handler._replace(stream_stream=_guard(stream, method))
    assert not handler.response_streaming, method  # the service's only streaming method is above
    unary, deserializer = handler.unary_unary, handler.request_deserializer

    async def call(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> Any:
        check(context)
        with reservation(limits) as held:
            raw = await receive(requests, limits, held)
            try:
                request = deserializer(raw)
            except DecodeError as exc:
                raise InvalidInput(f"the request is not a valid protobuf message: {exc}") from None
            del raw
            return await unary(request, context)

    return handler._replace(
        request_streaming=True, request_deserializer=None, unary_unary=None, stream_unary=_guard(call, method)
    )


def _unsupported(feature: str) -> Callable[..., Awaitable[Any]]:
    async def method(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        raise Unsupported(f"{feature} is not implemented")

    return method


def bounded_timeout(
    parameters: dict[str, Any], time_remaining_s: float | None, default_s: float
) -> dict[str, Any]:
    """``parameters`` with ``timeout`` (µs) no later than the gRPC deadline, if one is set.

    Without a ``timeout`` parameter, or with 0 (no timeout of its own), the server default
    ``default_s`` is the one bounded; an invalid ``timeout`` is left for the data plane to
    reject.
    """
    if time_remaining_s is None:
        return parameters
    timeout_us = parameters.get("timeout")
    if timeout_us is None or (type(timeout_us) is int and timeout_us == 0):
        timeout_us = int(default_s * 1e6)
    if not isinstance(timeout_us, int) or isinstance(timeout_us, bool) or timeout_us <= 0:
        return parameters
    return {**parameters, "timeout": min(timeout_us, max(1, int(time_remaining_s * 1e6)))}


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """``inference.GRPCInferenceService`` over a :class:`DataPlane`; raises NaiadErrors."""

    def __init__(self, dataplane: DataPlane, max_message_bytes: int = 2**31 - 1):
        self._dp = dataplane
        # Inputs read from shared memory are bounded as a gRPC message is, not as an HTTP body.
        self._shm = dataplane.shared_memory.bounded(max_message_bytes)

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self._dp.live())

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=await self._dp.ready())

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        # Triton (and tritonclient.http's is_model_ready) say "not ready" for an unknown model.
        try:
            ready = await self._dp.model_ready(request.name, request.version)
        except ModelNotFound:
            ready = False
        return pb.ModelReadyResponse(ready=ready)

    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: Any
    ) -> pb.ServerMetadataResponse:
        return to_server_metadata(self._dp.server_metadata())

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        return to_model_metadata(await self._dp.model_metadata(request.name, request.version))

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        return pb.ModelConfigResponse(config=await self._dp.model_config(request.name, request.version))

    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: Any
    ) -> pb.ModelStatisticsResponse:
        return to_model_statistics(await self._dp.model_statistics(request.name, request.version))

    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: Any
    ) -> pb.RepositoryIndexResponse:
        return to_repository_index(await self._dp.repository_index(request.ready))

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        parameters = from_repository_parameters(request.parameters)
        await self._dp.load_model(request.model_name, parameters)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        parameters = from_repository_parameters(request.parameters)
        await self._dp.unload_model(request.model_name, parameters)
        return pb.RepositoryModelUnloadResponse()

    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInferResponse:
        with self._dp.admit():  # the gateway's in-flight bound (UNAVAILABLE when full)
            route_key = _metadata(context, rollout.ROUTE_METADATA)
            entry, version = await self._dp.route(request.model_name, request.model_version, route_key)
            infer_request = from_infer_request(request, entry.name, version, self._shm)
            infer_request.parameters = bounded_timeout(
                infer_request.parameters, context.time_remaining(), self._dp.request_timeout_s
            )
            response = await self._dp.infer(infer_request, entry)
            return to_infer_response(response, shared_memory_outputs(infer_request))

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: grpc.aio.ServicerContext
    ) -> None:
        """Answer each request of the stream on its own (concurrently, so they can batch);
        a failing request gets ``error_message`` and the stream goes on."""
        write_lock = asyncio.Lock()

        async def answer(request: pb.ModelInferRequest) -> None:
            reply = await self._stream_reply(request, context)
            async with write_lock:
                await context.write(reply)

        async with asyncio.TaskGroup() as group:
            async for request in request_iterator:
                group.create_task(answer(request))

    async def _stream_reply(
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelStreamInferResponse:
        try:
            reply = pb.ModelStreamInferResponse(infer_response=await self.ModelInfer(request, context))
        except Exception as exc:
            _, message = status_of(exc, "ModelStreamInfer")
            # The id lets a client of the raw stub match the error to its request.
            echo = pb.ModelInferResponse(
                id=request.id, model_name=request.model_name, model_version=request.model_version
            )
            reply = pb.ModelStreamInferResponse(error_message=message, infer_response=echo)
        # Each answer is its request's last, flagged as Triton flags them (decoupled clients
        # such as tritonclient's stream wait for it).
        reply.infer_response.parameters["triton_final_response"].bool_param = True
        return reply

    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest, context: Any
    ) -> pb.SystemSharedMemoryStatusResponse:
        return to_shared_memory_status(self._dp.shared_memory.status(request.name))

    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: Any
    ) -> pb.SystemSharedMemoryRegisterResponse:
        await self._dp.register_shared_memory(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, context: Any
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        await self._dp.unregister_shared_memory(request.name)  # no name: every region
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        raise unsupported_cuda()

    CudaSharedMemoryRegister = CudaSharedMemoryStatus
    CudaSharedMemoryUnregister = CudaSharedMemoryStatus
    TraceSetting = _unsupported("the trace extension")
    LogSettings = _unsupported("the logging extension")


def _metadata(context: grpc.aio.ServicerContext, key: str) -> str | None:
    """The value of invocation metadata ``key`` (lower case), or None."""
    for item in context.invocation_metadata() or ():
        if item.key == key:
            return item.value if isinstance(item.value, str) else None
    return None


@contextlib.asynccontextmanager
async def grpc_server(
    dataplane: DataPlane, host: str, port: int, grace_s: float = STOP_GRACE_S,
    access: AccessPolicy | None = None, limits: GrpcLimits | None = None, reuse_port: bool = False,
    front: str = "naiad",
) -> AsyncIterator[Any]:
    """A started gRPC server on ``host:port``; on exit it refuses new RPCs at once and gives
    in-flight ones ``grace_s`` seconds to finish (then cancels them). ``access`` restricts
    API groups (``--grpc-restricted-protocol``); ``limits``: message size, read timeout and
    the shared byte budget (grpc's own 4 MiB message default without). ``reuse_port``: the
    port shared with this server's other gateway processes (:mod:`gateway.siblings`);
    without, a port in use fails the start instead of being silently shared. ``front``
    (``--grpc-front``): ``naiad``, the gateway's own HTTP/2 connections
    (:mod:`gateway.grpc_front`), or ``grpcio``, a ``grpc.aio`` server; both serve the same
    handlers."""
    largest = limits.max_message_bytes if limits is not None else 2**31 - 1
    handlers = method_handlers(InferenceServicer(dataplane, largest), access, limits)
    if front == "naiad":
        paths = {f"/{SERVICE}/{name}": handler for name, handler in handlers.items()}
        server = GrpcFront(paths, limits, _http2_limits(limits))
        await server.start(host, port, reuse_port)
        try:
            yield server
        finally:
            await server.stop(grace_s)
        return
    options = [("grpc.so_reuseport", int(reuse_port))]
    options += limits.server_options() if limits is not None else []
    aio_server = grpc.aio.server(options=options)
    aio_server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    aio_server.add_registered_method_handlers(SERVICE, handlers)
    aio_server.add_insecure_port(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    await aio_server.start()
    try:
        yield aio_server
    finally:
        await aio_server.stop(grace_s)


def _http2_limits(limits: GrpcLimits | None) -> Http2Limits:
    """The connection timeouts grpc core gets from ``limits`` (:meth:`GrpcLimits.server_options`)."""
    if limits is None:
        return Http2Limits()
    return Http2Limits(handshake_timeout_s=limits.handshake_timeout_s, idle_timeout_s=limits.idle_timeout_s)
