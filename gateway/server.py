"""Assemble and run the gateway: HTTP, gRPC and metrics servers on one event loop.

Every resource (Redis pool, reply reader, listening sites, and for ``naiad serve`` the
local scaler) is opened in :func:`run_gateway` and closed in reverse order on the way out.
Stopping is graceful: HTTP and gRPC stop accepting together, then in-flight requests get
``shutdown_grace_s`` to finish while the reply reader and Redis are still open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pathlib
import shutil
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import redis.asyncio as aioredis
from aiohttp import web

from gateway.access import AccessPolicy
from gateway.dataplane import DataPlane
from gateway.grpc_limits import GrpcLimits
from gateway.grpc_server import grpc_server
from gateway.http import RUNNER_OPTIONS, create_app
from gateway.http_fast import fast_front
from gateway.http_limits import HttpLimits, LimitedAppRunner
from gateway.inflight import SharedInflight
from gateway.limits import ByteBudget
from gateway.liveness import RedisLiveness
from gateway.load_probe import LoadProbe
from gateway.metrics import create_metrics_app
from gateway.registry import ModelRegistry, poll_repository
from gateway.response_cache import WAIT_BLOCK_S, CacheConfig, ResponseCache
from gateway.shared_memory import SystemSharedMemory
from gateway.siblings import (
    Siblings,
    check_ports_free,
    control_folder,
    per_process,
    start_siblings,
    stop_siblings,
    wait_started,
    watch_siblings,
)
from naiad import procs, tasks
from naiad.busy_poll import BusyPoll
from naiad.queue_client import READER_BLOCK_S, QueueDispatcher
from naiad.redis_client import connect
from naiad.reply_channel import ReplyServer
from naiad.settings import Settings
from repository_store import open_store

logger = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def _site(
    app: web.Application, host: str, port: int, limits: HttpLimits, reuse_port: bool = False, **options: Any
) -> AsyncIterator[None]:
    """``app`` served on ``host:port`` under ``limits`` (connections, header and idle
    timeouts); on exit aiohttp closes the listening socket, then waits for in-flight
    handlers (``shutdown_timeout`` in ``options``, default 60 s). ``front`` in ``options``:
    each connection's first protocol (:class:`LimitedAppRunner`); ``reuse_port``: the port
    shared with this server's other gateway processes (:mod:`gateway.siblings`)."""
    runner = LimitedAppRunner(app, limits, access_log=None, **options)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, reuse_port=reuse_port or None).start()
        yield
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def _dispatcher(
    redis: aioredis.Redis, redis_url: str, settings: Settings
) -> AsyncIterator[QueueDispatcher]:  # fmt: skip
    """The gateway's queue client, with its direct reply channel per ``direct_replies``,
    which also hands requests to idle workers per ``direct_requests`` (:mod:`naiad.reply_channel`;
    closed after the client stopped), checking the heartbeat of one that holds a request
    a heartbeat period unanswered."""
    reader = connect(redis_url, longest_block_s=READER_BLOCK_S)
    dispatcher = QueueDispatcher(redis, reader)
    hand_off = settings.direct_requests
    orphaned = dispatcher.orphaned if hand_off else None
    replies = None
    if settings.direct_replies:
        replies = ReplyServer(dispatcher.deliver, dispatcher.record_executions, orphaned)
    if replies is not None:
        try:
            await replies.start()
        except OSError as exc:  # e.g. a TMPDIR too long for a socket's path: replies go through Redis
            logger.warning("no direct reply channel (%s): every reply goes through Redis", exc)
            replies = None
        else:
            dispatcher.reply_address = replies.address
            dispatcher.direct = replies if hand_off else None
            dispatcher.liveness_s = settings.heartbeat_s
    await dispatcher.start()
    try:
        yield dispatcher
    finally:
        await dispatcher.stop()
        if replies is not None:
            await replies.close()
        await reader.aclose()


@contextlib.asynccontextmanager
async def _endpoints(settings: Settings, dataplane: DataPlane, limits: HttpLimits) -> AsyncIterator[None]:
    """The HTTP and gRPC endpoints, one byte budget for both (``limits.budget``); on the way
    out both stop accepting, then give in-flight requests ``shutdown_grace_s`` to finish."""
    grace = settings.shutdown_grace_s
    http_access = AccessPolicy(settings.http_restricted_api, "--http-restricted-api")
    grpc_access = AccessPolicy(settings.grpc_restricted_protocol, "--grpc-restricted-protocol")
    app = create_app(dataplane, settings.http_max_body_bytes, http_access, limits)
    front = fast_front(dataplane, limits, http_access) if settings.http_fast_infer else None
    shared = settings.gateway_processes > 1 or bool(settings.gateway_sibling_of)
    http = _site(
        app, settings.http_host, settings.http_port, limits, reuse_port=shared, shutdown_timeout=grace,
        front=front, **RUNNER_OPTIONS,
    )
    rpc_limits = GrpcLimits(
        limits.budget, settings.grpc_max_message_bytes, settings.http_body_timeout_s,
        settings.http_header_timeout_s, settings.http_keepalive_timeout_s,
    )  # fmt: skip
    rpc = grpc_server(
        dataplane, settings.http_host, settings.grpc_port, grace_s=grace, access=grpc_access,
        limits=rpc_limits, reuse_port=shared, front=settings.grpc_front,
    )
    await http.__aenter__()
    try:
        await rpc.__aenter__()
    except BaseException:
        await http.__aexit__(None, None, None)
        raise
    try:
        yield
    finally:
        await asyncio.gather(rpc.__aexit__(None, None, None), http.__aexit__(None, None, None))


@contextlib.asynccontextmanager
async def _background(coroutine: Coroutine[Any, Any, None]) -> AsyncIterator[None]:
    """Run ``coroutine`` as a task for the duration of the block, cancelled on the way out."""
    task = asyncio.create_task(coroutine)
    try:
        yield
    finally:
        await tasks.cancel_and_wait(task)  # a plain cancel may be lost (naiad.tasks)


async def _response_cache(
    stack: contextlib.AsyncExitStack, settings: Settings, redis: aioredis.Redis, redis_url: str
) -> ResponseCache | None:
    """The response cache (``--cache-config``), with its own client for followers' BLPOPs;
    None when the server side of the cache is off."""
    if not settings.response_cache_enabled:
        return None
    blocking = connect(redis_url, longest_block_s=WAIT_BLOCK_S)
    stack.push_async_callback(blocking.aclose)
    config = CacheConfig(settings.response_cache_max_bytes, settings.response_cache_ttl_s)
    return ResponseCache(redis, blocking, config)


async def run_gateway(settings: Settings, redis_url: str, stop: asyncio.Event) -> None:
    """Serve until ``stop`` is set. Indexes the repository into Redis at start (a sibling
    process, :mod:`gateway.siblings`, reads what the first one indexed)."""
    sibling = bool(settings.gateway_sibling_of)
    if not sibling:  # the process count resolved once; its siblings get the same share of the limits
        settings = per_process(settings)
        if settings.gateway_processes > 1:
            check_ports_free(settings.http_host, [settings.http_port, settings.grpc_port])
    async with contextlib.AsyncExitStack() as stack:
        redis = connect(redis_url)
        stack.push_async_callback(redis.aclose)
        store = await asyncio.to_thread(open_store, settings.model_repository)
        probe = LoadProbe(settings.model_repository, settings.cache_dir, settings.cache_max_bytes)
        registry = ModelRegistry(redis, store, load_check=probe)
        if sibling:
            await registry.sync()
        else:
            await registry.start(settings.model_control_mode, settings.load_model)
        if settings.model_control_mode == "poll" and not sibling:
            polling = poll_repository(registry, settings.repository_poll_secs)
            await stack.enter_async_context(_background(polling))
        dispatcher = await stack.enter_async_context(_dispatcher(redis, redis_url, settings))
        cache = await _response_cache(stack, settings, redis, redis_url)
        dataplane = DataPlane(
            redis, registry, dispatcher, settings.request_timeout_s, settings.model_control_mode,
            cache=cache, max_queue_size=settings.max_queue_size, max_inflight=settings.max_inflight,
            shared_memory=SystemSharedMemory(settings.http_max_body_bytes),
        )
        dispatcher.stats_sink = dataplane.stats_writer.add  # a batch's statistics sent with its replies
        if dispatcher.direct is not None:  # a request alone in this gateway is handed at once
            dispatcher.direct.lone = dataplane.alone
            if settings.busy_poll_us:  # and its answer polled for (naiad.busy_poll)
                dispatcher.busy_poll = BusyPoll(settings.busy_poll_us / 1e6, dataplane.alone_in_server)
        liveness = RedisLiveness(redis, settings.redis_down_grace_s)
        dataplane.liveness = liveness.live
        await stack.enter_async_context(_background(liveness.run()))
        stack.callback(dataplane.shared_memory.close)  # after the endpoints closed
        stack.push_async_callback(dataplane.close)  # after the endpoints closed
        limits = HttpLimits.from_settings(settings, ByteBudget(settings.max_buffered_bytes))
        await stack.enter_async_context(_siblings(settings, dataplane))
        await stack.enter_async_context(_endpoints(settings, dataplane, limits))
        if sibling:
            logger.info("gateway process %d serving on the same ports", os.getpid())
            procs.report_ready()  # the first process is not ready until its siblings are
            await stop.wait()
            return
        # /metrics is the 'metrics' API group of --http-restricted-api.
        access = AccessPolicy(settings.http_restricted_api)
        metrics = create_metrics_app(registry, access, dataplane.flush_statistics)
        metrics_host = settings.metrics_address or settings.http_host
        await stack.enter_async_context(_site(metrics, metrics_host, settings.metrics_port, limits))
        await stack.enter_async_context(_sibling_processes(settings, redis_url, dataplane))
        logger.info(
            "serving %s: HTTP on :%d, gRPC on :%d (%s front), metrics on :%d",
            settings.model_repository, settings.http_port, settings.grpc_port, settings.grpc_front,
            settings.metrics_port,
        )
        await stop.wait()


@contextlib.asynccontextmanager
async def _siblings(settings: Settings, dataplane: DataPlane) -> AsyncIterator[None]:
    """This process's control socket among the server's gateway processes, when there are
    several (:mod:`gateway.siblings`); the first process makes their folder."""
    if settings.gateway_processes <= 1 and not settings.gateway_sibling_of:
        yield
        return
    folder = pathlib.Path(settings.gateway_sibling_of) if settings.gateway_sibling_of else control_folder()
    siblings = Siblings(folder, dataplane.sibling_handlers())
    await siblings.start()
    dataplane.siblings = siblings
    try:
        dataplane.shared_inflight = SharedInflight(folder)  # before the siblings start: the first makes it
    except OSError as exc:  # only busy polling needs it (naiad.busy_poll): it stays off then
        logger.warning("no shared count of the gateway processes' requests (%s): no busy polling", exc)
    dataplane.siblings_starting = not settings.gateway_sibling_of  # until _sibling_processes saw them serve
    try:
        yield
    finally:
        dataplane.siblings = None
        if dataplane.shared_inflight is not None:
            dataplane.shared_inflight, shared = None, dataplane.shared_inflight
            shared.close()
        await siblings.close()
        if not settings.gateway_sibling_of:  # the first process made the folder
            shutil.rmtree(folder, ignore_errors=True)


@contextlib.asynccontextmanager
async def _sibling_processes(settings: Settings, redis_url: str, dataplane: DataPlane) -> AsyncIterator[None]:
    """The first process's siblings (``--gateway-processes``), started once its ports are
    bound (a port in use fails here first) and stopped before it closes them."""
    if dataplane.siblings is None:
        yield
        return
    folder = dataplane.siblings.folder
    processes = start_siblings(settings, redis_url, folder)
    try:
        await wait_started(processes)
        dataplane.siblings_starting = False
        async with _background(watch_siblings(processes)):
            yield
    finally:
        await asyncio.to_thread(stop_siblings, processes, settings.shutdown_grace_s)
