"""Build Naiad's example Triton model repository into OUT_DIR.

Seven models, all from data shipped inside installed packages (nothing is downloaded):

- ``digits``: a small MLP trained on scikit-learn's handwritten digits (the 360-row holdout of
  ``digits_data.py`` is never seen in training), exported with skl2onnx. ``max_batch_size: 64``
  with dynamic batching; input ``input`` FP32 [64] (raw 0..16 pixels), outputs
  ``probabilities`` FP32 [10] (with ``labels.txt`` for the classification extension) and
  ``label`` INT64 [1].
- ``digits_pytorch`` and ``digits_tensorflow``: the same trained classifier (the same weights,
  taken from the fitted scikit-learn pipeline) as TorchScript (``pytorch_libtorch``, Triton's
  ``input__0``/``output__0``/``output__1`` naming) and as a SavedModel
  (``tensorflow_savedmodel``, the ONNX model's tensor names as signature keys); each is checked
  to give the ONNX model's outputs on the holdout (probabilities within 1e-5, same labels).
- ``digits_ensemble`` (``platform: "ensemble"``), Triton's classic preprocessing ensemble:
  ``digits_preprocess`` (Python backend, ``digits_preprocess_model.py`` as its ``model.py``)
  turns raw 8x8 UINT8 images (pixels 0..16) into FP32 [64] features normalised with the
  training split's StandardScaler statistics (``normalization.json``), and ``digits_mlp``
  (the same trained MLP without its scaler, ONNX) classifies them. The ensemble's outputs are
  ``digits``' on the same pixels; the build checks that the normalisation and ``digits_mlp``
  give the ONNX ``digits`` outputs on the holdout.
- ``silero_vad``: the pretrained Silero VAD ONNX file from the ``silero_vad`` package,
  ``max_batch_size: 0`` because its recurrent ``state`` carries the batch at dim 1. Its scalar
  ``sr`` input becomes a [1] input (a Reshape node added in front): Triton has no 0-d tensors
  and allows an empty ``reshape`` only on batching models. Outputs are checked bit-identical
  to the packaged graph.

Each model is built into a staging folder next to OUT_DIR, checked (config parsed into
``ModelConfig``, the ONNX graph run with onnxruntime at the config's shapes), and only then
moved into OUT_DIR; a model whose files are already identical is left untouched, so rebuilding
is idempotent and other models in OUT_DIR are never touched.
"""

from __future__ import annotations

import argparse
import filecmp
import functools
import importlib.util
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from digits_data import N_CLASSES, N_FEATURES, load_split
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

DIGITS_CONFIG = """\
name: "digits"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [
  { name: "input" data_type: TYPE_FP32 dims: [ 64 ] }
]
output [
  { name: "probabilities" data_type: TYPE_FP32 dims: [ 10 ] label_filename: "labels.txt" },
  { name: "label" data_type: TYPE_INT64 dims: [ 1 ] }
]
dynamic_batching {
  preferred_batch_size: [ 8, 16 ]
  max_queue_delay_microseconds: 2000
}
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

DIGITS_PYTORCH_CONFIG = """\
name: "digits_pytorch"
platform: "pytorch_libtorch"
max_batch_size: 64
# Triton's PyTorch naming: <name>__<index> is the position among forward's arguments/results.
input [
  { name: "input__0" data_type: TYPE_FP32 dims: [ 64 ] }
]
output [
  { name: "output__0" data_type: TYPE_FP32 dims: [ 10 ] label_filename: "labels.txt" },
  { name: "output__1" data_type: TYPE_INT64 dims: [ 1 ] }
]
dynamic_batching {
  preferred_batch_size: [ 8, 16 ]
  max_queue_delay_microseconds: 2000
}
# A GPU where the worker has one, else the CPU.
instance_group [ { kind: KIND_AUTO count: 1 } ]
"""

DIGITS_TENSORFLOW_CONFIG = """\
name: "digits_tensorflow"
platform: "tensorflow_savedmodel"
max_batch_size: 64
# Names are the serving_default signature's keys.
input [
  { name: "input" data_type: TYPE_FP32 dims: [ 64 ] }
]
output [
  { name: "probabilities" data_type: TYPE_FP32 dims: [ 10 ] label_filename: "labels.txt" },
  { name: "label" data_type: TYPE_INT64 dims: [ 1 ] }
]
dynamic_batching {
  preferred_batch_size: [ 8, 16 ]
  max_queue_delay_microseconds: 2000
}
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

DIGITS_MLP_CONFIG = """\
name: "digits_mlp"
platform: "onnxruntime_onnx"
max_batch_size: 64
# Features already normalised (digits_preprocess): the digits MLP without its StandardScaler.
input [
  { name: "input" data_type: TYPE_FP32 dims: [ 64 ] }
]
output [
  { name: "probabilities" data_type: TYPE_FP32 dims: [ 10 ] label_filename: "labels.txt" },
  { name: "label" data_type: TYPE_INT64 dims: [ 1 ] }
]
dynamic_batching {
  preferred_batch_size: [ 8, 16 ]
  max_queue_delay_microseconds: 2000
}
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

DIGITS_PREPROCESS_CONFIG = """\
name: "digits_preprocess"
backend: "python"
max_batch_size: 64
input [
  { name: "pixels" data_type: TYPE_UINT8 dims: [ 8, 8 ] }
]
output [
  { name: "features" data_type: TYPE_FP32 dims: [ 64 ] }
]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

DIGITS_ENSEMBLE_CONFIG = """\
name: "digits_ensemble"
platform: "ensemble"
max_batch_size: 64
input [
  { name: "pixels" data_type: TYPE_UINT8 dims: [ 8, 8 ] }
]
output [
  { name: "probabilities" data_type: TYPE_FP32 dims: [ 10 ] label_filename: "labels.txt" },
  { name: "label" data_type: TYPE_INT64 dims: [ 1 ] }
]
ensemble_scheduling {
  step [
    {
      model_name: "digits_preprocess"
      model_version: -1
      input_map { key: "pixels" value: "pixels" }
      output_map { key: "features" value: "features" }
    },
    {
      model_name: "digits_mlp"
      model_version: -1
      input_map { key: "input" value: "features" }
      output_map { key: "probabilities" value: "probabilities" }
      output_map { key: "label" value: "label" }
    }
  ]
}
"""

SILERO_CONFIG = """\
name: "silero_vad"
platform: "onnxruntime_onnx"
# The recurrent state is [2, batch, 128]: the batch is not dim 0, so no implicit batch dim.
max_batch_size: 0
input [
  { name: "input" data_type: TYPE_FP32 dims: [ -1, -1 ] },
  { name: "state" data_type: TYPE_FP32 dims: [ 2, -1, 128 ] },
  # The sample rate, 8000 or 16000. Triton has no scalar tensors (and refuses an empty
  # reshape when max_batch_size is 0), so the graph was given a [1] input that it squeezes.
  { name: "sr" data_type: TYPE_INT64 dims: [ 1 ] }
]
output [
  { name: "output" data_type: TYPE_FP32 dims: [ -1, 1 ] },
  { name: "stateN" data_type: TYPE_FP32 dims: [ 2, -1, 128 ] }
]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

MIN_DIGITS_ACCURACY = 0.9
# How far another framework's digits probabilities may be from the ONNX model's (float32).
DIGITS_ATOL = 1e-5
ONNX_OPSET = {"": 15, "ai.onnx.ml": 3}
ORT_TYPES = {
    model_config_pb2.TYPE_FP32: "tensor(float)",
    model_config_pb2.TYPE_INT64: "tensor(int64)",
}


def parse_config(text: str) -> model_config_pb2.ModelConfig:
    """Parse ``config.pbtxt`` text exactly as the gateway does."""
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def model_side_dims(io, max_batch_size: int) -> list[int]:
    """Shape the ONNX graph sees for a config input/output: reshape applied, batch dim added."""
    dims = list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)
    return [-1, *dims] if max_batch_size > 0 else dims


def shape_matches(dims: Sequence[int], shape: Sequence[int]) -> bool:
    """Whether a concrete ``shape`` fits config ``dims`` (``-1`` matches any size)."""
    return len(dims) == len(shape) and all(d in (-1, s) for d, s in zip(dims, shape, strict=True))


def check_signature(session: ort.InferenceSession, config: model_config_pb2.ModelConfig) -> None:
    """The graph's input and output names and element types are exactly the config's."""
    for kind, graph_ios, config_ios in (
        ("input", session.get_inputs(), config.input),
        ("output", session.get_outputs(), config.output),
    ):
        graph = {io.name: io.type for io in graph_ios}
        declared = {io.name: ORT_TYPES[io.data_type] for io in config_ios}
        if graph != declared:
            raise ValueError(f"{config.name}: graph {kind}s {graph} != config {declared}")


def check_outputs(config: model_config_pb2.ModelConfig, outputs: dict[str, np.ndarray], batch: int) -> None:
    """Each output's concrete shape fits the config (with ``batch`` as the batch dim)."""
    for io in config.output:
        dims = model_side_dims(io, config.max_batch_size)
        if config.max_batch_size > 0:
            dims[0] = batch
        if not shape_matches(dims, outputs[io.name].shape):
            raise ValueError(f"{config.name}.{io.name}: shape {outputs[io.name].shape} != {dims}")


def run_session(session: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run every output of ``session``; returns them by name."""
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


@functools.cache
def train_digits():
    """A scaled MLP on the training part of the fixed split (about 0.5 s; once per process)."""
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x_train, _, y_train, _ = load_split()
    model = make_pipeline(
        StandardScaler(),
        MLPClassifier(hidden_layer_sizes=(64,), max_iter=1000, random_state=0),
    )
    return model.fit(x_train, y_train)


def export_digits(model) -> onnx.ModelProto:
    """skl2onnx export, then ``label`` reshaped from [batch] to [batch, 1] for Triton's dims."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    proto = convert_sklearn(
        model,
        initial_types=[("input", FloatTensorType([None, N_FEATURES]))],
        options={id(model[-1]): {"zipmap": False}},
        target_opset=ONNX_OPSET,
    )
    graph = proto.graph
    # skl2onnx names the graph with a random uuid and lists opsets in set (hash seed) order.
    graph.name = "digits"
    opsets = sorted(proto.opset_import, key=lambda opset: opset.domain)
    del proto.opset_import[:]
    proto.opset_import.extend(opsets)
    for node in graph.node:
        node.output[:] = ["label_flat" if out == "label" else out for out in node.output]
    graph.initializer.append(onnx.numpy_helper.from_array(np.array([-1, 1], dtype=np.int64), "label_shape"))
    graph.node.append(
        onnx.helper.make_node("Reshape", ["label_flat", "label_shape"], ["label"], name="label_2d")
    )
    label = next(o for o in graph.output if o.name == "label")
    label.CopyFrom(onnx.helper.make_tensor_value_info("label", onnx.TensorProto.INT64, [None, 1]))
    onnx.checker.check_model(proto, full_check=True)
    return proto


def digits_accuracy(model_file: Path, config: model_config_pb2.ModelConfig) -> float:
    """Accuracy of the ONNX file on the holdout; checks shapes at a full batch and at one row."""
    _, x_holdout, _, y_holdout = load_split()
    session = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    check_signature(session, config)
    for batch in (config.max_batch_size, 1):
        check_outputs(config, run_session(session, {"input": x_holdout[:batch]}), batch)
    outputs = run_session(session, {"input": x_holdout})
    if not np.array_equal(outputs["label"][:, 0], outputs["probabilities"].argmax(axis=1)):
        raise ValueError("digits: label disagrees with argmax(probabilities)")
    return float(np.mean(outputs["label"][:, 0] == y_holdout))


def build_digits(model_dir: Path) -> str:
    config = write_digits_folder(model_dir, DIGITS_CONFIG)
    model_file = model_dir / "1" / "model.onnx"
    model_file.write_bytes(export_digits(train_digits()).SerializeToString())
    accuracy = digits_accuracy(model_file, config)
    if accuracy <= MIN_DIGITS_ACCURACY:
        raise ValueError(f"digits: holdout accuracy {accuracy:.4f} <= {MIN_DIGITS_ACCURACY}")
    return f"holdout accuracy {accuracy:.4f} on 360 digits"


@functools.cache
def digits_reference() -> tuple[np.ndarray, np.ndarray]:
    """The ONNX ``digits`` model's ``(probabilities, label)`` on the 360 holdout rows."""
    _, x_holdout, _, _ = load_split()
    proto = export_digits(train_digits()).SerializeToString()
    session = ort.InferenceSession(proto, providers=["CPUExecutionProvider"])
    outputs = run_session(session, {"input": x_holdout})
    return outputs["probabilities"], outputs["label"]


def check_same_as_onnx(
    config: model_config_pb2.ModelConfig, run: Callable[[np.ndarray], dict[str, np.ndarray]]
) -> str:
    """``run`` (holdout rows -> outputs by config name, probabilities first) fits the config's
    shapes at a full batch and at one row, and gives the ONNX model's outputs on the holdout."""
    _, x_holdout, _, _ = load_split()
    for batch in (config.max_batch_size, 1):
        check_outputs(config, run(x_holdout[:batch]), batch)
    outputs = run(x_holdout)
    probabilities, label = (outputs[io.name] for io in config.output)
    expected_probabilities, expected_label = digits_reference()
    if probabilities.dtype != np.float32 or label.dtype != np.int64:
        raise ValueError(f"{config.name}: output dtypes {probabilities.dtype}, {label.dtype}")
    gap = float(np.max(np.abs(probabilities - expected_probabilities)))
    if gap > DIGITS_ATOL or not np.array_equal(label, expected_label):
        raise ValueError(f"{config.name}: differs from the ONNX digits model (max |dp| {gap:.2e})")
    return f"same outputs as the ONNX digits on 360 holdout digits (max |dp| {gap:.1e})"


def write_digits_folder(model_dir: Path, config_text: str) -> model_config_pb2.ModelConfig:
    """The model folder's config, labels file and empty version folder ``1``."""
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(config_text)
    (model_dir / "labels.txt").write_text("".join(f"{i}\n" for i in range(N_CLASSES)))
    return parse_config(config_text)


def build_digits_pytorch(model_dir: Path) -> str:
    import torch
    from digits_export import digits_weights, save_torchscript

    config = write_digits_folder(model_dir, DIGITS_PYTORCH_CONFIG)
    model_file = model_dir / "1" / "model.pt"
    save_torchscript(digits_weights(train_digits()), model_file)
    with warnings.catch_warnings():  # torch 2.9+ calls TorchScript deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        module = torch.jit.load(str(model_file))

    def run(x: np.ndarray) -> dict[str, np.ndarray]:
        with torch.inference_mode():
            results = module(torch.from_numpy(x.copy()))
        return {io.name: r.numpy() for io, r in zip(config.output, results, strict=True)}

    return check_same_as_onnx(config, run)


def build_digits_tensorflow(model_dir: Path) -> str:
    from digits_export import digits_weights, save_savedmodel

    config = write_digits_folder(model_dir, DIGITS_TENSORFLOW_CONFIG)
    model_file = model_dir / "1" / "model.savedmodel"
    save_savedmodel(digits_weights(train_digits()), model_file)
    import tensorflow as tf

    signature = tf.saved_model.load(str(model_file)).signatures["serving_default"]

    def run(x: np.ndarray) -> dict[str, np.ndarray]:
        results = signature(input=tf.constant(x))
        return {io.name: results[io.name].numpy() for io in config.output}

    return check_same_as_onnx(config, run)


def normalization(x: np.ndarray) -> np.ndarray:
    """What ``digits_preprocess`` computes, from the statistics it is given, for FP32 [n, 64]
    pixels (the build's check of ``digits_mlp`` and of those statistics)."""
    from digits_export import digits_weights

    weights = digits_weights(train_digits())
    return (x - weights.mean) / weights.scale


def build_digits_mlp(model_dir: Path) -> str:
    """The fitted MLP without its StandardScaler, checked to give the ONNX ``digits``
    outputs on normalised holdout rows."""
    config = write_digits_folder(model_dir, DIGITS_MLP_CONFIG)
    proto = export_digits(train_digits()[1:])  # the pipeline's last step only
    proto.graph.name = "digits_mlp"
    model_file = model_dir / "1" / "model.onnx"
    model_file.write_bytes(proto.SerializeToString())
    session = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    check_signature(session, config)
    return check_same_as_onnx(config, lambda x: run_session(session, {"input": normalization(x)}))


def build_digits_preprocess(model_dir: Path) -> str:
    """``model.py`` (from ``digits_preprocess_model.py``) and the StandardScaler statistics it
    normalises with."""
    import json

    from digits_export import digits_weights

    parse_config(DIGITS_PREPROCESS_CONFIG)
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(DIGITS_PREPROCESS_CONFIG)
    source = (Path(__file__).parent / "digits_preprocess_model.py").read_text()
    (model_dir / "1" / "model.py").write_text(source)
    weights = digits_weights(train_digits())
    statistics = {"mean": weights.mean.tolist(), "scale": weights.scale.tolist()}
    (model_dir / "1" / "normalization.json").write_text(json.dumps(statistics, indent=1) + "\n")
    return "raw UINT8 [8, 8] pixels -> normalised FP32 [64] features"


def build_digits_ensemble(model_dir: Path) -> str:
    """The ensemble's config, labels and empty version folder (an ensemble has no file)."""
    config = write_digits_folder(model_dir, DIGITS_ENSEMBLE_CONFIG)
    steps = " -> ".join(step.model_name for step in config.ensemble_scheduling.step)
    return f"pixels -> {steps}"


def silero_source() -> Path:
    """The packaged ONNX file, found without importing ``silero_vad`` (which imports torch)."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the silero-vad package is not installed (pip install --no-deps)")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.onnx"


def rename_uses(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Rename every node input ``old`` to ``new`` in ``graph`` and its subgraphs (If, Loop)."""
    for node in graph.node:
        node.input[:] = [new if name == old else name for name in node.input]
        for attribute in node.attribute:
            for subgraph in [attribute.g] if attribute.HasField("g") else attribute.graphs:
                rename_uses(subgraph, old, new)


def squeeze_sr(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The Silero graph with its scalar ``sr`` input turned into a [1] input squeezed inside."""
    graph = proto.graph
    rename_uses(graph, "sr", "sr_scalar")
    sr = next(i for i in graph.input if i.name == "sr")
    sr.CopyFrom(onnx.helper.make_tensor_value_info("sr", onnx.TensorProto.INT64, [1]))
    graph.initializer.append(onnx.numpy_helper.from_array(np.zeros(0, dtype=np.int64), "sr_scalar_shape"))
    squeeze = onnx.helper.make_node("Reshape", ["sr", "sr_scalar_shape"], ["sr_scalar"])
    nodes = [squeeze, *graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.checker.check_model(proto, full_check=True)
    return proto


def silero_feeds(batch: int) -> dict[str, np.ndarray]:
    """One 512-sample 16 kHz chunk (a 440 Hz tone) per row, a zero state, ``sr`` as [1]."""
    t = np.arange(512, dtype=np.float32) / 16000
    return {
        "input": np.tile(0.5 * np.sin(2 * np.pi * 440 * t), (batch, 1)).astype(np.float32),
        "state": np.zeros((2, batch, 128), dtype=np.float32),
        "sr": np.array([16000], dtype=np.int64),
    }


def build_silero(model_dir: Path) -> str:
    config = parse_config(SILERO_CONFIG)
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(SILERO_CONFIG)
    model_file = model_dir / "1" / "model.onnx"
    original = silero_source()
    model_file.write_bytes(squeeze_sr(onnx.load(original)).SerializeToString())
    session = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    reference = ort.InferenceSession(str(original), providers=["CPUExecutionProvider"])
    check_signature(session, config)
    for batch in (1, 2):
        feeds = silero_feeds(batch)
        for io in config.input:
            if not shape_matches(model_side_dims(io, 0), feeds[io.name].shape):
                raise ValueError(f"silero_vad.{io.name}: feed shape does not fit the config")
        outputs = run_session(session, feeds)
        check_outputs(config, outputs, batch)
        expected = run_session(reference, {**feeds, "sr": feeds["sr"].reshape(())})
        if any(not np.array_equal(outputs[k], expected[k]) for k in expected):
            raise ValueError("silero_vad: the adapted graph disagrees with the packaged one")
    return f"speech probability of a 440 Hz tone: {float(outputs['output'][0, 0]):.3f}"


MODELS: dict[str, Callable[[Path], str]] = {
    "digits": build_digits,
    "digits_pytorch": build_digits_pytorch,
    "digits_tensorflow": build_digits_tensorflow,
    "digits_mlp": build_digits_mlp,
    "digits_preprocess": build_digits_preprocess,
    "digits_ensemble": build_digits_ensemble,
    "silero_vad": build_silero,
}


def same_tree(a: Path, b: Path) -> bool:
    """Whether two folders hold the same relative paths (folders too: an ensemble's version
    folder is empty) and the files identical bytes."""
    if sorted(p.relative_to(a) for p in a.rglob("*")) != sorted(p.relative_to(b) for p in b.rglob("*")):
        return False
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    if files_a != sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file()):
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, [str(p) for p in files_a], shallow=False)
    return not mismatch and not errors


def install(staged: Path, target: Path, trash: Path) -> str:
    """Move a staged model folder to ``target`` unless ``target`` already holds the same files."""
    if target.is_dir() and same_tree(staged, target):
        return "up to date"
    status = "updated" if target.exists() else "built"
    if target.exists():
        target.rename(trash / target.name)
    staged.rename(target)
    return status


def build(out_dir: Path, models: Sequence[str] = tuple(MODELS)) -> dict[str, str]:
    """Build ``models`` into ``out_dir``; returns a one-line summary per model."""
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {}
    # Staging sits beside out_dir (same filesystem, so renames are atomic) and not inside it,
    # where a server polling the repository would take it for a model.
    with tempfile.TemporaryDirectory(prefix=f".{out_dir.name}.build-", dir=out_dir.parent) as tmp:
        staging, trash = Path(tmp) / "staging", Path(tmp) / "trash"
        trash.mkdir()
        for name in models:
            started = time.perf_counter()
            detail = MODELS[name](staging / name)
            status = install(staging / name, out_dir / name, trash)
            elapsed = time.perf_counter() - started
            summary[name] = f"{status} in {elapsed:.1f} s; {detail}"
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path, metavar="OUT_DIR", help="model repository folder")
    parser.add_argument(
        "--model", action="append", choices=sorted(MODELS), help="build only this model (repeat)"
    )
    args = parser.parse_args(argv)
    summary = build(args.out_dir, args.model or tuple(MODELS))
    print(f"model repository {args.out_dir.resolve()}")
    for name, line in summary.items():
        print(f"  {name}: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
