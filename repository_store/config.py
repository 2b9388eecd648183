"""``config.pbtxt``: parsing into Triton's ``ModelConfig``, validation and version policy.

The message type is the canonical one shipped with ``tritonclient``
(``tritonclient.grpc.model_config_pb2.ModelConfig``), parsed with
``google.protobuf.text_format``. Rules follow Triton's ``model_configuration.md`` and the
checks in Triton's ``model_config_utils.cc`` (``ValidateModelConfig``, ``ValidateIOShape``).
"""

from __future__ import annotations

import math

from google.protobuf import descriptor, json_format, text_format
from tritonclient.grpc import model_config_pb2

from naiad import queue_policy
from naiad.errors import ConfigError
from repository_store.ensemble import validate_scheduling
from repository_store.warmup import validate_warmup

ModelConfig = model_config_pb2.ModelConfig

# platform -> normalised backend (Triton model_configuration.md, "Platform and Backend").
_PLATFORMS = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorflow_savedmodel": "tensorflow",
    "ensemble": "ensemble",
}
_BACKENDS = {
    "onnxruntime": "onnxruntime",
    "pytorch": "pytorch",
    "tensorflow": "tensorflow",
    "python": "python",
}
# Triton's default model file names per backend (model_repository.md, "Model Files").
_DEFAULT_FILENAMES = {
    "onnxruntime": "model.onnx",
    "pytorch": "model.pt",
    "tensorflow": "model.savedmodel",
    "python": "model.py",
    "ensemble": "",
}
WILDCARD_DIM = -1


def parse_config(text: bytes | str, model_name: str) -> ModelConfig:
    """Parse ``config.pbtxt`` text into a ``ModelConfig``.

    An empty ``name`` is filled with ``model_name``.
    :raises ConfigError: text that is not UTF-8 or does not parse (the parser's message), or a
        ``name`` that differs from the folder name (Triton requires them to agree).
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config.pbtxt of '{model_name}' is not UTF-8: {exc}") from None
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ConfigError(f"config.pbtxt of '{model_name}' does not parse: {exc}") from None
    return _named(config, model_name, "config.pbtxt")


def parse_config_json(text: str, model_name: str) -> ModelConfig:
    """Parse a model config given as JSON (Triton's load request ``config`` parameter, the
    shape ``GET v2/models/<name>/config`` returns) into a ``ModelConfig``.

    :raises ConfigError: text that does not parse as a ``ModelConfig``, or a ``name`` that
        differs from ``model_name``. An empty ``name`` is filled in.
    """
    config = ModelConfig()
    try:
        json_format.Parse(text, config)
    except (json_format.ParseError, TypeError) as exc:
        raise ConfigError(f"config of '{model_name}' does not parse: {exc}") from None
    return _named(config, model_name, "config")


def _named(config: ModelConfig, model_name: str, source: str) -> ModelConfig:
    if not config.name:
        config.name = model_name
    elif config.name != model_name:
        raise ConfigError(f"{source} name '{config.name}' does not match the model folder '{model_name}'")
    return config


def backend_of(cfg: ModelConfig) -> str:
    """Normalised backend: 'onnxruntime' | 'pytorch' | 'tensorflow' | 'python' | 'ensemble'.

    :raises ConfigError: no platform/backend, an unsupported one, or the two disagree.
    """
    from_platform = _PLATFORMS.get(cfg.platform) if cfg.platform else None
    from_backend = _BACKENDS.get(cfg.backend) if cfg.backend else None
    if cfg.platform and from_platform is None:
        raise ConfigError(f"unsupported platform '{cfg.platform}'")
    if cfg.backend and from_backend is None:
        raise ConfigError(f"unsupported backend '{cfg.backend}'")
    if from_platform and from_backend and from_platform != from_backend:
        raise ConfigError(f"platform '{cfg.platform}' and backend '{cfg.backend}' disagree")
    backend = from_platform or from_backend
    if backend is None:
        raise ConfigError(f"model '{cfg.name}' must specify 'platform' or 'backend'")
    return backend


def default_model_filename(cfg: ModelConfig) -> str:
    """``cfg.default_model_filename`` or the backend's default (Triton model_repository.md):
    onnxruntime 'model.onnx', pytorch 'model.pt', tensorflow 'model.savedmodel',
    python 'model.py'; '' for an ensemble (it has no model file).

    :raises ConfigError: as :func:`backend_of`.
    """
    backend = backend_of(cfg)
    if cfg.default_model_filename and backend != "ensemble":
        return cfg.default_model_filename
    return _DEFAULT_FILENAMES[backend]


#: Backend -> the platform Triton fills in beside it (and back), as its core's config completion.
_PLATFORM_OF = {"onnxruntime": "onnxruntime_onnx", "pytorch": "pytorch_libtorch",
                "tensorflow": "tensorflow_savedmodel"}  # fmt: skip


def completed_config(cfg: ModelConfig) -> ModelConfig:
    """A copy of a valid ``cfg`` with the defaults Triton fills in before it serves a model
    (core ``model_config_utils.cc`` ``NormalizeModelConfig`` and the backend's completion),
    which its model configuration endpoint returns and a Python model's ``args`` hold:
    ``version_policy`` latest 1; for a model that is not an ensemble the platform of a known
    backend and the backend of a platform, ``default_model_filename``, ``optimization`` with
    pinned input and output memory, and instance groups named ``<model>`` (none configured:
    one CPU instance) or ``<model>_<index>``, ``count`` 1 when 0 and ``KIND_AUTO`` as
    ``KIND_CPU`` (the gateway does not know its workers' devices; on a GPU machine Triton
    says ``KIND_GPU``); for an ensemble ``model_transaction_policy``. Compared field by field
    with Triton 2.51's answer by ``tests/differential``.

    :raises ConfigError: as :func:`backend_of`.
    """
    out = ModelConfig()
    out.CopyFrom(cfg)
    if not out.HasField("version_policy"):
        out.version_policy.latest.num_versions = 1
    backend = backend_of(cfg)
    if backend == "ensemble":
        out.model_transaction_policy.decoupled = cfg.model_transaction_policy.decoupled
        return out
    out.platform = out.platform or _PLATFORM_OF.get(backend, "")
    out.backend = out.backend or backend
    out.default_model_filename = default_model_filename(cfg)
    for field in ("input_pinned_memory", "output_pinned_memory"):
        if not out.optimization.HasField(field):
            getattr(out.optimization, field).enable = True
    _complete_instance_groups(out)
    return out


def _complete_instance_groups(cfg: ModelConfig) -> None:
    groups = cfg.instance_group
    if not groups:
        groups.add(name=cfg.name, kind=model_config_pb2.ModelInstanceGroup.KIND_CPU, count=1)
        return
    for index, group in enumerate(groups):
        group.name = group.name or f"{cfg.name}_{index}"
        group.count = group.count or 1
        if group.kind == model_config_pb2.ModelInstanceGroup.KIND_AUTO:
            group.kind = model_config_pb2.ModelInstanceGroup.KIND_CPU


def validate_config(cfg: ModelConfig) -> None:
    """Check a parsed config the way Triton does before loading.

    Rules (Triton model_configuration.md and model_config_utils.cc): a known platform/backend;
    ``max_batch_size >= 0``; inputs and outputs each with a unique non-empty name, a data_type
    and non-empty ``dims`` of entries ``>= 1`` or ``-1``; a ``reshape`` whose element count
    agrees with ``dims`` when both are fully known, and not empty for a non-batching model;
    at least one input and one output unless the model is an ensemble; a non-zero
    ``num_versions`` in a ``latest`` version policy; for an ensemble, a step graph that is
    sound on its own (:func:`repository_store.ensemble.validate_scheduling`); a sound
    ``dynamic_batching`` (:func:`naiad.queue_policy.check_config`).
    :raises ConfigError: naming the first rule broken.
    """
    backend = backend_of(cfg)
    if cfg.max_batch_size < 0:
        raise ConfigError(f"max_batch_size must be >= 0, got {cfg.max_batch_size}")
    _validate_tensors("input", cfg.input, cfg.max_batch_size)
    _validate_tensors("output", cfg.output, cfg.max_batch_size)
    if backend != "ensemble" and (not cfg.input or not cfg.output):
        raise ConfigError(f"model '{cfg.name}' must specify at least one input and one output")
    policy = cfg.version_policy
    if policy.WhichOneof("policy_choice") == "latest" and policy.latest.num_versions < 1:
        raise ConfigError("version_policy latest must specify a non-zero num_versions")
    validate_scheduling(cfg)
    queue_policy.check_config(cfg)  # dynamic_batching: preferred sizes, priorities, ordering
    validate_warmup(cfg)  # model_warmup samples fit the inputs (repository_store.warmup)


def _validate_tensors(kind: str, tensors, max_batch_size: int) -> None:
    seen: set[str] = set()
    for tensor in tensors:
        if not tensor.name:
            raise ConfigError(f"model {kind} must specify 'name'")
        prefix = f"model {kind} '{tensor.name}'"
        if tensor.name in seen:
            raise ConfigError(f"{prefix} is declared more than once")
        seen.add(tensor.name)
        if tensor.data_type == model_config_pb2.TYPE_INVALID:
            raise ConfigError(f"{prefix} must specify 'data_type'")
        _validate_shape(prefix, list(tensor.dims), tensor, max_batch_size)


def _validate_shape(prefix: str, dims: list[int], tensor, max_batch_size: int) -> None:
    if not dims:
        raise ConfigError(f"{prefix} must specify 'dims'")
    _check_dims(prefix, "dims", dims)
    if not tensor.HasField("reshape"):
        return
    shape = list(tensor.reshape.shape)
    if not shape and max_batch_size == 0:
        raise ConfigError(f"{prefix} cannot have empty reshape for non-batching model")
    _check_dims(prefix, "reshape", shape)
    if WILDCARD_DIM not in dims and WILDCARD_DIM not in shape:
        if math.prod(dims) != math.prod(shape):
            raise ConfigError(f"{prefix} has different size for dims {dims} and reshape {shape}")


def _check_dims(prefix: str, what: str, dims: list[int]) -> None:
    for dim in dims:
        if dim < 1 and dim != WILDCARD_DIM:
            raise ConfigError(
                f"{prefix} {what} must be integers >= 1, or -1 for a variable-size dimension; got {dims}"
            )


def select_versions(cfg: ModelConfig, available: list[int]) -> list[int]:
    """The versions to serve, ascending, per Triton's version policy.

    Source: Triton model_configuration.md, "Version Policy": ``latest { num_versions: N }``
    serves the N highest versions (the default is latest 1); ``all {}`` serves every version;
    ``specific { versions: [...] }`` serves those listed that exist.
    """
    versions = sorted(set(available))
    policy = cfg.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return versions
    if choice == "specific":
        wanted = set(policy.specific.versions)
        return [v for v in versions if v in wanted]
    count = policy.latest.num_versions if choice == "latest" else 1
    return versions[-count:] if count > 0 else []


_INT64_TYPES = frozenset({
    descriptor.FieldDescriptor.TYPE_INT64, descriptor.FieldDescriptor.TYPE_UINT64,
    descriptor.FieldDescriptor.TYPE_SINT64, descriptor.FieldDescriptor.TYPE_FIXED64,
    descriptor.FieldDescriptor.TYPE_SFIXED64,
})  # fmt: skip


def config_to_triton_json(cfg: ModelConfig) -> dict:
    """The config as Triton's ``ModelConfigToJson`` writes it (core ``model_config_utils.cc``),
    the form HTTP ``GET v2/models/<name>/config`` returns and a Python model's
    ``args["model_config"]`` holds: proto field names, every field
    without presence printed with its default (``"max_batch_size": 0``, ``"input": []``),
    enums by name (``"data_type": "TYPE_FP32"``) and 64-bit integers as JSON numbers
    (``"dims": [4]``) where protobuf's JSON would write strings. Map keys stay strings."""
    data = json_format.MessageToDict(
        cfg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _int64_as_numbers(cfg.DESCRIPTOR, data)
    return data


def _int64_as_numbers(message: descriptor.Descriptor, data: dict) -> None:
    for field in message.fields:
        if field.name not in data:
            continue
        value = data[field.name]
        entry = field.message_type
        if entry is not None and entry.GetOptions().map_entry:
            value_field = entry.fields_by_name["value"]
            for key, item in list(value.items()):
                value[key] = _convert(value_field, item)
        elif isinstance(value, list):
            data[field.name] = [_convert(field, item) for item in value]
        else:
            data[field.name] = _convert(field, value)


def _convert(field: descriptor.FieldDescriptor, value):
    if field.message_type is not None:
        _int64_as_numbers(field.message_type, value)
        return value
    return int(value) if field.type in _INT64_TYPES else value
