from __future__ import annotations

import pytest
from rs_helpers import ENSEMBLE_CONFIG, onnx_config
from tritonclient.grpc import model_config_pb2

from naiad.errors import ConfigError
from repository_store import (
    backend_of,
    completed_config,
    config_to_triton_json,
    default_model_filename,
    parse_config,
    select_versions,
    validate_config,
)


def test_parse_fills_empty_name() -> None:
    cfg = parse_config(onnx_config("").encode(), "resnet")
    assert isinstance(cfg, model_config_pb2.ModelConfig)
    assert cfg.name == "resnet"
    assert cfg.max_batch_size == 8
    assert [i.name for i in cfg.input] == ["x"]
    assert list(cfg.output[0].dims) == [3]


def test_parse_error_carries_parser_message() -> None:
    with pytest.raises(ConfigError, match=r"does not parse: .*1:\d+"):
        parse_config("max_batch_size: [", "m")


def test_parse_unknown_field_is_an_error() -> None:
    with pytest.raises(ConfigError, match="no_such_field"):
        parse_config("no_such_field: 1", "m")


def test_parse_non_utf8_is_an_error() -> None:
    with pytest.raises(ConfigError, match="UTF-8"):
        parse_config(b'name: "\xff"', "m")


def test_parse_name_mismatch() -> None:
    with pytest.raises(ConfigError, match="does not match"):
        parse_config(onnx_config("other"), "m")


SECOND_X = '{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }'


def cfg_of(text: str, name: str = "m") -> model_config_pb2.ModelConfig:
    return parse_config(text, name)


@pytest.mark.parametrize(
    ("text", "backend", "filename"),
    [
        ('platform: "onnxruntime_onnx"', "onnxruntime", "model.onnx"),
        ('backend: "onnxruntime"', "onnxruntime", "model.onnx"),
        ('platform: "onnxruntime_onnx" backend: "onnxruntime"', "onnxruntime", "model.onnx"),
        ('platform: "pytorch_libtorch"', "pytorch", "model.pt"),
        ('backend: "pytorch"', "pytorch", "model.pt"),
        ('platform: "tensorflow_savedmodel"', "tensorflow", "model.savedmodel"),
        ('backend: "python"', "python", "model.py"),
        ('platform: "ensemble"', "ensemble", ""),
        ('backend: "python" default_model_filename: "entry.py"', "python", "entry.py"),
    ],
)
def test_backend_and_default_filename(text: str, backend: str, filename: str) -> None:
    cfg = cfg_of(text)
    assert backend_of(cfg) == backend
    assert default_model_filename(cfg) == filename


@pytest.mark.parametrize(
    "text",
    [
        "",
        'platform: "tensorrt_plan"',
        'backend: "vllm"',
        'platform: "onnxruntime_onnx" backend: "python"',
    ],
)
def test_unrecognised_backend(text: str) -> None:
    with pytest.raises(ConfigError):
        backend_of(cfg_of(text))


def test_valid_configs_pass() -> None:
    validate_config(cfg_of(onnx_config("m")))
    validate_config(cfg_of(ENSEMBLE_CONFIG))
    scalar = onnx_config("m").replace("dims: [ 4 ]", "dims: [ 1 ] reshape { shape: [ ] }")
    validate_config(cfg_of(scalar))
    reshaped = onnx_config("m").replace("dims: [ 4 ]", "dims: [ 4 ] reshape { shape: [ 2, 2 ] }")
    validate_config(cfg_of(reshaped))
    variable = onnx_config("m").replace("dims: [ 4 ]", "dims: [ -1, 4 ] reshape { shape: [ 8 ] }")
    validate_config(cfg_of(variable))


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("max_batch_size: 8", "max_batch_size: -1", "max_batch_size"),
        ('name: "x" data_type', 'name: "" data_type', "must specify 'name'"),
        ("data_type: TYPE_FP32 dims: [ 4 ]", "dims: [ 4 ]", "data_type"),
        ("dims: [ 4 ]", "dims: [ 0 ]", ">= 1"),
        ("dims: [ 4 ]", "dims: [ -2 ]", ">= 1"),
        ("dims: [ 4 ]", "dims: [ ]", "must specify 'dims'"),
        ("dims: [ 4 ]", "dims: [ 4 ] reshape { shape: [ 3 ] }", "different size"),
        ("dims: [ 4 ]", "dims: [ 4 ] reshape { shape: [ 2, 0 ] }", ">= 1"),
        (
            "output [",
            'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ] output [',
            "more than once",
        ),
        ("input [", "#input [", "at least one input"),
        ("output [", "#output [", "at least one input and one output"),
        ("max_batch_size: 8", "version_policy { latest { num_versions: 0 } }", "num_versions"),
    ],
)
def test_invalid_configs(old: str, new: str, message: str) -> None:
    text = onnx_config("m")
    assert old in text
    with pytest.raises(ConfigError, match=message):
        validate_config(cfg_of(text.replace(old, new, 1)))


def test_empty_reshape_needs_batching() -> None:
    text = onnx_config("m").replace("max_batch_size: 8", "max_batch_size: 0")
    text = text.replace("dims: [ 4 ]", "dims: [ 1 ] reshape { shape: [ ] }")
    with pytest.raises(ConfigError, match="empty reshape"):
        validate_config(cfg_of(text))


@pytest.mark.parametrize(
    ("policy", "available", "expected"),
    [
        ("", [1, 2, 3], [3]),
        ("", [], []),
        ("version_policy { latest { num_versions: 2 } }", [3, 1, 10, 2], [3, 10]),
        ("version_policy { latest { num_versions: 5 } }", [2, 1], [1, 2]),
        ("version_policy { all { } }", [3, 1, 2], [1, 2, 3]),
        ("version_policy { specific { versions: [ 1, 3, 9 ] } }", [1, 2, 3], [1, 3]),
        ("version_policy { specific { versions: [ 9 ] } }", [1, 2, 3], []),
    ],
)
def test_select_versions(policy: str, available: list[int], expected: list[int]) -> None:
    assert select_versions(cfg_of(onnx_config("m", policy)), available) == expected


def test_config_json_uses_proto_field_names_and_numbers() -> None:
    text = onnx_config("m", "dynamic_batching { max_queue_delay_microseconds: 100 }")
    data = config_to_triton_json(cfg_of(text))
    assert data["name"] == "m"
    assert data["max_batch_size"] == 8
    assert data["input"][0]["data_type"] == "TYPE_FP32"
    assert data["input"][0]["dims"] == [4]
    assert data["dynamic_batching"]["max_queue_delay_microseconds"] == 100


def test_completed_config_fills_in_tritons_defaults():
    """The fields Triton 2.51 adds (tests/differential compares them with its answer)."""
    done = config_to_triton_json(completed_config(cfg_of('backend: "python" max_batch_size: 2')))
    assert done["version_policy"] == {"latest": {"num_versions": 1}}
    assert done["default_model_filename"] == "model.py" and done["platform"] == ""
    assert done["instance_group"] == [{"name": "m", "kind": "KIND_CPU", "count": 1, "gpus": [],
                                       "secondary_devices": [], "profile": [], "passive": False,
                                       "host_policy": ""}]  # fmt: skip
    assert done["optimization"]["input_pinned_memory"] == {"enable": True}
    assert done["optimization"]["output_pinned_memory"] == {"enable": True}


def test_completed_config_keeps_what_is_given():
    given = cfg_of("""backend: "onnxruntime" version_policy: { all { } }
        instance_group [ { kind: KIND_AUTO }, { name: "g" count: 3 kind: KIND_GPU gpus: [ 0 ] } ]
        optimization { input_pinned_memory { enable: false } }""")
    done = completed_config(given)
    assert done.platform == "onnxruntime_onnx" and done.HasField("version_policy")
    assert done.version_policy.WhichOneof("policy_choice") == "all"
    assert [(g.name, g.count, g.kind) for g in done.instance_group] == [
        ("m_0", 1, model_config_pb2.ModelInstanceGroup.KIND_CPU),
        ("g", 3, model_config_pb2.ModelInstanceGroup.KIND_GPU),
    ]
    assert not done.optimization.input_pinned_memory.enable and done.optimization.output_pinned_memory.enable
    assert not given.HasField("optimization") or not given.optimization.output_pinned_memory.enable  # a copy


def test_completed_config_of_an_ensemble():
    done = completed_config(cfg_of(ENSEMBLE_CONFIG, "ens"))
    assert done.HasField("model_transaction_policy") and not done.instance_group
    assert not done.default_model_filename and not done.HasField("optimization")
