"""ONNX Runtime backend (Triton's ``onnxruntime_onnx`` platform / ``onnxruntime`` backend).

Uses the CUDA execution provider when asked for ``cuda`` and onnxruntime has it, else the
CPU provider (https://onnxruntime.ai/docs/execution-providers/). BYTES tensors are passed to
ONNX Runtime as numpy arrays of ``str`` (its string tensor type).
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import ml_dtypes
import numpy as np
import onnxruntime as ort
from onnx import TensorProto
from tritonclient.grpc import model_config_pb2 as mc

from naiad.errors import InvalidInput
from repository_store import default_model_filename

logger = logging.getLogger(__name__)


def providers_for(device: str) -> list[str]:
    """Execution providers in preference order for ``device`` (``cpu`` or ``cuda``)."""
    available = ort.get_available_providers()
    if device == "cuda" and "CUDAExecutionProvider" in available:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def _decode(item: object) -> object:
    if not isinstance(item, bytes):
        return item
    try:
        return item.decode()
    except UnicodeDecodeError:
        raise InvalidInput("ONNX Runtime string tensors hold UTF-8 text only") from None


def _to_ort(array: np.ndarray) -> np.ndarray:
    if array.dtype == np.object_:
        return np.vectorize(_decode, otypes=[object])(array)
    return array


def _bf16_value(array: np.ndarray) -> ort.OrtValue:
    """numpy has no bfloat16 that onnxruntime's Python API takes: pass the raw 16-bit
    words with the ONNX element type instead."""
    words = np.ascontiguousarray(array).view(np.uint16)
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(words, onnx_element_type=TensorProto.BFLOAT16)


def _ort_value(array: np.ndarray) -> ort.OrtValue:
    if array.dtype == ml_dtypes.bfloat16:
        return _bf16_value(array)
    return ort.OrtValue.ortvalue_from_numpy(_to_ort(array))


def _from_bf16_value(value: ort.OrtValue) -> np.ndarray:
    shape = value.shape()
    count = int(np.prod(shape))
    words = (ctypes.c_uint16 * count).from_address(value.data_ptr())
    return np.frombuffer(words, dtype=np.uint16).copy().view(ml_dtypes.bfloat16).reshape(shape)


class OnnxRuntimeBackend:
    """One ``InferenceSession`` over ``model.onnx`` (or the config's default file name)."""

    def __init__(self, path: Path, device: str):
        options = ort.SessionOptions()
        options.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), options, providers=providers_for(device))
        self.output_names = [output.name for output in self.session.get_outputs()]
        tensors = [*self.session.get_inputs(), *self.session.get_outputs()]
        self.uses_bf16 = any(t.type == "tensor(bfloat16)" for t in tensors)
        logger.info("loaded %s with %s", path, self.session.get_providers())

    def infer(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        names = outputs or self.output_names
        if self.uses_bf16:
            return self._infer_ort_values(inputs, names)
        feed = {name: _to_ort(array) for name, array in inputs.items()}
        results = self.session.run(names, feed)
        return dict(zip(names, results, strict=True))

    def _infer_ort_values(self, inputs: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        feed = {name: _ort_value(array) for name, array in inputs.items()}
        results = self.session.run_with_ort_values(names, feed)
        return {
            name: _from_bf16_value(v) if v.data_type() == "tensor(bfloat16)" else v.numpy()
            for name, v in zip(names, results, strict=True)
        }


def load(version_dir: Path, config: mc.ModelConfig, device: str) -> OnnxRuntimeBackend:
    return OnnxRuntimeBackend(version_dir / default_model_filename(config), device)


def warm_up() -> None:
    """Create and run a session of a tiny model, so ONNX Runtime's one-time set-up (its
    environment, the first session's costs) is done before a warm-pool process is claimed."""
    from onnx import helper  # noqa: PLC0415 - only warm-pool processes need it

    nodes = [helper.make_node("Gemm", ["x", "w"], ["h"]), helper.make_node("Softmax", ["h"], ["y"])]
    graph = helper.make_graph(
        nodes, "warm_up",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor("w", TensorProto.FLOAT, [2, 2], [1.0, 0.0, 0.0, 1.0])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    session.run(None, {"x": np.zeros((1, 2), np.float32)})
