"""Running one dynamic batch of one version: merge, run, split, and Triton's phase timings.

:class:`BatchExecutor` is the one place a worker runs a batch. For a merged backend (ONNX
Runtime, TorchScript, SavedModel) it times Triton's three compute phases (statistics
extension): ``compute_input`` (reshape to the config's ``reshape``, merge along dimension 0:
:func:`workers.batching.merge`), ``compute_infer`` (the backend) and ``compute_output``
(reshape back, split per request: :func:`workers.batching.split`, encode the replies). A
request-level backend (Triton's Python backend, ``execute_requests``, see
:class:`workers.backends.Backend`) takes the batch's requests as they are and answers each on
its own, outputs or the error that fails that request alone; its phases are kept alike:
compute_input 0 (nothing to merge), compute_infer (the backend), compute_output (encoding).

The backend runs in the model's thread (:mod:`workers.model_thread`, the one that loaded it).
For a merged backend that is a thread of its own, so the worker's event loop (heartbeats,
claims) keeps going, unless the batch is expected to compute within :data:`INLINE_INFER_S`:
then a thread hand-off would cost more than the model, and it runs on the event loop
(:func:`expected_ns`, from what batches of as many input elements took: a batch of the same
rows but longer sequences, or larger images, is another size class). A request-level
backend (a Python model) runs all its calls on the thread it loaded on: the event loop's own
(:func:`workers.loader.runs_on_loop`; its time depends on its input and its code on anything
it imports, so no estimate decides, docs/benchmarks.md "Stop 22": the loop's stall is made
safe instead, :mod:`naiad.loop_stall`), else a thread of its own.
"""

from __future__ import annotations

import logging
import math
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

import numpy as np

from naiad import logs, stats, tracing
from naiad.codec import QueuedRequest, Reply, encode_reply
from naiad.datatypes import datatype_of
from naiad.errors import InferenceFailed, NaiadError
from naiad.inference import Tensor
from workers import batching, model_thread, rate_limiter, spin_watch
from workers.loader import VersionLoader
from workers.model import ModelRunner

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: A batch expected to compute within this many seconds runs on the event loop.
INLINE_INFER_S = 0.001


class BatchExecutor:
    """Runs the batches of one worker's model through the versions ``loader`` loads."""

    def __init__(self, model: str, loader: VersionLoader):
        self.model = model
        self.loader = loader
        #: Triton's rate limiter (``--rate-limit execution_count``): a batch runs only with its
        #: instance group's resources held, machine-wide; None: off, or no resources.
        self.rate_limit: rate_limiter.RateLimiter | None = None
        # each runner's last compute_infer (ns) per batch size class (input elements' bit_length())
        self._infer_ns: weakref.WeakKeyDictionary[ModelRunner, dict[int, int]] = weakref.WeakKeyDictionary()
        #: Runs the batches that do not run on the loop: the model's thread, which loaded it.
        self.thread = loader.thread
        #: Framework threads that busy-wait go to SCHED_IDLE between batches (:mod:`workers.spin_watch`).
        self.spin_watch = spin_watch.watch(loader.settings.demote_spinning_threads)

    async def execute(self, group: list[QueuedRequest]) -> tuple[list[bytes], stats.Execution | None]:
        """Run ``group`` (one batch, one version): the encoded replies in ``group`` order, and
        the batch's statistics if it ran. Never raises for the model's sake: a failure of the
        whole batch answers each of its requests with the error. With the batch's log context
        (version, request ids) and, when tracing is on, a ``naiad.queue`` span per request
        and the ``naiad.batch`` span."""
        version, ids = group[0].request.version, [q.request_id for q in group]
        started_ns = time.time_ns()
        attributes, links = None, []
        if tracing.enabled():
            for queued in group:
                tracing.record("naiad.queue", int(queued.enqueued_at * 1e9), started_ns,
                               {"naiad.request_id": queued.request_id}, parent=queued.traceparent)
            attributes = {"naiad.model": self.model, "naiad.version": version,
                          "naiad.request_ids": ids, "naiad.batch_requests": len(group)}
            links = [q.traceparent for q in group]
        with logs.request_context(logs.batch_ids(ids), version=version), tracing.span(
            "naiad.batch", attributes, kind="consumer", parent=group[0].traceparent,
            links=links,
        ):
            payloads, run = await self._execute_batch(group)
            elapsed_ms = (time.time_ns() - started_ns) / 1e6
            logger.debug("batch of %d requests done in %.2f ms", len(group), elapsed_ms)
            return payloads, run

    async def _execute_batch(
        self, group: list[QueuedRequest]
    ) -> tuple[list[bytes], stats.Execution | None]:
        if self.spin_watch is not None:  # before the version's load: it is the batch's time
            self.spin_watch.batch_started()
        try:
            runner = await self.loader.get(group[0].request.version)
            async with rate_limiter.slot(self.rate_limit):
                if is_request_level(runner):
                    return await run_requests(runner, group, self.thread, self.spin_watch)
                return await self._run_merged(runner, group)
        except Exception as exc:
            return self._failed(group, exc), None
        finally:
            if self.spin_watch is not None:
                self.spin_watch.batch_ended()

    def runnable_now(self, version: int, elements: int) -> ModelRunner | None:
        """The runner :meth:`execute_now` would run a batch of ``version`` on (``elements``:
        its inputs' element count, all inputs together), or None when that batch needs
        something awaited: a version not loaded yet, the rate limiter, a request-level
        backend (a Python model) in a thread of its own, a merged batch not expected to
        compute inline (:meth:`inline`), or tracing (its spans)."""
        runner = self.loader.loaded(version)
        if runner is None or self.rate_limit is not None or tracing.enabled():
            return None
        if is_request_level(runner):
            return runner if self.thread.on_loop else None
        return runner if self.inline(runner, elements) else None

    def execute_now(
        self, runner: ModelRunner, group: list[QueuedRequest]
    ) -> tuple[list[bytes], stats.Execution | None]:  # fmt: skip
        """:meth:`execute` within the caller's turn of the event loop, on ``runner`` (from
        :meth:`runnable_now`, the same turn): nothing awaited, the same replies, statistics
        and log context (a lone request handed to an idle worker: :mod:`workers.worker`)."""
        ids = [q.request_id for q in group]
        with logs.request_context(logs.batch_ids(ids), version=group[0].request.version):
            if self.spin_watch is not None:
                self.spin_watch.batch_started()
            try:
                started_ns = time.time_ns()
                if is_request_level(runner):
                    done = requests_done(runner, group, self.thread.call, self.spin_watch)
                else:
                    prepared = self._prepare(runner, group)
                    done = self._finish(runner, group, prepared, self._infer_inline(runner, prepared))
                elapsed_ms = (time.time_ns() - started_ns) / 1e6
                logger.debug("batch of %d requests done in %.2f ms", len(group), elapsed_ms)
                return done
            except Exception as exc:
                return self._failed(group, exc), None
            finally:
                if self.spin_watch is not None:
                    self.spin_watch.batch_ended()

    def _failed(self, group: list[QueuedRequest], exc: Exception) -> list[bytes]:
        """A failure of the whole batch: each request answered with it. A backend's own
        error reaches the client with its text (:class:`InferenceFailed`)."""
        if not isinstance(exc, NaiadError):
            logger.exception("inference failed on model '%s'", self.model)
            exc = InferenceFailed(f"inference failed: {exc}")
        return [encode_reply(Reply(q.queue_id, error=exc)) for q in group]

    async def _run_merged(
        self, runner: ModelRunner, group: list[QueuedRequest]
    ) -> tuple[list[bytes], stats.Execution]:
        """Triton's phases, timed (module docstring) around merge, run, split."""
        prepared = self._prepare(runner, group)
        if self.inline(runner, prepared.elements):
            results = self._infer_inline(runner, prepared)
        else:
            with tracing.span("naiad.backend", {"naiad.batch_rows": sum(prepared.sizes)}):
                infer, feed, names = runner.backend.infer, prepared.feed, prepared.names
                results = await self.thread.run(_with_spinners, self.spin_watch, infer, feed, names)
        return self._finish(runner, group, prepared, results)

    def _prepare(self, runner: ModelRunner, group: list[QueuedRequest]) -> _Prepared:
        """compute_input: the batch's rows per request, merged into the backend's feed."""
        requests = [queued.request for queued in group]
        started_s, t0 = time.time(), time.perf_counter_ns()
        batched = runner.config.max_batch_size > 0
        sizes = [batching.rows(r) if batched else 1 for r in requests]
        feed = runner.feed(batching.merge(requests), sum(sizes))
        names = runner.names([o.name for o in requests[0].outputs])
        elements = sum([array.size for array in feed.values()])
        return _Prepared(started_s, t0, batched, sizes, feed, names, elements, time.perf_counter_ns())

    def _infer_inline(self, runner: ModelRunner, prepared: _Prepared) -> Any:
        """compute_infer on the event loop (:meth:`inline`)."""
        with tracing.span("naiad.backend", {"naiad.batch_rows": sum(prepared.sizes)}):
            return _with_spinners(self.spin_watch, runner.backend.infer, prepared.feed, prepared.names)

    def _finish(
        self, runner: ModelRunner, group: list[QueuedRequest], prepared: _Prepared, results: Any
    ) -> tuple[list[bytes], stats.Execution]:  # fmt: skip
        """compute_output: the outputs restored, split per request and encoded; the batch's
        statistics (its compute_infer also kept for :meth:`inline`)."""
        t1, t2 = prepared.t1, time.perf_counter_ns()
        self._infer_ns.setdefault(runner, {})[prepared.elements.bit_length()] = t2 - t1
        rows = sum(prepared.sizes)
        outputs = runner.restore(results, prepared.names, rows)
        parts = batching.split(outputs, prepared.sizes) if prepared.batched else [outputs]
        phases = {"compute_input": t1 - prepared.t0, "compute_infer": t2 - t1}
        payloads = [
            encode_reply(Reply(q.queue_id, _tensors(part), timings_ns=dict(phases)))
            for q, part in zip(group, parts, strict=True)
        ]
        phases["compute_output"] = time.perf_counter_ns() - t2
        return payloads, _execution(group[0].request.version, rows, group, prepared.started_s, phases)

    def inline(self, runner: ModelRunner, elements: int) -> bool:
        """Run this batch (``elements``: its inputs' element count, all inputs together) on
        the event loop, not in a thread: when it is expected to take under
        :data:`INLINE_INFER_S` (:func:`expected_ns` of what ``runner`` took before)."""
        return expected_ns(self._infer_ns.get(runner, {}), elements) < INLINE_INFER_S * 1e9


class _Prepared(NamedTuple):
    """A merged batch ready for its backend (:meth:`BatchExecutor._prepare`): when it started
    (``time.time()`` s, and ``t0``/``t1`` ``perf_counter_ns`` around compute_input), whether
    the model batches, each request's rows (1 each when it does not), the feed, the output
    names, and the feed's element count."""

    started_s: float
    t0: int
    batched: bool
    sizes: list[int]
    feed: dict[str, np.ndarray]
    names: list[str]
    elements: int
    t1: int


def is_request_level(runner: ModelRunner) -> bool:
    """True when ``runner``'s backend answers requests one by one (``execute_requests``)."""
    return callable(getattr(runner.backend, "execute_requests", None))


async def run_requests(
    runner: ModelRunner, group: Sequence[QueuedRequest], thread: model_thread.ModelThread,
    spinners: spin_watch.SpinWatch | None = None,
) -> tuple[list[bytes], stats.Execution]:
    """Run ``group`` (one batch, one version) through the backend's ``execute_requests``,
    in ``thread`` (``spinners``, when given, at ``SCHED_OTHER`` there while it runs): the
    encoded replies in ``group`` order and the batch's statistics. Raises what the backend
    raises when the whole batch fails."""
    if thread.on_loop:  # nothing to await: the model runs in this turn (workers.model_thread)
        return requests_done(runner, group, thread.call, spinners)
    requests = [queued.request for queued in group]
    rows, started_s, t1 = _rows_of(runner, requests), time.time(), time.perf_counter_ns()
    spinners = around_model_code(spinners)
    with tracing.span("naiad.backend", {"naiad.batch_rows": rows, "naiad.batch_requests": len(group)}):
        results = await thread.run(_with_spinners, spinners, runner.backend.execute_requests, requests)  # type: ignore[attr-defined]
    return _answered(group, results, rows, started_s, t1)


def requests_done(
    runner: ModelRunner, group: Sequence[QueuedRequest], call: Callable[..., Any],
    spinners: spin_watch.SpinWatch | None = None,
) -> tuple[list[bytes], stats.Execution]:
    """:func:`run_requests` through ``call`` (:meth:`workers.model_thread.ModelThread.call`:
    the event loop's thread, now), nothing awaited."""
    requests = [queued.request for queued in group]
    rows, started_s, t1 = _rows_of(runner, requests), time.time(), time.perf_counter_ns()
    spinners = around_model_code(spinners)
    with tracing.span("naiad.backend", {"naiad.batch_rows": rows, "naiad.batch_requests": len(group)}):
        results = call(_with_spinners, spinners, runner.backend.execute_requests, requests)  # type: ignore[attr-defined]
    return _answered(group, results, rows, started_s, t1)


def around_model_code(spinners: spin_watch.SpinWatch | None) -> spin_watch.SpinWatch | None:
    """Who moves the spinners around a request-level batch (a Python model's ``execute``, its
    own Python around its framework's run): ``spinners`` when a library whose parallel runs
    wait for every pool thread is loaded (an OpenMP runtime, TensorFlow:
    :attr:`workers.spin_watch.SpinWatch.static_shares`), else None: they stay at
    ``SCHED_IDLE`` through it (:mod:`workers.spin_watch`, "A Python-backend model.py")."""
    return spinners if spinners is not None and spinners.static_shares else None


def _rows_of(runner: ModelRunner, requests: Sequence[Any]) -> int:
    """The batch's rows: its requests' first dimensions when the model batches, else one each."""
    return sum([batching.rows(r) for r in requests]) if runner.config.max_batch_size > 0 else len(requests)


def _answered(
    group: Sequence[QueuedRequest], results: Sequence[Any], rows: int, started_s: float, t1: int
) -> tuple[list[bytes], stats.Execution]:
    """The encoded replies of a request-level batch (per request its outputs or its error)
    and its statistics (compute_infer from ``t1``, ``perf_counter_ns``, to now)."""
    t2 = time.perf_counter_ns()
    phases = {"compute_input": 0, "compute_infer": t2 - t1}
    payloads = [
        encode_reply(Reply(q.queue_id, error=result) if isinstance(result, NaiadError)
                     else Reply(q.queue_id, result, timings_ns=dict(phases)))
        for q, result in zip(group, results, strict=True)
    ]  # fmt: skip
    phases["compute_output"] = time.perf_counter_ns() - t2
    return payloads, _execution(group[0].request.version, rows, group, started_s, phases)


def _with_spinners(spinners: spin_watch.SpinWatch | None, function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` with ``spinners`` at ``SCHED_OTHER`` while it runs, moved by the
    thread that runs it (:meth:`workers.spin_watch.SpinWatch.busy` and ``idle``): not while
    it waits to run, nor while the loop it answers waits to wake."""
    if spinners is None:
        return function(*args)
    spinners.busy()
    try:
        return function(*args)
    finally:
        spinners.idle()


def _execution(
    version: int, rows: int, group: Sequence[QueuedRequest], started_s: float, phases: dict[str, int]
) -> stats.Execution:
    """The statistics of one executed batch: each request's queue time (enqueue → the batch
    started, ns) and the phases."""
    queue_ns = [max(0, int((started_s - q.enqueued_at) * 1e9)) for q in group]
    return stats.Execution(version, rows, queue_ns, phases, int(time.time() * 1000))


def expected_ns(by_class: dict[int, int], size: int) -> float:
    """A batch's expected compute time (ns), ``size`` its inputs' element count, from
    ``by_class`` (the last time per size class, ``size.bit_length()``): the same class's time;
    else the nearest smaller class's time scaled by the size, else a larger class's time; inf
    when nothing was seen (a thread, once). A batch usually costs less per element than a
    smaller one, so the scaling usually overestimates; a model whose cost grows faster than
    its input (attention along a sequence) is underestimated, and a BYTES element counts one
    whatever its length: such a batch may run on the loop once, its time then sending its
    class to a thread."""
    size_class = size.bit_length()
    if size_class in by_class:
        return by_class[size_class]
    smaller = [c for c in by_class if c < size_class]
    if smaller:
        nearest = max(smaller)
        return by_class[nearest] * size / (1 << (nearest - 1) if nearest else 1)
    return min(by_class.values(), default=math.inf)


def _tensors(arrays: dict[str, np.ndarray]) -> list[Tensor]:
    return [Tensor(name, datatype_of(a.dtype), list(a.shape), a) for name, a in arrays.items()]
