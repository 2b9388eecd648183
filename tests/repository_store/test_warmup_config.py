"""model_warmup checked at index time (repository_store.warmup): a sample that cannot run
makes its model UNAVAILABLE with the reason, as a failing warmup fails Triton's load."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
from rs_helpers import onnx_config, write_tree

from naiad.errors import ConfigError
from repository_store import LocalStore, index_model, parse_config, validate_config

X_ZERO = 'inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } }'


def warmup(*samples: str) -> str:
    return "model_warmup [ " + ", ".join(samples) + " ]"


def sample(inputs: str = X_ZERO, batch: int = 1, name: str = "w") -> str:
    return f'{{ name: "{name}" batch_size: {batch} {inputs} }}'


def check(extra: str) -> None:
    validate_config(parse_config(onnx_config("m", extra), "m"))


def test_a_sound_sample_passes():
    check(warmup(sample(batch=8), sample(
        'inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "x/raw.bin" } }',
        name="from_file")))  # fmt: skip


@pytest.mark.parametrize(("extra", "message"), [
    (warmup(sample(batch=9)), "model_warmup 'w': batch_size 9 is over the model's 8"),
    (warmup(sample('inputs { key: "z" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } }')),
     "the model has no input 'z'"),
    (warmup(sample('inputs { key: "x" value: { data_type: TYPE_INT32 dims: [ 4 ] zero_data: true } }')),
     "data_type TYPE_INT32 is not the config's TYPE_FP32"),
    (warmup(sample('inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 5 ] zero_data: true } }')),
     "dims [5] do not fit the config's [4]"),
    (warmup(sample('inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ -1 ] zero_data: true } }')),
     "dims [-1] must all be fixed"),
    (warmup(sample('inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 4 ] } }')),
     "set one of zero_data, random_data or input_data_file"),
    (warmup(sample('inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "../" } }')),
     "must be a relative path inside the model's warmup/ folder"),
    (warmup(sample("")), "no data for input(s) 'x'"),
])  # fmt: skip
def test_a_broken_sample_is_a_config_error_naming_it(extra, message):
    with pytest.raises(ConfigError, match="model_warmup 'w'") as caught:
        check(extra)
    assert message in caught.value.message


def test_a_batch_zero_sample_is_skipped_as_in_triton():
    check(warmup(sample("", batch=0)))


def test_a_non_batching_model_takes_batch_size_1_only():
    config = onnx_config("m", warmup(sample(batch=2))).replace("max_batch_size: 8", "max_batch_size: 0")
    with pytest.raises(ConfigError, match="batch_size 2 is over the model's 1"):
        validate_config(parse_config(config, "m"))


def file_sample(filename: str) -> str:
    return warmup(sample(
        f'inputs {{ key: "x" value: {{ data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "{filename}" }} }}'))


@pytest.mark.parametrize(("files", "state", "reason"), [
    ({"warmup/x.bin": np.arange(4, dtype="<f4").tobytes()}, "READY", ""),
    ({"warmup/x.bin": np.arange(6, dtype="<f4").tobytes()}, "READY", ""),  # longer: read from its start
    ({"warmup/x.bin": b"\x00" * 8},
     "UNAVAILABLE", "model_warmup 'w' input 'x': warmup/x.bin has 8 bytes, the sample needs 16"),
    ({"x.bin": b"\x00" * 16},
     "UNAVAILABLE", "model_warmup 'w' input 'x': warmup/x.bin is missing from the model folder"),
])  # fmt: skip
def test_the_index_checks_warmup_files(tmp_path: pathlib.Path, files, state, reason):
    tree = {"m/config.pbtxt": onnx_config("m", file_sample("x.bin")), "m/1/model.onnx": b"onnx"}
    root = write_tree(tmp_path / "repo", tree | {f"m/{path}": data for path, data in files.items()})
    entry = index_model(LocalStore(root), "m")
    assert (entry.state, entry.reason) == (state, reason)


def test_the_warmup_folder_is_not_a_version(tmp_path: pathlib.Path):
    tree = {"m/config.pbtxt": onnx_config("m", file_sample("x.bin")), "m/1/model.onnx": b"onnx",
            "m/warmup/x.bin": b"\x00" * 16}  # fmt: skip
    assert index_model(LocalStore(write_tree(tmp_path / "repo", tree)), "m").versions == [1]
