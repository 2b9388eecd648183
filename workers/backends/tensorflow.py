"""TensorFlow backend (Triton's ``tensorflow_savedmodel`` platform / ``tensorflow`` backend).

The model is the SavedModel folder ``model.savedmodel/`` (or the config's
``default_model_filename``), run through its ``serving_default`` signature (Triton's
``TF_SIGNATURE_DEF`` config parameter picks another). Tensors are matched by the signature's
input and output keys, which are the config's names (Triton tensorflow_backend,
``ValidateTRITONTFModel``): at load, the config must list exactly the signature's inputs, each
config input and output must be a key of the signature with the same datatype, and a batching
model's tensors must have a variable first dimension.

On a GPU (the worker was given one and this TensorFlow build sees it) memory grows as needed
(``tf.config.experimental.set_memory_growth``) instead of TensorFlow's default of taking the
whole card, as Triton's ``allow-growth`` default does; otherwise GPUs are hidden and it runs on
the CPU. TensorFlow's C++ logging is quieted (``TF_CPP_MIN_LOG_LEVEL=2``, unless set) before
it is imported. No ``warm_up``: a warm-pool process that prepares TensorFlow only imports it
(3-4 s, ~600 MB), since creating its devices before the model's placement is known would fix
them.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from repository_store import default_model_filename

# Both must precede the import. 2: errors only. Growth also covers a process whose devices
# were initialized before configure_devices ran (TensorFlow reads this when it creates them).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
import tensorflow as tf  # noqa: E402

logger = logging.getLogger(__name__)

SIGNATURE_PARAMETER = "TF_SIGNATURE_DEF"
DEFAULT_SIGNATURE = "serving_default"
# config datatype -> TensorFlow dtype name (tf.DType.name)
TF_DTYPES: dict[int, str] = {
    mc.TYPE_BOOL: "bool",
    mc.TYPE_UINT8: "uint8",
    mc.TYPE_UINT16: "uint16",
    mc.TYPE_UINT32: "uint32",
    mc.TYPE_UINT64: "uint64",
    mc.TYPE_INT8: "int8",
    mc.TYPE_INT16: "int16",
    mc.TYPE_INT32: "int32",
    mc.TYPE_INT64: "int64",
    mc.TYPE_FP16: "float16",
    mc.TYPE_FP32: "float32",
    mc.TYPE_FP64: "float64",
    mc.TYPE_BF16: "bfloat16",
    mc.TYPE_STRING: "string",
}
_devices_configured = False


def configure_devices(device: str) -> None:
    """Once per process, before TensorFlow touches a device: memory growth on each GPU when
    ``device`` is ``cuda``, else no GPU at all."""
    global _devices_configured
    if _devices_configured:
        return
    gpus = tf.config.list_physical_devices("GPU")
    try:
        if device == "cuda":
            for gpu in gpus:
                tf.config.experimental.set_memory_growth(gpu, True)
        elif gpus:
            tf.config.set_visible_devices([], "GPU")
    except RuntimeError as exc:  # already initialized (a second model version in this process)
        logger.warning("TensorFlow devices already set up: %s", exc)
    _devices_configured = True
    logger.info("TensorFlow on %s", "GPU (memory growth)" if device == "cuda" and gpus else "CPU")


def _type_name(data_type: int) -> str:
    return mc.DataType.Name(data_type)


def _model_type(dtype: tf.DType) -> str:
    by_name = {name: config for config, name in TF_DTYPES.items()}
    return _type_name(by_name[dtype.name]) if dtype.name in by_name else dtype.name


def _check_spec(kind: str, spec, tensor: tf.TensorSpec, batching: bool) -> None:
    """One config input/output against the signature's ``tensor``: datatype and shape."""
    if TF_DTYPES.get(spec.data_type) != tensor.dtype.name:
        raise ValueError(f"configuration expects datatype {_type_name(spec.data_type)} for {kind} "
                         f"'{spec.name}', model provides {_model_type(tensor.dtype)}")  # fmt: skip
    if tensor.shape.rank is None:
        return  # the signature leaves the shape open
    model = [-1 if d is None else d for d in tensor.shape.as_list()]
    dims = list(spec.reshape.shape) if spec.HasField("reshape") else list(spec.dims)
    expected = [-1, *dims] if batching else dims
    fits = len(model) == len(expected) and all(
        m in (-1, e) or e == -1 for m, e in zip(model, expected, strict=True)
    )
    if not fits or (batching and model[0] != -1):
        batch = "; the first is the batch" if batching else ""
        raise ValueError(f"{kind} '{spec.name}': model shape {model} does not fit the configuration's "
                         f"{expected} (-1: any size{batch})")  # fmt: skip


class TensorFlowBackend:
    """One SavedModel signature; inputs and outputs by its keys (module doc).

    :raises ValueError: the signature and the config disagree (names, counts, datatypes, shapes).
    """

    def __init__(self, path: Path, config: mc.ModelConfig):
        self.model = tf.saved_model.load(str(path))
        name = DEFAULT_SIGNATURE
        if SIGNATURE_PARAMETER in config.parameters:
            name = config.parameters[SIGNATURE_PARAMETER].string_value or DEFAULT_SIGNATURE
        if name not in self.model.signatures:
            have = sorted(self.model.signatures)
            raise ValueError(f"the SavedModel has no signature '{name}' (it has {have})")
        self.function = self.model.signatures[name]
        _, inputs = self.function.structured_input_signature
        outputs = self.function.structured_outputs
        self._check(config, inputs, outputs)
        self.dtypes = {spec.name: tf.as_dtype(TF_DTYPES[spec.data_type]) for spec in config.input}
        self.output_names = [spec.name for spec in config.output]
        logger.info("loaded %s signature '%s'", path, name)

    @staticmethod
    def _check(config: mc.ModelConfig, inputs: dict, outputs: dict) -> None:
        batching = config.max_batch_size > 0
        if len(config.input) != len(inputs):
            raise ValueError(f"configuration expects {len(config.input)} inputs, model provides "
                             f"{len(inputs)} ({sorted(inputs)})")  # fmt: skip
        for kind, specs, tensors in (("input", config.input, inputs), ("output", config.output, outputs)):
            for spec in specs:
                if spec.name not in tensors:
                    raise ValueError(f"configuration names {kind} '{spec.name}', which the signature "
                                     f"does not have (its {kind}s: {sorted(tensors)})")  # fmt: skip
                _check_spec(kind, spec, tensors[spec.name], batching)

    def infer(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        """Run the signature on one batch; returns numpy arrays by output name (BYTES as
        object arrays of ``bytes``). Raises what TensorFlow raises."""
        feed = {name: tf.constant(array, dtype=self.dtypes[name]) for name, array in inputs.items()}
        results = self.function(**feed)
        return {name: results[name].numpy() for name in outputs or self.output_names}


def load(version_dir: Path, config: mc.ModelConfig, device: str) -> TensorFlowBackend:
    configure_devices(device)
    return TensorFlowBackend(version_dir / default_model_filename(config), config)
