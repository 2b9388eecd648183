"""Sending one request to a model, in one place: validate → time out → place → queue → record.

The gateway's data plane (a client's request, and each step of an ensemble: it counts as a
request of its model) and a worker's BLS calls (a Python model calling another model) send
requests the same way, through :class:`ModelClient`:

1. **validate** the request against the model's config (:func:`naiad.validation.validate_request`)
   and its scheduling parameters (:func:`check_scheduling_parameters`);
2. **time out**: the request's ``timeout`` parameter (µs), or the server's default;
3. **place** it by the model's queue policy (:func:`naiad.queue_policy.place`: its priority
   level's stream and bound, its queue timeout, ``preserve_ordering``);
4. **queue** it (:class:`naiad.queue_client.QueueDispatcher`, which wakes the scaler for a
   model at zero), or answer it another way the caller gives (the gateway's response cache and
   ensemble scheduler);
5. **record** its outcome in the model's statistics, a success or a failure with Triton's
   reason (:func:`naiad.stats.failure_reason`), through the process's
   :class:`naiad.stats_writer.StatsWriter` (Triton counts only requests that reach the
   model: one refused by validation is not counted).

Resolving the model and version (:func:`naiad.registry.select_version`) comes before.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from naiad import queue_policy, stats
from naiad.errors import InvalidInput
from naiad.inference import InferRequest, InferResponse
from naiad.queue_client import QueueDispatcher
from naiad.queue_policy import Placement
from naiad.registry import ModelEntry
from naiad.stats_writer import Add, StatsWriter
from naiad.validation import validate_request

#: Triton's scheduling parameters: ``priority`` (uint64; 0 = the model's default) and
#: ``timeout`` (µs, uint64; 0 = none).
SCHEDULING_PARAMETERS = ("priority", "timeout")

#: How a caller answers a validated request itself: ``(entry, request, timeout_s) -> response``.
Answer = Callable[[ModelEntry, InferRequest, float], Awaitable[InferResponse]]


def check_scheduling_parameters(parameters: dict[str, Any]) -> None:
    """Raise :class:`InvalidInput` unless ``priority`` and ``timeout``, where given, are
    integers in 0..2**64-1 (JSON ``true`` and ``1.5`` are not)."""
    for name in SCHEDULING_PARAMETERS:
        value = parameters.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**64:
            raise InvalidInput(f"parameter '{name}' must be a non-negative integer, got {value!r}")


class ModelClient:
    """Sends requests to models through their queues (module docstring). ``request_timeout_s``:
    the timeout of a request without its own; ``max_queue_size``: the server's bound of a
    queue whose model sets none (0: none)."""

    def __init__(
        self, dispatcher: QueueDispatcher, writer: StatsWriter, request_timeout_s: float,
        max_queue_size: int = 0,
    ):  # fmt: skip
        self.dispatcher = dispatcher
        self.writer = writer
        self.request_timeout_s = request_timeout_s
        self.max_queue_size = max_queue_size

    def timeout_s(self, request: InferRequest) -> float:
        """The request's ``timeout`` (µs) in seconds; none or 0 (Triton: no timeout of its
        own) means the server default. Raises :class:`InvalidInput` for a bad ``priority``
        or ``timeout``; both travel to the worker in the request's parameters."""
        check_scheduling_parameters(request.parameters)
        timeout_us = request.parameters.get("timeout")
        return timeout_us / 1e6 if timeout_us else self.request_timeout_s

    def placement(self, entry: ModelEntry, request: InferRequest) -> Placement:
        """Where ``request`` waits (:func:`naiad.queue_policy.place`): its priority level's
        stream, bounded by the level's ``max_queue_size`` (Triton's queue policy) when set,
        else by the server's; its queue timeout; ``preserve_ordering``."""
        return queue_policy.place(entry.name, entry.config, request.parameters, self.max_queue_size)

    async def queue(self, entry: ModelEntry, request: InferRequest, timeout_s: float) -> InferResponse:
        """Queue ``request`` for ``entry``'s workers and wait at most ``timeout_s`` for its
        answer (the errors of :meth:`QueueDispatcher.infer`)."""
        return await self.dispatcher.infer(request, timeout_s, placement=self.placement(entry, request))

    async def infer(
        self, entry: ModelEntry, request: InferRequest, timeout_s: float | None = None,
        answer: Answer | None = None, extra: Add | None = None, wait_recorded: bool = False,
    ) -> InferResponse:  # fmt: skip
        """Validate ``request`` (resolved to a version of ``entry``), answer it within
        ``timeout_s`` (None: its own timeout) by :meth:`queue` or ``answer``, and record its
        outcome with its duration here, plus ``extra`` counters (e.g. the response cache's).
        ``wait_recorded``: return only once the statistics are written (a BLS caller may read
        them next), the write hurried rather than left to linger (:meth:`StatsWriter.flush`;
        a BLS call waited :data:`naiad.stats_writer.LINGER_S`, 100 ms, for it before stop 43).
        Raises what validation or the answer raises (a cancellation too: the client went
        away), recorded as a failure when validation passed."""
        started_ns = time.perf_counter_ns()
        validate_request(entry.config, request)
        timeout_s = self.timeout_s(request) if timeout_s is None else timeout_s
        try:
            response = await (answer or self.queue)(entry, request, timeout_s)
        except (Exception, asyncio.CancelledError) as exc:
            self.record(request, False, started_ns, stats.failure_reason(exc), extra)
            raise
        self.record(request, True, started_ns, extra=extra)
        if wait_recorded:  # a failed write is logged by the writer
            await self.writer.flush()
        return response

    def record(
        self, request: InferRequest, ok: bool, started_ns: int, reason: str = "OTHER",
        extra: Add | None = None,
    ) -> asyncio.Future[None]:  # fmt: skip
        """Add one request's outcome (a failure with Triton's ``reason``) to its model's
        statistics, written in the background with those of requests finishing meanwhile;
        the future of that write (never awaited on the answer's path)."""
        duration_ns, now_ms = time.perf_counter_ns() - started_ns, int(time.time() * 1000)
        written = self.writer.add_request(request.model, request.version, ok, duration_ns, now_ms, reason)
        return written if extra is None else self.writer.add(extra)  # the same write
