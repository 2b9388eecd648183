"""The KServe v2 HTTP/REST adapter: aiohttp handlers that parse, call the data plane, render.

Endpoints and bodies: KServe v2 REST protocol ("HTTP/REST" section) and Triton's extensions
(binary tensor data, model configuration, model repository). Every non-200 answer, the
framework's own 404/405 included, is JSON ``{"error": "..."}`` from one middleware. Request
bodies may be gzip or deflate (:mod:`gateway.http_encoding`; serve the app with
:data:`RUNNER_OPTIONS` so aiohttp leaves them to us) and infer responses honour
``Accept-Encoding``. The REST surface is described by ``gateway/openapi.yaml`` (also
``docs/openapi.yaml``), served as JSON at ``GET /v2/openapi.json``. ``GET /`` is a read-only
HTML status page (:mod:`gateway.status_page`).
"""

from __future__ import annotations

import asyncio
import importlib.resources
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from http import HTTPStatus
from typing import Any, TypeVar

import yaml
from aiohttp import hdrs, web
from redis.exceptions import RedisError

from gateway.access import HTTP_GROUPS, AccessPolicy
from gateway.dataplane import DataPlane
from gateway.http_codec import HEADER_LENGTH, parse_infer_request, parse_raw_request, render_infer_response
from gateway.http_encoding import COMPRESS_MIN_BYTES, accepted_coding, compress, decode_body
from gateway.http_limits import RESERVATION, HttpLimits, limits_middleware, read_body_limited
from gateway.shared_memory import unsupported_cuda
from gateway.status import status_snapshot
from gateway.status_page import render_page
from naiad import rollout
from naiad.errors import InvalidInput, Unavailable, as_naiad_error

logger = logging.getLogger(__name__)

DATAPLANE = web.AppKey("dataplane", DataPlane)
MAX_BODY_BYTES = web.AppKey("max_body_bytes", int)
OPENAPI_JSON = web.AppKey("openapi_json", bytes)
LIMITS = web.AppKey("limits", HttpLimits)

#: ``web.AppRunner`` options the HTTP app needs: request bodies reach the handlers as sent,
#: so :func:`read_body` decodes them with its own size bound and error answers; a client
#: that disconnects cancels its handler, which withdraws its queued request
#: (:meth:`naiad.queue_client.QueueDispatcher.infer`).
RUNNER_OPTIONS: dict[str, Any] = {"auto_decompress": False, "handler_cancellation": True}
#: Bodies at least this large are decoded or compressed in a thread, off the event loop.
THREAD_BYTES = 1024 * 1024

T = TypeVar("T")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_json(message: str) -> str:
    """The body of every non-200 answer: ``{"error": message}``."""
    return json.dumps({"error": message})


def error_response(status: int, message: str) -> web.Response:
    return web.json_response(text=error_json(message), status=status)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Map :class:`NaiadError` and aiohttp's own HTTP errors to JSON ``{"error": ...}``."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc.status, exc.reason)
    except Exception as exc:
        status, message, headers, close = error_answer(exc, request.method, request.path)
        response = error_response(status, message)
        response.headers.update(headers)
        if close:  # a body left unread
            response.force_close()
        return response


def error_answer(exc: Exception, method: str, path: str) -> tuple[int, str, dict[str, str], bool]:
    """The answer to ``exc`` raised by a handler: ``(status, message, extra headers, close
    the connection after it)``; an unexpected error is logged with its traceback and is a
    generic 500 (:func:`naiad.errors.as_naiad_error`)."""
    known = as_naiad_error(exc)
    if known is None:
        logger.error("unhandled error on %s %s", method, path, exc_info=exc)
        return HTTPStatus.INTERNAL_SERVER_ERROR, "internal server error", {}, False
    return known.status, known.message, dict(getattr(known, "headers", {})), bool(
        getattr(known, "close_connection", False)
    )


def access_middleware(policy: AccessPolicy) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Checks each request against ``policy`` by the API group of the route it matched
    (:data:`gateway.access.HTTP_GROUPS`); runs inside :func:`error_middleware`, so a refusal
    is a JSON 401. Unmatched routes pass (their 404/405 comes next)."""

    @web.middleware
    async def check_access(request: web.Request, handler: Handler) -> web.StreamResponse:
        route = request.match_info.route
        resource = route.resource if request.match_info.http_exception is None else None
        group = HTTP_GROUPS.get(resource.canonical) if resource is not None else None
        policy.check(group, request.headers)
        return await handler(request)

    return check_access


def _dp(request: web.Request) -> DataPlane:
    return request.app[DATAPLANE]


def _model(request: web.Request) -> tuple[str, str]:
    return request.match_info["model"], request.match_info.get("version", "")


def _status(ok: bool) -> web.Response:
    # KServe v2: health endpoints answer 200 when true, and Triton 400 when false (Triton with
    # an empty body; here a JSON error, as every non-200 answer is).
    return web.Response(status=200) if ok else error_response(HTTPStatus.BAD_REQUEST, "not ready")


async def health_live(request: web.Request) -> web.Response:
    return _status(_dp(request).live())


async def health_ready(request: web.Request) -> web.Response:
    return _status(await _dp(request).ready())


async def server_metadata(request: web.Request) -> web.Response:
    return web.json_response(_dp(request).server_metadata())


async def model_metadata(request: web.Request) -> web.Response:
    return web.json_response(await _dp(request).model_metadata(*_model(request)))


async def model_ready(request: web.Request) -> web.Response:
    reason = await _dp(request).model_readiness(*_model(request))  # Triton: 400 with no reason
    return web.Response(status=200) if not reason else error_response(HTTPStatus.BAD_REQUEST, reason)


async def model_config(request: web.Request) -> web.Response:
    return web.json_response(await _dp(request).model_config_json(*_model(request)))


async def model_statistics(request: web.Request) -> web.Response:
    """Triton's statistics extension; ``GET /v2/models/stats`` covers every model."""
    name, version = request.match_info.get("model", ""), request.match_info.get("version", "")
    return web.json_response(await _dp(request).model_statistics(name, version))


def _header_length(headers: Mapping[str, str]) -> int | None:
    raw = headers.get(HEADER_LENGTH)
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 18):
        raise InvalidInput(f"{HEADER_LENGTH} must be a non-negative integer")
    return int(raw)


async def _off_loop(size: int, func: Callable[..., T], *args: Any) -> T:
    """``func(*args)``, in a worker thread when ``size`` (bytes) is large enough to stall
    the event loop (JSON parsing, (de)compression), inline otherwise."""
    return await asyncio.to_thread(func, *args) if size >= THREAD_BYTES else func(*args)


async def read_body(request: web.Request) -> bytes:
    """The request body with its ``Content-Encoding`` (gzip, deflate) undone; 413 when the
    sent or the decoded body is over the limit, 501 for another coding; read within the
    app's :class:`HttpLimits` (timeouts, shared byte budget) when it has them."""
    limits = request.app.get(LIMITS)
    body = await (read_body_limited(request, limits) if limits else request.read())
    coding = request.headers.get(hdrs.CONTENT_ENCODING)
    if not coding:
        return body
    decoded = await _off_loop(len(body), decode_body, body, coding, request.app[MAX_BODY_BYTES])
    if limits is not None and len(decoded) > len(body):  # the inflated copy is held too
        request[RESERVATION].add(len(decoded))
    return decoded


async def infer(request: web.Request) -> web.Response:
    """One inference, counted against the gateway's in-flight bound from its first byte."""
    with _dp(request).admit():
        return await _infer(request)


async def _infer(request: web.Request) -> web.Response:
    payload, headers = await answer_infer(
        _dp(request), *_model(request), request.headers, lambda: read_body(request)
    )
    return web.Response(body=payload, headers=headers)


async def answer_infer(
    dp: DataPlane, name: str, version: str, headers: Mapping[str, str], read: Callable[[], Awaitable[bytes]]
) -> tuple[bytes, dict[str, str]]:
    """One inference over HTTP, whatever parsed it (aiohttp, or :mod:`gateway.http_fast`):
    the model and version from the path, the request's ``headers`` (case-insensitive), and
    ``read`` giving its body with any ``Content-Encoding`` undone, read after the model is
    resolved. Returns the answer's body and headers (binary tensor extension; compressed
    for an ``Accept-Encoding`` the server supports when large enough). Raises the data
    plane's :class:`NaiadError` subclasses."""
    entry, version_number = await dp.route(name, version, headers.get(rollout.ROUTE_HEADER))
    body = await read()
    header_length = _header_length(headers)
    if header_length == 0 and entry.config is not None:  # a Raw Binary Request
        infer_request = parse_raw_request(body, entry.config, entry.name, version_number)
    else:
        infer_request = await _off_loop(
            len(body), parse_infer_request, body, header_length, entry.name, version_number, dp.shared_memory
        )
    response = await dp.infer(infer_request, entry)
    payload, answer_headers = render_infer_response(response, infer_request)
    # Inference-Header-Content-Length keeps counting uncompressed bytes: tritonclient
    # decompresses first, then splits (tritonclient/http/_infer_result.py).
    accept = headers.get(hdrs.ACCEPT_ENCODING)
    coding = accepted_coding(accept) if len(payload) >= COMPRESS_MIN_BYTES else None
    if coding is not None:
        payload = await _off_loop(len(payload), compress, payload, coding)
        answer_headers = {**answer_headers, hdrs.CONTENT_ENCODING: coding}
    if accept is not None:
        answer_headers = {**answer_headers, hdrs.VARY: hdrs.ACCEPT_ENCODING}
    return payload, answer_headers


async def _json_object(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object; an empty body is ``{}``."""
    body = await read_body(request)
    if not body.strip():
        return {}
    try:
        value = json.loads(body)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, a 5,000-digit number
        raise InvalidInput(f"request body is not valid JSON: {exc}") from None
    except RecursionError:  # e.g. 100,000 nested arrays
        raise InvalidInput("request body JSON is nested too deeply") from None
    if not isinstance(value, dict):
        raise InvalidInput("request body must be a JSON object")
    return value


def _parameters(body: dict[str, Any]) -> dict[str, Any]:
    parameters = body.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidInput("'parameters' must be a JSON object")
    return parameters


async def repository_index(request: web.Request) -> web.Response:
    """Triton's model repository extension: ``POST /v2/repository/index``."""
    ready = (await _json_object(request)).get("ready", False)
    if not isinstance(ready, bool):
        raise InvalidInput("'ready' must be a boolean")
    rows = await _dp(request).repository_index(ready)
    # Triton writes "reason" only when there is one.
    return web.json_response([{k: v for k, v in row.items() if k != "reason" or v} for row in rows])


async def repository_load(request: web.Request) -> web.Response:
    parameters = _parameters(await _json_object(request))
    await _dp(request).load_model(request.match_info["model"], parameters)
    return web.Response(status=200)


async def repository_unload(request: web.Request) -> web.Response:
    parameters = _parameters(await _json_object(request))
    await _dp(request).unload_model(request.match_info["model"], parameters)
    return web.Response(status=200)


def _register_field(body: dict[str, Any], name: str, required: bool) -> int:
    if name not in body:
        if required:
            raise InvalidInput(f"Shared memory register request has no '{name}' field")
        return 0
    value = body[name]
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
        raise InvalidInput(f"Shared memory register request: '{name}' must be a non-negative integer")
    return value


async def shm_register(request: web.Request) -> web.Response:
    """``POST /v2/systemsharedmemory/region/{region}/register`` with ``{key, offset,
    byte_size}`` (Triton's shared memory extension)."""
    body = await _json_object(request)
    if "key" not in body:
        raise InvalidInput("Shared memory register request has no 'key' field")
    if not isinstance(body["key"], str):
        raise InvalidInput("Shared memory register request: 'key' must be a string")
    byte_size = _register_field(body, "byte_size", required=True)
    offset = _register_field(body, "offset", required=False)
    await _dp(request).register_shared_memory(request.match_info["region"], body["key"], offset, byte_size)
    return web.Response(status=200)


async def shm_unregister(request: web.Request) -> web.Response:
    """``POST /v2/systemsharedmemory[/region/{region}]/unregister``: one region, or all."""
    await _dp(request).unregister_shared_memory(request.match_info.get("region", ""))
    return web.Response(status=200)


async def shm_status(request: web.Request) -> web.Response:
    """``GET /v2/systemsharedmemory[/region/{region}]/status``: ``[{name, key, offset, byte_size}]``."""
    return web.json_response(_dp(request).shared_memory.status(request.match_info.get("region", "")))


async def cuda_shm(request: web.Request) -> web.Response:
    """Every ``/v2/cudasharedmemory/...`` endpoint: 501, CUDA shared memory is not supported."""
    raise unsupported_cuda()


async def status_page(request: web.Request) -> web.Response:
    """``GET /``: the read-only HTML status page (:mod:`gateway.status_page`)."""
    try:
        await _dp(request).flush_statistics()
        snapshot = await status_snapshot(_dp(request).redis)
    except RedisError as exc:
        raise Unavailable(f"status unavailable: {exc}") from None
    return web.Response(text=render_page(snapshot), content_type="text/html")


async def openapi(request: web.Request) -> web.Response:
    return web.Response(body=request.app[OPENAPI_JSON], content_type="application/json")


def load_openapi() -> dict[str, Any]:
    """The OpenAPI document of this app (``gateway/openapi.yaml``, shipped in the package)."""
    text = importlib.resources.files("gateway").joinpath("openapi.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


def _routes() -> list[web.RouteDef]:
    model = "/v2/models/{model}"
    versioned = model + "/versions/{version}"
    routes = [
        web.get("/v2/health/live", health_live),
        web.get("/v2/health/ready", health_ready),
        web.get("/v2", server_metadata),
        web.get("/v2/openapi.json", openapi),
        web.get("/", status_page),
        # Before "/v2/models/{model}", which would take "stats" for a model name.
        web.get("/v2/models/stats", model_statistics),
        web.post("/v2/repository/index", repository_index),
        web.post("/v2/repository/models/{model}/load", repository_load),
        web.post("/v2/repository/models/{model}/unload", repository_unload),
    ]
    shared_memory = (
        ("/v2/systemsharedmemory", shm_status, shm_register, shm_unregister),
        ("/v2/cudasharedmemory", cuda_shm, cuda_shm, cuda_shm),  # all 501
    )
    for prefix, status, register, unregister in shared_memory:
        region = prefix + "/region/{region}"
        routes += [
            web.get(prefix + "/status", status),
            web.get(region + "/status", status),
            web.post(region + "/register", register),
            web.post(prefix + "/unregister", unregister),
            web.post(region + "/unregister", unregister),
        ]
    for base in (model, versioned):
        routes += [  # infer first: aiohttp tries the routes under /v2/models in this order
            web.post(base + "/infer", infer),
            web.get(base, model_metadata),
            web.get(base + "/ready", model_ready),
            web.get(base + "/config", model_config),
            web.get(base + "/stats", model_statistics),
        ]
    return routes


def create_app(
    dataplane: DataPlane, max_body_bytes: int, access: AccessPolicy | None = None,
    limits: HttpLimits | None = None,
) -> web.Application:
    """The HTTP application; ``max_body_bytes`` caps request bodies (413 above it);
    ``access`` restricts API groups (``--http-restricted-api``); ``limits``: read timeouts
    and the shared byte budget (serve it with :class:`gateway.http_limits.LimitedAppRunner`)."""
    middlewares = [error_middleware, access_middleware(access)] if access else [error_middleware]
    if limits is not None:
        middlewares.insert(0, limits_middleware(limits))
    app = web.Application(client_max_size=max_body_bytes, middlewares=middlewares)
    if limits is not None:
        app[LIMITS] = limits
    app[DATAPLANE] = dataplane
    app[MAX_BODY_BYTES] = max_body_bytes
    app[OPENAPI_JSON] = json.dumps(load_openapi()).encode()
    app.add_routes(_routes())
    return app
