"""Build Naiad's example Triton model repository into OUT_DIR.

Two models, both from data shipped inside installed packages (nothing is downloaded):

- ``digits``: a small MLP trained on scikit-learn's handwritten digits (the 360-row holdout of
  ``digits_data.py`` is never seen in training), exported with skl2onnx. ``max_batch_size: 64``
  with dynamic batching; input ``input`` FP32 [64] (raw 0..16 pixels), outputs
  ``probabilities`` FP32 [10] (with ``labels.txt`` for the classification extension) and
  ``label`` INT64 [1].
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
import importlib.util
import sys
import tempfile
import time
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


def train_digits():
    """A scaled MLP on the training part of the fixed split (about 0.5 s)."""
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
    config = parse_config(DIGITS_CONFIG)
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(DIGITS_CONFIG)
    (model_dir / "labels.txt").write_text("".join(f"{i}\n" for i in range(N_CLASSES)))
    model_file = model_dir / "1" / "model.onnx"
    model_file.write_bytes(export_digits(train_digits()).SerializeToString())
    accuracy = digits_accuracy(model_file, config)
    if accuracy <= MIN_DIGITS_ACCURACY:
        raise ValueError(f"digits: holdout accuracy {accuracy:.4f} <= {MIN_DIGITS_ACCURACY}")
    return f"holdout accuracy {accuracy:.4f} on 360 digits"


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


MODELS: dict[str, Callable[[Path], str]] = {"digits": build_digits, "silero_vad": build_silero}


def same_tree(a: Path, b: Path) -> bool:
    """Whether two folders hold the same relative file paths with identical bytes."""
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    if files_a != files_b:
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
