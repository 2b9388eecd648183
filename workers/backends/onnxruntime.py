"""ONNX Runtime backend (Triton's ``onnxruntime_onnx`` platform / ``onnxruntime`` backend).

Uses the CUDA execution provider when asked for ``cuda`` and onnxruntime has it, else the
CPU provider (https://onnxruntime.ai/docs/execution-providers/). BYTES tensors are passed to
ONNX Runtime as numpy arrays of ``str`` (its string tensor type).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tritonclient.grpc import model_config_pb2 as mc

from repository_store import default_model_filename

logger = logging.getLogger(__name__)


def providers_for(device: str) -> list[str]:
    """Execution providers in preference order for ``device`` (``cpu`` or ``cuda``)."""
    available = ort.get_available_providers()
    if device == "cuda" and "CUDAExecutionProvider" in available:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def _to_ort(array: np.ndarray) -> np.ndarray:
    if array.dtype == np.object_:
        return np.vectorize(lambda b: b.decode() if isinstance(b, bytes) else b, otypes=[object])(array)
    return array


class OnnxRuntimeBackend:
    """One ``InferenceSession`` over ``model.onnx`` (or the config's default file name)."""

    def __init__(self, path: Path, device: str):
        options = ort.SessionOptions()
        options.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), options, providers=providers_for(device))
        self.output_names = [output.name for output in self.session.get_outputs()]
        logger.info("loaded %s with %s", path, self.session.get_providers())

    def infer(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        names = outputs or self.output_names
        feed = {name: _to_ort(array) for name, array in inputs.items()}
        results = self.session.run(names, feed)
        return dict(zip(names, results, strict=True))


def load(version_dir: Path, config: mc.ModelConfig, device: str) -> OnnxRuntimeBackend:
    return OnnxRuntimeBackend(version_dir / default_model_filename(config), device)
