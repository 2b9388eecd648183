"""``silero_vad`` (max_batch_size 0, ``sr`` sent as a [1] INT64 tensor) served over HTTP equals
the packaged upstream graph run directly with onnxruntime (``sr`` fed as a 0-d scalar)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import requests
import tritonclient.http as httpclient


def packaged_silero() -> Path:
    """``silero_vad.onnx`` inside the installed ``silero_vad`` package (found without importing
    it, since importing it loads torch)."""
    spec = importlib.util.find_spec("silero_vad")
    assert spec and spec.submodule_search_locations, "the silero-vad package is not installed"
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.onnx"


def test_silero_vad_equals_onnxruntime(naiad_server, example_repository):
    server = naiad_server()
    triton = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        if not triton.is_model_ready("silero_vad"):
            reason = requests.get(f"{server.http}/v2/models/silero_vad", timeout=5).json().get("error", "")
            pytest.fail(f"silero_vad is not ready: {reason}")
        t = np.arange(512, dtype=np.float32) / 16000
        chunk = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)[None, :]
        state = np.zeros((2, 1, 128), np.float32)
        sr = np.array([16000], np.int64)
        inputs = []
        for name, array, datatype in (
            ("input", chunk, "FP32"),
            ("state", state, "FP32"),
            ("sr", sr, "INT64"),
        ):
            tensor = httpclient.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        result = triton.infer("silero_vad", inputs)
    finally:
        triton.close()
    # The reference is the packaged upstream graph, which takes ``sr`` as a 0-d scalar.
    session = ort.InferenceSession(str(packaged_silero()), providers=["CPUExecutionProvider"])
    output, state_n = session.run(
        ["output", "stateN"], {"input": chunk, "state": state, "sr": np.array(16000, np.int64)}
    )
    np.testing.assert_allclose(result.as_numpy("output"), output, rtol=1e-5)
    np.testing.assert_allclose(result.as_numpy("stateN"), state_n, rtol=1e-5)
