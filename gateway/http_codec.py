"""KServe v2 HTTP/REST bodies ⇄ transport-free requests and responses.

JSON tensors follow the KServe v2 REST protocol ("Tensor Data": row-major, flat or nested
lists; BYTES as strings). Binary tensors follow Triton's binary tensor data extension
(docs/protocol/extension_binary_data.md): the ``Inference-Header-Content-Length`` header gives
the JSON header's size, each binary input carries ``parameters.binary_data_size`` and its
bytes follow the header in input order; outputs are binary when asked per output
(``parameters.binary_data``) or for all by the request parameter ``binary_data_output``;
a BF16/FP16 tensor cannot be JSON (Triton answers 400).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from naiad.datatypes import BINARY_ONLY, element_count, from_bytes, numpy_dtype, to_bytes
from naiad.errors import InvalidInput
from naiad.inference import InferRequest, InferResponse, RequestedOutput, Tensor

HEADER_LENGTH = "Inference-Header-Content-Length"
MAX_DIMS = 64


def _parse_header(body: bytes, header_length: int | None) -> tuple[dict[str, Any], memoryview]:
    if header_length is not None and not 0 < header_length <= len(body):
        raise InvalidInput(f"{HEADER_LENGTH} {header_length} does not fit a {len(body)}-byte body")
    end = len(body) if header_length is None else header_length
    try:
        header = json.loads(body[:end])
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


def _shape(raw: Any, name: str) -> list[int]:
    if not isinstance(raw, list) or len(raw) > MAX_DIMS:
        raise InvalidInput(f"input '{name}': 'shape' must be a list of at most {MAX_DIMS} sizes")
    if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**63 for d in raw):
        raise InvalidInput(f"input '{name}': shape {raw} must hold non-negative integers")
    return raw


# JSON value kinds (numpy dtype.kind of the parsed list) each datatype kind accepts:
# booleans only for BOOL, integers for integer types, integers or floats for float types.
_ACCEPTS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}


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
        raise ValueError(f"JSON values of kind '{values.dtype}' are not {dtype}")
    cast = values.astype(dtype)
    if dtype.kind in "iu" and values.size and not np.array_equal(cast.astype(values.dtype), values):
        raise ValueError(f"values out of range for {dtype}")
    return cast


def _json_data(name: str, datatype: str, data: Any, shape: list[int]) -> np.ndarray:
    if datatype in BINARY_ONLY:
        raise InvalidInput(f"input '{name}': {datatype} data must use the binary extension")
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


def _input(spec: Any, binary: memoryview, offset: int) -> tuple[Tensor, int]:
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise InvalidInput("each input must be an object with a 'name'")
    name, datatype = spec["name"], spec.get("datatype")
    if not isinstance(datatype, str):
        raise InvalidInput(f"input '{name}': missing 'datatype'")
    numpy_dtype(datatype)
    shape = _shape(spec.get("shape"), name)
    size = _object(spec.get("parameters"), f"input '{name}' parameters").get("binary_data_size")
    if size is None:
        if "data" not in spec:
            raise InvalidInput(f"input '{name}': neither 'data' nor 'binary_data_size' given")
        return Tensor(name, datatype, shape, _json_data(name, datatype, spec["data"], shape)), offset
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise InvalidInput(f"input '{name}': binary_data_size must be a non-negative integer, got {size!r}")
    if offset + size > len(binary):
        raise InvalidInput(f"input '{name}': binary_data_size {size} runs past the request body")
    data = from_bytes(bytes(binary[offset : offset + size]), datatype, shape)
    return Tensor(name, datatype, shape, data), offset + size


def _requested_output(spec: Any) -> RequestedOutput:
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise InvalidInput("each requested output must be an object with a 'name'")
    params = _object(spec.get("parameters"), f"output '{spec['name']}' parameters")
    binary = params.get("binary_data")
    class_count = params.get("classification", 0)
    if not isinstance(class_count, int) or class_count < 0:
        raise InvalidInput(f"output '{spec['name']}': classification must be a non-negative integer")
    return RequestedOutput(spec["name"], None if binary is None else bool(binary), class_count)


def parse_infer_request(
    body: bytes, header_length: int | None, model: str, version: int
) -> InferRequest:
    """Build an :class:`InferRequest` from a v2 HTTP body (JSON, or JSON + binary tensors).

    Raises :class:`InvalidInput` for malformed JSON, bad shapes or data that does not match
    its shape and datatype, and for binary data that is too short or left over.
    """
    header, binary = _parse_header(body, header_length)
    specs = header.get("inputs")
    if not isinstance(specs, list) or not specs:
        raise InvalidInput("the request must have a non-empty 'inputs' list")
    inputs, offset = [], 0
    for spec in specs:
        tensor, offset = _input(spec, binary, offset)
        inputs.append(tensor)
    if offset != len(binary):
        raise InvalidInput(f"{len(binary) - offset} bytes of binary data belong to no input")
    output_specs = header.get("outputs") or []
    if not isinstance(output_specs, list):
        raise InvalidInput("'outputs' must be a list")
    outputs = [_requested_output(spec) for spec in output_specs]
    parameters = _object(header.get("parameters"), "'parameters'")
    request_id = header.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidInput("'id' must be a string")
    return InferRequest(model, version, inputs, outputs, request_id, parameters)


def _json_values(tensor: Tensor) -> list[Any]:
    if tensor.datatype == "BYTES":
        try:
            return [bytes(item).decode() for item in tensor.data.reshape(-1)]
        except UnicodeDecodeError:
            raise InvalidInput(
                f"output '{tensor.name}' holds non-UTF-8 bytes: request it with binary_data"
            ) from None
    values = tensor.data.reshape(-1)
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        return [v if math.isfinite(v) else NON_FINITE[str(v)] for v in values.tolist()]
    return values.tolist()


#: JSON has no NaN or infinities (RFC 8259 §6). Real Triton 2.51 writes the bare tokens
#: ``NaN``, ``Infinity``, ``-Infinity`` (invalid JSON that strict parsers refuse); Naiad writes
#: them as strings, which ``tritonclient``'s ``as_numpy`` (``np.array(data, dtype=...)``)
#: turns back into the same float values (docs/protocol.md, accepted differences).
NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def render_infer_response(
    response: InferResponse, request: InferRequest
) -> tuple[bytes, dict[str, str]]:
    """The HTTP body and headers for ``response``: JSON, or JSON + binary outputs.

    An output is binary when its request entry says ``binary_data: true``, or, when it says
    nothing, when the request parameter ``binary_data_output`` is true (Triton's rule).
    """
    default_binary = bool(request.parameters.get("binary_data_output", False))
    wanted = {output.name: output for output in request.outputs}
    outputs, chunks = [], []
    for tensor in response.outputs:
        choice = wanted[tensor.name].binary if tensor.name in wanted else None
        item: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape}
        if (default_binary if choice is None else choice):
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
    head = json.dumps(body).encode()
    if not chunks:
        return head, {"Content-Type": "application/json"}
    headers = {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(head))}
    return b"".join([head, *chunks]), headers
