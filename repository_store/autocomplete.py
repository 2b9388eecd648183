"""Complete a missing or partial ``config.pbtxt`` from an ONNX model's own signature.

Triton's behaviour (docs/user_guide/model_configuration.md, "Auto-Generated Model
Configuration", and the onnxruntime backend's ``AutoCompleteConfig``): with no platform or
backend, a ``model.onnx`` makes the model ``onnxruntime_onnx``; with no inputs and outputs
they are read from the graph. When every input and output has a variable first dimension and
``max_batch_size`` is unset, the model batches with ``max_batch_size`` 4 (Triton's
``--backend-config=default-max-batch-size``) and, having no scheduler, gets a default
``dynamic_batching {}``. Only the graph is read (``load_external_data=False``).
"""

from __future__ import annotations

import pathlib
import tempfile

import onnx
from onnx import TensorProto

from naiad.errors import ConfigError, RepositoryError
from repository_store.config import ModelConfig, model_config_pb2
from repository_store.store import RepositoryStore

DEFAULT_MAX_BATCH_SIZE = 4
ONNX_FILENAME = "model.onnx"

# ONNX element type -> config data type (Triton's onnxruntime backend, onnx_utils.cc).
_DATA_TYPES = {
    TensorProto.BOOL: "TYPE_BOOL",
    TensorProto.UINT8: "TYPE_UINT8",
    TensorProto.UINT16: "TYPE_UINT16",
    TensorProto.UINT32: "TYPE_UINT32",
    TensorProto.UINT64: "TYPE_UINT64",
    TensorProto.INT8: "TYPE_INT8",
    TensorProto.INT16: "TYPE_INT16",
    TensorProto.INT32: "TYPE_INT32",
    TensorProto.INT64: "TYPE_INT64",
    TensorProto.FLOAT16: "TYPE_FP16",
    TensorProto.FLOAT: "TYPE_FP32",
    TensorProto.DOUBLE: "TYPE_FP64",
    TensorProto.BFLOAT16: "TYPE_BF16",
    TensorProto.STRING: "TYPE_STRING",
}


def needs_autocomplete(config: ModelConfig) -> bool:
    """True when the config lacks a platform/backend or declares no inputs and no outputs."""
    no_runtime = not config.platform and not config.backend
    return no_runtime or (not config.input and not config.output and config.platform != "ensemble")


def _dims(value_info: onnx.ValueInfoProto) -> list[int]:
    shape = value_info.type.tensor_type.shape
    return [d.dim_value if d.HasField("dim_value") else -1 for d in shape.dim]


def _data_type(value_info: onnx.ValueInfoProto) -> int:
    elem = value_info.type.tensor_type.elem_type
    if elem not in _DATA_TYPES:
        raise ConfigError(f"'{value_info.name}' has an ONNX element type ({elem}) Triton cannot serve")
    return model_config_pb2.DataType.Value(_DATA_TYPES[elem])


def _graph_tensors(graph: onnx.GraphProto) -> tuple[list, list]:
    initializers = {init.name for init in graph.initializer}
    inputs = [vi for vi in graph.input if vi.name not in initializers]
    return inputs, list(graph.output)


def complete_from_onnx(config: ModelConfig, model: onnx.ModelProto) -> ModelConfig:
    """A copy of ``config`` completed from ``model``'s graph, following the module's rules.

    Raises :class:`ConfigError` for an element type with no Triton data type.
    """
    done = ModelConfig()
    done.CopyFrom(config)
    if not done.platform and not done.backend:
        done.platform = "onnxruntime_onnx"
    inputs, outputs = _graph_tensors(model.graph)
    shapes = [_dims(vi) for vi in inputs + outputs]
    batching = bool(shapes) and all(shape and shape[0] == -1 for shape in shapes)
    if done.max_batch_size == 0 and batching and not done.input and not done.output:
        done.max_batch_size = DEFAULT_MAX_BATCH_SIZE
        if not done.HasField("dynamic_batching") and not done.HasField("sequence_batching"):
            done.dynamic_batching.SetInParent()
    skip = 1 if done.max_batch_size > 0 else 0
    if not done.input and not done.output:
        for vi in inputs:
            done.input.add(name=vi.name, data_type=_data_type(vi), dims=_dims(vi)[skip:])
        for vi in outputs:
            done.output.add(name=vi.name, data_type=_data_type(vi), dims=_dims(vi)[skip:])
    return done


def autocomplete(store: RepositoryStore, config: ModelConfig, versions: list[int]) -> ModelConfig:
    """Complete ``config`` from the ONNX file of the newest of ``versions`` in ``store``.

    Raises :class:`ConfigError` when there is no ONNX file to read or it does not parse.
    """
    filename = config.default_model_filename or ONNX_FILENAME
    if config.platform not in ("", "onnxruntime_onnx") or config.backend not in ("", "onnxruntime"):
        raise ConfigError(f"model '{config.name}': only ONNX models can be auto-completed")
    if not versions:
        raise ConfigError(f"model '{config.name}' has no version to auto-complete the config from")
    with tempfile.TemporaryDirectory(prefix="naiad-autocomplete-") as folder:
        path = pathlib.Path(folder) / "model.onnx"
        try:
            store.fetch_file(config.name, max(versions), filename, path)
            model = onnx.load(str(path), load_external_data=False)
        except (OSError, RepositoryError, ValueError) as exc:
            what = f"model '{config.name}': cannot read {filename} to complete its config"
            raise ConfigError(f"{what}: {exc}") from None
        except Exception as exc:  # protobuf's DecodeError and friends: not an ONNX file
            raise ConfigError(f"model '{config.name}': {filename} is not an ONNX model ({exc})") from None
    return complete_from_onnx(config, model)
