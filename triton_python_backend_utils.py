"""Naiad's ``triton_python_backend_utils``: the API a Triton Python-backend ``model.py`` imports.

A model written for Triton's Python backend (``import triton_python_backend_utils as
pb_utils``) runs unchanged on a Naiad worker (:mod:`workers.backends.python`). The names,
signatures and behaviour follow Triton's python_backend README ("Usage", "Error Handling",
"Business Logic Scripting", "Auto-complete config", "Logging") and its
``src/resources/triton_python_backend_utils.py``:

- :class:`Tensor` (``name()``, ``as_numpy()``, ``triton_dtype()``, ``shape()``, dlpack),
  BYTES tensors as numpy ``object`` arrays of ``bytes``;
- :class:`InferenceRequest`: the requests ``execute`` receives, and BLS requests to other
  models (``exec()``, ``async_exec()``) that travel through the target model's queue;
- :class:`InferenceResponse`, :class:`TritonError` (with Triton's error codes),
  :class:`TritonModelException`;
- the lookup helpers (``get_input_tensor_by_name`` ...), dtype helpers, :class:`ModelConfig`
  (the object ``auto_complete_config`` receives) and :class:`Logger`.

- :class:`InferenceResponseSender` (``request.get_response_sender()``) in a model that is not
  decoupled: one response a request, as Triton 2.51 serves it.

Not offered (Naiad has no equivalent): decoupled models (several responses a request), GPU
tensors, custom metrics. This module imports only numpy and the standard library.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import json
import logging
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "TRITON_STRING_TO_NUMPY",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "Logger",
    "ModelConfig",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "using_decoupled_model_transaction_policy",
]

#: Config data type name -> numpy type (Triton's table; ``TYPE_STRING`` is BYTES).
TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

# model_config.proto DataType numbers (TYPE_BOOL = 1 ... TYPE_STRING = 13).
_TYPE_NUMBERS: dict[int, Any] = {
    1: np.bool_, 2: np.uint8, 3: np.uint16, 4: np.uint32, 5: np.uint64, 6: np.int8,
    7: np.int16, 8: np.int32, 9: np.int64, 10: np.float16, 11: np.float32, 12: np.float64,
    13: np.object_,
}  # fmt: skip

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_GPU = 2

_LENGTH = struct.Struct("<I")


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """``"TYPE_FP32"`` -> ``np.float32``. Raises KeyError for an unknown name (as Triton)."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    """A ``DataType`` enum number (``TYPE_FP32`` = 11) -> numpy type; None when unknown."""
    return _TYPE_NUMBERS.get(data_type)


def numpy_to_triton_type(data_type: Any) -> int | None:
    """A numpy dtype or type -> its ``DataType`` number; ``bytes_`` is ``TYPE_STRING``."""
    dtype = np.dtype(data_type)
    if dtype.kind == "S":
        return 13
    return _NUMBER_OF_DTYPE.get(dtype)


#: :data:`_TYPE_NUMBERS` the other way (each tensor a model makes asks it: a dict, not a scan).
_NUMBER_OF_DTYPE: dict[np.dtype, int] = {np.dtype(t): number for number, t in _TYPE_NUMBERS.items()}


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | tuple[()] | None:
    """A BYTES tensor as Triton's Python backend's own helper gives it: ``bytes`` of 4-byte
    little-endian length prefixes and elements, row-major; ``()`` for an empty tensor; None
    for one that is neither of objects nor of byte strings (``S``). An object element whose
    type is exactly ``bytes`` is taken as it is, any other is ``str(element)`` in UTF-8 (so an
    ``np.bytes_(b"a")`` is ``b"b'a'"``), as every path of the server sends it
    (:func:`naiad.datatypes.bytes_elements`; this module imports numpy only)."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype != np.object_ and input_tensor.dtype.type != np.bytes_:
        return None
    parts = []
    for item in input_tensor.reshape(-1).tolist():
        raw = item if type(item) is bytes else str(item).encode("utf-8")
        parts += [_LENGTH.pack(len(raw)), raw]
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor: bytes | np.ndarray) -> np.ndarray:
    """Inverse of :func:`serialize_byte_tensor`: a flat object array of ``bytes``."""
    view = memoryview(bytes(encoded_tensor))
    items, offset = [], 0
    while offset < len(view):
        (size,) = _LENGTH.unpack_from(view, offset)
        items.append(bytes(view[offset + 4 : offset + 4 + size]))
        offset += 4 + size
    result = np.empty(len(items), dtype=np.object_)
    result[:] = items
    return result


class TritonModelException(Exception):
    """Raised by a model (``initialize``, ``execute``, ``finalize``) to report a failure; an
    exception out of ``execute`` fails every request of that call with its message."""

    def __init__(self, msg: str):
        super().__init__(msg)
        self._msg = msg

    def message(self) -> str:
        return self._msg


class TritonError:
    """An error for one response: ``InferenceResponse(error=TritonError("..."))``.

    ``code`` is one of the class's Triton error codes (``TRITONSERVER_Error_Code``); the
    default is ``INTERNAL`` (python_backend README, "Error Handling"). The client's HTTP
    status follows Triton's HTTP server: INTERNAL 500, NOT_FOUND 404, UNAVAILABLE 503,
    UNSUPPORTED 501, the others 400.
    """

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, msg: str, code: int = INTERNAL):
        self._msg = msg
        self._code = code

    def __str__(self) -> str:
        return self._msg

    def __repr__(self) -> str:
        return f"TritonError({self._msg!r}, {self._code})"

    def message(self) -> str:
        return self._msg

    def code(self) -> int:
        return self._code


class Tensor:
    """A named tensor of a request or response, holding a numpy array.

    BYTES tensors are ``object`` arrays (of ``bytes``; ``str`` elements are sent as UTF-8).
    Raises :class:`TritonModelException` for a non-array, or a numpy ``str_``/``void`` array
    (Triton asks for ``np.object_`` instead).
    """

    def __init__(self, name: str, numpy_array: np.ndarray, triton_dtype: int | None = None):
        if not isinstance(numpy_array, np.ndarray):
            raise TritonModelException(f"tensor '{name}' must be created from a numpy array")
        self._name = name
        self._array = numpy_array
        if triton_dtype is None:  # the common case: a native dtype of the table, one lookup
            number = _NUMBER_OF_DTYPE.get(numpy_array.dtype)
            self._triton_dtype = number if number is not None else self._number_of(numpy_array.dtype)
            return
        self._number_of(numpy_array.dtype)  # refuses str_ and void
        if numpy_array.dtype != np.dtype(triton_to_numpy_type(triton_dtype)):
            self._array = numpy_array.view(triton_to_numpy_type(triton_dtype))
        self._triton_dtype = triton_dtype

    @staticmethod
    def _number_of(dtype: np.dtype) -> int | None:
        """The ``DataType`` number of ``dtype``; raises for numpy ``str_`` and ``void``."""
        if dtype.type in (np.str_, np.void):
            raise TritonModelException(
                "Tensor dtype used for numpy_array is not supported by Python backend. "
                "Please use np.object_ instead."
            )
        return numpy_to_triton_type(dtype)

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, dtype={self._array.dtype}, shape={self._array.shape})"

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def triton_dtype(self) -> int | None:
        """The ``DataType`` number of the tensor (``TYPE_FP32`` = 11)."""
        return self._triton_dtype

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        """Always True: Naiad hands the model host memory."""
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule of the array (e.g. for ``torch.utils.dlpack.from_dlpack``)."""
        return self._array.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, dlpack_tensor: Any) -> Tensor:
        """A tensor from a DLPack capsule or an object with ``__dlpack__`` (a CPU torch
        tensor, a numpy array), sharing its memory."""
        if not hasattr(dlpack_tensor, "__dlpack__"):
            dlpack_tensor = _Capsule(dlpack_tensor)
        return Tensor(name, np.from_dlpack(dlpack_tensor))


class _Capsule:
    """A bare DLPack capsule (host memory) as the object ``np.from_dlpack`` takes."""

    def __init__(self, capsule: Any):
        self._capsule = capsule

    def __dlpack__(self, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU


def _parameters_json(parameters: dict[str, Any] | str | None) -> str:
    """``request.parameters()``'s text: JSON as Triton 2.51's stub writes it, compact and with
    UTF-8 kept (asked of real Triton: ``{"s":"hé","i":3}``); ``"{}"`` for none."""
    if parameters is None:
        return "{}"
    if isinstance(parameters, str):
        json.loads(parameters)  # a ValueError for malformed JSON, here rather than later
        return parameters
    if not isinstance(parameters, dict):
        raise TritonModelException("request parameters must be a dict or a JSON string")
    return json.dumps(parameters, separators=(",", ":"), ensure_ascii=False) if parameters else "{}"


#: Sends a BLS request through its model's queue, returning a future of its response.
BlsSubmit = Callable[["InferenceRequest"], "concurrent.futures.Future[InferenceResponse]"]

#: Set by the worker (:mod:`workers.bls`); None outside a Naiad worker.
_bls_submit: BlsSubmit | None = None


def _install_bls(submit: BlsSubmit | None) -> None:
    """Let :meth:`InferenceRequest.exec` reach other models through ``submit`` (the worker's
    BLS client); None removes it."""
    global _bls_submit
    _bls_submit = submit


class InferenceRequest:
    """A request: one of those ``execute`` receives, or a BLS request a model builds to call
    another model (python_backend README, "Business Logic Scripting")::

        request = pb_utils.InferenceRequest(model_name="digits", requested_output_names=["y"],
                                            inputs=[pb_utils.Tensor("x", x)])
        response = request.exec()          # blocks this execute call only
        response = await request.async_exec()   # from ``async def execute``

    ``model_version`` -1 is the newest version the server serves; ``timeout`` is in µs (0:
    the server's default request timeout); ``parameters`` a dict or a JSON string.
    """

    def __init__(
        self, request_id: str = "", correlation_id: int | str = 0, inputs: list[Tensor] | None = None,
        requested_output_names: list[str] | None = None, model_name: str = "", model_version: int = -1,
        flags: int = 0, timeout: int = 0, preferred_memory: Any = None, trace: Any = None,
        parameters: dict[str, Any] | str | None = None,
    ):  # fmt: skip
        if inputs is None or requested_output_names is None or not model_name:
            raise TypeError("InferenceRequest needs model_name, requested_output_names and inputs")
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._inputs = list(inputs)
        self._requested_output_names = list(requested_output_names)
        self._model_name = model_name
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._preferred_memory = preferred_memory
        self._trace = trace
        self._parameters = _parameters_json(parameters)
        self._sender: InferenceResponseSender | None = None
        self._received_by_server = False  # a BLS request, built by a model

    @classmethod
    def _received(
        cls, request_id: str, inputs: list[Tensor], requested_output_names: list[str], model_name: str,
        model_version: int, timeout: int, parameters: str,
    ) -> InferenceRequest:  # fmt: skip
        """A request ``execute`` receives, built by the server (``workers.backends.python``)
        from a validated request: the lists are the new request's own, ``parameters`` is JSON
        already, and nothing is checked (0.46 µs against 2.04 for the keyword constructor,
        ``timeit`` on the benchmark VM)."""
        request = cls.__new__(cls)
        request._request_id, request._correlation_id, request._inputs = request_id, 0, inputs
        request._requested_output_names, request._model_name = requested_output_names, model_name
        request._model_version, request._flags, request._timeout = model_version, 0, timeout
        request._preferred_memory = request._trace = request._sender = None
        request._parameters, request._received_by_server = parameters, True
        return request

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def requested_output_names(self) -> set[str]:
        """The outputs to return; for a request ``execute`` receives, every output of the
        model when the client asked for none (as Triton's core fills them in). A new ``set``
        each call, as Triton 2.51's stub answers (its C++ ``std::set`` converted by pybind11;
        asked of real Triton): a model that adds to it or empties it changes nothing."""
        return set(self._requested_output_names)

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        """The request's timeout in µs (0: none of its own)."""
        return self._timeout

    def parameters(self) -> str:
        """The request's parameters as a JSON object string (``json.loads`` it)."""
        return self._parameters

    def trace(self) -> Any:
        return self._trace

    def is_cancelled(self) -> bool:
        """Whether the client cancelled the request. Naiad skips a request withdrawn before
        its batch starts, so a request ``execute`` sees is never cancelled."""
        return False

    def get_response_sender(self) -> InferenceResponseSender:
        """This request's response sender (the same one at each call): ``execute`` may answer
        the request through it instead of in its returned list (:class:`InferenceResponseSender`)."""
        if self._sender is None:
            self._sender = InferenceResponseSender(received=self._received_by_server)
        return self._sender

    def exec(self, decoupled: bool = False) -> InferenceResponse:
        """Run this request on ``model_name`` and wait for its response. Errors (unknown
        model, bad input, the model's own failure, timeout) come back in the response's
        ``error()``, never raised."""
        return self._submit(decoupled).result()

    def async_exec(self, decoupled: bool = False) -> asyncio.Future[InferenceResponse]:
        """:meth:`exec` without blocking: an awaitable of the response, to ``await`` (or
        ``asyncio.gather``) in an ``async def execute``. The request is sent at once."""
        return asyncio.wrap_future(self._submit(decoupled), loop=asyncio.get_running_loop())

    def _submit(self, decoupled: bool) -> concurrent.futures.Future[InferenceResponse]:
        if decoupled:
            raise TritonModelException("BLS requests to decoupled models are not supported by Naiad")
        if _bls_submit is None:
            done: concurrent.futures.Future[InferenceResponse] = concurrent.futures.Future()
            error = TritonError("BLS requests can only be sent from 'execute' on a Naiad worker",
                                TritonError.UNAVAILABLE)  # fmt: skip
            done.set_result(InferenceResponse(error=error))
            return done
        return _bls_submit(self)


class InferenceResponseSender:
    """A request's response sender in a model that is not decoupled: ``execute`` answers the
    request with ``send(response, flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL)`` (or ``send
    (response)`` then ``send(flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL)``) instead of in the
    list it returns, as Triton 2.51 serves it (asked of it). The rules and messages are
    python_backend's (``src/response_sender.cc``, ``src/pb_stub.cc``): flags 0 or the final
    flag, a response with flags 0, one response, nothing after the final flag and no final
    flag before a response, each refused with :class:`TritonModelException`; a BLS request's
    sender refuses every send. The server reads what was sent when ``execute`` returns: a
    response sent later, from another thread, is not taken."""

    def __init__(self, received: bool = True) -> None:
        self._received = received  # False: a BLS request's, which has no model to answer for
        self._response: InferenceResponse | None = None
        self._closed = False  # the final flag was sent

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException("Inference Response object must be provided when the response flags "
                                       "is set to zero.")  # fmt: skip
        if not self._received:
            raise TritonModelException("Unable to send response. Response sender has no reference to the "
                                       "decoupled state of the model.")  # fmt: skip
        if response is not None and self._response is not None:
            raise TritonModelException("Unable to send response. Non-decoupled model cannot send more than "
                                       "one response.")  # fmt: skip
        if response is None and flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL and self._response is None:
            raise TritonModelException("Unable to send response. Non-decoupled model cannot send complete "
                                       "final before sending a response.")  # fmt: skip
        if self._closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(f"expected an InferenceResponse, got {type(response).__name__}")
        if flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self._closed = True
        if response is not None:
            self._response = response

    def is_cancelled(self) -> bool:
        return False  # as InferenceRequest.is_cancelled


class InferenceResponse:
    """The answer to one request: ``output_tensors`` (a list of :class:`Tensor`) or
    ``error`` (a :class:`TritonError`; the outputs are then ignored)."""

    def __init__(
        self, output_tensors: list[Tensor] | None = None, error: TritonError | None = None,
        parameters: dict[str, Any] | str | None = None,
    ):  # fmt: skip
        if output_tensors is None:
            output_tensors = []
        if not isinstance(output_tensors, list):
            raise TritonModelException('"output_tensors" must be a list.')
        if error is not None and not isinstance(error, TritonError):
            raise TritonModelException('"error" must be a TritonError.')
        self._output_tensors = output_tensors
        self._error = error
        self._parameters = "{}" if parameters is None else _parameters_json(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._output_tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    """The request's input called ``name``, or None."""
    return _named(inference_request.inputs(), name)


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    """The response's output called ``name``, or None."""
    return _named(inference_response.output_tensors(), name)


def _named(tensors: list[Tensor], name: str) -> Tensor | None:
    """The first of ``tensors`` called ``name``, or None (a loop: 0.30 µs against a
    generator's 0.68 for one tensor, ``timeit`` on the benchmark VM; every model calls it per
    request)."""
    for tensor in tensors:
        if tensor.name() == name:
            return tensor
    return None


def _config_by_name(model_config: dict[str, Any], kind: str, name: str) -> dict[str, Any] | None:
    return next((spec for spec in model_config.get(kind, []) if spec.get("name") == name), None)


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The ``input`` entry called ``name`` of a config dict (``json.loads(args["model_config"])``)."""
    return _config_by_name(model_config, "input", name)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The ``output`` entry called ``name`` of a config dict, e.g. ``{"name": "OUTPUT0",
    "data_type": "TYPE_FP32", "dims": [4], ...}``."""
    return _config_by_name(model_config, "output", name)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


_INPUT_PROPERTIES = {"name", "data_type", "dims", "optional", "reshape", "is_shape_tensor"}
_OUTPUT_PROPERTIES = {"name", "data_type", "dims", "reshape", "label_filename", "is_shape_tensor"}


class ModelConfig:
    """The model configuration ``auto_complete_config`` receives and returns (python_backend
    README, "auto_complete_config"): ``as_dict()`` reads it; ``set_max_batch_size``,
    ``set_dynamic_batching``, ``add_input``, ``add_output`` and
    ``set_model_transaction_policy`` complete it. Conflicts raise ValueError, as in Triton.
    """

    def __init__(self, model_config: str | dict[str, Any]):
        config = json.loads(model_config) if isinstance(model_config, str) else model_config
        config.setdefault("input", [])
        config.setdefault("output", [])
        config.setdefault("max_batch_size", 0)
        self._model_config = config

    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def as_dict(self) -> dict[str, Any]:
        return self._model_config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Raises ValueError when the config already sets a larger non-zero value."""
        current = int(self._model_config.get("max_batch_size", 0))
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config "
                f"function for model '{self._name()}' specified max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Use the dynamic batcher (default settings) unless the config has one already.
        Raises ValueError when a sequence batcher or ensemble scheduling is set."""
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but auto-complete-"
                    f"config function for model '{self._name()}' tries to set scheduling_choice "
                    "as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        self._model_config["model_transaction_policy"] = dict(transaction_policy_dict)

    def add_input(self, input: dict[str, Any]) -> None:  # noqa: A002 - Triton's parameter name
        """Add an input (``name``, ``data_type``, ``dims``, optionally ``optional``...), or
        complete the config's input of that name. Raises ValueError on a conflict."""
        self._add("input", input, _INPUT_PROPERTIES)

    def add_output(self, output: dict[str, Any]) -> None:
        """As :meth:`add_input`, for an output."""
        self._add("output", output, _OUTPUT_PROPERTIES)

    def _add(self, kind: str, spec: dict[str, Any], allowed: set[str]) -> None:
        name = spec.get("name")
        if name is None:
            raise ValueError(f"{kind} in auto-complete-config function for model '{self._name()}' "
                             "is missing 'name' property.")  # fmt: skip
        for needed in ("data_type", "dims"):
            if needed not in spec:
                raise ValueError(f"{kind} '{name}' in auto-complete-config function for model "
                                 f"'{self._name()}' is missing '{needed}' property.")  # fmt: skip
        extra = sorted(set(spec) - allowed)
        if extra:
            raise ValueError(f"{kind} '{name}' in auto-complete-config function for model "
                             f"'{self._name()}' contains unsupported properties {extra}.")  # fmt: skip
        for current in self._model_config[kind]:
            if current.get("name") == name:
                self._merge(kind, current, spec)
                return
        self._model_config[kind].append(dict(spec))

    def _merge(self, kind: str, current: dict[str, Any], spec: dict[str, Any]) -> None:
        name, have = spec["name"], current.get("data_type", "TYPE_INVALID")
        if have not in ("TYPE_INVALID", spec["data_type"]):
            raise ValueError(f"unable to load model '{self._name()}', configuration expects datatype "
                             f"{have} for {kind} '{name}', model provides {spec['data_type']}")  # fmt: skip
        dims = [int(d) for d in current.get("dims", [])]
        if dims and dims != [int(d) for d in spec["dims"]]:
            raise ValueError(f"model '{self._name()}', tensor '{name}': the model expects dims "
                             f"{spec['dims']} but the model configuration specifies dims {dims}")  # fmt: skip
        current.update(spec)


class LogLevel(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_LEVELS = {LogLevel.INFO: logging.INFO, LogLevel.WARNING: logging.WARNING,
           LogLevel.ERROR: logging.ERROR, LogLevel.VERBOSE: logging.DEBUG}  # fmt: skip
_model_logger = logging.getLogger("triton_python_backend_utils")


class Logger:
    """Triton's model logger (python_backend README, "Logging"): into the worker's log, with
    its model and request context; VERBOSE is DEBUG."""

    @staticmethod
    def log(message: str, level: LogLevel = LogLevel.INFO) -> None:
        _model_logger.log(_LEVELS[LogLevel(level)], "%s", message)

    @staticmethod
    def log_info(message: str) -> None:
        Logger.log(message, LogLevel.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        Logger.log(message, LogLevel.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        Logger.log(message, LogLevel.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        Logger.log(message, LogLevel.VERBOSE)


class PreferredMemory:
    """Accepted for compatibility (``InferenceRequest(preferred_memory=...)``); outputs are
    always in host memory."""

    def __init__(self, preferred_memory_type: int = TRITONSERVER_MEMORY_CPU, preferred_device_id: int = 0):
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id
