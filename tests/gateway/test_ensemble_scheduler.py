"""The ensemble scheduler without servers: the data plane's ``resolve`` and ``serve`` are
replaced by small in-process models (numpy functions with a delay), so the order steps start
and finish in, what each step receives and how failures travel can be observed exactly.
End-to-end behaviour through real workers is in ``tests/e2e/test_ensembles.py``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np
import pytest

from gateway.ensemble import EnsembleScheduler, batch_shape
from naiad.errors import DeadlineExceeded, InferenceFailed, InvalidInput, ModelNotReady
from naiad.inference import InferRequest, InferResponse, RequestedOutput, Tensor
from naiad.registry import READY, ModelEntry
from naiad.validation import validate_request
from repository_store import parse_config, validate_config

VECTOR = "data_type: TYPE_FP32 dims: [ 4 ]"


def unary(name: str, mbs: int = 8, dims: str = "4") -> str:
    return (
        f'name: "{name}" platform: "onnxruntime_onnx" max_batch_size: {mbs}\n'
        f'input [ {{ name: "in" data_type: TYPE_FP32 dims: [ {dims} ] }} ]\n'
        f'output [ {{ name: "out" data_type: TYPE_FP32 dims: [ {dims} ] }} ]\n'
    )


ADD = (
    'name: "add" platform: "onnxruntime_onnx" max_batch_size: 8\n'
    f'input [ {{ name: "left" {VECTOR} }}, {{ name: "right" {VECTOR} }} ]\n'
    f'output [ {{ name: "out" {VECTOR} }} ]\n'
)
# x -> double -> doubled ; x -> plus1 -> t2 ; (doubled, t2) -> add -> y
DIAMOND = f"""
name: "diamond" platform: "ensemble" max_batch_size: 8
input [ {{ name: "x" {VECTOR} }} ]
output [ {{ name: "y" {VECTOR} }}, {{ name: "doubled" {VECTOR} }} ]
ensemble_scheduling {{ step [
  {{ model_name: "double" model_version: -1 input_map {{ key: "in" value: "x" }}
     output_map {{ key: "out" value: "doubled" }} }},
  {{ model_name: "plus1" model_version: -1 input_map {{ key: "in" value: "x" }}
     output_map {{ key: "out" value: "t2" }} }},
  {{ model_name: "add" model_version: -1 input_map {{ key: "left" value: "doubled" }}
     input_map {{ key: "right" value: "t2" }} output_map {{ key: "out" value: "y" }} }}
] }}
"""
FUNCTIONS: dict[str, Callable[..., np.ndarray]] = {
    "double": lambda **t: t["in"] * 2,
    "plus1": lambda **t: t["in"] + 1,
    "add": lambda **t: t["left"] + t["right"],
    "flat": lambda **t: t["in"],
}


class Models:
    """In-process stand-ins for the data plane: every step's request, start and end."""

    def __init__(self, *configs: str, delays: dict[str, float] | None = None):
        self.entries = {}
        for text in configs:
            config = parse_config(text, text.split('"')[1])
            validate_config(config)
            self.entries[config.name] = ModelEntry(config.name, config, [1], READY)
        self.delays = delays or {}
        self.failures: dict[str, Exception] = {}
        self.events: list[tuple[str, str]] = []
        self.requests: dict[str, tuple[InferRequest, float]] = {}

    async def resolve(self, name: str, version: str) -> tuple[ModelEntry, int]:
        entry = self.entries.get(name)
        if entry is None:
            raise ModelNotReady(f"model '{name}' is not ready: gone")
        return entry, 1

    async def serve(self, entry: ModelEntry, request: InferRequest, timeout_s: float) -> InferResponse:
        validate_request(entry.config, request)
        self.requests[entry.name] = (request, timeout_s)
        self.events.append(("start", entry.name))
        try:
            await asyncio.sleep(self.delays.get(entry.name, 0.01))
        except asyncio.CancelledError:
            self.events.append(("cancelled", entry.name))
            raise
        if entry.name in self.failures:
            raise self.failures[entry.name]
        arrays = {t.name: t.data for t in request.inputs}
        out = FUNCTIONS[entry.name](**arrays)
        self.events.append(("end", entry.name))
        return InferResponse(entry.name, 1, [Tensor("out", "FP32", list(out.shape), out)], request.id)

    def scheduler(self) -> EnsembleScheduler:
        return EnsembleScheduler(self.resolve, self.serve)


def request(x: np.ndarray, model: str = "diamond", outputs=(), **parameters) -> InferRequest:
    tensor = Tensor("x", "FP32", list(x.shape), x)
    return InferRequest(model, 1, [tensor], [RequestedOutput(n) for n in outputs], "req-7", parameters)


def run(models: Models, req: InferRequest, timeout_s: float = 5.0) -> InferResponse:
    entry = models.entries[req.model]
    validate_request(entry.config, req)
    return asyncio.run(models.scheduler().infer(entry, req, timeout_s))


X = np.arange(8, dtype=np.float32).reshape(2, 4)


def test_independent_steps_run_together_and_the_join_waits_for_both() -> None:
    models = Models(DIAMOND, unary("double"), unary("plus1"), ADD, delays={"double": 0.05, "plus1": 0.02})
    response = run(models, request(X))
    assert models.events == [
        ("start", "double"), ("start", "plus1"), ("end", "plus1"), ("end", "double"),
        ("start", "add"), ("end", "add"),
    ]  # fmt: skip
    outputs = {t.name: t for t in response.outputs}
    assert [t.name for t in response.outputs] == ["y", "doubled"]  # the config's order
    np.testing.assert_array_equal(outputs["y"].data, X * 2 + X + 1)
    np.testing.assert_array_equal(outputs["doubled"].data, X * 2)
    assert outputs["y"].shape == [2, 4] and response.id == "req-7" and response.model == "diamond"


def test_parallel_steps_overlap_in_time() -> None:
    """Both branches of the diamond are started before either ends: they run at once."""
    models = Models(DIAMOND, unary("double"), unary("plus1"), ADD, delays={"double": 0.2, "plus1": 0.2})
    run(models, request(X))
    assert {event for event in models.events[:2]} == {("start", "double"), ("start", "plus1")}


def test_requested_outputs_prune_steps() -> None:
    models = Models(DIAMOND, unary("double"), unary("plus1"), ADD)
    response = run(models, request(X, outputs=["doubled"]))
    assert [name for kind, name in models.events if kind == "start"] == ["double"]
    assert [t.name for t in response.outputs] == ["doubled"]


def test_step_requests_carry_id_parameters_and_the_time_left() -> None:
    models = Models(DIAMOND, unary("double"), unary("plus1"), ADD, delays={"double": 0.1, "plus1": 0.1})
    run(models, request(X, priority=2, timeout=3_000_000), timeout_s=3.0)
    first, first_timeout = models.requests["double"]
    last, last_timeout = models.requests["add"]
    assert first.id == last.id == "req-7"
    assert first.parameters["priority"] == last.parameters["priority"] == 2
    assert 2.9 < first_timeout <= 3.0 and last_timeout < first_timeout - 0.09
    assert last.parameters["timeout"] == pytest.approx(last_timeout * 1e6, abs=1000)
    assert [o.name for o in last.outputs] == ["out"]
    assert sorted(t.name for t in last.inputs) == ["left", "right"]


def test_a_failing_step_fails_the_request_and_cancels_the_others() -> None:
    models = Models(DIAMOND, unary("double"), unary("plus1"), ADD, delays={"double": 5.0, "plus1": 0.01})
    models.failures["plus1"] = InvalidInput("bad pixels")
    started = time.perf_counter()
    with pytest.raises(InvalidInput) as caught:
        run(models, request(X))
    assert caught.value.message == "in ensemble 'diamond', step 1 ('plus1'): bad pixels"
    assert ("cancelled", "double") in models.events and ("start", "add") not in models.events
    assert time.perf_counter() - started < 2.0


def test_a_step_model_gone_names_the_step() -> None:
    models = Models(DIAMOND, unary("double"), unary("plus1"), ADD)
    del models.entries["add"]
    with pytest.raises(
        ModelNotReady, match=r"in ensemble 'diamond', step 2 \('add'\): model 'add' is not ready"
    ):
        run(models, request(X))


def test_a_bad_shape_reaching_a_step_is_its_validation_error() -> None:
    wide = DIAMOND.replace(
        'name: "x" data_type: TYPE_FP32 dims: [ 4 ]', 'name: "x" data_type: TYPE_FP32 dims: [ -1 ]'
    )
    models = Models(wide, unary("double"), unary("plus1"), ADD)
    x = np.ones((1, 3), dtype=np.float32)
    with pytest.raises(InvalidInput, match=r"in ensemble 'diamond', step 0 \('double'\): unexpected shape"):
        run(models, request(x))


def test_the_deadline_bounds_the_steps_left() -> None:
    models = Models(DIAMOND, unary("double"), unary("plus1"), ADD, delays={"double": 0.15, "plus1": 0.01})
    with pytest.raises(DeadlineExceeded, match=r"step 2 \('add'\): the request timed out before step 2"):
        run(models, request(X), timeout_s=0.1)


def test_an_output_no_step_returned_fails_the_request() -> None:
    models = Models(DIAMOND, unary("double"), unary("plus1"), ADD)

    async def serve_nothing(entry, req, timeout_s):
        return InferResponse(entry.name, 1, [], req.id)

    scheduler = EnsembleScheduler(models.resolve, serve_nothing)
    req = request(X, outputs=["doubled"])
    with pytest.raises(InferenceFailed, match=r"output 'doubled' was not produced: step 0 \('double'\)"):
        asyncio.run(scheduler.infer(models.entries["diamond"], req, 1.0))


def test_batch_dimension_between_batching_and_non_batching_models() -> None:
    # a batching ensemble [-1, 4] feeding a non-batching model whose dims are [4]: the batch
    # of one loses its batch dimension there and regains it on the way out
    chain = f"""
    name: "chain" platform: "ensemble" max_batch_size: 4
    input [ {{ name: "x" {VECTOR} }} ] output [ {{ name: "y" {VECTOR} }} ]
    ensemble_scheduling {{ step [ {{ model_name: "flat" model_version: -1
      input_map {{ key: "in" value: "x" }} output_map {{ key: "out" value: "y" }} }} ] }}
    """
    models = Models(chain, unary("flat", mbs=0))
    response = run(models, request(X[:1], model="chain"))
    assert models.requests["flat"][0].inputs[0].shape == [4]
    assert response.outputs[0].shape == [1, 4]
    np.testing.assert_array_equal(response.outputs[0].data, X[:1])


@pytest.mark.parametrize(
    ("dims", "batching", "tensor_batch", "shape", "expected"),
    [
        ([4], True, 2, [2, 4], [2, 4]),  # both batched: unchanged
        ([4], True, 0, [4], [1, 4]),  # unbatched tensor fitting dims: gains a batch of 1
        ([4], True, 0, [3, 4], [3, 4]),  # already carries a batch: unchanged
        ([4], False, 1, [1, 4], [4]),  # batch of 1 into a non-batching [4]: loses it
        ([-1, 4], False, 1, [1, 4], [1, 4]),  # fits the non-batching dims as is
        ([4], False, 2, [2, 4], [2, 4]),  # batch of 2 cannot be squeezed: the reader decides
    ],
)
def test_batch_shape(dims, batching, tensor_batch, shape, expected) -> None:
    assert batch_shape(dims, batching, tensor_batch, shape) == expected
