"""The benchmark's model repository (Triton layout), built once into ``.bench/repository``.

- ``tiny``: one ``Identity`` node, FP32 [16] in (``input``) and out (``output``),
  ``max_batch_size: 64``, no dynamic batching: the cost of a request with no model in it.
- ``digits``: the example classifier (``examples/build_repository.py``: an MLP on scikit-learn's
  digits, FP32 [64] raw 0..16 pixels in, ``probabilities`` FP32 [10] and ``label`` INT64 [1]
  out), with its ``dynamic_batching``; ``digits_nobatch``: the same model and config without it.
- ``digits_cnn``: a heavier real model for the same input: the digits upsampled in the graph to
  32×32 (bilinear), three 3×3 convolutions (32, 32, 64 channels, two max-pools) and a
  4096→1024→1024→10 head (≈5.3 M weights, 21 MB); trained here with PyTorch on the training part
  of the fixed split (holdout accuracy checked > 0.95), exported to ONNX. One row costs a few ms
  on one CPU core and the fully connected head is matrix-vector work per row, so batching
  (matrix-matrix) pays; ``digits_cnn_nobatch``: without ``dynamic_batching``.
- ``digits_python``: the same ``digits`` ONNX graph run by a Triton Python-backend ``model.py``
  (``bench/peers/digits_python/model.py``: ONNX Runtime over the whole batch), config
  ``max_batch_size: 32``, ``dynamic_batching { }``, one CPU instance: the one model real Triton
  (whose wheel has no ONNX backend) and Naiad serve unchanged, side by side.
- ``digits_onnx``: the same ``digits`` graph on Naiad's ONNX backend under ``digits_python``'s
  scheduling (``max_batch_size: 32``, ``dynamic_batching { }``, one CPU instance): issue 14's
  setup for the peers comparison, where the example ``digits`` cuts its batches at its
  preferred sizes 8 and 16 and takes up to 64.

Both configs of a pair differ only in the ``dynamic_batching`` block. The batched ones run with
``max_queue_delay_microseconds: 0`` (:data:`QUEUE_DELAY_US`; Triton's advice for a
latency-sensitive model: a batch is what is queued when the worker is free, no waiting for a
preferred size), the example ``digits`` included. A model folder that exists is reused
(``--rebuild`` builds again); its queue delay is set again on every run.

    .venv/bin/python -m bench.perf.models [--repository .bench/repository] [--rebuild]
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from bench.perf.loadgen import Target, Tensor

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_REPOSITORY = ROOT / ".bench" / "repository"
MIN_CNN_ACCURACY = 0.95

TINY_CONFIG = """\
name: "tiny"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [ { name: "input" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "output" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

CNN_CONFIG = """\
name: "digits_cnn"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [ { name: "input" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "probabilities" data_type: TYPE_FP32 dims: [ 10 ] } ]
dynamic_batching {
  preferred_batch_size: [ 16, 32 ]
  max_queue_delay_microseconds: 0
}
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

PYTHON_CONFIG = """\
name: "digits_python"
backend: "python"
max_batch_size: 32
input [ { name: "input" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [
  { name: "probabilities" data_type: TYPE_FP32 dims: [ 10 ] },
  { name: "label" data_type: TYPE_INT64 dims: [ 1 ] }
]
dynamic_batching { }
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
PYTHON_MODEL = ROOT / "bench" / "peers" / "digits_python" / "model.py"
ONNX_PEER_CONFIG = PYTHON_CONFIG.replace('name: "digits_python"\nbackend: "python"',
                                         'name: "digits_onnx"\nplatform: "onnxruntime_onnx"')

#: The batched benchmark models' ``max_queue_delay_microseconds``.
QUEUE_DELAY_US = 0

# name -> (inputs as (name, datatype, dims without the batch dimension), outputs)
SIGNATURES = {
    "tiny": ([("input", "FP32", [16])], ["output"]),
    "digits": ([("input", "FP32", [64])], ["probabilities", "label"]),
    "digits_cnn": ([("input", "FP32", [64])], ["probabilities"]),
    "digits_python": ([("input", "FP32", [64])], ["probabilities", "label"]),
    "digits_onnx": ([("input", "FP32", [64])], ["probabilities", "label"]),
}


def signature(model: str) -> tuple[list[tuple[str, str, list[int]]], list[str]]:
    """Inputs and outputs of a benchmark model (``*_nobatch`` included)."""
    return SIGNATURES[model.removesuffix("_nobatch")]


def without_batching(config: str, name: str) -> str:
    """``config`` renamed to ``name`` with its ``dynamic_batching { ... }`` block removed."""
    text = re.sub(r"dynamic_batching\s*\{[^}]*\}\n?", "", config)
    if text == config:
        raise ValueError("the config has no dynamic_batching block")
    return re.sub(r'^name: "[^"]*"', f'name: "{name}"', text, count=1, flags=re.M)


def set_queue_delay(repository: Path, name: str, microseconds: int = QUEUE_DELAY_US) -> None:
    """Rewrite ``max_queue_delay_microseconds`` in model ``name``'s config.pbtxt."""
    path = repository / name / "config.pbtxt"
    text = path.read_text()
    setting = f"max_queue_delay_microseconds: {microseconds}"
    edited = re.sub(r"max_queue_delay_microseconds:\s*\d+", setting, text)
    if edited != text:
        path.write_text(edited)


def write_model(repository: Path, name: str, config: str, onnx_bytes: bytes) -> None:
    folder = repository / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.onnx").write_bytes(onnx_bytes)
    (folder / "config.pbtxt").write_text(config)


def build_tiny(repository: Path) -> None:
    import onnx  # noqa: PLC0415
    from onnx import TensorProto, helper  # noqa: PLC0415

    graph = helper.make_graph(
        [helper.make_node("Identity", ["input"], ["output"])],
        "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [None, 16])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [None, 16])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    write_model(repository, "tiny", TINY_CONFIG, model.SerializeToString())


def examples_importable() -> None:
    """``examples/`` on ``sys.path`` (its scripts import each other by module name)."""
    if str(ROOT / "examples") not in sys.path:
        sys.path.insert(0, str(ROOT / "examples"))


def build_digits(repository: Path) -> None:
    """The example's ``digits`` (built by its own script's function) and ``digits_nobatch``."""
    examples_importable()
    import build_repository  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        build_repository.build_digits(Path(tmp) / "digits")
        shutil.copytree(Path(tmp) / "digits", repository / "digits", dirs_exist_ok=True)
    config = (repository / "digits" / "config.pbtxt").read_text()
    onnx_bytes = (repository / "digits" / "1" / "model.onnx").read_bytes()
    write_model(repository, "digits_nobatch", without_batching(config, "digits_nobatch"), onnx_bytes)
    shutil.copy(repository / "digits" / "labels.txt", repository / "digits_nobatch" / "labels.txt")


def build_digits_python(repository: Path) -> None:
    """``digits_python``: :data:`PYTHON_MODEL` beside the ``digits`` graph (built if missing)."""
    if not (repository / "digits" / "1" / "model.onnx").exists():
        build_digits(repository)
    graph = (repository / "digits" / "1" / "model.onnx").read_bytes()
    write_model(repository, "digits_python", PYTHON_CONFIG, graph)
    shutil.copy(PYTHON_MODEL, repository / "digits_python" / "1" / "model.py")


def build_digits_onnx(repository: Path) -> None:
    """``digits_onnx``: the ``digits`` graph (built if missing) under :data:`ONNX_PEER_CONFIG`."""
    if not (repository / "digits" / "1" / "model.onnx").exists():
        build_digits(repository)
    graph = (repository / "digits" / "1" / "model.onnx").read_bytes()
    write_model(repository, "digits_onnx", ONNX_PEER_CONFIG, graph)


def cnn_module():
    """The ``digits_cnn`` network (a ``torch.nn.Module`` taking [batch, 64] raw pixels)."""
    import torch  # noqa: PLC0415
    from torch import nn  # noqa: PLC0415

    class DigitsCnn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(1, 32, 3, padding=1),
                nn.ReLU(),
                nn.Conv2d(32, 32, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(32, 64, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
            )
            self.head = nn.Sequential(
                nn.Flatten(),
                nn.Linear(64 * 8 * 8, 1024),
                nn.ReLU(),
                nn.Linear(1024, 1024),
                nn.ReLU(),
                nn.Linear(1024, 10),
            )

        def forward(self, x):
            images = nn.functional.interpolate(x.reshape(-1, 1, 8, 8) / 16.0, size=(32, 32), mode="bilinear")
            return self.head(self.features(images))

    torch.manual_seed(0)
    return DigitsCnn()


def train_cnn(epochs: int = 12):
    """Adam on the training part of the example's fixed split (``examples/digits_data.py``)."""
    import torch  # noqa: PLC0415

    examples_importable()
    from digits_data import load_split  # noqa: PLC0415

    x_train, _, y_train, _ = load_split()
    net, generator = cnn_module(), torch.Generator().manual_seed(0)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    x, y = torch.from_numpy(x_train), torch.from_numpy(y_train)
    for _ in range(epochs):
        for rows in torch.randperm(len(x), generator=generator).split(64):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(net(x[rows]), y[rows]).backward()
            optimizer.step()
    return net.eval()


def export_cnn(net) -> bytes:
    """ONNX (opset 17, TorchScript exporter), softmax appended: ``input`` → ``probabilities``."""
    import io  # noqa: PLC0415

    import torch  # noqa: PLC0415

    model = torch.nn.Sequential(net, torch.nn.Softmax(dim=1)).eval()
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (torch.zeros(1, 64),),
            buffer,
            input_names=["input"],
            output_names=["probabilities"],
            opset_version=17,
            dynamo=False,
            dynamic_axes={"input": {0: "batch"}, "probabilities": {0: "batch"}},
        )
    return buffer.getvalue()


def cnn_accuracy(onnx_bytes: bytes) -> float:
    import onnxruntime as ort  # noqa: PLC0415

    examples_importable()
    from digits_data import load_split  # noqa: PLC0415

    _, x_holdout, _, y_holdout = load_split()
    session = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
    (probabilities,) = session.run(["probabilities"], {"input": x_holdout})
    if probabilities.shape != (len(x_holdout), 10):
        raise ValueError(f"digits_cnn: output shape {probabilities.shape}")
    return float(np.mean(probabilities.argmax(axis=1) == y_holdout))


def build_cnn(repository: Path) -> None:
    onnx_bytes = export_cnn(train_cnn())
    accuracy = cnn_accuracy(onnx_bytes)
    if accuracy <= MIN_CNN_ACCURACY:
        raise ValueError(f"digits_cnn: holdout accuracy {accuracy:.4f} <= {MIN_CNN_ACCURACY}")
    write_model(repository, "digits_cnn", CNN_CONFIG, onnx_bytes)
    write_model(
        repository, "digits_cnn_nobatch", without_batching(CNN_CONFIG, "digits_cnn_nobatch"), onnx_bytes
    )
    print(f"digits_cnn: holdout accuracy {accuracy:.4f}", file=sys.stderr)


def target(url: str, model: str, protocol: str = "http", encoding: str = "binary") -> Target:
    """One-row requests to a benchmark model: a real held-out digit for the digits models."""
    inputs, outputs = signature(model)
    tensors = []
    for name, datatype, dims in inputs:
        if dims == [64]:
            examples_importable()
            from digits_data import load_holdout  # noqa: PLC0415

            data = load_holdout()[0][:1]
        else:
            data = np.random.default_rng(0).random([1, *dims]).astype(np.float32)
        tensors.append(Tensor(name, datatype, data))
    return Target(url, model, tuple(tensors), protocol=protocol, encoding=encoding, outputs=tuple(outputs))


BUILDERS = {
    "tiny": build_tiny,
    "digits": build_digits,
    "digits_cnn": build_cnn,
    "digits_python": build_digits_python,
    "digits_onnx": build_digits_onnx,
}


def ensure_repository(
    repository: Path = DEFAULT_REPOSITORY, models=tuple(BUILDERS), rebuild: bool = False
) -> Path:
    """Build the missing ``models`` (all by default) into ``repository``; returns it."""
    repository.mkdir(parents=True, exist_ok=True)
    for name in models:
        if name in ("digits_python", "digits_onnx"):  # cheap, and their files may have changed
            BUILDERS[name](repository)
        elif rebuild or not (repository / name / "config.pbtxt").exists():
            started = time.monotonic()
            BUILDERS[name](repository)
            print(f"built {name} in {time.monotonic() - started:.1f} s", file=sys.stderr)
        if name in ("digits", "digits_cnn"):
            set_queue_delay(repository, name)
    return repository


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY)
    parser.add_argument("--rebuild", action="store_true")
    args = parser.parse_args()
    ensure_repository(args.repository, rebuild=args.rebuild)


if __name__ == "__main__":
    main()
