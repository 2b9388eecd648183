"""The trained ``digits`` classifier (scikit-learn's StandardScaler + one-hidden-layer MLP) as a
TorchScript file and as a TensorFlow SavedModel, with the very weights the ONNX export holds.

Both compute, in float32, what skl2onnx's graph computes:
``probabilities = softmax(relu(((x - mean) / scale) @ W1 + b1) @ W2 + b2)`` and
``label = argmax(probabilities)`` as INT64 [batch, 1]. Only ``build_repository.py`` imports
this module; torch and tensorflow are imported by the function that needs each.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class DigitsWeights:
    """float32 arrays: ``mean``/``scale`` [64], ``w1`` [64, H], ``b1`` [H], ``w2`` [H, 10], ``b2`` [10]."""

    mean: np.ndarray
    scale: np.ndarray
    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray


def digits_weights(pipeline) -> DigitsWeights:
    """The weights of a fitted ``make_pipeline(StandardScaler(), MLPClassifier(...))`` with one
    hidden ReLU layer and a softmax output (scikit-learn's multi-class MLP)."""
    scaler, mlp = pipeline[0], pipeline[-1]
    if mlp.activation != "relu" or mlp.out_activation_ != "softmax" or len(mlp.coefs_) != 2:
        raise ValueError("expected one hidden ReLU layer and a softmax output")

    def f32(array) -> np.ndarray:
        return np.ascontiguousarray(array, dtype=np.float32)

    return DigitsWeights(
        f32(scaler.mean_), f32(scaler.scale_),
        f32(mlp.coefs_[0]), f32(mlp.intercepts_[0]), f32(mlp.coefs_[1]), f32(mlp.intercepts_[1]),
    )  # fmt: skip


def save_torchscript(weights: DigitsWeights, path: Path) -> None:
    """``forward(pixels: FP32 [batch, 64]) -> (probabilities FP32 [batch, 10], label INT64
    [batch, 1])``, scripted and saved to ``path`` (Triton's ``model.pt``)."""
    import torch

    class Digits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for name, array in vars(weights).items():
                self.register_buffer(name, torch.from_numpy(array.copy()))

        def forward(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            hidden = torch.relu(((pixels - self.mean) / self.scale) @ self.w1 + self.b1)
            probabilities = torch.softmax(hidden @ self.w2 + self.b2, dim=1)
            return probabilities, torch.argmax(probabilities, dim=1, keepdim=True)

    with warnings.catch_warnings():  # torch 2.9+ calls TorchScript deprecated; Triton serves it
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.trace(Digits().eval(), torch.zeros(2, 64)), str(path))


def save_savedmodel(weights: DigitsWeights, path: Path) -> None:
    """A SavedModel at ``path`` (Triton's ``model.savedmodel/``) whose ``serving_default``
    signature takes ``input`` FP32 [None, 64] and returns ``probabilities`` FP32 [None, 10] and
    ``label`` INT64 [None, 1]."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    class Digits(tf.Module):
        def __init__(self) -> None:
            super().__init__(name="digits")
            self.weights = {k: tf.constant(v, name=k) for k, v in vars(weights).items()}

        @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32, name="input")])
        def serve(self, input):  # noqa: A002 - the signature's input key is its argument name
            w = self.weights
            hidden = tf.nn.relu(tf.matmul((input - w["mean"]) / w["scale"], w["w1"]) + w["b1"])
            probabilities = tf.nn.softmax(tf.matmul(hidden, w["w2"]) + w["b2"], axis=1)
            label = tf.expand_dims(tf.argmax(probabilities, axis=1, output_type=tf.int64), 1)
            return {"probabilities": probabilities, "label": label}

    module = Digits()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    _fix_fingerprint_uuid(path / "fingerprint.pb")


def _fix_fingerprint_uuid(path: Path) -> None:
    """TensorFlow writes a random ``uuid`` into ``fingerprint.pb``; everything else a save
    writes is deterministic. The uuid becomes the model's checksum, so that rebuilding an
    unchanged model writes identical files."""
    from tensorflow.core.protobuf import fingerprint_pb2

    fingerprint = fingerprint_pb2.FingerprintDef.FromString(path.read_bytes())
    fingerprint.uuid = str(fingerprint.saved_model_checksum)
    path.write_bytes(fingerprint.SerializeToString(deterministic=True))
