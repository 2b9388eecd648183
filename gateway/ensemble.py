"""The ensemble scheduler: an ensemble's steps run in the gateway, each step an inference
request to its composing model through that model's queue, like a client's request.

Semantics follow Triton (docs user_guide/ensemble_models.md; core's
``ensemble_scheduler.cc``):

- **Data flow**: a step starts as soon as every ensemble tensor it reads exists, so steps
  that do not depend on each other run at the same time (one asyncio task each). Only the
  steps the requested outputs depend on run (the others are pruned).
- **Step requests** carry the ensemble request's ``id`` and parameters (``priority``;
  ``timeout`` becomes the time left of the ensemble's deadline, which also bounds each
  step's wait), ask for every output the step maps, and go through the data plane's own
  path for the composing model: validation against its config, its response cache, its
  queue, its statistics (a step counts as a request of its model, as in Triton).
- **Failure**: the first step that fails fails the request; the steps still running are
  cancelled (their queue entries withdrawn). The error keeps its class, so its status, and
  says where: ``in ensemble 'E', step 1 ('M'): <the step's message>``.
- **Batching**: a tensor carries the batch size it was made with (0: not batched). Passed
  between a batching and a non-batching config, it gains a leading 1 or loses its batch
  dimension of 1 where the receiving dims need it (Triton's ``ReshapeTensorDims``).
- **Missing tensors**: an optional ensemble input not given, or a mapped output a step did
  not return, is absent: a step reading it gets no such input (its validation decides), and
  a requested ensemble output that is absent fails the request.
- **Statistics** of the ensemble itself: the data plane records its success or failure and
  duration like any model's; here each success also counts one execution of the request's
  batch size (``execution_count``, ``inference_count``, ``batch_stats``), with zero compute
  durations: Triton sums its composing models' there, which run in workers and keep their
  own statistics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from naiad import stats, tracing
from naiad.errors import DeadlineExceeded, InferenceFailed, NaiadError
from naiad.inference import InferRequest, InferResponse, RequestedOutput, Tensor
from naiad.registry import ModelEntry
from naiad.stats_writer import StatsWriter
from repository_store.ensemble import LATEST, EnsembleGraph, EnsembleStep, dims_agree

logger = logging.getLogger(__name__)

#: ``resolve(model, version)`` -> the entry and version number (``version`` '' = newest);
#: :meth:`gateway.dataplane.DataPlane.resolve`.
Resolve = Callable[[str, str], Awaitable[tuple[ModelEntry, int]]]
#: ``serve(entry, request, timeout_s)`` -> the answer of one model to ``request``, validated
#: and recorded as a request of that model; the data plane's path for any request.
Serve = Callable[[ModelEntry, InferRequest, float], Awaitable[InferResponse]]


def batch_shape(dims: Sequence[int], batching: bool, tensor_batch: int, shape: Sequence[int]) -> list[int]:
    """The shape a tensor of ``shape``, made with batch size ``tensor_batch`` (0: not
    batched), takes where a config of ``dims`` (without batch dimension; ``batching``:
    ``max_batch_size > 0``) reads it. Triton's ``ReshapeTensorDims``: a batching reader of
    an unbatched tensor that fits ``dims`` gets a leading 1; a non-batching reader of a
    batch-of-1 tensor that does not fit ``dims`` gets it without the batch dimension;
    anything else is passed unchanged (and validated by the reader)."""
    shape = list(shape)
    if batching == (tensor_batch != 0):
        return shape
    if batching:
        return [1, *shape] if dims_agree(dims, shape) else shape
    if tensor_batch == 1 and not dims_agree(dims, shape):
        return shape[1:]
    return shape


def _config_dims(spec: mc.ModelInput | mc.ModelOutput) -> list[int]:
    return list(spec.reshape.shape) if spec.HasField("reshape") else list(spec.dims)


def in_step(ensemble: str, step: EnsembleStep, exc: NaiadError) -> NaiadError:
    """``exc`` of the same class (so the same status), its message saying where it happened."""
    return type(exc)(f"in ensemble '{ensemble}', {step}: {exc.message}")


@dataclass
class _Value:
    """An ensemble tensor once known: the tensor (None: absent) and its batch size (0: the
    config that made it does not batch)."""

    tensor: Tensor | None
    batch: int


class EnsembleScheduler:
    """Runs ensemble requests; ``resolve`` and ``serve`` are the data plane's (see
    :data:`Resolve`, :data:`Serve`); ``writer`` writes the ensemble's execution counts with
    the gateway's other statistics (None: not recorded)."""

    def __init__(self, resolve: Resolve, serve: Serve, writer: StatsWriter | None = None):
        self.resolve = resolve
        self.serve = serve
        self.writer = writer

    async def infer(self, entry: ModelEntry, request: InferRequest, timeout_s: float) -> InferResponse:
        """Run the ensemble ``entry`` on ``request`` (already validated against the
        ensemble's config) within ``timeout_s`` seconds; the response holds the requested
        outputs (all when none are named) in the ensemble config's order.

        :raises NaiadError: a step's error (see the module doc), :class:`DeadlineExceeded`
            when the time runs out between steps, :class:`InferenceFailed` for a requested
            output no step returned.
        """
        assert entry.config is not None
        run = _EnsembleRun(self, entry.config, request, time.monotonic() + timeout_s)
        graph = EnsembleGraph.of(entry.config)
        wanted = [o.name for o in request.outputs] or list(graph.outputs)
        await run.run(graph.needed_steps(wanted))
        response = InferResponse(request.model, request.version, run.outputs(wanted), request.id)
        self._record(request, max(1, run.batch))
        return response

    def _record(self, request: InferRequest, rows: int) -> None:
        """The ensemble's execution (its composing models count their own), in the
        background as every request's statistics (:class:`StatsWriter`)."""
        if self.writer is None:
            return
        execution = stats.Execution(request.version, rows, [0], {}, int(time.time() * 1000))
        self.writer.add(lambda pipe: stats.add_execution(pipe, request.model, execution))


class _EnsembleRun:
    """The state of one ensemble request: the ensemble tensors known so far."""

    def __init__(
        self, scheduler: EnsembleScheduler, config: mc.ModelConfig, request: InferRequest, deadline: float
    ):
        self.scheduler = scheduler
        self.config = config
        self.request = request
        self.deadline = deadline  # time.monotonic()
        batched = config.max_batch_size > 0 and request.inputs
        self.batch = request.inputs[0].shape[0] if batched else 0
        self.values: dict[str, _Value] = {t.name: _Value(None, self.batch) for t in config.input}
        self.values |= {t.name: _Value(t, self.batch) for t in request.inputs}

    async def run(self, steps: list[EnsembleStep]) -> None:
        """Run ``steps``, each once every tensor it reads is known; the first error raised
        (of steps failing together, the first in the config's order) cancels the others."""
        pending = list(steps)
        running: dict[asyncio.Task[tuple[InferResponse, int]], EnsembleStep] = {}
        try:
            while pending or running:
                for step in [s for s in pending if all(t in self.values for t in s.input_map.values())]:
                    pending.remove(step)
                    running[asyncio.create_task(self._step(step), name=f"ensemble-{step}")] = step
                if not running:  # validation makes this unreachable; never wait forever
                    raise InferenceFailed(f"in ensemble '{self.config.name}', steps {pending} cannot start")
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                finished = sorted(
                    ((running.pop(task), task) for task in done), key=lambda pair: pair[0].index
                )
                errors = [task.exception() for _, task in finished if task.exception() is not None]
                if errors:
                    raise errors[0]
                for step, task in finished:
                    self._store(step, *task.result())
        finally:
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)

    async def _step(self, step: EnsembleStep) -> tuple[InferResponse, int]:
        """Run one step; its response and the batch size of its outputs."""
        attributes = {"naiad.model": step.model_name, "naiad.ensemble_step": step.index}
        with tracing.span("naiad.ensemble_step", attributes):
            try:
                version = "" if step.model_version == LATEST else str(step.model_version)
                entry, number = await self.scheduler.resolve(step.model_name, version)
                remaining = self.deadline - time.monotonic()
                if remaining <= 0:
                    raise DeadlineExceeded(f"the request timed out before {step} could start")
                request, batch = self._step_request(step, entry, number, remaining)
                return await self.scheduler.serve(entry, request, remaining), batch
            except NaiadError as exc:
                raise in_step(self.config.name, step, exc) from None

    def _step_request(
        self, step: EnsembleStep, entry: ModelEntry, version: int, remaining_s: float
    ) -> tuple[InferRequest, int]:
        """The step's request to ``entry``'s model and the batch size it carries."""
        model = entry.config
        assert model is not None
        batching = model.max_batch_size > 0
        specs = {spec.name: spec for spec in model.input}
        inputs = []
        for name, tensor_name in sorted(step.input_map.items()):
            value = self.values[tensor_name]
            if value.tensor is None:
                continue
            dims = list(specs[name].dims) if name in specs else list(value.tensor.shape)
            shape = batch_shape(dims, batching, value.batch, value.tensor.shape)
            inputs.append(Tensor(name, value.tensor.datatype, shape, value.tensor.data.reshape(shape)))
        parameters = dict(self.request.parameters)
        if "timeout" in parameters:
            parameters["timeout"] = max(1, int(remaining_s * 1e6))
        request = InferRequest(
            step.model_name, version, inputs, [RequestedOutput(name) for name in sorted(step.output_map)],
            self.request.id, parameters,
        )  # fmt: skip
        batch = inputs[0].shape[0] if batching and inputs and inputs[0].shape else 0
        return request, batch

    def _store(self, step: EnsembleStep, response: InferResponse, batch: int) -> None:
        returned = {tensor.name: tensor for tensor in response.outputs}
        for name, tensor_name in step.output_map.items():
            got = returned.get(name)
            tensor = None if got is None else Tensor(tensor_name, got.datatype, got.shape, got.data)
            self.values[tensor_name] = _Value(tensor, batch)

    def outputs(self, wanted: list[str]) -> list[Tensor]:
        """The requested ensemble outputs, in the config's order, shaped for the ensemble's
        batching. Raises :class:`InferenceFailed` for one that no step returned."""
        result = []
        for spec in self.config.output:
            if spec.name not in wanted:
                continue
            value = self.values.get(spec.name)
            if value is None or value.tensor is None:
                raise InferenceFailed(
                    f"in ensemble '{self.config.name}', output '{spec.name}' was not produced: "
                    f"{self._producer(spec.name)} returned no such tensor"
                )
            tensor = value.tensor
            shape = batch_shape(_config_dims(spec), self.batch != 0, value.batch, tensor.shape)
            result.append(Tensor(spec.name, tensor.datatype, shape, tensor.data.reshape(shape)))
        return result

    def _producer(self, tensor: str) -> str:
        graph = EnsembleGraph.of(self.config)
        return str(graph.steps[graph.producer[tensor]]) if tensor in graph.producer else "?"
