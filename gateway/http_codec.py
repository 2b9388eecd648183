"""KServe v2 HTTP/REST bodies ⇄ transport-free requests and responses.

JSON tensors follow the KServe v2 REST protocol ("Tensor Data": row-major, flat or nested
lists; BYTES as strings). Binary tensors follow Triton's binary tensor data extension
(docs/protocol/extension_binary_data.md): the ``Inference-Header-Content-Length`` header gives
the JSON header's size, each binary input carries ``parameters.binary_data_size`` and its
bytes follow the header in input order; outputs are binary when asked per output
(``parameters.binary_data``) or for all by the request parameter ``binary_data_output``;
a BF16/FP16 tensor cannot be JSON, either way (Triton's 400 and messages). Both flags must
be JSON booleans. A "Raw Binary Request" (``Inference-Header-Content-Length: 0``) is the
bytes of a one-input model's only input (:func:`parse_raw_request`).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import orjson
from tritonclient.grpc import model_config_pb2 as mc

from gateway.shared_memory import SystemSharedMemory, read_tensor, shared_memory_outputs, shared_memory_ref
from naiad.datatypes import BINARY_ONLY, bytes_elements, element_count, from_bytes, numpy_dtype, to_bytes
from naiad.errors import InvalidInput
from naiad.inference import InferRequest, InferResponse, RequestedOutput, Tensor
from naiad.memo import remember
from naiad.validation import wire_datatype

HEADER_LENGTH = "Inference-Header-Content-Length"
MAX_DIMS = 64


#: An integer of 19 digits or more is one orjson may read as a float where ``json`` reads an
#: int (orjson keeps integers in [-2**63, 2**64 - 1] only): a text holding one goes to
#: ``json.loads``. Found in one C pass that maps every digit to "0", ``.`` and ``e``/``E`` to
#: themselves and everything else to " ", then substring searches (a regex costs 3x orjson's
#: parse): a run of 19 "0" after a " " (or at the start) not followed by ``.`` or ``e`` is an
#: integer's digits; the digits of a fraction or an exponent (``0.016527635976672173``, as
#: any client's FP32 data has) follow ``.`` or ``e`` and are floats to both parsers.
_NUMBER_CHARS = bytes(48 if 48 <= c <= 57 else c if c in b".eE" else 32 for c in range(256))
_LONG_RUN = b" " + b"0" * 19


def _long_integer(text: bytes) -> bool:
    """Whether ``text`` (JSON) may hold an integer of 19 digits or more (see above)."""
    mapped = b" " + text.translate(_NUMBER_CHARS)
    at = mapped.find(_LONG_RUN)
    while at >= 0:
        end = at + len(_LONG_RUN)
        while end < len(mapped) and mapped[end] == 48:  # "0"
            end += 1
        if end == len(mapped) or mapped[end] not in b".eE":
            return True
        at = mapped.find(_LONG_RUN, end)
    return False


#: A text with this many brackets may nest deeper than ``json.loads`` parses (it raises
#: RecursionError near the interpreter's recursion limit, 1,000; orjson goes to 1,024, and
#: code that walks a value that deep would fail later): it goes to ``json.loads``.
MAX_ORJSON_BRACKETS = 512


def loads(text: bytes) -> Any:
    """``json.loads(text)``, faster: orjson parses what is strict RFC 8259 JSON within its
    limits (most requests); the rest goes to ``json.loads``, so the values accepted and the
    errors raised are ``json.loads``'s own: what orjson refuses (``NaN``, lone surrogates,
    malformed text), any text that may hold an integer of 19 digits (:func:`_long_integer`)
    and any with :data:`MAX_ORJSON_BRACKETS` brackets or more (nesting)."""
    brackets = text.count(b"[") + text.count(b"{")
    if brackets < MAX_ORJSON_BRACKETS and not _long_integer(text):
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)


def dumps(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON (as Triton writes it: no spaces), by orjson; by
    ``json.dumps`` (ASCII, escapes) what orjson cannot write: an integer past 64 bits, a
    string with a lone surrogate (a client's ``id`` may hold one)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":")).encode()


def _parse_header(body: bytes, header_length: int | None) -> tuple[dict[str, Any], memoryview]:
    if header_length is not None and not 0 < header_length <= len(body):
        raise InvalidInput(f"{HEADER_LENGTH} {header_length} does not fit a {len(body)}-byte body")
    end = len(body) if header_length is None else header_length
    try:
        header = loads(body[:end])
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, a 5,000-digit number
        raise InvalidInput(f"failed to parse the request JSON: {exc}") from None
    except RecursionError:
        raise InvalidInput("the request JSON is nested too deeply") from None
    if not isinstance(header, dict):
        raise InvalidInput("the request body must be a JSON object")
    return header, memoryview(body)[end:]


def _object(value: Any, what: str) -> dict[str, Any]:
    """``value`` if it is a JSON object, ``{}`` if absent; InvalidInput otherwise."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} must be a JSON object")
    return value


def _scalars(parameters: dict[str, Any]) -> dict[str, Any]:
    """``parameters`` if every value is a KServe v2 ``$parameter`` (a boolean, number or
    string); InvalidInput naming the first that is not (Triton refuses them too)."""
    for key, value in parameters.items():
        if not isinstance(value, str | int | float):
            raise InvalidInput(f"parameter '{key}' has invalid type: it must be a boolean, a number "
                               "or a string")  # fmt: skip
    return parameters


#: Triton 2.51's HTTP answer (400) to a request parameter named ``triton_...`` (asked of it; the
#: prefix is case-sensitive, as there).
RESERVED_PREFIX_MESSAGE = (
    "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
)


def _request_parameters(header: dict[str, Any]) -> dict[str, Any]:
    """The request's own ``parameters``: scalars (:func:`_scalars`), no key Triton reserves."""
    parameters = _scalars(_object(header.get("parameters"), "'parameters'"))
    if parameters and any(key.startswith("triton_") for key in parameters):
        raise InvalidInput(RESERVED_PREFIX_MESSAGE)
    return parameters


def _shape(raw: Any, name: str) -> list[int]:
    if not isinstance(raw, list) or len(raw) > MAX_DIMS:
        raise InvalidInput(f"input '{name}': 'shape' must be a list of at most {MAX_DIMS} sizes")
    for d in raw:  # a loop, not all(generator): a request's few dims
        if type(d) is not int or not 0 <= d < 2**63:  # bool is not an int here
            raise InvalidInput(f"input '{name}': shape {raw} must hold non-negative integers")
    return raw


# JSON value kinds (numpy dtype.kind of the parsed list) each datatype kind accepts:
# booleans only for BOOL, integers for integer types, integers or floats for float types.
_ACCEPTS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}
#: What a refused value is, by the kind numpy gave the parsed JSON (its type code, e.g. ``<U1``,
#: means nothing to a client), and what the datatype needs, by the kind of its numpy dtype.
_JSON_KINDS = {"U": "string", "b": "boolean", "f": "floating-point number", "i": "number", "u": "number"}
_NEEDS = {"b": "booleans", "i": "integers", "u": "integers", "f": "numbers"}


def _flatten(data: Any) -> list[Any]:
    """Row-major leaves of nested JSON lists, without recursion."""
    leaves, stack = [], [data]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        else:
            leaves.append(item)
    return leaves


def _big_integers(data: Any, dtype: np.dtype) -> np.ndarray:
    """Exact integer parsing for values numpy could not hold in int64 (e.g. UINT64 max)."""
    items = _flatten(data)
    info = np.iinfo(dtype)
    if not all(type(v) is int and info.min <= v <= info.max for v in items):
        raise ValueError(f"values must be integers in {info.min}..{info.max}")
    return np.array(items, dtype=dtype)


def _numbers(data: Any, dtype: np.dtype) -> np.ndarray:
    """Cast parsed JSON numbers to ``dtype``, refusing what Triton refuses: ``null``, strings,
    floats for integer types, values out of range (no silent truncation or wrap-around)."""
    values = np.asarray(data).reshape(-1)
    if dtype.kind in "iu" and values.dtype.kind in "fO":
        return _big_integers(data, dtype)  # numpy parsed ints past int64 as float/object
    if values.size and values.dtype.kind not in _ACCEPTS[dtype.kind]:
        kind = _JSON_KINDS.get(values.dtype.kind, "null, object, mixed or over-64-bit")
        raise ValueError(f"JSON {kind} values are not {_NEEDS[dtype.kind]}")
    if dtype.kind in "iu" and values.size:  # by value: a cast back would hide a wrap-around
        info = np.iinfo(dtype)
        if int(values.min()) < info.min or int(values.max()) > info.max:
            raise ValueError(f"values out of range for {dtype}")
    return values.astype(dtype)


#: Triton's message for an input with more than one source of data (HTTP server, 2.51).


def _json_data(name: str, datatype: str, data: Any, shape: list[int]) -> np.ndarray:
    if datatype in BINARY_ONLY:
        raise InvalidInput(f"receiving {datatype} data via JSON is not supported. Please use the "
                           f"binary data format for input {name}")  # fmt: skip
    try:
        if datatype == "BYTES":
            flat = np.array(data, dtype=np.object_).reshape(-1)
            if not all(isinstance(item, str) for item in flat):
                raise InvalidInput(f"input '{name}': BYTES data must be strings")
            array = np.empty(flat.size, dtype=np.object_)
            array[:] = [item.encode() for item in flat]
        else:
            array = _numbers(data, numpy_dtype(datatype))
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidInput(f"input '{name}': data does not fit {datatype}: {exc}") from None
    count = element_count(shape)
    if array.size != count:
        raise InvalidInput(f"input '{name}': shape {shape} needs {count} elements, data has {array.size}")
    return array.reshape(shape)


def _only_one_source(name: str, has_data: bool, has_binary: bool, has_shm: bool) -> None:
    """Triton's ``ValidateInputContentType``: an input's data comes from exactly one place."""
    if has_data + has_binary + has_shm == 1:
        return
    given = [f for f, on in (("'data'", has_data), ("'binary_data_size'", has_binary),
                            ("'shared_memory_region'", has_shm)) if on]  # fmt: skip
    raise InvalidInput(
        "Input must set only one of the following fields: 'data', "
        "'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'. But "
        + (f"set {' '.join(given)}" if given else "no field is set")
    )


def _input(
    spec: Any, binary: memoryview, offset: int, shm: SystemSharedMemory | None = None
) -> tuple[Tensor, int]:
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise InvalidInput("each input must be an object with a 'name'")
    name, datatype = spec["name"], spec.get("datatype")
    if not isinstance(datatype, str):
        raise InvalidInput(f"input '{name}': missing 'datatype'")
    numpy_dtype(datatype)
    shape = _shape(spec.get("shape"), name)
    params = _object(spec["parameters"], f"input '{name}' parameters") if "parameters" in spec else {}
    size, region = None, None
    if params:
        size, region = params.get("binary_data_size"), shared_memory_ref(params, name)
    if region is not None or (size is not None and "data" in spec):
        _only_one_source(name, "data" in spec, size is not None, region is not None)
        return Tensor(name, datatype, shape, read_tensor(shm, region, name, datatype, shape)), offset
    if size is None:
        if "data" not in spec:
            raise InvalidInput(f"input '{name}': neither 'data' nor 'binary_data_size' given")
        return Tensor(name, datatype, shape, _json_data(name, datatype, spec["data"], shape)), offset
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise InvalidInput(f"input '{name}': binary_data_size must be a non-negative integer, got {size!r}")
    _check_binary_size(name, size, offset, binary)
    data = from_bytes(bytes(binary[offset : offset + size]), datatype, shape)
    return Tensor(name, datatype, shape, data), offset + size


def _flag(value: Any, what: str) -> bool | None:
    """A boolean parameter of the binary extension (``binary_data``, ``binary_data_output``):
    ``None`` when absent; InvalidInput for anything but JSON ``true``/``false`` (the extension
    defines a bool; Triton refuses the string ``"false"`` too, with 500 where the spec
    wants 400)."""
    if value is None or isinstance(value, bool):
        return value
    raise InvalidInput(f"{what} must be a boolean, got {json.dumps(value)}")


def _requested_output(spec: Any) -> RequestedOutput:
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise InvalidInput("each requested output must be an object with a 'name'")
    if spec.get("parameters") is None:  # the common case: no messages to format, nothing to check
        return RequestedOutput(spec["name"])
    params = _object(spec.get("parameters"), f"output '{spec['name']}' parameters")
    binary = _flag(params.get("binary_data"), f"output '{spec['name']}': 'binary_data'")
    class_count = params.get("classification", 0)
    if not isinstance(class_count, int) or class_count < 0:
        raise InvalidInput(f"output '{spec['name']}': classification must be a non-negative integer")
    region = shared_memory_ref(params, spec["name"])
    if region is not None and class_count:
        raise InvalidInput("Output can't set both 'shared_memory_region' and 'classification'")
    if region is not None and binary is True:
        raise InvalidInput("Output can't set both 'shared_memory_region' and 'binary_data'")
    return RequestedOutput(spec["name"], binary, class_count, region)


#: Largest JSON header of a binary request that is remembered (:class:`_BinaryHeader`), and
#: how many are (then they start afresh).
MAX_REMEMBERED_HEADER_BYTES = 4096
MAX_REMEMBERED_HEADERS = 256


class _BinaryHeader:
    """What a binary request's JSON header says, every input's data in the binary part:
    clients send the same header request after request (only the tensor bytes change), so
    it is parsed once (~8 µs for the benchmark's) and each request only cuts its bytes."""

    def __init__(self, request: InferRequest, sizes: list[int]) -> None:
        pairs = zip(request.inputs, sizes, strict=True)
        self.inputs = [(t.name, t.datatype, tuple(t.shape), size) for t, size in pairs]
        self.outputs = [(o.name, o.binary, o.class_count, o.shared_memory) for o in request.outputs]
        self.id, self.parameters = request.id, dict(request.parameters)

    def request(self, binary: memoryview, model: str, version: int) -> InferRequest:
        inputs, offset = [], 0
        for name, datatype, shape, size in self.inputs:
            _check_binary_size(name, size, offset, binary)
            data = from_bytes(bytes(binary[offset : offset + size]), datatype, list(shape))
            inputs.append(Tensor(name, datatype, list(shape), data))
            offset += size
        _check_binary_end(offset, binary)
        outputs = [RequestedOutput(*output) for output in self.outputs]
        return InferRequest(model, version, inputs, outputs, self.id, dict(self.parameters))


_binary_headers: dict[bytes, _BinaryHeader] = {}


def _check_binary_size(name: str, size: int, offset: int, binary: memoryview) -> None:
    if offset + size > len(binary):
        raise InvalidInput(f"input '{name}': binary_data_size {size} runs past the request body")


def _check_binary_end(offset: int, binary: memoryview) -> None:
    if offset != len(binary):
        raise InvalidInput(f"{len(binary) - offset} bytes of binary data belong to no input")


def _binary_sizes(specs: list[Any]) -> list[int] | None:
    """Each input's ``binary_data_size`` when every input's data is in the binary part (no
    ``data``, no shared memory region), else None."""
    sizes = []
    for spec in specs:
        params = spec.get("parameters")
        if "data" in spec or not isinstance(params, dict) or "shared_memory_region" in params:
            return None
        sizes.append(params["binary_data_size"])
    return sizes


def parse_infer_request(
    body: bytes, header_length: int | None, model: str, version: int,
    shm: SystemSharedMemory | None = None,
) -> InferRequest:
    """Build an :class:`InferRequest` from a v2 HTTP body (JSON, or JSON + binary tensors;
    inputs naming a ``shared_memory_region`` are read from ``shm``). A binary request's
    header seen before is not parsed again (:class:`_BinaryHeader`).

    Raises :class:`InvalidInput` for malformed JSON, bad shapes or data that does not match
    its shape and datatype, and for binary data that is too short or left over.
    """
    # a header that does not fit the body is refused by _parse_header, never looked up
    known = 0 < (header_length or 0) <= min(MAX_REMEMBERED_HEADER_BYTES, len(body))
    if known and (seen := _binary_headers.get(body[:header_length])) is not None:
        return seen.request(memoryview(body)[header_length:], model, version)
    header, binary = _parse_header(body, header_length)
    specs = header.get("inputs")
    if not isinstance(specs, list) or not specs:
        raise InvalidInput("the request must have a non-empty 'inputs' list")
    inputs, offset = [], 0
    for spec in specs:
        tensor, offset = _input(spec, binary, offset, shm)
        inputs.append(tensor)
    _check_binary_end(offset, binary)
    output_specs = header.get("outputs") or []
    if not isinstance(output_specs, list):
        raise InvalidInput("'outputs' must be a list")
    outputs = [_requested_output(spec) for spec in output_specs]
    parameters = _request_parameters(header)
    _flag(parameters.get("binary_data_output"), "'binary_data_output'")
    request_id = header.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidInput("'id' must be a string")
    request = InferRequest(model, version, inputs, outputs, request_id, parameters)
    if known and (sizes := _binary_sizes(specs)) is not None:
        remember(_binary_headers, body[:header_length], _BinaryHeader(request, sizes), MAX_REMEMBERED_HEADERS)
    return request


def parse_raw_request(body: bytes, config: mc.ModelConfig, model: str, version: int) -> InferRequest:
    """A "Raw Binary Request" (binary data extension: ``Inference-Header-Content-Length: 0``):
    the whole body is the bytes of the model's only input, its datatype and ``dims`` from the
    configuration (a batch of 1 in front when the model batches); every output is sent back
    binary, as Triton does. Raises :class:`InvalidInput` for a model with other than one
    input, variable dims, or a body whose size does not fit them."""
    if len(config.input) != 1:
        raise InvalidInput(f"raw binary request needs a model with exactly one input; model "
                           f"'{model}' has {len(config.input)}")  # fmt: skip
    spec = config.input[0]
    dims = list(spec.dims)
    shape = ([1] if config.max_batch_size > 0 else []) + dims
    datatype = wire_datatype(spec.data_type)
    if any(d < 0 for d in shape):
        raise InvalidInput(f"raw binary request: input '{spec.name}' of model '{model}' has "
                           f"variable dims {dims}")  # fmt: skip
    try:
        data = from_bytes(body, datatype, shape)
    except InvalidInput as exc:
        raise InvalidInput(f"raw binary request: {exc.message}") from None
    tensor = Tensor(spec.name, datatype, shape, data)
    return InferRequest(model, version, [tensor], [], "", {"binary_data_output": True})


def _json_values(tensor: Tensor) -> list[Any]:
    if tensor.datatype in BINARY_ONLY:
        raise InvalidInput(f"sending {tensor.datatype} data via JSON is not supported. Please use "
                           "the binary data format for output")  # fmt: skip
    if tensor.datatype == "BYTES":
        try:
            return [raw.decode() for raw in bytes_elements(tensor.data)]
        except UnicodeDecodeError:
            raise InvalidInput(
                f"output '{tensor.name}' holds non-UTF-8 bytes: request it with binary_data"
            ) from None
    flat = tensor.data.reshape(-1)
    values = flat.tolist()
    if flat.dtype.kind == "f" and not _all_finite(flat, values):
        return [v if math.isfinite(v) else NON_FINITE[str(v)] for v in values]
    return values


#: Up to this many values a Python ``sum`` checks them faster than numpy's call overhead.
SUM_CHECK_MAX = 128


def _all_finite(flat: np.ndarray, values: list[float]) -> bool:
    """Whether every value is finite. A sum is finite only when every value is (one that
    overflows to infinity just sends finite values the slow way); numpy for many values."""
    if len(values) <= SUM_CHECK_MAX:
        return math.isfinite(sum(values))
    return bool(np.isfinite(flat).all())


#: JSON has no NaN or infinities (RFC 8259 §6). Real Triton 2.51 writes the bare tokens
#: ``NaN``, ``Infinity``, ``-Infinity`` (invalid JSON that strict parsers refuse); Naiad writes
#: them as strings, which ``tritonclient``'s ``as_numpy`` (``np.array(data, dtype=...)``)
#: turns back into the same float values (docs/protocol.md, accepted differences).
NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def render_infer_response(
    response: InferResponse, request: InferRequest
) -> tuple[bytes, dict[str, str]]:
    """The HTTP body and headers for ``response``: JSON, or JSON + binary outputs; an output
    written to a shared memory region has only its name, datatype and shape.

    An output is binary when its request entry says ``binary_data: true``, or, when it says
    nothing, when the request parameter ``binary_data_output`` is true (Triton's rule).
    """
    default_binary = bool(_flag(request.parameters.get("binary_data_output"), "'binary_data_output'"))
    wanted = {output.name: output for output in request.outputs}
    in_regions = shared_memory_outputs(request)
    outputs, chunks = [], []
    for tensor in response.outputs:
        choice = wanted[tensor.name].binary if tensor.name in wanted else None
        item: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape}
        if tensor.name in in_regions:
            pass  # written to its shared memory region: no data (Triton's answer has none)
        elif (default_binary if choice is None else choice):
            raw = to_bytes(tensor.data, tensor.datatype)
            item["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            item["data"] = _json_values(tensor)
        outputs.append(item)
    body: dict[str, Any] = {"model_name": response.model, "model_version": str(response.version)}
    if response.id:
        body["id"] = response.id
    if response.parameters:
        body["parameters"] = response.parameters
    body["outputs"] = outputs
    head = dumps(body)
    if not any(chunks):  # binary outputs of 0 bytes only: plain JSON, as from Triton
        return head, {"Content-Type": "application/json"}
    headers = {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(head))}
    return b"".join([head, *chunks]), headers
