"""Business Logic Scripting: a worker's Python model calling another model.

``pb_utils.InferenceRequest(...).exec()`` / ``async_exec()`` (python_backend README, "Business
Logic Scripting") land in :meth:`BlsClient.submit`, called from the thread that runs the
model's ``execute``. The request travels exactly as a client's does through a gateway: resolved
against the registry by the same rules (:func:`naiad.registry.select_version`;
``model_version`` -1: the newest version served), then validated, timed, placed, queued and
counted in the target's statistics by the same :class:`naiad.model_client.ModelClient` (the
queue wakes the scaler when the target has no worker, so a model at zero starts). The
dispatcher, with its own reply list (``naiad:reply:bls-<worker id>``) and its own Redis
clients, lives on an event loop of its own in a daemon thread ("naiad-bls"), not on the
worker's: a Python model's ``execute`` may run on the worker's event-loop thread, and an
``exec`` made there blocks that loop until the answer comes, which a dispatcher on that loop
could never read. ``exec`` waits on a :class:`concurrent.futures.Future`; ``async_exec`` wraps
the same future on the caller's loop; both work from any thread. Every failure comes back as
the response's ``error()``, never raised, of code INTERNAL, as Triton 2.51's stub gives BLS
errors; an unknown model has Triton's message. An ensemble target is refused at once:
ensembles are scheduled by the gateway (:mod:`gateway.ensemble`), and no worker reads an
ensemble's queue.

The thread, its loop and its connections start on the first BLS call, so a worker whose model
never calls another model holds no extra thread or Redis connection. A call after
:meth:`BlsClient.close` (the worker is stopping) is answered at once with an error
(:data:`CLOSED`), as is one still waiting when the client closes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
from collections.abc import Coroutine
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

import triton_python_backend_utils as pb_utils
from naiad import tasks
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

#: The name of the thread that runs the BLS client's event loop.
THREAD_NAME = "naiad-bls"
#: The error of a BLS call sent after the client closed, or still waiting when it closed.
CLOSED = "BLS client is closed: the worker is stopping"
#: Seconds :meth:`BlsClient.close` waits for the close work (flush, dispatcher, connections)
#: on the BLS loop, then for its thread to end.
CLOSE_S, JOIN_S = 10.0, 5.0


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
    """Sends this worker's BLS requests through the target models' queues, from an event loop
    of its own in a daemon thread (module doc), started by the first :meth:`submit`. Every
    object bound to an asyncio loop (Redis clients, registry reader, dispatcher, statistics
    writer, lock) is made and used on that loop only. :meth:`submit` may be called from any
    thread, the worker's loop thread included, even while it blocks on the answer."""

    def __init__(self, settings: Settings, redis_url: str, worker_id: str):
        self.settings = settings
        self.redis_url = redis_url
        self.client_id = f"bls-{worker_id}"
        self._guard = threading.Lock()  # the thread's start and the close, against submits
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # bound to the loop that first uses them (the BLS loop); no connection before that
        self.redis = connect(redis_url)
        self.registry = RegistryReader(self.redis)
        self._starting = asyncio.Lock()
        self._client: ModelClient | None = None  # with its reply reader, made by _started
        self._reader: Redis | None = None

    def submit(
        self, request: pb_utils.InferenceRequest
    ) -> concurrent.futures.Future[pb_utils.InferenceResponse]:
        """Send ``request`` from any thread; the future's result is its response. After
        :meth:`close` the future is already resolved, to an error response (:data:`CLOSED`)."""
        with self._guard:  # scheduled under the guard: a close that follows sees the call
            if self._closed:
                return _resolved(_failed(CLOSED))
            if self._loop is None:
                self._start()
            assert self._loop is not None
            return asyncio.run_coroutine_threadsafe(self._answer(request), self._loop)

    def _start(self) -> None:
        """Start the BLS loop in its daemon thread (holding ``_guard``)."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=_run_forever, args=(loop,), name=THREAD_NAME, daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread

    async def _answer(self, request: pb_utils.InferenceRequest) -> pb_utils.InferenceResponse:
        """:meth:`execute`, on the BLS loop; a call cancelled by :meth:`close` is answered
        with :data:`CLOSED` (any other cancellation, its caller's, stays one)."""
        try:
            return await self.execute(request)
        except asyncio.CancelledError:
            if self._closed:
                return _failed(CLOSED)
            raise

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
        """Close the client, on the worker's loop: when its thread started, run the close work
        on the BLS loop (:meth:`_close_on_loop`, at most :data:`CLOSE_S`), waited for without
        blocking the caller's loop, then stop that loop, join its thread (at most
        :data:`JOIN_S`) and close the loop. Later calls are answered :data:`CLOSED`; a second
        close does nothing. Raises what the close work raised, once the thread is stopped."""
        with self._guard:
            self._closed = True
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        try:
            await _wait_on(loop, self._close_on_loop(), CLOSE_S)
        finally:
            await _stop(loop, thread)

    async def _close_on_loop(self) -> None:
        """On the BLS loop: write the statistics still held, stop the reply reader (waiting
        calls are cancelled: answered :data:`CLOSED`), end every other task of the loop, and
        close the connections."""
        try:
            if self._client is not None:
                await self._client.writer.flush()
                await self._client.dispatcher.stop()
            await _end_other_tasks()
        finally:
            for client in (self._reader, self.redis):
                if client is not None:  # the reader: only once a call started the dispatcher
                    await client.aclose()


def _run_forever(loop: asyncio.AbstractEventLoop) -> None:
    """The BLS thread: run ``loop`` until :meth:`BlsClient.close` stops it."""
    asyncio.set_event_loop(loop)
    loop.run_forever()


def _resolved(response: pb_utils.InferenceResponse) -> concurrent.futures.Future[pb_utils.InferenceResponse]:
    """A future already resolved to ``response``: :meth:`BlsClient.submit`'s answer once closed."""
    done: concurrent.futures.Future[pb_utils.InferenceResponse] = concurrent.futures.Future()
    done.set_result(response)
    return done


async def _wait_on(
    loop: asyncio.AbstractEventLoop, work: Coroutine[Any, Any, None], timeout_s: float
) -> None:
    """Run ``work`` on ``loop`` (another thread's) and wait for it from the caller's loop, at
    most ``timeout_s`` (then it is cancelled and a warning logged). Raises what it raised."""
    try:
        await asyncio.wait_for(asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, loop)), timeout_s)
    except TimeoutError:
        logger.warning("the BLS client did not close within %.0f s", timeout_s)


async def _end_other_tasks() -> None:
    """Cancel every task of the running loop but the caller's and wait until they end."""
    current = asyncio.current_task()
    others = [task for task in asyncio.all_tasks() if task is not current]
    await asyncio.gather(*(tasks.cancel_and_wait(task) for task in others), return_exceptions=True)


async def _stop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """Stop ``loop``, join ``thread`` that runs it (at most :data:`JOIN_S`, in a worker thread
    of the caller's loop, not blocking it), then close the loop."""
    loop.call_soon_threadsafe(loop.stop)
    await asyncio.to_thread(thread.join, JOIN_S)
    if thread.is_alive():
        logger.warning("the BLS thread did not end within %.0f s; its loop is left open", JOIN_S)
        return
    loop.close()


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


def install(settings: Settings, redis_url: str, worker_id: str) -> BlsClient:
    """A BLS client for this worker, reachable from ``pb_utils.InferenceRequest.exec``; it
    starts nothing until the first call, then connects to ``redis_url`` from its own loop.
    Close it (:meth:`BlsClient.close`, on the worker's loop) when the worker exits."""
    client = BlsClient(settings, redis_url, worker_id)
    pb_utils._install_bls(client.submit)  # noqa: SLF001 - the module's hook for its host
    return client
