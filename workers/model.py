"""A loaded model version: the backend plus Triton's tensor conventions around it.

``reshape`` (Triton model_configuration.md, "Reshape"): a client sends an input in the
config's ``dims`` and the model receives it in ``reshape.shape`` (the batch dimension, when
``max_batch_size`` > 0, stays in front); outputs go the other way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from workers.backends import Backend


def _with_batch(config: mc.ModelConfig, batch: int, dims: Sequence[int]) -> list[int]:
    return ([batch] if config.max_batch_size > 0 else []) + list(dims)


class ModelRunner:
    """Runs batches on one model version with client-facing shapes on both sides."""

    def __init__(self, config: mc.ModelConfig, backend: Backend):
        self.config = config
        self.backend = backend
        self.input_reshape = {s.name: list(s.reshape.shape) for s in config.input if s.HasField("reshape")}
        self.output_reshape = {s.name: list(s.dims) for s in config.output if s.HasField("reshape")}
        self.output_names = [spec.name for spec in config.output]

    def run(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[str], batch: int
    ) -> dict[str, np.ndarray]:
        """Run one batch of ``batch`` rows; ``outputs`` empty means every config output.

        Returns arrays by output name in the config's output order. Raises what the
        backend raises, or ValueError when an array cannot take its configured shape.
        The worker calls the three steps apart to time them (Triton's compute phases).
        """
        names = self.names(outputs)
        return self.restore(self.backend.infer(self.feed(inputs, batch), names), names, batch)

    def feed(self, inputs: dict[str, np.ndarray], batch: int) -> dict[str, np.ndarray]:
        """Client-shaped merged inputs as the model takes them (``reshape`` applied)."""
        return {
            name: array.reshape(_with_batch(self.config, batch, self.input_reshape[name]))
            if name in self.input_reshape
            else array
            for name, array in inputs.items()
        }

    def names(self, outputs: Sequence[str]) -> list[str]:
        """Outputs to compute, in the config's order (``outputs`` empty: all of them)."""
        return [name for name in self.output_names if not outputs or name in outputs]

    def restore(
        self, results: dict[str, np.ndarray], names: Sequence[str], batch: int
    ) -> dict[str, np.ndarray]:
        """The backend's ``results`` in client shapes, by name in ``names`` order."""
        for name, dims in self.output_reshape.items():
            if name in results and sum(d == -1 for d in dims) <= 1:
                results[name] = results[name].reshape(_with_batch(self.config, batch, dims))
        return {name: results[name] for name in names}
