"""Auto-completion of missing or partial configs from an ONNX model's graph."""

from __future__ import annotations

import pathlib

import onnx
import pytest
from onnx import TensorProto, helper

from naiad.errors import ConfigError
from repository_store import LocalStore, index_model
from repository_store.autocomplete import complete_from_onnx, needs_autocomplete
from repository_store.config import ModelConfig, model_config_pb2, parse_config

DTYPES = {
    TensorProto.FLOAT: "TYPE_FP32",
    TensorProto.INT64: "TYPE_INT64",
    TensorProto.STRING: "TYPE_STRING",
    TensorProto.BOOL: "TYPE_BOOL",
    TensorProto.FLOAT16: "TYPE_FP16",
    TensorProto.UINT8: "TYPE_UINT8",
    TensorProto.BFLOAT16: "TYPE_BF16",
}


def identity(elem: int, shape: list) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "identity",
        [helper.make_tensor_value_info("x", elem, shape)],
        [helper.make_tensor_value_info("y", elem, shape)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def write_model(root: pathlib.Path, name: str, model: onnx.ModelProto, config: str | None) -> None:
    (root / name / "1").mkdir(parents=True)
    onnx.save(model, str(root / name / "1" / "model.onnx"))
    if config is not None:
        (root / name / "config.pbtxt").write_text(config)


@pytest.mark.parametrize("elem,type_name", DTYPES.items())
def test_every_datatype_maps_to_its_config_type(elem, type_name):
    done = complete_from_onnx(ModelConfig(name="m"), identity(elem, ["batch", 3]))
    assert model_config_pb2.DataType.Name(done.input[0].data_type) == type_name
    assert model_config_pb2.DataType.Name(done.output[0].data_type) == type_name


def test_variable_first_dim_batches_with_triton_defaults():
    done = complete_from_onnx(ModelConfig(name="m"), identity(TensorProto.FLOAT, ["n", 3, 5]))
    assert done.platform == "onnxruntime_onnx"
    assert done.max_batch_size == 4
    assert done.HasField("dynamic_batching")
    assert list(done.input[0].dims) == [3, 5] and list(done.output[0].dims) == [3, 5]


def test_fixed_first_dim_does_not_batch():
    done = complete_from_onnx(ModelConfig(name="m"), identity(TensorProto.FLOAT, [2, "k"]))
    assert done.max_batch_size == 0
    assert not done.HasField("dynamic_batching")
    assert list(done.input[0].dims) == [2, -1]


def test_explicit_settings_are_kept():
    config = parse_config('name: "m" max_batch_size: 16 backend: "onnxruntime"', "m")
    done = complete_from_onnx(config, identity(TensorProto.FLOAT, ["n", 3]))
    assert done.backend == "onnxruntime" and not done.platform
    assert done.max_batch_size == 16 and list(done.input[0].dims) == [3]


def test_complete_config_needs_nothing():
    config = parse_config(
        'name: "m" platform: "onnxruntime_onnx" input [{name: "x" data_type: TYPE_FP32 dims: [1]}]',
        "m",
    )
    assert not needs_autocomplete(config)
    assert needs_autocomplete(ModelConfig(name="m"))


def test_index_completes_a_model_without_config(tmp_path):
    write_model(tmp_path, "bare", identity(TensorProto.INT32, ["n", 4]), None)
    entry = index_model(LocalStore(tmp_path), "bare")
    assert entry.ready, entry.reason
    assert entry.config.max_batch_size == 4
    assert [i.name for i in entry.config.input] == ["x"]


def test_index_completes_a_partial_config(tmp_path):
    write_model(tmp_path, "partial", identity(TensorProto.FLOAT, [2, 2]), 'max_batch_size: 0')
    entry = index_model(LocalStore(tmp_path), "partial")
    assert entry.ready, entry.reason
    assert list(entry.config.output[0].dims) == [2, 2]


def test_garbage_model_file_makes_only_that_model_unavailable(tmp_path):
    (tmp_path / "junk" / "1").mkdir(parents=True)
    (tmp_path / "junk" / "1" / "model.onnx").write_bytes(b"\x00not an onnx file" * 10)
    write_model(tmp_path, "good", identity(TensorProto.FLOAT, ["n", 1]), None)
    store = LocalStore(tmp_path)
    junk = index_model(store, "junk")
    assert not junk.ready and "model.onnx" in junk.reason
    assert index_model(store, "good").ready


def test_no_version_folder_is_unavailable_with_reason(tmp_path):
    (tmp_path / "empty").mkdir()
    entry = index_model(LocalStore(tmp_path), "empty")
    assert not entry.ready and "version" in entry.reason


def test_autocomplete_rejects_non_onnx_platform():
    from repository_store.autocomplete import autocomplete

    config = parse_config('name: "m" platform: "pytorch_libtorch"', "m")
    with pytest.raises(ConfigError):
        autocomplete(None, config, [1])
