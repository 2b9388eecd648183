"""The floor: a minimal KServe v2 server calling ONNX Runtime in-process, one request at a time.

What any server of an ONNX model must at least spend per request on this machine: aiohttp parses
the request, the handler decodes the tensors (JSON ``data`` or Triton's binary tensor extension,
docs/protocol/extension_binary_data.md), calls ``InferenceSession.run`` *on the event loop* (no
queue, no thread, no batching: requests run strictly one after another) and encodes the answer
(JSON, or binary when the request sets ``binary_data_output`` or an output's ``binary_data``).
Sessions use ONNX Runtime's default options (a run of one row never wakes the intra-op pool,
so its spinning, which Naiad's ONNX backend turns off, costs nothing here). It runs on the
event loop every Naiad process runs on (:func:`naiad.eventloop.run`: uvloop when installed,
with Naiad's garbage-collector tuning), so the floor is the cheapest Python loop, not asyncio's.

Serves every model folder of a Triton-layout repository (``NAME/<newest version>/model.onnx``),
or only ``--models``. Routes: ``GET /v2/health/live|ready``, ``GET /v2/models/{m}[/ready]``,
``POST /v2/models/{m}[/versions/{v}]/infer``. Errors are 400/404 with ``{"error": ...}``.

With ``--grpc-port``, the same loop also serves KServe v2 gRPC ``ModelInfer`` (tensors in
``raw_input_contents``, outputs in ``raw_output_contents``) on a ``grpc.aio`` server, the
library Naiad's gateway uses: what any Python gRPC front of this model must at least spend.

    .venv/bin/python bench/floor_server.py --model-repository .bench/repository --port 8000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
from aiohttp import web
from tritonclient.grpc import service_pb2 as pb

from naiad import eventloop

HEADER_LENGTH = "Inference-Header-Content-Length"
V2_TO_NUMPY = {
    "FP32": np.dtype("float32"),
    "FP64": np.dtype("float64"),
    "FP16": np.dtype("float16"),
    "BOOL": np.dtype("bool"),
    "INT8": np.dtype("int8"),
    "INT16": np.dtype("int16"),
    "INT32": np.dtype("int32"),
    "INT64": np.dtype("int64"),
    "UINT8": np.dtype("uint8"),
    "UINT16": np.dtype("uint16"),
    "UINT32": np.dtype("uint32"),
    "UINT64": np.dtype("uint64"),
}
NUMPY_TO_V2 = {dtype: v2 for v2, dtype in V2_TO_NUMPY.items()}
ORT_TO_V2 = {
    f"tensor({ {'float32': 'float', 'float64': 'double'}.get(d.name, d.name) })": v2
    for v2, d in V2_TO_NUMPY.items()
}
MODELS = web.AppKey("models", dict)


class BadRequest(web.HTTPBadRequest):
    def __init__(self, message: str):
        super().__init__(text=json.dumps({"error": message}), content_type="application/json")


class Model:
    """One ONNX Runtime session and its v2 metadata."""

    def __init__(self, name: str, path: Path):
        options = ort.SessionOptions()
        options.log_severity_level = 3
        self.name, self.session = (
            name,
            ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]),
        )
        self.output_names = [o.name for o in self.session.get_outputs()]

    def metadata(self) -> dict:
        def spec(io) -> dict:
            shape = [d if isinstance(d, int) else -1 for d in io.shape]
            return {"name": io.name, "datatype": ORT_TO_V2[io.type], "shape": shape}

        return {
            "name": self.name,
            "versions": ["1"],
            "platform": "onnxruntime_onnx",
            "inputs": [spec(i) for i in self.session.get_inputs()],
            "outputs": [spec(o) for o in self.session.get_outputs()],
        }


def decode_inputs(header: dict, raw: bytes) -> dict[str, np.ndarray]:
    """Input arrays from the request's JSON ``data`` or its binary section (in input order)."""
    feeds, offset = {}, 0
    for spec in header.get("inputs", []):
        try:
            name, shape, dtype = spec["name"], spec["shape"], V2_TO_NUMPY[spec["datatype"]]
        except KeyError as exc:
            raise BadRequest(f"input without a valid {exc}") from None
        size = (spec.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            array = np.frombuffer(raw, dtype, count=size // dtype.itemsize, offset=offset)
            offset += size
        else:
            array = np.asarray(spec.get("data", []), dtype)
        try:
            feeds[name] = array.reshape(shape)
        except ValueError:
            raise BadRequest(f"input {name}: {array.size} elements do not fit shape {shape}") from None
    return feeds


def encode_outputs(model: str, header: dict, names: list[str], results: list[np.ndarray]) -> web.Response:
    """JSON outputs, or the binary extension's JSON header + raw bytes."""
    binary_default = bool((header.get("parameters") or {}).get("binary_data_output", False))
    asked = {
        o["name"]: (o.get("parameters") or {}).get("binary_data", binary_default)
        for o in header.get("outputs") or []
    }
    outputs, chunks = [], []
    for name, array in zip(names, results, strict=True):
        entry = {"name": name, "datatype": NUMPY_TO_V2[array.dtype], "shape": list(array.shape)}
        if asked.get(name, binary_default):
            data = np.ascontiguousarray(array).tobytes()
            entry["parameters"] = {"binary_data_size": len(data)}
            chunks.append(data)
        else:
            entry["data"] = array.reshape(-1).tolist()
        outputs.append(entry)
    body = json.dumps(
        {"model_name": model, "model_version": "1", "outputs": outputs}, separators=(",", ":")
    ).encode()
    if not chunks:
        return web.Response(body=body, content_type="application/json")
    headers = {HEADER_LENGTH: str(len(body))}
    return web.Response(
        body=body + b"".join(chunks), headers=headers, content_type="application/octet-stream"
    )


def model_for(request: web.Request) -> Model:
    model = request.app[MODELS].get(request.match_info["model"])
    if model is None:
        raise web.HTTPNotFound(text=json.dumps({"error": "unknown model"}), content_type="application/json")
    return model


async def infer(request: web.Request) -> web.Response:
    model = model_for(request)
    body = await request.read()
    length = request.headers.get(HEADER_LENGTH)
    split = int(length) if length is not None else len(body)
    try:
        header = json.loads(body[:split])
    except ValueError:
        raise BadRequest("the request header is not JSON") from None
    feeds = decode_inputs(header, body[split:])
    names = [o["name"] for o in header.get("outputs") or []] or model.output_names
    try:
        results = model.session.run(names, feeds)
    except Exception as exc:  # noqa: BLE001 - ONNX Runtime's errors are the client's input here
        raise BadRequest(f"inference failed: {exc}") from None
    return encode_outputs(model.name, header, names, results)


async def metadata(request: web.Request) -> web.Response:
    return web.json_response(model_for(request).metadata())


async def model_ready(request: web.Request) -> web.Response:
    model_for(request)
    return web.Response()


async def health(_request: web.Request) -> web.Response:
    return web.Response()


def load_models(repository: Path, only: list[str] | None) -> dict[str, Model]:
    """``NAME/<newest numeric version>/model.onnx`` for each model folder (or only ``only``)."""
    models = {}
    for folder in sorted(p for p in repository.iterdir() if p.is_dir()):
        if only and folder.name not in only:
            continue
        versions = sorted((int(v.name) for v in folder.iterdir() if v.name.isdigit()), reverse=True)
        path = next(
            (folder / str(v) / "model.onnx" for v in versions if (folder / str(v) / "model.onnx").exists()),
            None,
        )
        if path is not None:
            models[folder.name] = Model(folder.name, path)
    if not models:
        raise SystemExit(f"no ONNX model under {repository}")
    return models


def create_app(models: dict[str, Model]) -> web.Application:
    app = web.Application(client_max_size=64 * 2**20)
    app[MODELS] = models
    app.router.add_get("/v2/health/live", health)
    app.router.add_get("/v2/health/ready", health)
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        app.router.add_get(prefix, metadata)
        app.router.add_get(prefix + "/ready", model_ready)
        app.router.add_post(prefix + "/infer", infer)
    return app


async def model_infer(models: dict[str, Model], request, context):
    """``ModelInfer``: raw input tensors in, raw output tensors out (NOT_FOUND for an unknown
    model, INVALID_ARGUMENT for inputs that do not fit or a failing run)."""
    model = models.get(request.model_name)
    if model is None:
        await context.abort(grpc.StatusCode.NOT_FOUND, "unknown model")
    try:
        feeds = {spec.name: np.frombuffer(raw, V2_TO_NUMPY[spec.datatype]).reshape(list(spec.shape))
                 for spec, raw in zip(request.inputs, request.raw_input_contents, strict=True)}  # fmt: skip
        names = [o.name for o in request.outputs] or model.output_names
        results = model.session.run(names, feeds)
    except Exception as exc:  # noqa: BLE001 - the client's input is at fault here
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"inference failed: {exc}")
    response = pb.ModelInferResponse(model_name=model.name, model_version="1", id=request.id)
    for name, array in zip(names, results, strict=True):
        response.outputs.add(name=name, datatype=NUMPY_TO_V2[array.dtype], shape=array.shape)
        response.raw_output_contents.append(np.ascontiguousarray(array).tobytes())
    return response


def grpc_server(models: dict[str, Model], host: str, port: int):
    """A ``grpc.aio`` server with ``ModelInfer`` (:func:`model_infer`) on ``host:port``, not started."""
    async def handler(request, context):
        return await model_infer(models, request, context)

    method = grpc.unary_unary_rpc_method_handler(
        handler, request_deserializer=pb.ModelInferRequest.FromString,
        response_serializer=pb.ModelInferResponse.SerializeToString,
    )  # fmt: skip
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {"ModelInfer": method}),)
    )
    server.add_insecure_port(f"{host}:{port}")
    return server


async def serve(models: dict[str, Model], host: str, port: int, grpc_port: int | None) -> None:
    """The HTTP app on ``port`` and, with ``grpc_port``, ``ModelInfer`` there, until SIGINT
    or SIGTERM; then both stop (in-flight calls get no grace: a benchmark's server)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    runner = web.AppRunner(create_app(models), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    server = grpc_server(models, host, grpc_port) if grpc_port is not None else None
    if server is not None:
        await server.start()
    try:
        await stop.wait()
    finally:
        if server is not None:
            await server.stop(None)
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-repository", type=Path, required=True)
    parser.add_argument("--models", nargs="*", help="serve only these")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, help="also serve gRPC ModelInfer here")
    args = parser.parse_args()
    models = load_models(args.model_repository, args.models)
    eventloop.run(serve(models, args.host, args.port, args.grpc_port))


if __name__ == "__main__":
    main()
