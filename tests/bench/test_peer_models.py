"""The peers comparison's two Naiad models schedule alike (issue 14: ``max_batch_size`` 32,
``dynamic_batching { }``, one CPU instance): only the backend differs."""

from __future__ import annotations

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from bench.perf.models import ONNX_PEER_CONFIG, PYTHON_CONFIG


def parsed(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def test_digits_onnx_schedules_as_digits_python():
    onnx, python = parsed(ONNX_PEER_CONFIG), parsed(PYTHON_CONFIG)
    assert (onnx.name, onnx.platform, onnx.backend) == ("digits_onnx", "onnxruntime_onnx", "")
    assert python.backend == "python"
    for config in (onnx, python):
        config.ClearField("name"), config.ClearField("platform"), config.ClearField("backend")
    assert onnx == python
    assert onnx.max_batch_size == 32 and onnx.HasField("dynamic_batching")
    assert not onnx.dynamic_batching.preferred_batch_size
