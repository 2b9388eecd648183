"""ONNX Runtime backend (Triton's ``onnxruntime_onnx`` platform / ``onnxruntime`` backend).

Uses the CUDA execution provider when asked for ``cuda`` and onnxruntime has it, else the
CPU provider (https://onnxruntime.ai/docs/execution-providers/). BYTES tensors are passed to
ONNX Runtime as numpy arrays of ``str`` (its string tensor type).

Session options (:func:`session_options`) come from the config's ``parameters``, as Triton's
ONNX Runtime backend reads them (onnxruntime_backend README, "Model Config Options"):
``intra_op_thread_count`` and ``inter_op_thread_count`` (0, the default: ONNX Runtime's own
choice, one intra-op thread per physical core). One setting differs from ONNX Runtime's
default: idle intra-op threads do not spin (``session.intra_op.allow_spinning`` 0,
https://onnxruntime.ai/docs/performance/tune-performance/threading.html). A spinning pool
keeps its threads busy for a while after every run: on this 2-core machine 2.4 ms of CPU
for a 0.2 ms batch of 32 digits rows, taken from the gateway and the other workers, and paid
for by a serverless user. A model that wants them spinning sets that key to "1" in its
``parameters``.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnxruntime as ort
from onnx import TensorProto
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument
from tritonclient.grpc import model_config_pb2 as mc

from naiad.errors import InvalidInput
from repository_store import default_model_filename
from workers.ort_spinning import SPINNING, SPINNING_DEFAULT

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


#: Triton's ONNX Runtime thread-count parameters and the SessionOptions field each sets.
THREAD_PARAMETERS = {"intra_op_thread_count": "intra_op_num_threads",
                     "inter_op_thread_count": "inter_op_num_threads"}  # fmt: skip
#: The most threads a thread-count parameter may ask for (a larger value is ignored).
MAX_THREADS = 1024


def _parameter(config: mc.ModelConfig | None, key: str) -> str | None:
    if config is None or key not in config.parameters:
        return None
    return config.parameters[key].string_value.strip()


def session_options(config: mc.ModelConfig | None = None) -> ort.SessionOptions:
    """ONNX Runtime options for ``config``'s model (module docstring). A thread count that
    is not an integer in 0..:data:`MAX_THREADS` (ASCII digits), or a spinning value other
    than "0" or "1", is logged and ignored (the default stays), as the PyTorch backend
    treats its thread counts."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    for key, field in THREAD_PARAMETERS.items():
        value = _parameter(config, key)
        if value is None:
            continue
        if value.isascii() and value.isdigit() and int(value) <= MAX_THREADS:
            setattr(options, field, int(value))
        else:
            logger.warning("ignoring %s=%r: not an integer in 0..%d", key, value, MAX_THREADS)
    spinning = _parameter(config, SPINNING)
    if spinning is not None and spinning not in ("0", "1"):
        logger.warning("ignoring %s=%r: not 0 or 1", SPINNING, spinning)
        spinning = None
    options.add_session_config_entry(SPINNING, spinning or SPINNING_DEFAULT)
    return options


def direct_run(session: ort.InferenceSession) -> Callable[..., list[Any]] | None:
    """The ``run(output_names, feed, run_options)`` of ``session``'s native binding, for a
    session on the CPU provider alone; else None (call ``session.run``). ONNX Runtime's Python
    ``InferenceSession.run`` (``onnxruntime_inference_collection.py``, 1.32) adds to each call
    a check that every graph input is fed (the request was validated against the config
    already, but an input the config marks ``optional`` may be left out: the backend checks
    that one itself, with the wrapper's words), an ownership check of
    ``OrtValue`` inputs (none here: numpy arrays) and a fall-back to other providers on
    ``EPFail`` (nothing to fall back to from the CPU): ~8 µs of a ~41 µs one-row digits run
    and of a ~79 µs 32-row one, in a warm loop on the benchmark VM (``python -m
    bench.perf.ort_run_api``; docs/benchmarks.md, "Stop 34")."""
    binding = getattr(session, "_sess", None)
    run = getattr(binding, "run", None)
    if session.get_providers() != ["CPUExecutionProvider"] or not callable(run):
        return None
    return run


class OnnxRuntimeBackend:
    """One ``InferenceSession`` over ``model.onnx`` (or the config's default file name)."""

    def __init__(self, path: Path, device: str, config: mc.ModelConfig | None = None):
        options = session_options(config)
        self.session = ort.InferenceSession(str(path), options, providers=providers_for(device))
        self.output_names = [output.name for output in self.session.get_outputs()]
        tensors = [*self.session.get_inputs(), *self.session.get_outputs()]
        self.uses_bf16 = any(t.type == "tensor(bfloat16)" for t in tensors)
        self._run = direct_run(self.session)
        #: The graph inputs a run needs (what ``InferenceSession.run`` checks, which the binding's
        #: run does not: a config's ``optional`` input left out would fail in a kernel, with its
        #: source line for a message).
        inputs = self.session.get_inputs()
        self._required = frozenset(i.name for i in inputs if not i.type.startswith("optional"))
        logger.info("loaded %s with %s", path, self.session.get_providers())

    def infer(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        names = outputs or self.output_names
        if self.uses_bf16:
            return self._infer_ort_values(inputs, names)
        feed = {name: _to_ort(array) for name, array in inputs.items()}
        run = self._run
        if run is not None and not self._required <= feed.keys():  # InferenceSession.run's words
            missing = [i.name for i in self.session.get_inputs() if i.name in self._required - feed.keys()]
            raise ValueError(f"Required inputs ({missing}) are missing from input feed ({list(feed)}).")
        try:
            results = run(names, feed, None) if run is not None else self.session.run(names, feed)
        except InvalidArgument as exc:  # the request's fault: Triton answers INVALID_ARG (400)
            raise InvalidInput(f"inference failed: {exc}") from None
        return dict(zip(names, results, strict=True))

    def _infer_ort_values(self, inputs: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        feed = {name: _ort_value(array) for name, array in inputs.items()}
        results = self.session.run_with_ort_values(names, feed)
        return {
            name: _from_bf16_value(v) if v.data_type() == "tensor(bfloat16)" else v.numpy()
            for name, v in zip(names, results, strict=True)
        }


def load(version_dir: Path, config: mc.ModelConfig, device: str) -> OnnxRuntimeBackend:
    return OnnxRuntimeBackend(version_dir / default_model_filename(config), device, config)


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
    providers = ["CPUExecutionProvider"]
    session = ort.InferenceSession(model.SerializeToString(), session_options(), providers=providers)
    session.run(None, {"x": np.zeros((1, 2), np.float32)})
