"""The tensor datatypes of the KServe v2 protocol and their numpy and config equivalents.

Source: KServe v2 "Tensor Data Types" (https://kserve.github.io/website/docs/concepts/
architecture/data-plane/v2-protocol) and Triton's ``model_config.proto`` ``DataType`` enum;
``TYPE_STRING`` in a config is ``BYTES`` on the wire. BYTES elements are serialized as a
4-byte little-endian length followed by the bytes (Triton binary tensor data extension).
"""

from __future__ import annotations

import functools
import math
import struct
import sys

import ml_dtypes
import numpy as np

from naiad.errors import InvalidInput

# v2 datatype -> numpy dtype (BYTES is an object array of ``bytes``).
NUMPY_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "BYTES": np.dtype(np.object_),
}

# v2 datatypes whose values cannot be written as JSON numbers (Triton: binary only).
BINARY_ONLY = frozenset({"FP16", "BF16"})

_LEN = struct.Struct("<I")

#: The wire is little-endian; on such a host its arrays need no conversion.
NATIVE_IS_LITTLE = sys.byteorder == "little"


def numpy_dtype(datatype: str) -> np.dtype:
    """The numpy dtype of a v2 datatype. Raises :class:`InvalidInput` for an unknown one."""
    try:
        return NUMPY_DTYPES[datatype]
    except KeyError:
        raise InvalidInput(f"unknown datatype '{datatype}'") from None


def datatype_of(dtype: np.dtype) -> str:
    """The v2 datatype of a numpy dtype (object and byte-string arrays are BYTES)."""
    if dtype.kind in "OSU":
        return "BYTES"
    known = _DATATYPE_OF.get(dtype)  # the native-order dtypes (every output, nearly)
    if known is not None:
        return known
    dtype = dtype.newbyteorder("=") if dtype.byteorder not in "=|" else dtype
    for name, candidate in NUMPY_DTYPES.items():
        if candidate == dtype and name != "BYTES":
            return name
    raise InvalidInput(f"no v2 datatype for numpy dtype {dtype}")


#: The v2 datatype of each native-order numpy dtype of :data:`NUMPY_DTYPES` (BYTES aside).
_DATATYPE_OF = {dtype: name for name, dtype in NUMPY_DTYPES.items() if name != "BYTES"}


def config_to_datatype(config_type_name: str) -> str:
    """``TYPE_FP32`` -> ``FP32``; ``TYPE_STRING`` -> ``BYTES`` (Triton model_config.proto)."""
    name = config_type_name.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def datatype_to_config(datatype: str) -> str:
    """``FP32`` -> ``TYPE_FP32``; ``BYTES`` -> ``TYPE_STRING``."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def element_size(datatype: str) -> int:
    """Bytes per element of a fixed-size datatype; 0 for BYTES (variable length)."""
    return 0 if datatype == "BYTES" else numpy_dtype(datatype).itemsize


def element_count(shape: list[int]) -> int:
    """Elements of a tensor of ``shape`` (1 for a scalar), in exact integer arithmetic so a
    hostile shape cannot wrap around as numpy's fixed-width product would."""
    return math.prod(shape)


def bytes_elements(array: np.ndarray) -> list[bytes]:
    """The elements of a BYTES tensor, row-major, each as ``bytes``: the one rule every path
    that sends a BYTES tensor uses (binary extension, JSON, gRPC, the queue codec).

    Triton's rule (python_backend ``serialize_byte_tensor``): an element whose type is exactly
    ``bytes`` is taken as it is, as is each element of a byte-string (``S``) array; any other
    element becomes ``str(element)`` in UTF-8: a ``str`` (or ``np.str_``) its text, but also
    ``1`` -> ``b"1"``, ``1.5`` -> ``b"1.5"``, ``None`` -> ``b"None"``, ``[1, 2]`` ->
    ``b"[1, 2]"``, and an ``np.bytes_`` in an object array ``b"a"`` -> ``b"b'a'"``.
    """
    # tolist(): an object array's own elements, an S array's as plain bytes, a U array's as str;
    # f"{item!s}" is str(item) without a call (a str, the common case, is returned as it is).
    return [item if type(item) is bytes else f"{item!s}".encode() for item in array.reshape(-1).tolist()]


def serialize_bytes(array: np.ndarray) -> bytes:
    """Flatten a BYTES tensor (row-major) into length-prefixed elements.

    Each element becomes bytes by :func:`bytes_elements`; the prefix is a uint32 LE.
    """
    items = bytes_elements(array)
    parts = [b""] * (2 * len(items))  # prefix, element, prefix, element ...
    parts[::2] = map(_LEN.pack, map(len, items))
    parts[1::2] = items
    return b"".join(parts)


def deserialize_bytes(buffer: bytes | memoryview, count: int | None = None) -> np.ndarray:
    """Parse length-prefixed elements into a flat object array of ``bytes``.

    Raises :class:`InvalidInput` when a length runs past the buffer, or when ``count`` is
    given and the buffer holds a different number of elements.
    """
    view = memoryview(buffer)
    items: list[bytes] = []
    offset = 0
    while offset < len(view):
        if offset + 4 > len(view):
            raise InvalidInput("BYTES tensor data ends inside a length prefix")
        (size,) = _LEN.unpack_from(view, offset)
        offset += 4
        if offset + size > len(view):
            raise InvalidInput("BYTES tensor element runs past the end of its data")
        items.append(bytes(view[offset : offset + size]))
        offset += size
    if count is not None and len(items) != count:
        raise InvalidInput(f"BYTES tensor holds {len(items)} elements, its shape needs {count}")
    result = np.empty(len(items), dtype=np.object_)
    result[:] = items
    return result


@functools.cache
def _little_endian(datatype: str) -> np.dtype:
    """The little-endian dtype of a fixed-size datatype (the wire's byte order), made once
    (an unknown datatype raises :class:`InvalidInput` and is not cached)."""
    return numpy_dtype(datatype).newbyteorder("<")


def to_bytes(array: np.ndarray, datatype: str) -> bytes:
    """Raw little-endian row-major bytes of a tensor, as the binary extension sends them."""
    if datatype == "BYTES":
        return serialize_bytes(array)
    return np.ascontiguousarray(array, dtype=_little_endian(datatype)).tobytes()


def from_bytes(buffer: bytes | memoryview, datatype: str, shape: list[int]) -> np.ndarray:
    """Build a tensor of ``shape`` from raw bytes; the size must match exactly.

    Raises :class:`InvalidInput` when the byte count disagrees with shape and datatype.
    """
    count = element_count(shape)
    if datatype == "BYTES":
        return deserialize_bytes(buffer, count).reshape(shape)
    dtype = numpy_dtype(datatype)
    expected = count * dtype.itemsize
    if len(buffer) != expected:
        raise InvalidInput(
            f"tensor data has {len(buffer)} bytes, shape {shape} of {datatype} needs {expected}"
        )
    array = np.frombuffer(buffer, dtype=_little_endian(datatype))
    return (array if NATIVE_IS_LITTLE else array.astype(dtype)).reshape(shape)
