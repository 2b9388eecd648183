"""``examples/build_repository.py``: the example repository it writes is valid for Triton and
for Naiad, its models run at the shapes their configs declare, and rebuilding changes nothing.

The script runs as ``make repo`` runs it (a subprocess); the checks below re-derive everything
from the written files with onnxruntime and ``ModelConfig``, not from the script's helpers.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BUILD = EXAMPLES / "build_repository.py"
ORT_TYPES = {
    model_config_pb2.TYPE_FP32: "tensor(float)",
    model_config_pb2.TYPE_INT64: "tensor(int64)",
}


def build(out_dir: Path) -> str:
    """Run the build script; returns its stdout."""
    done = subprocess.run(
        [sys.executable, str(BUILD), str(out_dir)],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def load_config(model_dir: Path) -> model_config_pb2.ModelConfig:
    text = (model_dir / "config.pbtxt").read_text()
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def session(model_dir: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(model_dir / "1" / "model.onnx"), providers=["CPUExecutionProvider"])


def model_shape(io, config: model_config_pb2.ModelConfig, batch: int) -> list[int]:
    """The tensor shape the ONNX graph sees: ``reshape`` applied, the batch dim prepended."""
    dims = list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)
    return [batch, *dims] if config.max_batch_size > 0 else dims


def fits(dims: list[int], shape: tuple[int, ...]) -> bool:
    return len(dims) == len(shape) and all(d in (-1, s) for d, s in zip(dims, shape, strict=True))


def snapshot(root: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every file under ``root``: its bytes, inode and mtime."""
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_ino, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out_dir = tmp_path_factory.mktemp("build") / "model_repository"
    build(out_dir)
    return out_dir


@pytest.fixture(scope="module")
def holdout() -> Iterator[tuple[np.ndarray, np.ndarray]]:
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(EXAMPLES))
        from digits_data import load_holdout

        yield load_holdout()


def test_help() -> None:
    done = subprocess.run([sys.executable, str(BUILD), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "OUT_DIR" in done.stdout


def test_layout(repository: Path) -> None:
    files = sorted(str(p.relative_to(repository)) for p in repository.rglob("*") if p.is_file())
    assert files == [
        "digits/1/model.onnx",
        "digits/config.pbtxt",
        "digits/labels.txt",
        "digits_ensemble/config.pbtxt",
        "digits_ensemble/labels.txt",
        "digits_mlp/1/model.onnx",
        "digits_mlp/config.pbtxt",
        "digits_mlp/labels.txt",
        "digits_preprocess/1/model.py",
        "digits_preprocess/1/normalization.json",
        "digits_preprocess/config.pbtxt",
        "digits_pytorch/1/model.pt",
        "digits_pytorch/config.pbtxt",
        "digits_pytorch/labels.txt",
        "digits_tensorflow/1/model.savedmodel/fingerprint.pb",
        "digits_tensorflow/1/model.savedmodel/saved_model.pb",
        "digits_tensorflow/1/model.savedmodel/variables/variables.data-00000-of-00001",
        "digits_tensorflow/1/model.savedmodel/variables/variables.index",
        "digits_tensorflow/config.pbtxt",
        "digits_tensorflow/labels.txt",
        "silero_vad/1/model.onnx",
        "silero_vad/config.pbtxt",
    ]
    assert not list(repository.parent.glob(".*build-*")), "staging folder left behind"


def test_configs_parse(repository: Path) -> None:
    digits, silero = load_config(repository / "digits"), load_config(repository / "silero_vad")
    assert (digits.name, silero.name) == ("digits", "silero_vad")
    assert digits.platform == silero.platform == "onnxruntime_onnx"
    assert digits.max_batch_size == 64 and silero.max_batch_size == 0
    assert list(digits.dynamic_batching.preferred_batch_size) == [8, 16]
    assert digits.dynamic_batching.max_queue_delay_microseconds == 2000
    assert [g.kind for g in digits.instance_group] == [model_config_pb2.ModelInstanceGroup.KIND_CPU]
    sr = next(io for io in silero.input if io.name == "sr")
    # Triton refuses an empty reshape on a non-batching model: sr is a plain [1] tensor.
    assert list(sr.dims) == [1] and not sr.HasField("reshape")
    for model in (digits, silero):
        for io in [*model.input, *model.output]:
            assert not (io.HasField("reshape") and model.max_batch_size == 0), io.name


def test_digits_labels_file(repository: Path) -> None:
    config = load_config(repository / "digits")
    probabilities = next(io for io in config.output if io.name == "probabilities")
    labels = (repository / "digits" / probabilities.label_filename).read_text().splitlines()
    assert labels == [str(i) for i in range(10)]


@pytest.mark.parametrize("model", ["digits", "digits_mlp", "silero_vad"])
def test_graph_signature_matches_config(repository: Path, model: str) -> None:
    config, graph = load_config(repository / model), session(repository / model)
    assert {i.name: i.type for i in graph.get_inputs()} == {
        io.name: ORT_TYPES[io.data_type] for io in config.input
    }
    assert {o.name: o.type for o in graph.get_outputs()} == {
        io.name: ORT_TYPES[io.data_type] for io in config.output
    }


@pytest.mark.parametrize("batch", [1, 7, 64])
def test_digits_output_shapes(repository: Path, holdout: tuple[np.ndarray, np.ndarray], batch: int) -> None:
    config, graph = load_config(repository / "digits"), session(repository / "digits")
    (input_io,) = config.input
    rows = holdout[0][:batch]
    assert fits(model_shape(input_io, config, batch), rows.shape)
    names = [io.name for io in config.output]
    outputs = dict(zip(names, graph.run(names, {"input": rows}), strict=True))
    for io in config.output:
        assert list(outputs[io.name].shape) == model_shape(io, config, batch), io.name
    assert outputs["probabilities"].dtype == np.float32
    assert outputs["label"].dtype == np.int64


def test_digits_holdout_accuracy(repository: Path, holdout: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = holdout
    assert x.shape == (360, 64) and x.dtype == np.float32
    assert y.shape == (360,) and y.dtype == np.int64
    graph = session(repository / "digits")
    labels = np.concatenate(
        [graph.run(["label"], {"input": x[i : i + 64]})[0][:, 0] for i in range(0, len(x), 64)]
    )
    assert np.mean(labels == y) > 0.9


def test_framework_digits_configs(repository: Path) -> None:
    torch_config = load_config(repository / "digits_pytorch")
    tf_config = load_config(repository / "digits_tensorflow")
    assert (torch_config.platform, tf_config.platform) == ("pytorch_libtorch", "tensorflow_savedmodel")
    assert [io.name for io in torch_config.input] == ["input__0"]
    assert [io.name for io in torch_config.output] == ["output__0", "output__1"]
    assert [io.name for io in tf_config.input] == ["input"]
    assert [io.name for io in tf_config.output] == ["probabilities", "label"]
    onnx_config = load_config(repository / "digits")
    for config in (torch_config, tf_config):
        assert config.max_batch_size == onnx_config.max_batch_size
        assert config.dynamic_batching == onnx_config.dynamic_batching
        for io, onnx_io in zip([*config.input, *config.output], [*onnx_config.input, *onnx_config.output],
                               strict=True):
            assert (io.data_type, list(io.dims)) == (onnx_io.data_type, list(onnx_io.dims))
        labels = (repository / config.name / "labels.txt").read_text()
        assert labels == (repository / "digits" / "labels.txt").read_text()


def onnx_outputs(repository: Path, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    probabilities, label = session(repository / "digits").run(["probabilities", "label"], {"input": x})
    return probabilities, label


@pytest.mark.parametrize("batch", [1, 64, 360])
def test_torchscript_digits_equals_onnx(
    repository: Path, holdout: tuple[np.ndarray, np.ndarray], batch: int
) -> None:
    import torch

    with warnings.catch_warnings():  # torch 2.9+ calls TorchScript deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        module = torch.jit.load(str(repository / "digits_pytorch" / "1" / "model.pt"))
    x = holdout[0][:batch]
    probabilities, label = module(torch.from_numpy(x.copy()))
    expected_probabilities, expected_label = onnx_outputs(repository, x)
    assert probabilities.dtype == torch.float32 and label.dtype == torch.int64
    np.testing.assert_allclose(probabilities.numpy(), expected_probabilities, atol=1e-5)
    np.testing.assert_array_equal(label.numpy(), expected_label)


@pytest.mark.parametrize("batch", [1, 64, 360])
def test_savedmodel_digits_equals_onnx(
    repository: Path, holdout: tuple[np.ndarray, np.ndarray], batch: int
) -> None:
    import tensorflow as tf

    loaded = tf.saved_model.load(str(repository / "digits_tensorflow" / "1" / "model.savedmodel"))
    signature = loaded.signatures["serving_default"]
    assert sorted(signature.structured_input_signature[1]) == ["input"]
    x = holdout[0][:batch]
    outputs = signature(input=tf.constant(x))
    expected_probabilities, expected_label = onnx_outputs(repository, x)
    np.testing.assert_allclose(outputs["probabilities"].numpy(), expected_probabilities, atol=1e-5)
    np.testing.assert_array_equal(outputs["label"].numpy(), expected_label)


def test_preprocessing_ensemble_layout(repository: Path) -> None:
    ensemble = load_config(repository / "digits_ensemble")
    assert ensemble.platform == "ensemble" and ensemble.max_batch_size == 64
    assert [s.model_name for s in ensemble.ensemble_scheduling.step] == ["digits_preprocess", "digits_mlp"]
    assert (repository / "digits_ensemble" / "1").is_dir()  # the (empty) version folder
    preprocess = load_config(repository / "digits_preprocess")
    assert preprocess.backend == "python" and [io.name for io in preprocess.input] == ["pixels"]
    source = (repository / "digits_preprocess" / "1" / "model.py").read_text()
    assert "import triton_python_backend_utils as pb_utils" in source and "class TritonPythonModel" in source


@pytest.mark.parametrize("batch", [1, 64, 360])
def test_normalised_mlp_equals_digits(
    repository: Path, holdout: tuple[np.ndarray, np.ndarray], batch: int
) -> None:
    """What the ensemble computes (normalisation with the shipped statistics, then
    ``digits_mlp``) is ``digits`` on the raw pixels."""
    import json

    statistics = json.loads((repository / "digits_preprocess" / "1" / "normalization.json").read_text())
    x = holdout[0][:batch]
    features = ((x - np.float32(statistics["mean"])) / np.float32(statistics["scale"])).astype(np.float32)
    mlp = session(repository / "digits_mlp")
    probabilities, label = mlp.run(["probabilities", "label"], {"input": features})
    expected_probabilities, expected_label = onnx_outputs(repository, x)
    np.testing.assert_allclose(probabilities, expected_probabilities, atol=1e-5)
    np.testing.assert_array_equal(label, expected_label)


def silero_feeds(config: model_config_pb2.ModelConfig, batch: int) -> dict[str, np.ndarray]:
    """What a client sends, at the config's dims (-1 filled in): a loud square wave."""
    feeds = {
        "input": np.zeros((batch, 512), dtype=np.float32),
        "state": np.zeros((2, batch, 128), dtype=np.float32),
        "sr": np.array([16000], dtype=np.int64),
    }
    feeds["input"][:, ::2] = 0.5
    for io in config.input:
        assert fits(model_shape(io, config, batch), feeds[io.name].shape), io.name
    return feeds


def packaged_silero() -> ort.InferenceSession:
    spec = importlib.util.find_spec("silero_vad")  # finds it without importing torch
    assert spec is not None and spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.onnx"
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("batch", [1, 3])
def test_silero_runs_at_config_shapes(repository: Path, batch: int) -> None:
    config, graph = load_config(repository / "silero_vad"), session(repository / "silero_vad")
    reference = packaged_silero()
    feeds, names = silero_feeds(config, batch), [io.name for io in config.output]
    for _ in range(2):  # the state it returns goes back in, as a streaming client does
        outputs = dict(zip(names, graph.run(names, feeds), strict=True))
        for io in config.output:
            assert fits(list(io.dims), outputs[io.name].shape), io.name
        assert outputs["output"].shape == (batch, 1)
        assert np.all((outputs["output"] >= 0) & (outputs["output"] <= 1))
        # Same numbers as the packaged graph, which takes sr as a scalar.
        expected = reference.run(names, {**feeds, "sr": feeds["sr"].reshape(())})
        for name, array in zip(names, expected, strict=True):
            np.testing.assert_array_equal(outputs[name], array)
        feeds["state"] = outputs["stateN"]


def test_rebuild_is_idempotent(repository: Path) -> None:
    before = snapshot(repository)
    stdout = build(repository)
    assert stdout.count("up to date") == 7, stdout
    assert snapshot(repository) == before


def test_rebuild_repairs_and_keeps_other_models(tmp_path: Path, repository: Path) -> None:
    out_dir = tmp_path / "repo"
    for path in repository.rglob("*"):
        if path.is_file():
            target = out_dir / path.relative_to(repository)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    (out_dir / "digits" / "labels.txt").write_text("tampered\n")
    (out_dir / "other" / "1").mkdir(parents=True)
    (out_dir / "other" / "config.pbtxt").write_text('name: "other"\n')
    stdout = build(out_dir)
    assert "digits: updated" in stdout and "silero_vad: up to date" in stdout, stdout
    assert "digits_pytorch: up to date" in stdout, stdout
    assert snapshot(out_dir / "digits").keys() == snapshot(repository / "digits").keys()
    assert (out_dir / "digits" / "labels.txt").read_bytes() == (
        repository / "digits" / "labels.txt"
    ).read_bytes()
    assert (out_dir / "other" / "config.pbtxt").read_text() == 'name: "other"\n'
