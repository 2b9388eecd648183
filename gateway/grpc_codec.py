"""KServe v2 gRPC messages ⇄ transport-free requests and responses, as explicit pairs.

Messages are the generated ones shipped in ``tritonclient.grpc`` (``service_pb2``). Tensor
rules follow the KServe v2 gRPC protocol ("Tensor Data") and Triton's ``grpc_utils.cc``:

- An input's data comes either from its typed ``contents`` or from ``raw_input_contents``
  (one entry per input, in input order); a request that uses raw data uses it for every input
  and no typed ``contents`` at all. An input naming a ``shared_memory_region`` (Triton's
  shared memory extension) has neither and takes no ``raw_input_contents`` entry.
- Typed fields per datatype: INT8/INT16/INT32 in ``int_contents``, UINT8/UINT16/UINT32 in
  ``uint_contents``, INT64/UINT64/BOOL/FP32/FP64/BYTES in their own fields; FP16 and BF16
  have no typed field and travel only as raw bytes.
- Outputs always go in ``raw_output_contents`` (what Triton sends and ``tritonclient``
  reads), BYTES as 4-byte little-endian length-prefixed elements.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb

from gateway.shared_memory import SystemSharedMemory, read_tensor, shared_memory_ref
from naiad.datatypes import bytes_elements, element_count, from_bytes, numpy_dtype, to_bytes
from naiad.errors import InvalidInput
from naiad.inference import InferRequest, InferResponse, RequestedOutput, SharedMemoryRef, Tensor

#: v2 datatype -> the ``InferTensorContents`` field that carries it (FP16/BF16: none).
CONTENTS_FIELDS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}

#: The numpy dtype each typed field holds (the wire width before narrowing to the datatype).
FIELD_DTYPES = {
    "bool_contents": np.dtype(np.bool_),
    "int_contents": np.dtype(np.int32),
    "int64_contents": np.dtype(np.int64),
    "uint_contents": np.dtype(np.uint32),
    "uint64_contents": np.dtype(np.uint64),
    "fp32_contents": np.dtype(np.float32),
    "fp64_contents": np.dtype(np.float64),
}

MAX_DIMS = 64
INT64_MAX = 2**63 - 1


# --- parameters -------------------------------------------------------------------------


def from_parameters(params: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    """A ``map<string, InferParameter>`` as a plain dict of Python scalars."""
    result: dict[str, Any] = {}
    if not params:  # most maps: no walk through the Mapping ABC's items view
        return result
    for key, param in params.items():
        choice = param.WhichOneof("parameter_choice")
        if choice is None:
            raise InvalidInput(f"parameter '{key}' has no value")
        result[key] = getattr(param, choice)
    return result


#: The one request parameter named ``triton_...`` Triton's gRPC front takes (a bool, the
#: stream's option for an empty final response; Naiad flags every streamed answer final).
EMPTY_FINAL = "triton_enable_empty_final_response"
#: Triton's gRPC refusal of any other ``triton_...`` request parameter (``SetInferenceRequestMetadata``).
RESERVED_PREFIX_MESSAGE = (
    "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys "
    f"starting with 'triton_' are allowed: {EMPTY_FINAL}"
)


def request_parameters(params: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    """A request's own ``parameters`` (:func:`from_parameters`) as Triton's gRPC front takes
    them: no ``triton_...`` key but :data:`EMPTY_FINAL` (a bool, not passed on);
    :class:`InvalidInput` with Triton's message otherwise."""
    parameters = from_parameters(params)
    if parameters and any(key.startswith("triton_") for key in parameters):
        if any(key.startswith("triton_") and key != EMPTY_FINAL for key in parameters):
            raise InvalidInput(RESERVED_PREFIX_MESSAGE)
        if not isinstance(parameters.pop(EMPTY_FINAL), bool):
            raise InvalidInput(f"invalid value type for '{EMPTY_FINAL}' parameter, expected bool_param.")
    return parameters


def to_parameters(values: Mapping[str, Any]) -> dict[str, pb.InferParameter]:
    """Plain scalars as ``InferParameter`` messages (ints above int64 as ``uint64_param``)."""
    result = {}
    for key, value in values.items():
        if isinstance(value, bool):
            result[key] = pb.InferParameter(bool_param=value)
        elif isinstance(value, int):
            field = "int64_param" if value <= INT64_MAX else "uint64_param"
            result[key] = pb.InferParameter(**{field: value})
        elif isinstance(value, float):
            result[key] = pb.InferParameter(double_param=value)
        elif isinstance(value, str):
            result[key] = pb.InferParameter(string_param=value)
        else:
            raise TypeError(f"parameter '{key}': {type(value).__name__} has no InferParameter form")
    return result


# --- typed tensor contents --------------------------------------------------------------


def _contents_field(name: str, datatype: str) -> str:
    numpy_dtype(datatype)  # unknown datatype -> InvalidInput
    field = CONTENTS_FIELDS.get(datatype)
    if field is None:
        raise InvalidInput(f"input '{name}': {datatype} data must be sent in raw_input_contents")
    return field


def from_contents(name: str, datatype: str, shape: list[int], contents: pb.InferTensorContents) -> np.ndarray:
    """The array a typed ``contents`` holds. Raises :class:`InvalidInput` when the values are
    in another field than the datatype's, their count disagrees with ``shape``, or an integer
    does not fit the datatype (e.g. 300 for INT8)."""
    field = _contents_field(name, datatype)
    stray = [f.name for f, _ in contents.ListFields() if f.name != field]
    if stray:
        raise InvalidInput(f"input '{name}': {datatype} data belongs in {field}, not {stray[0]}")
    values = getattr(contents, field)
    count = element_count(shape)  # exact: a hostile shape must not wrap around
    if len(values) != count:
        raise InvalidInput(f"input '{name}': shape {shape} needs {count} elements, {field} has {len(values)}")
    if datatype == "BYTES":
        array = np.empty(count, dtype=np.object_)
        array[:] = list(values)
        return array.reshape(shape)
    wide = np.array(values, dtype=FIELD_DTYPES[field])
    array = wide.astype(numpy_dtype(datatype))
    if array.dtype != wide.dtype and not np.array_equal(array, wide):
        raise InvalidInput(f"input '{name}': a value in {field} does not fit {datatype}")
    return array.reshape(shape)


def to_contents(tensor: Tensor) -> pb.InferTensorContents:
    """A tensor as typed ``contents``; FP16/BF16 raise :class:`InvalidInput` (raw only)."""
    field = _contents_field(tensor.name, tensor.datatype)
    contents = pb.InferTensorContents()
    if tensor.datatype == "BYTES":
        items = bytes_elements(tensor.data)
    else:
        items = tensor.data.reshape(-1).astype(FIELD_DTYPES[field]).tolist()
    getattr(contents, field).extend(items)
    return contents


# --- inference requests -----------------------------------------------------------------


def _shape(name: str, dims: Any) -> list[int]:
    shape = list(dims)
    if len(shape) > MAX_DIMS or any(d < 0 for d in shape):
        raise InvalidInput(f"input '{name}': shape {shape} must hold at most {MAX_DIMS} sizes >= 0")
    return shape


def _input(spec: pb.ModelInferRequest.InferInputTensor, raw: bytes | None) -> Tensor:
    shape = _shape(spec.name, spec.shape)
    numpy_dtype(spec.datatype)
    if raw is None:
        data = from_contents(spec.name, spec.datatype, shape, spec.contents)
    elif spec.HasField("contents"):
        raise InvalidInput(f"input '{spec.name}': contents must not be given when raw_input_contents is used")
    else:
        try:
            data = from_bytes(raw, spec.datatype, shape)
        except InvalidInput as exc:
            raise InvalidInput(f"input '{spec.name}': {exc.message}") from None
    return Tensor(spec.name, spec.datatype, shape, data)


def _requested_output(spec: pb.ModelInferRequest.InferRequestedOutputTensor) -> RequestedOutput:
    params = from_parameters(spec.parameters)
    class_count = params.get("classification", 0)
    if not isinstance(class_count, int) or isinstance(class_count, bool) or class_count < 0:
        raise InvalidInput(f"output '{spec.name}': classification must be a non-negative integer")
    region = shared_memory_ref(params, spec.name)
    if region is not None and class_count:
        raise InvalidInput("output can't set both 'shared_memory_region' and 'classification'")
    return RequestedOutput(spec.name, None, class_count, region)


def _region_input(
    spec: pb.ModelInferRequest.InferInputTensor, region: SharedMemoryRef, shm: SystemSharedMemory | None
) -> Tensor:
    if spec.HasField("contents"):
        raise InvalidInput(
            f"unexpected 'content' provided when using shared memory for input tensor '{spec.name}'"
        )
    shape = _shape(spec.name, spec.shape)
    numpy_dtype(spec.datatype)
    return Tensor(spec.name, spec.datatype, shape, read_tensor(shm, region, spec.name, spec.datatype, shape))


def from_infer_request(
    request: pb.ModelInferRequest, model: str, version: int, shm: SystemSharedMemory | None = None
) -> InferRequest:
    """Build an :class:`InferRequest` for ``model`` ``version`` (already resolved); inputs
    naming a ``shared_memory_region`` are read from ``shm`` and take no raw_input_contents.

    Raises :class:`InvalidInput` for no inputs, a raw/typed mix, a ``raw_input_contents``
    count other than the count of inputs not in shared memory, and data that does not fit
    its shape and datatype.
    """
    if not request.inputs:
        raise InvalidInput("the request must have at least one input")
    regions = [shared_memory_ref(from_parameters(spec.parameters), spec.name) for spec in request.inputs]
    plain = sum(region is None for region in regions)
    raw_list = list(request.raw_input_contents)
    if raw_list and len(raw_list) != plain:
        raise InvalidInput(
            f"expected {plain} raw_input_contents (one per input not in shared memory), got {len(raw_list)}"
        )
    raws = iter(raw_list)
    inputs = [
        _region_input(spec, region, shm) if region is not None
        else _input(spec, next(raws) if raw_list else None)
        for spec, region in zip(request.inputs, regions, strict=True)
    ]  # fmt: skip
    outputs = [_requested_output(spec) for spec in request.outputs]
    parameters = request_parameters(request.parameters)
    return InferRequest(model, version, inputs, outputs, request.id, parameters)


def to_infer_request(request: InferRequest, raw: bool = True) -> pb.ModelInferRequest:
    """The message for ``request``: tensors as ``raw_input_contents``, or typed ``contents``."""
    message = pb.ModelInferRequest(
        model_name=request.model,
        model_version=str(request.version) if request.version else "",
        id=request.id,
        parameters=to_parameters(request.parameters),
    )
    for tensor in request.inputs:
        spec = message.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        if raw:
            message.raw_input_contents.append(to_bytes(tensor.data, tensor.datatype))
        else:
            spec.contents.CopyFrom(to_contents(tensor))
    for output in request.outputs:
        params = {"classification": output.class_count} if output.class_count else {}
        message.outputs.add(name=output.name, parameters=to_parameters(params))
    return message


# --- inference responses ----------------------------------------------------------------


def to_infer_response(
    response: InferResponse, in_regions: frozenset[str] = frozenset()
) -> pb.ModelInferResponse:
    """The message for ``response``; every output's bytes in ``raw_output_contents``, empty
    for the outputs named in ``in_regions`` (written to shared memory; Triton sends one
    ``raw_output_contents`` per output all the same)."""
    message = pb.ModelInferResponse(
        model_name=response.model,
        model_version=str(response.version),
        id=response.id,
        parameters=to_parameters(response.parameters),
    )
    for tensor in response.outputs:
        message.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        in_region = tensor.name in in_regions
        message.raw_output_contents.append(b"" if in_region else to_bytes(tensor.data, tensor.datatype))
    return message


def from_infer_response(message: pb.ModelInferResponse) -> InferResponse:
    """An :class:`InferResponse` from a message whose outputs are all raw."""
    if len(message.raw_output_contents) != len(message.outputs):
        raise InvalidInput("expected one raw_output_contents per output")
    outputs = [
        Tensor(spec.name, spec.datatype, list(spec.shape), from_bytes(raw, spec.datatype, list(spec.shape)))
        for spec, raw in zip(message.outputs, message.raw_output_contents, strict=True)
    ]
    raw = message.model_version
    version = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 18 else 0
    return InferResponse(
        message.model_name, version, outputs, message.id, from_parameters(message.parameters)
    )


# --- metadata (server to client only) ---------------------------------------------------


def to_server_metadata(metadata: Mapping[str, Any]) -> pb.ServerMetadataResponse:
    """``DataPlane.server_metadata()`` as its message."""
    return pb.ServerMetadataResponse(
        name=metadata["name"], version=metadata["version"], extensions=metadata["extensions"]
    )


def to_model_metadata(metadata: Mapping[str, Any]) -> pb.ModelMetadataResponse:
    """``DataPlane.model_metadata()`` as its message (shapes with ``-1`` for the batch)."""

    def tensors(items: list[dict[str, Any]]) -> list[pb.ModelMetadataResponse.TensorMetadata]:
        return [
            pb.ModelMetadataResponse.TensorMetadata(
                name=item["name"], datatype=item["datatype"], shape=item["shape"]
            )
            for item in items
        ]

    return pb.ModelMetadataResponse(
        name=metadata["name"],
        versions=metadata["versions"],
        platform=metadata["platform"],
        inputs=tensors(metadata["inputs"]),
        outputs=tensors(metadata["outputs"]),
    )


def to_model_statistics(statistics: Mapping[str, Any]) -> pb.ModelStatisticsResponse:
    """``DataPlane.model_statistics()`` as its message: the dict already has the message's
    JSON shape (Triton's statistics extension uses the proto field names over HTTP)."""
    return json_format.ParseDict(statistics, pb.ModelStatisticsResponse())


def to_repository_index(index: list[Mapping[str, str]]) -> pb.RepositoryIndexResponse:
    """``DataPlane.repository_index()`` as its message (``version`` absent stays empty)."""
    return pb.RepositoryIndexResponse(
        models=[pb.RepositoryIndexResponse.ModelIndex(**item) for item in index]
    )


def to_shared_memory_status(regions: list[Mapping[str, Any]]) -> pb.SystemSharedMemoryStatusResponse:
    """``SystemSharedMemory.status()`` as its message: ``regions`` keyed by name."""
    return pb.SystemSharedMemoryStatusResponse(
        regions={item["name"]: pb.SystemSharedMemoryStatusResponse.RegionStatus(**item) for item in regions}
    )


def from_repository_parameters(params: Mapping[str, pb.ModelRepositoryParameter]) -> dict[str, Any]:
    """A load/unload request's parameters as plain values (what the HTTP body carries)."""
    values: dict[str, Any] = {}
    for key, param in params.items():
        kind = param.WhichOneof("parameter_choice")
        values[key] = getattr(param, kind) if kind else None
    return values
