"""PyTorch backend (Triton's ``pytorch_libtorch`` platform / ``pytorch`` backend): TorchScript.

The model file is ``model.pt`` (or the config's ``default_model_filename``), loaded with
``torch.jit.load``. Tensors are matched to the forward's arguments and results as Triton's
pytorch_backend does (its README, "Configuration", and ``GetNamingConvention``):

- **Inputs**, in this order of preference: (1) every config input is named after an argument
  of ``forward`` (FORWARD_ARGUMENT); else (2) every name is ``<name>__<index>`` and the index
  is the argument's position (NAMED_INDEX, ``input__0``); else (3) the config's order is the
  arguments' order (STRICT_CONFIG_ORDERING, with a warning). A forward taking a single
  ``Dict[str, Tensor]`` gets the inputs by their config names instead. The config must list
  as many inputs as ``forward`` takes.
- **Outputs**: ``<name>__<index>`` picks element ``index`` of the returned tuple (or list);
  otherwise the config's order is the results' order. A forward returning one tensor has one
  output. Returning a ``Dict[str, Tensor]`` (not accepted by Triton) matches the config's
  output names to its keys.

Datatypes (Triton's ``ModelConfigDataTypeToTorchType``): BOOL, UINT8, INT8, INT16, INT32,
INT64, FP16, FP32, FP64, plus BF16. ``TYPE_STRING`` (BYTES) is a ``List[str]`` argument or
result, one-dimensional, as in Triton; the unsigned 16/32/64-bit types are refused at load.

Runs under ``torch.inference_mode()`` on CUDA when the worker was given a GPU and torch has
one, else on the CPU. Threads: the config parameters ``INTRA_OP_THREAD_COUNT`` and
``INTER_OP_THREAD_COUNT`` (Triton's), else as many intra-op threads as CPUs this process may
use (:func:`naiad.host.usable_cpus`: affinity and cgroup CPU limit) and one inter-op thread: a worker runs
one batch at a time and scales by processes.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from pathlib import Path

import ml_dtypes
import numpy as np
import torch
from tritonclient.grpc import model_config_pb2 as mc

from naiad import host
from naiad.errors import InferenceFailed, InvalidInput
from repository_store import default_model_filename

logger = logging.getLogger(__name__)

TORCH_DTYPES: dict[int, torch.dtype] = {
    mc.TYPE_BOOL: torch.bool,
    mc.TYPE_UINT8: torch.uint8,
    mc.TYPE_INT8: torch.int8,
    mc.TYPE_INT16: torch.int16,
    mc.TYPE_INT32: torch.int32,
    mc.TYPE_INT64: torch.int64,
    mc.TYPE_FP16: torch.float16,
    mc.TYPE_FP32: torch.float32,
    mc.TYPE_FP64: torch.float64,
    mc.TYPE_BF16: torch.bfloat16,
}
DELIMITER = "__"


def named_index(name: str) -> int | None:
    """The index of a ``<name>__<index>`` tensor name (after the first ``__``), else None."""
    _, delimiter, index = name.partition(DELIMITER)
    return int(index) if delimiter and index.isascii() and index.isdigit() else None


def input_positions(names: Sequence[str], arguments: Sequence[str]) -> dict[str, int]:
    """The forward-argument position of each config input ``names`` (``arguments``: the
    forward's argument names without ``self``), by Triton's three conventions (module doc)."""
    if all(name in arguments for name in names):
        return {name: arguments.index(name) for name in names}
    return _indexed(names, "input")


def output_positions(names: Sequence[str]) -> dict[str, int]:
    """The position of each config output in the forward's results (module doc)."""
    return _indexed(names, "output")


def _indexed(names: Sequence[str], kind: str) -> dict[str, int]:
    indices = [named_index(name) for name in names]
    if all(index is not None for index in indices):
        return dict(zip(names, indices, strict=True))  # type: ignore[arg-type]
    logger.warning("%ss %s do not all follow the <name>__<index> naming convention%s: "
                   "using the config's order", kind, list(names),
                   " nor name forward arguments" if kind == "input" else "")  # fmt: skip
    return {name: position for position, name in enumerate(names)}


def _type_name(data_type: int) -> str:
    return mc.DataType.Name(data_type)


def _check_datatypes(config: mc.ModelConfig) -> None:
    for kind, specs in (("input", config.input), ("output", config.output)):
        for spec in specs:
            if spec.data_type not in TORCH_DTYPES and spec.data_type != mc.TYPE_STRING:
                raise ValueError(f"unsupported datatype {_type_name(spec.data_type)} for {kind} "
                                 f"'{spec.name}' (the PyTorch backend has no such tensor type)")  # fmt: skip
            batch_dims = 1 if config.max_batch_size > 0 else 0
            if spec.data_type == mc.TYPE_STRING and len(spec.dims) + batch_dims > 1:
                raise ValueError(f"{kind} '{spec.name}': TYPE_STRING is a List[str] in TorchScript, "
                                 "so it must be one-dimensional (batch dimension included)")  # fmt: skip


def _result_count(schema) -> int | None:
    """How many results ``forward`` declares (None: not known before it runs, or a dict)."""
    result = schema.returns[0].type if len(schema.returns) == 1 else None
    if result is None or result.kind() == "DictType":
        return None
    if result.kind() == "ListType":  # List[str] is one BYTES output; List[Tensor], several
        return 1 if result.getElementType().kind() == "StringType" else None
    return len(result.elements()) if result.kind() == "TupleType" else 1


def configure_threads(config: mc.ModelConfig) -> None:
    """Set torch's thread pools from the config's parameters, else the defaults (module doc)."""
    def parameter(key: str, default: int) -> int:
        value = config.parameters[key].string_value if key in config.parameters else ""
        try:
            return max(1, int(value)) if value else default
        except ValueError:
            logger.warning("ignoring %s=%r: not an integer", key, value)
            return default

    usable = host.usable_cpus()
    torch.set_num_threads(parameter("INTRA_OP_THREAD_COUNT", usable))
    try:
        torch.set_num_interop_threads(parameter("INTER_OP_THREAD_COUNT", 1))
    except RuntimeError:  # settable once per process: a second version keeps the first's
        pass


class PyTorchBackend:
    """One TorchScript module; inputs and outputs matched to the config (module doc).

    :raises ValueError: the module and the config disagree (counts, names, datatypes).
    """

    def __init__(self, path: Path, config: mc.ModelConfig, device: str):
        self.config = config
        self.device = torch.device("cuda" if device == "cuda" and torch.cuda.is_available() else "cpu")
        with warnings.catch_warnings():  # torch 2.9+ calls TorchScript deprecated; Triton serves it
            warnings.simplefilter("ignore", DeprecationWarning)
            self.module = torch.jit.load(str(path), map_location=self.device)
        self.module.eval()
        schema = self.module.forward.schema
        arguments = [a for a in schema.arguments if a.type.kind() != "ClassType"]  # drop self
        self.dict_input = len(arguments) == 1 and arguments[0].type.kind() == "DictType"
        _check_datatypes(config)
        names = [spec.name for spec in config.input]
        if self.dict_input:
            self.positions = {name: 0 for name in names}
        else:
            self.positions = self._match_inputs(names, arguments)
        self.output_index = output_positions([spec.name for spec in config.output])
        self.result_count = _result_count(schema)
        self._check_outputs()
        self.specs = {spec.name: spec for spec in [*config.input, *config.output]}
        logger.info("loaded %s on %s (inputs by position %s)", path, self.device, self.positions)

    def _match_inputs(self, names: list[str], arguments: list) -> dict[str, int]:
        for argument in arguments:
            if argument.type.kind() not in ("TensorType", "ListType"):
                raise ValueError(f"forward argument '{argument.name}' is a {argument.type}: only "
                                 "Tensor, List[str] or one Dict[str, Tensor] are supported")  # fmt: skip
        argument_names = [argument.name for argument in arguments]
        if len(arguments) != len(names):
            raise ValueError(f"configuration expects {len(names)} inputs, model provides "
                             f"{len(arguments)} (forward{tuple(argument_names)})")  # fmt: skip
        positions = input_positions(names, argument_names)
        for name, position in positions.items():
            if position >= len(arguments):
                raise ValueError(f"input '{name}' refers to forward argument {position}, but forward "
                                 f"takes {len(arguments)}: {argument_names}")  # fmt: skip
        if len(set(positions.values())) != len(positions):
            raise ValueError(f"inputs {names} map to the same forward argument twice: {positions}")
        return positions

    def _check_outputs(self) -> None:
        if self.result_count is None:
            return
        for name, index in self.output_index.items():
            if index >= self.result_count:
                raise ValueError(f"output '{name}' refers to result {index}, but forward returns "
                                 f"{self.result_count}")  # fmt: skip

    def infer(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        """Run ``forward`` on one batch; returns numpy arrays by config output name.

        :raises InvalidInput: a BYTES element that is not UTF-8.
        :raises InferenceFailed: the results do not match the config (count, datatype).
        """
        with torch.inference_mode():
            converted = {name: self._to_torch(name, array) for name, array in inputs.items()}
            if self.dict_input:
                results = self.module(converted)
            else:
                arguments: list[object] = [None] * len(self.positions)
                for name, value in converted.items():
                    arguments[self.positions[name]] = value
                results = self.module(*arguments)
            names = outputs or list(self.output_index)
            return {name: self._to_numpy(name, self._pick(results, name)) for name in names}

    def _to_torch(self, name: str, array: np.ndarray) -> torch.Tensor | list[str]:
        if array.dtype == np.object_:
            try:
                return [item.decode() if isinstance(item, bytes) else str(item) for item in array.reshape(-1)]
            except UnicodeDecodeError:
                raise InvalidInput(f"input '{name}': TorchScript strings hold UTF-8 text only") from None
        if array.dtype == ml_dtypes.bfloat16:
            tensor = torch.from_numpy(np.ascontiguousarray(array).view(np.int16).copy()).view(torch.bfloat16)
        else:
            tensor = torch.from_numpy(array if array.flags.writeable else array.copy())
        return tensor.to(self.device)

    def _pick(self, results: object, name: str) -> object:
        if isinstance(results, dict):
            if name not in results:
                raise InferenceFailed(f"output '{name}' is not among the keys forward returned: "
                                      f"{sorted(results)}")  # fmt: skip
            return results[name]
        values = list(results) if isinstance(results, tuple) else [results]
        if len(values) == 1 and isinstance(values[0], list) and values[0] and \
                isinstance(values[0][0], torch.Tensor):
            values = values[0]  # a List[Tensor] result: its elements are the outputs
        index = self.output_index[name]
        if index >= len(values):
            raise InferenceFailed(f"the output {name} in the model configuration refers to an output index "
                                  f"which doesn't exist. This model has {len(values)} outputs")  # fmt: skip
        return values[index]

    def _to_numpy(self, name: str, value: object) -> np.ndarray:
        spec = self.specs[name]
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            if spec.data_type != mc.TYPE_STRING:
                raise InferenceFailed(f"configuration expects datatype {_type_name(spec.data_type)} for "
                                      f"output '{name}', model provides List[str]")  # fmt: skip
            return np.array([item.encode() for item in value], dtype=np.object_)
        if not isinstance(value, torch.Tensor):
            raise InferenceFailed(f"output '{name}' must be a Tensor or List[str], model provides "
                                  f"{type(value).__name__}")  # fmt: skip
        if TORCH_DTYPES.get(spec.data_type) != value.dtype:
            known = (_type_name(t) for t, d in TORCH_DTYPES.items() if d == value.dtype)
            provided = next(known, str(value.dtype))
            raise InferenceFailed(f"configuration expects datatype {_type_name(spec.data_type)} for output "
                                  f"'{name}', model provides {provided}")  # fmt: skip
        if value.dim() == 0:
            raise InferenceFailed(f"output '{name}' is a scalar which is not supported")
        value = value.detach().cpu().contiguous()
        if value.dtype == torch.bfloat16:
            return value.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return value.numpy()


def load(version_dir: Path, config: mc.ModelConfig, device: str) -> PyTorchBackend:
    configure_threads(config)
    return PyTorchBackend(version_dir / default_model_filename(config), config, device)


def warm_up() -> None:
    """Run one small op, so torch's one-time set-up is done before a warm-pool claim."""
    with torch.inference_mode():
        torch.nn.functional.softmax(torch.ones(1, 2) @ torch.eye(2), dim=1)
