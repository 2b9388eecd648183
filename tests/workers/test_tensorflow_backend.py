"""``workers/backends/tensorflow.py``: tensors matched by the SavedModel signature's keys, the
``TF_SIGNATURE_DEF`` parameter, datatypes (strings included), and the load errors of a config
that disagrees with the signature. Real SavedModels, saved once for the module (TensorFlow's
import alone takes seconds)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from naiad.errors import ModelNotReady
from workers.backends import load_backend

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")


class Arithmetic(tf.Module):
    """``serving_default``: (a, b FP32 [None, 2]; tag BYTES [None, 1]) -> sum, product FP32,
    greeting BYTES. ``scaled``: (x FP32 [None, 2]) -> y = 3x."""

    @tf.function(input_signature=[
        tf.TensorSpec([None, 2], tf.float32, name="a"),
        tf.TensorSpec([None, 2], tf.float32, name="b"),
        tf.TensorSpec([None, 1], tf.string, name="tag"),
    ])  # fmt: skip
    def serve(self, a, b, tag):
        return {"sum": a + b, "product": a * b, "greeting": tf.strings.join(["hello ", tag])}

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
    def scaled(self, x):
        return {"y": x * 3}


@pytest.fixture(scope="module")
def savedmodel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A version folder ``1`` holding ``model.savedmodel`` and ``other.savedmodel``."""
    version = tmp_path_factory.mktemp("tf") / "1"
    module = Arithmetic()
    signatures = {"serving_default": module.serve, "scaled": module.scaled}
    for name in ("model.savedmodel", "other.savedmodel"):
        tf.saved_model.save(module, str(version / name), signatures=signatures)
    return version


def config(text: str, max_batch_size: int = 8) -> mc.ModelConfig:
    head = f'name: "m" platform: "tensorflow_savedmodel" max_batch_size: {max_batch_size}\n'
    return text_format.Parse(head + text, mc.ModelConfig())


def tensor(kind: str, name: str, data_type: str = "TYPE_FP32", dims: str = "[ 2 ]") -> str:
    return f'{kind} {{ name: "{name}" data_type: {data_type} dims: {dims} }}\n'


FULL = (tensor("input", "tag", "TYPE_STRING", "[ 1 ]") + tensor("input", "b") + tensor("input", "a")
        + tensor("output", "product") + tensor("output", "greeting", "TYPE_STRING", "[ 1 ]")
        + tensor("output", "sum"))  # fmt: skip
A = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
B = np.array([[10.0, 20.0], [30.0, 40.0]], np.float32)
TAG = np.array([[b"ada"], [b"\xffbytes"]], dtype=object)


def test_tensors_by_signature_key(savedmodel: Path) -> None:
    backend = load_backend(savedmodel, config(FULL), "cpu")
    out = backend.infer({"a": A, "b": B, "tag": TAG}, [])
    assert list(out) == ["product", "greeting", "sum"]  # the config's order
    np.testing.assert_array_equal(out["sum"], A + B)
    np.testing.assert_array_equal(out["product"], A * B)
    assert out["greeting"].dtype == object
    assert out["greeting"].tolist() == [[b"hello ada"], [b"hello \xffbytes"]]  # bytes, not text
    assert list(backend.infer({"a": A, "b": B, "tag": TAG}, ["sum"])) == ["sum"]


def test_signature_parameter_and_default_model_filename(savedmodel: Path) -> None:
    text = ('default_model_filename: "other.savedmodel"\n'
            'parameters { key: "TF_SIGNATURE_DEF" value: { string_value: "scaled" } }\n'
            + tensor("input", "x") + tensor("output", "y"))  # fmt: skip
    out = load_backend(savedmodel, config(text), "cuda")  # tensorflow-cpu: the CPU all the same
    np.testing.assert_array_equal(out.infer({"x": A}, [])["y"], A * 3)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (FULL.replace('"a"', '"alpha"'), "configuration names input 'alpha', which the signature does not "
                                         "have (its inputs: ['a', 'b', 'tag'])"),
        (FULL.replace('"sum"', '"total"'), "configuration names output 'total'"),
        (tensor("input", "a") + tensor("input", "b") + tensor("output", "sum"),
         "configuration expects 2 inputs, model provides 3"),
        (FULL.replace('name: "a" data_type: TYPE_FP32', 'name: "a" data_type: TYPE_FP64'),
         "configuration expects datatype TYPE_FP64 for input 'a', model provides TYPE_FP32"),
        (FULL.replace('"sum" data_type: TYPE_FP32 dims: [ 2 ]', '"sum" data_type: TYPE_FP32 dims: [ 3 ]'),
         "output 'sum': model shape [-1, 2] does not fit the configuration's [-1, 3]"),
        ('parameters { key: "TF_SIGNATURE_DEF" value: { string_value: "nope" } }\n' + FULL,
         "the SavedModel has no signature 'nope' (it has ['scaled', 'serving_default'])"),
    ],
)  # fmt: skip
def test_config_mismatch_does_not_load(savedmodel: Path, text: str, message: str) -> None:
    with pytest.raises(ModelNotReady, match="unable to load model 'm' version 1 \\(tensorflow\\)") as caught:
        load_backend(savedmodel, config(text), "cpu")
    assert message in caught.value.message


def test_unbatched_config_against_a_batch_dimension(savedmodel: Path) -> None:
    with pytest.raises(ModelNotReady, match=r"input 'tag': model shape \[-1, 1\] does not fit .* \[1\]"):
        load_backend(savedmodel, config(FULL, max_batch_size=0), "cpu")
    dims = FULL.replace("[ 2 ]", "[ -1, 2 ]").replace("[ 1 ]", "[ -1, 1 ]")
    backend = load_backend(savedmodel, config(dims, max_batch_size=0), "cpu")
    np.testing.assert_array_equal(backend.infer({"a": A, "b": B, "tag": TAG}, ["sum"])["sum"], A + B)


def test_not_a_savedmodel_does_not_load(tmp_path: Path) -> None:
    folder = tmp_path / "1" / "model.savedmodel"
    folder.mkdir(parents=True)
    (folder / "saved_model.pb").write_bytes(b"not a SavedModel")
    with pytest.raises(ModelNotReady, match="unable to load model 'm' version 1 \\(tensorflow\\)"):
        load_backend(tmp_path / "1", config(FULL), "cpu")
