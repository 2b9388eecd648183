"""The KServe v2 HTTP/REST adapter: aiohttp handlers that parse, call the data plane, render.

Endpoints and bodies: KServe v2 REST protocol ("HTTP/REST" section) and Triton's extensions
(binary tensor data, model configuration). Every non-200 answer, the framework's own 404/405
included, is JSON ``{"error": "..."}`` from one middleware.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus

from aiohttp import web

from gateway.dataplane import DataPlane
from gateway.http_codec import HEADER_LENGTH, parse_infer_request, render_infer_response
from naiad.errors import InvalidInput, NaiadError

logger = logging.getLogger(__name__)

DATAPLANE = web.AppKey("dataplane", DataPlane)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Map :class:`NaiadError` and aiohttp's own HTTP errors to JSON ``{"error": ...}``."""
    try:
        return await handler(request)
    except NaiadError as exc:
        return error_response(exc.status, exc.message)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc.status, exc.reason)
    except Exception:
        logger.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(HTTPStatus.INTERNAL_SERVER_ERROR, "internal server error")


def _dp(request: web.Request) -> DataPlane:
    return request.app[DATAPLANE]


def _model(request: web.Request) -> tuple[str, str]:
    return request.match_info["model"], request.match_info.get("version", "")


def _status(ok: bool) -> web.Response:
    # KServe v2: health endpoints answer 200 when true, and Triton 400 when false.
    return web.Response(status=200 if ok else 400)


async def health_live(request: web.Request) -> web.Response:
    return _status(_dp(request).live())


async def health_ready(request: web.Request) -> web.Response:
    return _status(await _dp(request).ready())


async def server_metadata(request: web.Request) -> web.Response:
    return web.json_response(_dp(request).server_metadata())


async def model_metadata(request: web.Request) -> web.Response:
    return web.json_response(await _dp(request).model_metadata(*_model(request)))


async def model_ready(request: web.Request) -> web.Response:
    return _status(await _dp(request).model_ready(*_model(request)))


async def model_config(request: web.Request) -> web.Response:
    return web.json_response(await _dp(request).model_config(*_model(request)))


def _header_length(request: web.Request) -> int | None:
    raw = request.headers.get(HEADER_LENGTH)
    if raw is None:
        return None
    if not raw.isdigit():
        raise InvalidInput(f"{HEADER_LENGTH} must be a non-negative integer")
    return int(raw)


async def infer(request: web.Request) -> web.Response:
    dp = _dp(request)
    entry, version = await dp.resolve(*_model(request))
    body = await request.read()
    infer_request = parse_infer_request(body, _header_length(request), entry.name, version)
    response = await dp.infer(infer_request)
    payload, headers = render_infer_response(response, infer_request)
    return web.Response(body=payload, headers=headers)


def _routes() -> list[web.RouteDef]:
    model = "/v2/models/{model}"
    versioned = model + "/versions/{version}"
    routes = [
        web.get("/v2/health/live", health_live),
        web.get("/v2/health/ready", health_ready),
        web.get("/v2", server_metadata),
    ]
    for base in (model, versioned):
        routes += [
            web.get(base, model_metadata),
            web.get(base + "/ready", model_ready),
            web.get(base + "/config", model_config),
            web.post(base + "/infer", infer),
        ]
    return routes


def create_app(dataplane: DataPlane, max_body_bytes: int) -> web.Application:
    """The HTTP application; ``max_body_bytes`` caps request bodies (413 above it)."""
    app = web.Application(client_max_size=max_body_bytes, middlewares=[error_middleware])
    app[DATAPLANE] = dataplane
    app.add_routes(_routes())
    return app
