"""Run a model version's ``model_warmup`` samples after its load, before it serves.

Triton (model_configuration.md, "Model Warmup"): each sample runs ``count`` times (0: once)
as one batch of ``batch_size`` copies of its batch-1 inputs; ``zero_data`` is zeros (empty
strings for ``TYPE_STRING``), ``random_data`` random values (zeros for ``TYPE_STRING``, as
Triton), ``input_data_file`` the raw bytes of ``<model>/warmup/<file>``. A sample that fails
fails the version's load: the worker then answers the requests waiting for it with the reason
and exits, as Triton marks the model UNAVAILABLE. The samples' shapes and files were already
checked when the model was indexed (:mod:`repository_store.warmup`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from naiad.datatypes import config_to_datatype, deserialize_bytes, element_count, from_bytes, numpy_dtype
from repository_store.warmup import batch1_bytes, data_file_path, sample_name
from workers.model import ModelRunner

logger = logging.getLogger(__name__)

#: Reads a file of the model folder by its path there (``warmup/x.bin``); None if absent.
ReadFile = Callable[[str], bytes | None]


class WarmupFailed(Exception):
    """A warmup sample could not be built or run; the message names the sample."""


def run_warmup(runner: ModelRunner, read_file: ReadFile) -> float:
    """Run every sample of ``runner.config.model_warmup``; returns the seconds taken.

    :raises WarmupFailed: ``warmup sample '<name>' failed: <why>`` for the first sample that
        cannot be built (a missing or short file) or that the backend refuses.
    """
    started = time.perf_counter()
    config = runner.config
    for number, sample in enumerate(config.model_warmup):
        if sample.batch_size == 0:
            continue  # Triton skips a batch-0 sample
        name = sample_name(sample, number)
        runs = max(1, sample.count)
        try:
            inputs, batch = sample_inputs(config, sample, read_file)
            for _ in range(runs):
                runner.run(inputs, [], batch)
        except Exception as exc:  # the backend's own errors name what it refused
            raise WarmupFailed(f"warmup sample '{name}' failed: {exc}") from exc
        logger.info("model '%s': warmup sample '%s' ran %d time(s), batch %d",
                    config.name, name, runs, batch)  # fmt: skip
    return time.perf_counter() - started


def sample_inputs(
    config: mc.ModelConfig, sample: mc.ModelWarmup, read_file: ReadFile
) -> tuple[dict[str, np.ndarray], int]:
    """The sample's inputs as one batch (``batch_size`` copies of each batch-1 tensor in
    front when the model batches) and its batch size. Raises ValueError for a missing or
    unreadable data file."""
    batched = config.max_batch_size > 0
    inputs = {}
    for name, data in sample.inputs.items():
        one = _tensor(data, read_file, f"input '{name}'")
        inputs[name] = np.repeat(one[np.newaxis], sample.batch_size, axis=0) if batched else one
    return inputs, sample.batch_size if batched else 1


def _tensor(data: mc.ModelWarmup.Input, read_file: ReadFile, what: str) -> np.ndarray:
    """One batch-1 tensor of ``data`` (shape ``dims``)."""
    datatype = config_to_datatype(mc.DataType.Name(data.data_type))
    shape = list(data.dims)
    kind = data.WhichOneof("input_data_type")
    if kind == "input_data_file":
        return _from_file(data, datatype, shape, read_file, what)
    if datatype == "BYTES":
        return np.full(shape, b"", dtype=np.object_)
    dtype = numpy_dtype(datatype)
    if kind == "random_data":
        return _random(dtype, shape)
    return np.zeros(shape, dtype)


def _from_file(
    data: mc.ModelWarmup.Input, datatype: str, shape: list[int], read_file: ReadFile, what: str
) -> np.ndarray:
    path = data_file_path(what, data.input_data_file)
    raw = read_file(path)
    if raw is None:
        raise ValueError(f"{what}: {path} is missing from the model folder")
    if datatype == "BYTES":
        return deserialize_bytes(raw, element_count(shape)).reshape(shape)
    needed = batch1_bytes(data) or 0
    if len(raw) < needed:
        raise ValueError(f"{what}: {path} has {len(raw)} bytes, the sample needs {needed}")
    return from_bytes(raw[:needed], datatype, shape)


def _random(dtype: np.dtype, shape: list[int]) -> np.ndarray:
    rng = np.random.default_rng()
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -128), min(info.max, 127), shape, endpoint=True).astype(dtype)
    return rng.random(shape, dtype=np.float32).astype(dtype)  # floats (bf16 too): [0, 1)
