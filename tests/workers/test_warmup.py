"""workers.warmup: Triton's model_warmup samples run on a real ONNX Runtime model."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from repository_store import parse_config
from workers.backends import load_backend
from workers.cold_start import cold_start_phases
from workers.model import ModelRunner
from workers.warmup import WarmupFailed, run_warmup, sample_inputs

CONFIG = """
name: "double" backend: "onnxruntime" max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


class Recording:
    """A backend wrapper that remembers the batches it ran."""

    def __init__(self, backend):
        self.backend, self.batches = backend, []

    def infer(self, inputs, outputs):
        self.batches.append({name: array.copy() for name, array in inputs.items()})
        return self.backend.infer(inputs, outputs)


def runner_for(tmp_path: pathlib.Path, warmup: str, width: int | None = 4) -> tuple[ModelRunner, Recording]:
    """``y = 2 x`` over ``x`` [batch, width] (ONNX Runtime refuses other widths)."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"])], "double",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, width])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(tmp_path / "model.onnx"))
    config = parse_config(CONFIG + warmup, "double")
    recording = Recording(load_backend(tmp_path, config, "cpu"))
    return ModelRunner(config, recording), recording


def x_input(kind: str, width: int = 4) -> str:
    return f'inputs {{ key: "x" value: {{ data_type: TYPE_FP32 dims: [ {width} ] {kind} }} }}'


def test_samples_run_count_times_as_one_batch_of_batch_size(tmp_path):
    data = np.array([1.0, 2.0, 3.0, 4.0], "<f4").tobytes() + b"ignored tail"
    from_file = x_input('input_data_file: "x.bin"')
    warmup = (f'model_warmup [ {{ name: "zeros" batch_size: 3 count: 2 {x_input("zero_data: true")} }},'
              f' {{ name: "file" batch_size: 2 {from_file} }} ]')
    runner, recording = runner_for(tmp_path, warmup)
    files = {"warmup/x.bin": data}
    assert run_warmup(runner, files.get) > 0
    shapes = [batch["x"].shape for batch in recording.batches]
    assert shapes == [(3, 4), (3, 4), (2, 4)]  # count 2, then count 0 = once
    assert not recording.batches[0]["x"].any()
    np.testing.assert_array_equal(recording.batches[2]["x"], [[1, 2, 3, 4], [1, 2, 3, 4]])


def test_random_data_is_random_and_batch_zero_is_skipped(tmp_path):
    warmup = (f'model_warmup [ {{ name: "r" batch_size: 1 {x_input("random_data: true")} }},'
              f' {{ name: "skipped" batch_size: 0 }} ]')
    runner, recording = runner_for(tmp_path, warmup)
    run_warmup(runner, {}.get)
    [batch] = recording.batches
    assert batch["x"].dtype == np.float32 and batch["x"].std() > 0


def test_a_sample_the_backend_refuses_fails_naming_it(tmp_path):
    wide = x_input("zero_data: true", 5)  # the config allows any width; the model only 4
    runner, _ = runner_for(tmp_path, f'model_warmup [ {{ name: "wide" batch_size: 1 {wide} }} ]')
    with pytest.raises(WarmupFailed, match=r"^warmup sample 'wide' failed: .*(dimension|shape)"):
        run_warmup(runner, {}.get)


def test_a_missing_file_fails_naming_the_sample(tmp_path):
    runner, _ = runner_for(tmp_path, 'model_warmup [ { name: "f" batch_size: 1 '
                           + x_input('input_data_file: "gone.bin"') + " } ]")
    with pytest.raises(WarmupFailed, match="warmup sample 'f' failed: input 'x': warmup/gone.bin is missing"):
        run_warmup(runner, {}.get)


def test_bytes_inputs_are_empty_strings_or_length_prefixed_file_data(tmp_path):
    config = parse_config(
        'name: "s" backend: "onnxruntime" max_batch_size: 0\n'
        'input [ { name: "t" data_type: TYPE_STRING dims: [ 2 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_STRING dims: [ 2 ] } ]\n'
        'model_warmup [ { name: "z" batch_size: 1 inputs { key: "t" value: { data_type: TYPE_STRING'
        ' dims: [ 2 ] random_data: true } } },'
        ' { name: "f" batch_size: 1 inputs { key: "t" value: { data_type: TYPE_STRING dims: [ 2 ]'
        ' input_data_file: "t.bin" } } } ]', "s")  # fmt: skip
    zero, file = config.model_warmup
    inputs, batch = sample_inputs(config, zero, {}.get)
    assert batch == 1 and inputs["t"].tolist() == [b"", b""]
    raw = b"\x02\x00\x00\x00hi\x03\x00\x00\x00abc"
    inputs, _ = sample_inputs(config, file, {"warmup/t.bin": raw}.get)
    assert inputs["t"].tolist() == [b"hi", b"abc"]


def test_cold_start_phases_count_the_warmup(tmp_path):
    from workers.loader import VersionLoad

    phases = cold_start_phases(0.0, {"start": 1.0, "registry": 2.0}, [VersionLoad(1, 0.5, 1.0, 2.5)], 7.0)
    assert phases == {"start": 1.0, "registry": 1.0, "open": 1.0, "pull": 0.5, "load": 1.0, "warmup": 2.5}
