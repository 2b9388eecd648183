"""Triton's ``model_warmup`` (model_configuration.md, "Model Warmup"), checked when a model is
indexed: a sample that cannot run makes the model UNAVAILABLE with the reason, as a warmup
failure fails Triton's load. The worker runs the samples (:mod:`workers.warmup`).

A sample (``ModelWarmup``): ``name``, ``batch_size`` (0: the sample is skipped, as Triton
does; at most ``max_batch_size``; 1 for a model that does not batch), ``count`` (runs; 0
means 1) and ``inputs``, a map from input name to ``data_type``, ``dims`` (without the
batch dimension, every one fixed) and one of ``zero_data``, ``random_data`` or
``input_data_file``: a file of the model folder's ``warmup/`` sub-folder holding the raw
row-major bytes of one batch-1 tensor (for ``TYPE_STRING``, each element a 4-byte
little-endian length, then its bytes; a longer file is read from its start, as Triton does).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable

from tritonclient.grpc import model_config_pb2 as mc

from naiad.datatypes import config_to_datatype, element_count, element_size
from naiad.errors import ConfigError

#: The model folder's sub-folder of warmup data files (Triton's ``kWarmupDataFolder``).
WARMUP_FOLDER = "warmup"


def sample_name(sample: mc.ModelWarmup, number: int) -> str:
    """The sample's name for messages (``#<number>`` when it has none)."""
    return sample.name or f"#{number}"


def validate_warmup(config: mc.ModelConfig) -> None:
    """Check every ``model_warmup`` sample of ``config`` against its inputs.

    :raises ConfigError: naming the sample and the rule broken: a batch size the model
        cannot take, an input the model does not have (or one it needs left out), another
        data type or shape than the config's, a variable dimension, no data kind, or an
        ``input_data_file`` path leaving the ``warmup/`` folder.
    """
    inputs = {spec.name: spec for spec in config.input}
    for number, sample in enumerate(config.model_warmup):
        prefix = f"model_warmup '{sample_name(sample, number)}'"
        if sample.batch_size == 0:
            continue
        limit = config.max_batch_size if config.max_batch_size > 0 else 1
        if sample.batch_size > limit:
            raise ConfigError(f"{prefix}: batch_size {sample.batch_size} is over the model's {limit}")
        for name, data in sample.inputs.items():
            if name not in inputs:
                raise ConfigError(f"{prefix}: the model has no input '{name}'")
            _check_input(f"{prefix} input '{name}'", data, inputs[name])
        missing = [n for n, spec in inputs.items() if n not in sample.inputs and not spec.optional]
        if missing:
            raise ConfigError(f"{prefix}: no data for input(s) {', '.join(repr(n) for n in missing)}")


def _check_input(prefix: str, data: mc.ModelWarmup.Input, spec: mc.ModelInput) -> None:
    if data.data_type != spec.data_type:
        raise ConfigError(f"{prefix}: data_type {mc.DataType.Name(data.data_type)} is not the "
                          f"config's {mc.DataType.Name(spec.data_type)}")  # fmt: skip
    dims = list(data.dims)
    if any(d < 1 for d in dims):
        raise ConfigError(f"{prefix}: dims {dims} must all be fixed (>= 1)")
    wanted = list(spec.dims)
    if len(dims) != len(wanted) or any(w not in (-1, d) for d, w in zip(dims, wanted, strict=True)):
        raise ConfigError(f"{prefix}: dims {dims} do not fit the config's {wanted}")
    kind = data.WhichOneof("input_data_type")
    if kind is None:
        raise ConfigError(f"{prefix}: set one of zero_data, random_data or input_data_file")
    if kind == "input_data_file":
        data_file_path(prefix, data.input_data_file)


def data_file_path(prefix: str, filename: str) -> str:
    """``warmup/<filename>``, the file's path in the model folder. Raises ConfigError for an
    empty, absolute or ``..`` path."""
    parts = filename.split("/")
    if not filename or filename.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ConfigError(f"{prefix}: input_data_file '{filename}' must be a relative path inside "
                          f"the model's {WARMUP_FOLDER}/ folder")  # fmt: skip
    return posixpath.join(WARMUP_FOLDER, filename)


def batch1_bytes(data: mc.ModelWarmup.Input) -> int | None:
    """Bytes of one batch-1 tensor of ``data`` (None for ``TYPE_STRING``: variable)."""
    size = element_size(config_to_datatype(mc.DataType.Name(data.data_type)))
    return element_count(list(data.dims)) * size if size else None


def file_problem(config: mc.ModelConfig, sizes: dict[str, int]) -> str:
    """Why the ``input_data_file`` samples of ``config`` cannot run ("" when they can), given
    ``sizes``: bytes of each file of the model folder by path. A file must exist and hold
    at least one batch-1 tensor (Triton: "warmup setting expects N bytes")."""
    for number, sample, name, data in _file_inputs(config):
        prefix = f"model_warmup '{sample_name(sample, number)}' input '{name}'"
        path = data_file_path(prefix, data.input_data_file)
        if path not in sizes:
            return f"{prefix}: {path} is missing from the model folder"
        needed = batch1_bytes(data)
        if needed is not None and sizes[path] < needed:
            return f"{prefix}: {path} has {sizes[path]} bytes, the sample needs {needed}"
    return ""


def uses_files(config: mc.ModelConfig) -> bool:
    """True when a sample reads an ``input_data_file`` (the index then lists the folder)."""
    return any(True for _ in _file_inputs(config))


def _file_inputs(config: mc.ModelConfig) -> Iterable[tuple[int, mc.ModelWarmup, str, mc.ModelWarmup.Input]]:
    for number, sample in enumerate(config.model_warmup):
        if sample.batch_size == 0:
            continue
        for name in sorted(sample.inputs):
            data = sample.inputs[name]
            if data.WhichOneof("input_data_type") == "input_data_file":
                yield number, sample, name, data
