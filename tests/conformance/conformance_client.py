"""The conformance suite's repository, its one ``naiad serve`` and one adapter per client.

The repository (built once, in a tmp dir) holds the example models (``digits``,
``silero_vad``: ``examples/build_repository.py``) plus small ONNX models made here with
``onnx.helper``:

- ``reshape_scalar``: ``max_batch_size 8``, input ``x`` INT64 ``dims [1]`` with
  ``reshape { shape: [] }`` over a graph whose input is 1-D ``[batch]`` (``y = x + 1``), and
  the output the same way: the client sends ``[b, 1]`` and gets ``[b, 1]``.
- ``versioned``: two versions under ``version_policy { all {} }``; version 1 adds 1, version 2
  adds 2 (FP32, ``max_batch_size 0``, ``dims [-1, -1]`` so hostile shapes reach the codecs).
- ``spare``: an identity model nothing infers on, for unload / load (no worker to drain).

The server runs with ``--model-control-mode explicit --load-model '*'`` so the repository
extension's load and unload work. One server serves the whole suite (``conftest.py``).

:class:`Client` hides what differs between ``tritonclient.http``, ``tritonclient.http.aio``,
``tritonclient.grpc`` and ``tritonclient.grpc.aio`` (sync or async, dicts or messages), so a
test body calls ``client("get_model_metadata", "digits")`` the same way for all four.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
from typing import Any

import numpy as np
import onnx
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from google.protobuf import json_format
from naiad_harness import NaiadServer
from onnx import helper

#: Each client call is bounded (cold starts included).
CALL_TIMEOUT_S = 60

RESHAPE_SCALAR_CONFIG = """\
name: "reshape_scalar"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_INT64 dims: [ 1 ] reshape: { shape: [ ] } } ]
output [ { name: "y" data_type: TYPE_INT64 dims: [ 1 ] reshape: { shape: [ ] } } ]
"""

VERSIONED_CONFIG = """\
name: "versioned"
platform: "onnxruntime_onnx"
max_batch_size: 0
version_policy: { all: {} }
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, -1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ -1, -1 ] } ]
"""

SPARE_CONFIG = """\
name: "spare"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


def add_model(elem: int, shape: list, value: float | int) -> onnx.ModelProto:
    """``y = x + value`` over inputs of ``shape`` (symbolic names allowed)."""
    numpy_type = helper.tensor_dtype_to_np_dtype(elem)
    constant = helper.make_tensor("c", elem, [], np.array([value], numpy_type).tolist())
    x = helper.make_tensor_value_info("x", elem, shape)
    y = helper.make_tensor_value_info("y", elem, shape)
    graph = helper.make_graph([helper.make_node("Add", ["x", "c"], ["y"])], "add", [x], [y], [constant])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def write_model(root: pathlib.Path, name: str, config: str, versions: dict[int, onnx.ModelProto]) -> None:
    folder = root / name
    for version, model in versions.items():
        (folder / str(version)).mkdir(parents=True)
        onnx.save(model, str(folder / str(version) / "model.onnx"))
    (folder / "config.pbtxt").write_text(config)




# --- one adapter for four clients -----------------------------------------------------------

CLIENTS = {
    "http": (httpclient, False),
    "http_aio": (httpaio, True),
    "grpc": (grpcclient, False),
    "grpc_aio": (grpcaio, True),
}


def _plain(message: Any) -> Any:
    """A protobuf message as the dict ``tritonclient.http`` returns for the same call."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


class Client:
    """Calls one tritonclient flavour synchronously; results normalised to HTTP's dicts."""

    def __init__(self, kind: str, server: NaiadServer):
        self.kind = kind
        self.module, self.aio = CLIENTS[kind]
        self.grpc = kind.startswith("grpc")
        self.url = server.grpc_url if self.grpc else server.url

    def __repr__(self) -> str:
        return f"Client({self.kind})"

    def new(self) -> Any:
        return self.module.InferenceServerClient(self.url)

    def run(self, body: Any) -> Any:
        """``body(client)`` (a coroutine function for the aio clients) on a fresh client."""
        if not self.aio:
            client = self.new()
            try:
                return body(client)
            finally:
                client.close()

        async def main() -> Any:
            client = self.new()
            try:
                return await body(client)
            finally:
                await client.close()

        return asyncio.run(asyncio.wait_for(main(), CALL_TIMEOUT_S))

    def __call__(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``client.method(*args, **kwargs)``; messages come back as HTTP-style dicts."""
        if self.aio:

            async def body(client: Any) -> Any:
                return await getattr(client, method)(*args, **kwargs)

        else:

            def body(client: Any) -> Any:
                return getattr(client, method)(*args, **kwargs)

        result = self.run(body)
        if self.grpc and hasattr(result, "DESCRIPTOR"):
            result = _plain(result)
            if method == "get_model_config":
                result = result["config"]
            elif method == "get_model_repository_index":
                result = result.get("models", [])
        return result

    # --- inference ------------------------------------------------------------------------

    def input(self, name: str, array: np.ndarray, datatype: str, binary: bool = True) -> Any:
        tensor = self.module.InferInput(name, list(array.shape), datatype)
        if self.grpc:
            tensor.set_data_from_numpy(array)
        else:
            tensor.set_data_from_numpy(array, binary_data=binary)
        return tensor

    def output(self, name: str, class_count: int = 0, binary: bool = True) -> Any:
        if self.grpc:
            return self.module.InferRequestedOutput(name, class_count=class_count)
        return self.module.InferRequestedOutput(name, binary_data=binary, class_count=class_count)

    def infer(self, model: str, inputs: dict[str, tuple[np.ndarray, str]], outputs=(), binary=True, **kw):
        """``(outputs as numpy by name, response header as a dict)`` of one infer call."""
        tensors = [self.input(name, array, dt, binary) for name, (array, dt) in inputs.items()]
        wanted = [self.output(*o, binary=binary) if isinstance(o, tuple) else self.output(o, binary=binary)
                  for o in outputs] or None  # fmt: skip
        result = self("infer", model, tensors, outputs=wanted, **kw)
        return unpack(result, self.grpc)


def unpack(result: Any, is_grpc: bool) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    response = _plain(result.get_response()) if is_grpc else result.get_response()
    arrays = {o["name"]: result.as_numpy(o["name"]) for o in response.get("outputs", [])}
    return arrays, response




def digits_row(n: int = 1) -> dict[str, tuple[np.ndarray, str]]:
    return {"input": (np.ones((n, 64), np.float32), "FP32")}


def json_dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


#: gRPC status code names and the HTTP status of the same error (naiad/errors.py's table).
GRPC_TO_HTTP = {
    "INVALID_ARGUMENT": 400,
    "NOT_FOUND": 404,
    "UNIMPLEMENTED": 501,
    "UNAVAILABLE": 503,
    "INTERNAL": 500,
    "DEADLINE_EXCEEDED": 504,
}


def http_status(exc: Exception) -> int:
    """The HTTP status of a tritonclient error (a gRPC code mapped by :data:`GRPC_TO_HTTP`)."""
    status = str(exc.status())
    if status.startswith("StatusCode."):
        return GRPC_TO_HTTP[status.removeprefix("StatusCode.")]
    return int(status)


def ints(values: Any) -> list[int]:
    """Shapes and counts as ints (protobuf JSON writes int64 as strings)."""
    return [int(v) for v in values]
