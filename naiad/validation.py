"""Check an inference request against its model's configuration before it is queued.

Rules follow Triton's model configuration docs ("Inputs and Outputs", "Maximum Batch Size",
"Reshape"): with ``max_batch_size`` > 0 every input carries an implicit leading batch
dimension of 1..max_batch_size, the same for all inputs; ``-1`` in ``dims`` matches any size;
``TYPE_STRING`` is ``BYTES`` on the wire; inputs marked ``optional`` may be left out.

Shared by the gateway (every client request) and workers (BLS requests from Python models,
which Triton validates the same way).
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from naiad.datatypes import config_to_datatype
from naiad.errors import InvalidInput
from naiad.inference import InferRequest, Tensor
from naiad.memo import remember


def wire_datatype(data_type: int) -> str:
    """The v2 datatype of a config ``DataType`` enum value (``TYPE_FP32`` -> ``FP32``)."""
    return config_to_datatype(mc.DataType.Name(data_type))


def client_shape(config: mc.ModelConfig, dims: list[int]) -> list[int]:
    """The shape a client sees for ``dims``: with the batch dimension (``-1``) when batching."""
    return ([-1] if config.max_batch_size > 0 else []) + list(dims)


@dataclass(frozen=True)
class _InputRule:
    datatype: str  # the v2 datatype the config declares
    shape: list[int]  # what a client sends: the batch dimension (-1) first when batching
    optional: bool


@dataclass(frozen=True)
class _Rules:
    """What :func:`validate_request` checks, read out of one config once (protobuf field
    access costs more than the checks)."""

    name: str
    max_batch_size: int
    inputs: dict[str, _InputRule]
    outputs: frozenset[str]
    #: Requests that passed, by what the checks read (input names, datatypes and shapes, then
    #: output names): one that looks the same passes without the checks.
    passed: dict[tuple[Any, ...], None] = field(default_factory=dict, compare=False)

    @classmethod
    def of(cls, config: mc.ModelConfig) -> _Rules:
        inputs = {spec.name: _InputRule(wire_datatype(spec.data_type), client_shape(config, list(spec.dims)),
                                        spec.optional) for spec in config.input}  # fmt: skip
        return cls(config.name, config.max_batch_size, inputs, frozenset(o.name for o in config.output))


#: Most request signatures a config's rules remember (then they start afresh).
MAX_REMEMBERED = 256


def _rules(config: mc.ModelConfig) -> _Rules:
    """The rules of ``config``, cached by its serialized bytes (a config changed in place
    gets new rules)."""
    return _rules_of(config.SerializeToString())


@functools.lru_cache(maxsize=1024)
def _rules_of(serialized: bytes) -> _Rules:
    return _Rules.of(mc.ModelConfig.FromString(serialized))


def _check_dims(tensor: Tensor, expected: list[int]) -> None:
    ok = len(tensor.shape) == len(expected) and all(
        want == -1 or want == got for want, got in zip(expected, tensor.shape, strict=True)
    )
    if not ok:
        raise InvalidInput(
            f"unexpected shape for input '{tensor.name}', model expects {expected}, "
            f"got {tensor.shape}"
        )


def _batch_size(max_batch_size: int, tensor: Tensor) -> int | None:
    if max_batch_size <= 0:
        return None
    if not tensor.shape:
        raise InvalidInput(f"input '{tensor.name}' lacks the batch dimension")
    batch = tensor.shape[0]
    if not 1 <= batch <= max_batch_size:
        raise InvalidInput(
            f"batch size {batch} of input '{tensor.name}' is outside 1..{max_batch_size}"
        )
    return batch


def _check_input(rules: _Rules, rule: _InputRule, tensor: Tensor) -> int | None:
    if tensor.datatype != rule.datatype:
        raise InvalidInput(
            f"input '{tensor.name}' has datatype {tensor.datatype}, model expects {rule.datatype}"
        )
    batch = _batch_size(rules.max_batch_size, tensor)
    _check_dims(tensor, rule.shape)
    return batch


def _unique_known(kind: str, names: list[str], known: Collection[str], model: str) -> set[str]:
    """``names`` as a set; InvalidInput for a name not in ``known`` or given twice."""
    seen: set[str] = set()
    for name in names:
        if name not in known:
            raise InvalidInput(f"unexpected inference {kind} '{name}' for model '{model}'")
        if name in seen:
            raise InvalidInput(f"{kind} '{name}' is given more than once")
        seen.add(name)
    return seen


def validate_request(config: mc.ModelConfig, request: InferRequest) -> None:
    """Raise :class:`InvalidInput` unless ``request`` fits ``config``.

    Checks input names (unknown, duplicate, missing non-optional), datatypes, shapes with the
    implicit batch dimension, one batch size across inputs, and requested output names
    (unknown, duplicate).
    Element counts against shapes are checked when the tensors are decoded.
    """
    rules = _rules(config)
    signature = (*[(t.name, t.datatype, *t.shape) for t in request.inputs], None,
                 *[o.name for o in request.outputs])  # fmt: skip
    if signature in rules.passed:
        return
    _check(rules, request)
    remember(rules.passed, signature, None, MAX_REMEMBERED)


def _check(rules: _Rules, request: InferRequest) -> None:
    specs = rules.inputs
    seen = _unique_known("input", [t.name for t in request.inputs], specs, rules.name)
    batches = {_check_input(rules, specs[t.name], t) for t in request.inputs} - {None}
    missing = [name for name, spec in specs.items() if name not in seen and not spec.optional]
    if missing:
        raise InvalidInput(f"expected inputs {sorted(missing)} for model '{rules.name}'")
    if len(batches) > 1:
        raise InvalidInput(f"inputs disagree on the batch size: {sorted(batches)}")
    _unique_known("output", [o.name for o in request.outputs], rules.outputs, rules.name)
