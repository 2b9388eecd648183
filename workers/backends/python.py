"""Triton's Python backend (``backend: "python"``): a ``model.py`` with ``TritonPythonModel``.

The contract is Triton's (python_backend README, "Usage"): the version folder holds
``model.py`` (or the config's ``default_model_filename``) defining ``class TritonPythonModel``
with ``execute(requests)`` and optionally ``initialize(args)`` and ``finalize()``; the model
imports :mod:`triton_python_backend_utils`. Here:

- **Load**: the file is imported under a unique module name with its version folder on
  ``sys.path`` (as Triton's stub does, so sibling modules import), then ``initialize(args)``
  runs with Triton's ``args``, every value a string: ``model_config`` (the completed config,
  :func:`repository_store.completed_config`, as Triton's JSON,
  :func:`repository_store.config_to_triton_json`), ``model_instance_kind``
  (``CPU``/``GPU``), ``model_instance_name`` (``<group>_<index>``, the group named as in
  the completed config: ``<model>`` without instance groups, ``<model>_<n>`` for an unnamed one;
  checked against Triton by ``tests/differential``), ``model_instance_device_id``,
  ``model_repository`` (the model's folder, here in the worker's download cache),
  ``model_version`` and ``model_name``.
- **Execute**: :meth:`PythonBackend.execute_requests` hands the model the *list* of requests
  of one dynamic batch (no merging) and gets one response per request. A response with an
  ``error`` fails that request only, its status from the error's code (Triton's HTTP server:
  INTERNAL 500, NOT_FOUND 404, UNAVAILABLE 503, UNSUPPORTED 501, the others 400). An
  exception, or a result that is not one response per request, fails the whole batch (500).
  ``async def execute`` runs on the backend's own event loop, where ``async_exec`` BLS calls
  are awaited (:mod:`workers.bls`).
- **Outputs**: only the requested ones go back (all of the config's when the client asked for
  none, as Triton's core fills them in; the stub prunes the rest, python_backend
  ``InferResponse::PruneOutputTensors``), so an output the config does not declare never
  reaches a client. Each one sent is checked against its config entry (:func:`output_fault`):
  a datatype or shape (``reshape.shape`` when given, else ``dims``, the request's batch size
  in front when the model batches) that contradicts it, or an output the client named that is
  missing from the response, fails that request (500) with a message naming the output (a
  request naming none gets the declared outputs the model gave, as from Triton). Triton's Python
  backend passes such outputs through unchecked; its framework backends reject them
  ("configuration expects datatype ... for output ..."), which is what a client relies on.
- **Finalize**: :meth:`PythonBackend.close` calls ``finalize()`` when the worker exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import inspect
import json
import logging
import os
import sys
import threading
import traceback
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

import triton_python_backend_utils as pb_utils
from naiad.datatypes import NUMPY_DTYPES, config_to_datatype, datatype_of, datatype_to_config
from naiad.errors import (
    AlreadyExists,
    InferenceFailed,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    NaiadError,
    Unavailable,
    UnknownError,
    Unsupported,
)
from naiad.inference import InferRequest, Tensor
from repository_store import completed_config, config_to_triton_json, default_model_filename

logger = logging.getLogger(__name__)

#: Request parameters Triton's core consumes (scheduling, sequences, the HTTP binary extension)
#: and so never shows a model in ``request.parameters()`` (asked of Triton 2.51).
RESERVED_PARAMETERS = frozenset(
    {"timeout", "priority", "binary_data_output", "sequence_id", "sequence_start", "sequence_end"}
)


def model_frames(exc: BaseException) -> str:
    """The ``At:`` part of Triton's message for an exception ``execute`` raised: from the frame
    that raised out to ``execute``, one line each, ``  <file>(<line>): <function>`` (pybind11's
    ``error_already_set`` text, which the stub sends; the stub's own code is C++). Naiad's
    frames (``pb_utils``, BLS: C++ in Triton) and asyncio's (an ``async def execute``) are
    left out."""
    frames = [(frame.f_code, line) for frame, line in traceback.walk_tb(exc.__traceback__)]
    model = [(code, line) for code, line in reversed(frames) if not code.co_filename.startswith(_NOT_MODEL)]
    lines = "".join(f"  {code.co_filename}({line}): {code.co_name}\n" for code, line in model)
    return f"\n\nAt:\n{lines}" if lines else ""


#: Where frames that are not the model's code come from: asyncio, Naiad's packages, ``pb_utils``.
_NOT_MODEL = (
    os.path.dirname(asyncio.__file__) + os.sep,
    pb_utils.__file__,
    *(str(Path(pb_utils.__file__).parent / package) + os.sep
      for package in ("naiad", "workers", "gateway", "repository_store")),
)  # fmt: skip

#: TritonError code -> the Naiad error a client gets (HTTP status as Triton's HTTP server).
_ERRORS_BY_CODE: dict[int, type[NaiadError]] = {
    pb_utils.TritonError.UNKNOWN: UnknownError,
    pb_utils.TritonError.INTERNAL: InferenceFailed,
    pb_utils.TritonError.NOT_FOUND: ModelNotFound,
    pb_utils.TritonError.INVALID_ARG: InvalidInput,
    pb_utils.TritonError.UNAVAILABLE: Unavailable,
    pb_utils.TritonError.UNSUPPORTED: Unsupported,
    pb_utils.TritonError.ALREADY_EXISTS: AlreadyExists,
    pb_utils.TritonError.CANCELLED: InvalidInput,
}


def naiad_error(error: pb_utils.TritonError) -> NaiadError:
    """The client-facing error of a response's ``TritonError`` (unknown codes: INTERNAL)."""
    return _ERRORS_BY_CODE.get(error.code(), InferenceFailed)(str(error.message()))


def instance_args(version_dir: Path, config: mc.ModelConfig, device: str) -> dict[str, str]:
    """``initialize``'s ``args``, as Triton's stub builds them (python_backend
    ``stub_launcher.cc``). The instance is GPU only when this worker was placed on one
    (``device`` ``cuda`` and ``CUDA_VISIBLE_DEVICES`` naming a device, which is then 0)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    gpu = device == "cuda" and visible not in ("", "-1")
    completed = completed_config(config)
    return {
        "model_config": json.dumps(config_to_triton_json(completed)),
        "model_instance_kind": "GPU" if gpu else "CPU",
        "model_instance_name": f"{completed.instance_group[0].name}_0",
        "model_instance_device_id": "0",
        "model_repository": str(version_dir.parent.absolute()),
        "model_version": version_dir.name,
        "model_name": config.name,
    }


class OutputRule(NamedTuple):
    """What :func:`output_fault` checks of one config output, read out of it once: its
    ``name``, its config ``datatype`` (``TYPE_FP32``) and ``dims`` (``reshape.shape`` when
    given, else ``dims``); for :meth:`fits`, the native numpy ``dtype`` of that datatype
    (None for ``TYPE_STRING``), its v2 name ``v2`` (``FP32``), and ``fixed``, the dims as a
    tuple when none is ``-1`` (else None)."""

    name: str
    datatype: str
    dims: list[int]
    dtype: np.dtype | None
    v2: str
    fixed: tuple[int, ...] | None

    @classmethod
    def of(cls, spec: mc.ModelOutput) -> OutputRule:
        dims = list(spec.reshape.shape) if spec.HasField("reshape") else list(spec.dims)
        datatype = mc.DataType.Name(spec.data_type)
        v2 = config_to_datatype(datatype)
        dtype = None if v2 == "BYTES" or v2 not in NUMPY_DTYPES else NUMPY_DTYPES[v2]
        fixed = None if -1 in dims else tuple(dims)
        return cls(spec.name, datatype, dims, dtype, v2, fixed)

    def fits(self, array: np.ndarray, rows: int | None) -> bool:
        """True when ``array`` is of this output's own native dtype and fixed shape (``rows``
        in front when the model batches): the common case, told in a few tuple and dtype
        compares (0.52 µs against 1.97 for :func:`output_fault`, ``timeit`` on the
        benchmark VM, Debian's CPython 3.11). False
        says nothing: :func:`output_fault` then decides (other byte orders, ``-1`` dims,
        BYTES, faults)."""
        if self.fixed is None or self.dtype is None or array.dtype != self.dtype:
            return False
        return array.shape == (self.fixed if rows is None else (rows, *self.fixed))


def output_fault(rule: OutputRule, array: np.ndarray, rows: int | None) -> str | None:
    """Why ``array`` cannot be the output ``rule`` describes of one request, or None when it fits: the
    config's datatype (``TYPE_STRING`` is BYTES: object or byte-string arrays) and shape
    (``reshape.shape`` when given, else ``dims``; ``-1`` matches any size), with ``rows``
    in front when the model batches (None: it does not)."""
    try:
        provided = datatype_to_config(datatype_of(array.dtype))
    except InvalidInput:
        provided = f"numpy {array.dtype}"
    if provided != rule.datatype:
        return (f"configuration expects datatype {rule.datatype} for output '{rule.name}', model "
                f"provides {provided}")  # fmt: skip
    shape = ([rows] if rows is not None else []) + rule.dims
    got = array.shape
    if len(got) != len(shape) or any(d not in (-1, a) for d, a in zip(shape, got, strict=True)):
        return (f"output '{rule.name}' has shape {list(array.shape)}, its configuration expects "
                f"{shape} (-1: any size)")  # fmt: skip
    return None


def import_model_file(path: Path, model: str) -> ModuleType:
    """Import ``path`` as a fresh module (a unique name, so versions and models never share
    one), with its folder on ``sys.path``. Raises what the import raises."""
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = f"_naiad_model_{model}_{path.parent.name}_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ModelNotReady(f"'{path.name}' of model '{model}' cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


class PythonBackend:
    """One instance of a ``TritonPythonModel``, loaded from ``path`` and initialized."""

    def __init__(self, path: Path, config: mc.ModelConfig, device: str):
        self.config = config
        self.args = instance_args(path.parent, config, device)
        self.instance = self.args["model_instance_name"]
        self.output_names = [spec.name for spec in config.output]
        self.output_rules = {spec.name: OutputRule.of(spec) for spec in config.output}
        self.batching = config.max_batch_size > 0
        self.input_reshape = {s.name: list(s.reshape.shape) for s in config.input if s.HasField("reshape")}
        self.output_dims = {s.name: list(s.dims) for s in config.output if s.HasField("reshape")}
        self._lock = threading.Lock()  # one execute at a time, as Triton's stub
        self._loop: asyncio.AbstractEventLoop | None = None
        self.module = self._import(path)
        self.model = self._create()
        self._closed = False

    def _import(self, path: Path) -> ModuleType:
        try:
            module = import_model_file(path, self.config.name)
        except (Exception, SystemExit) as exc:  # sys.exit() in model.py is its load failing
            raise ModelNotReady(f"failed to load model '{self.config.name}': importing "
                                f"'{path.name}' raised {type(exc).__name__}: {exc}") from exc  # fmt: skip
        if not inspect.isclass(getattr(module, "TritonPythonModel", None)):
            raise ModelNotReady(f"'{path.name}' of model '{self.config.name}' defines no class "
                                "TritonPythonModel")
        if not callable(getattr(module.TritonPythonModel, "execute", None)):
            raise ModelNotReady(f"TritonPythonModel of model '{self.config.name}' has no 'execute' method")
        return module

    def _create(self) -> Any:
        try:
            model = self.module.TritonPythonModel()
            if callable(getattr(model, "initialize", None)):
                model.initialize(dict(self.args))
        except (Exception, SystemExit) as exc:
            raise ModelNotReady(f"failed to load model '{self.config.name}': initialize() raised "
                                f"{type(exc).__name__}: {exc}") from exc  # fmt: skip
        if inspect.iscoroutinefunction(model.execute):
            self._loop = asyncio.new_event_loop()
        logger.info("loaded Python model '%s' (instance %s, %s)", self.config.name, self.instance,
                    self.args["model_instance_kind"])  # fmt: skip
        return model

    def execute_requests(self, requests: Sequence[InferRequest]) -> list[list[Tensor] | NaiadError]:
        """Run one batch of requests through ``execute``: per request its outputs or the
        error its response carried. Raises :class:`InferenceFailed` when ``execute`` raises
        or does not return one ``InferenceResponse`` per request (the whole batch fails)."""
        pb_requests = [self._request(r) for r in requests]
        responses = self._execute(pb_requests)
        triples = zip(responses, pb_requests, requests, strict=True)
        return [self._outputs(response, pb, self._rows(request), bool(request.outputs))
                for response, pb, request in triples]  # fmt: skip

    def _rows(self, request: InferRequest) -> int | None:
        """The request's batch size when the model batches (its inputs' first dimension)."""
        if not self.batching:
            return None
        return request.inputs[0].shape[0] if request.inputs and request.inputs[0].shape else 1

    def _execute(self, requests: list[pb_utils.InferenceRequest]) -> list[pb_utils.InferenceResponse]:
        """``execute``'s responses, checked as Triton 2.51's stub checks them, with its messages
        (asked of real Triton): a list, of one ``InferenceResponse`` per request. Raises
        :class:`InferenceFailed` otherwise, or when ``execute`` raised (the message then ends
        with the model's frames, innermost first, as the stub's pybind11 error text)."""
        with self._lock:
            try:
                if self._loop is not None:
                    responses = self._loop.run_until_complete(self.model.execute(requests))
                else:
                    responses = self.model.execute(requests)
            except BaseException as exc:  # the model's, any class (CancelledError too): not the worker's end
                logger.exception("execute of model '%s' raised", self.config.name)
                raise self._failed(f"{type(exc).__name__}: {exc}{model_frames(exc)}") from exc
        if any(request._sender is not None for request in requests):
            responses = self._sent(responses, requests)
        if type(responses) is not list:
            raise self._failed(f"Expected a list in the execute return, found type '{type(responses)}'.")
        for response in responses:
            if not isinstance(response, pb_utils.InferenceResponse):
                raise self._failed("Expected an 'InferenceResponse' object in the execute function return "
                                   f"list, found type '{type(response)}'.")  # fmt: skip
        if len(responses) != len(requests):
            raise self._failed("Number of InferenceResponse objects do not match the number of "
                               f"InferenceRequest objects. InferenceRequest(s) size is:{len(requests)}, "
                               f"and InferenceResponse(s) size is:{len(responses)}\n")  # fmt: skip
        return responses

    def _sent(self, returned: Any, requests: list[pb_utils.InferenceRequest]) -> Any:
        """The responses of a batch in which ``execute`` used response senders: a request's
        sent response, else its response in the list ``execute`` returned (when it returned
        one per request), else an error response for that request alone (the others keep
        what they were sent)."""
        listed = returned if type(returned) is list and len(returned) == len(requests) else None
        responses = []
        for index, request in enumerate(requests):
            sent = request._sender._response if request._sender is not None else None
            if sent is None and listed is None:
                message = (f"no response was sent or returned for request {index} of {len(requests)} "
                           f"(request id '{request.request_id()}')")  # fmt: skip
                sent = pb_utils.InferenceResponse(error=pb_utils.TritonError(self._failed(message).message))
            responses.append(sent if sent is not None else listed[index])  # type: ignore[index]
        return responses

    def _failed(self, message: str) -> InferenceFailed:
        """Triton's error for a batch whose ``execute`` failed (``<model>_<n>``: the instance)."""
        prefix = f"Failed to process the request(s) for model '{self.instance}', message: "
        return InferenceFailed(prefix + message)

    def _request(self, request: InferRequest) -> pb_utils.InferenceRequest:
        given = request.parameters
        parameters = {k: v for k, v in given.items() if k not in RESERVED_PARAMETERS} if given else None
        return pb_utils.InferenceRequest._received(
            request.id,
            [pb_utils.Tensor(t.name, self._model_input(t)) for t in request.inputs],
            [o.name for o in request.outputs] or list(self.output_names),
            self.config.name,
            request.version,
            int(given.get("timeout") or 0) if given else 0,
            pb_utils._parameters_json(parameters),
        )

    def _model_input(self, tensor: Tensor) -> np.ndarray:
        """A writable array in the shape the model takes (the config's ``reshape``)."""
        array = tensor.data if tensor.data.flags.writeable else tensor.data.copy()
        if tensor.name in self.input_reshape:
            batch = [array.shape[0]] if self.batching else []
            array = array.reshape(batch + self.input_reshape[tensor.name])
        return array

    def _outputs(
        self, response: pb_utils.InferenceResponse, request: pb_utils.InferenceRequest,
        rows: int | None, named: bool = True,
    ) -> list[Tensor] | NaiadError:
        """The requested outputs of ``response``, checked against the config (Triton's
        pruning: the others are dropped), or the error that fails the request. ``named``:
        the client named its outputs, so each must be there; otherwise every declared
        output the model gave goes back (Triton sends what the model produced)."""
        if response.has_error():
            return naiad_error(response.error())
        wanted = request._requested_output_names  # in the client's order; ``execute`` got copies
        tensors = response.output_tensors()
        # The client names no output twice (naiad.validation), so a response naming exactly
        # ``wanted`` has each name once; with a name twice the general path keeps the first.
        names = [tensor.name() for tensor in tensors]
        if names == wanted:
            chosen: Iterable[tuple[str, pb_utils.Tensor]] = zip(wanted, tensors, strict=True)  # as asked
        else:
            given: dict[str, pb_utils.Tensor] = {}
            for tensor in tensors:
                given.setdefault(tensor.name(), tensor)
            missing = [name for name in wanted if name not in given]
            if missing and named:
                return InferenceFailed(self._missing_message(missing, given))
            chosen = [(name, tensor) for name, tensor in given.items() if name in wanted]
        outputs = []
        for name, tensor in chosen:
            array, rule = tensor.as_numpy(), self.output_rules[name]
            if rule.fits(array, rows):
                datatype = rule.v2
            elif (fault := output_fault(rule, array, rows)) is not None:
                return InferenceFailed(f"model '{self.config.name}' returned a bad output: {fault}")
            else:
                datatype = datatype_of(array.dtype)
            array = self._client_output(name, array)
            outputs.append(Tensor(name, datatype, list(array.shape), array))
        return outputs

    def _missing_message(self, missing: list[str], given: dict[str, Any]) -> str:
        names = ", ".join(f"'{n}'" for n in missing)
        message = f"the response of model '{self.config.name}' has no output {names} (requested)"
        undeclared = [f"'{n}'" for n in given if n not in self.output_rules]
        if undeclared:
            message += f"; it has {', '.join(undeclared)}, which the model configuration does not declare"
        return message

    def _client_output(self, name: str, array: np.ndarray) -> np.ndarray:
        """``array`` in the config's ``dims`` when the output has a ``reshape``."""
        dims = self.output_dims.get(name)
        if dims is None or sum(d == -1 for d in dims) > 1:
            return array
        return array.reshape(([array.shape[0]] if self.batching else []) + dims)

    def infer(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        """One request from model-facing arrays (the :class:`Backend` protocol, e.g. for
        warm-up). Raises the response's error, as a :class:`NaiadError`."""
        tensors = [Tensor(n, datatype_of(a.dtype), list(a.shape), a) for n, a in inputs.items()]
        request = InferRequest(self.config.name, int(self.args["model_version"]), tensors)
        result = self.execute_requests([request])[0]
        if isinstance(result, NaiadError):
            raise result
        return {t.name: t.data for t in result if not outputs or t.name in outputs}

    def close(self) -> None:
        """``finalize()`` (once; its errors are logged), then drop the module."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            try:
                if callable(getattr(self.model, "finalize", None)):
                    self.model.finalize()
            except Exception:
                logger.exception("finalize of model '%s' raised", self.config.name)
            if self._loop is not None:
                with contextlib.suppress(Exception):
                    self._loop.close()
        sys.modules.pop(self.module.__name__, None)


def load(version_dir: Path, config: mc.ModelConfig, device: str) -> PythonBackend:
    """Import and initialize ``version_dir/model.py`` (or ``default_model_filename``).
    Raises :class:`ModelNotReady` when the file does not import, defines no usable
    ``TritonPythonModel``, or ``initialize`` raises."""
    return PythonBackend(version_dir / default_model_filename(config), config, device)


def auto_complete_main(argv: Sequence[str]) -> int:
    """``python -m workers.backends.python auto-complete MODEL_PY OUT_JSON``: run the
    model's ``auto_complete_config`` on the config JSON read from stdin (Triton's form) and
    write the completed config's JSON to ``OUT_JSON``. The repository index runs this in a
    child process (:mod:`repository_store.python_autocomplete`). Exit 0, or 1 with the error
    as stderr's last line."""
    if len(argv) != 3 or argv[0] != "auto-complete":
        print("usage: python -m workers.backends.python auto-complete MODEL_PY OUT_JSON", file=sys.stderr)
        return 2
    config = pb_utils.ModelConfig(sys.stdin.read())
    try:
        module = import_model_file(Path(argv[1]), str(config.as_dict().get("name", "model")))
        result = module.TritonPythonModel.auto_complete_config(config)
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if not isinstance(result, pb_utils.ModelConfig):
        print(f"auto_complete_config must return its pb_utils.ModelConfig, got {type(result).__name__}",
              file=sys.stderr)  # fmt: skip
        return 1
    Path(argv[2]).write_text(json.dumps(result.as_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(auto_complete_main(sys.argv[1:]))
