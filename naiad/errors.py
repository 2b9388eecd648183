"""One error hierarchy for the whole server, each error carrying its HTTP status.

Transports map these once: the aiohttp middleware answers ``{"error": message}`` with
``status``; the gRPC interceptor uses :data:`GRPC_CODES` (the table in Triton's
``src/grpc/grpc_utils.cc``, which follows the HTTP⇄gRPC mapping of
https://github.com/grpc/grpc/blob/master/doc/http-grpc-status-mapping.md).
"""

from __future__ import annotations

from http import HTTPStatus


class NaiadError(Exception):
    """Base error: ``status`` is the HTTP status the client gets, the message its ``error``."""

    status: HTTPStatus = HTTPStatus.INTERNAL_SERVER_ERROR

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidInput(NaiadError):
    """The request is malformed or does not match the model's configuration (400)."""

    status = HTTPStatus.BAD_REQUEST


class AlreadyExists(InvalidInput):
    """A name that is taken (a shared memory region registered twice), or a Python model's
    ``TritonError.ALREADY_EXISTS``: 400, gRPC ALREADY_EXISTS (as Triton)."""


class UnknownError(InvalidInput):
    """A Python model's ``TritonError.UNKNOWN``: 400, gRPC UNKNOWN (Triton)."""


class ModelNotFound(NaiadError):
    """No such model, or no such version of it (404)."""

    status = HTTPStatus.NOT_FOUND


class RegionNotFound(NaiadError):
    """No shared memory region of that name is registered (404; NOT_FOUND over gRPC, as
    Triton answers)."""

    status = HTTPStatus.NOT_FOUND


class ModelNotReady(NaiadError):
    """The model exists but is not loadable: a broken config or missing model file (400,
    as Triton answers a request to an unavailable model)."""

    status = HTTPStatus.BAD_REQUEST


class Unavailable(NaiadError):
    """A dependency (Redis, the object store, the worker pool) cannot serve now (503)."""

    status = HTTPStatus.SERVICE_UNAVAILABLE


class Overloaded(Unavailable):
    """The model's queue is full, or the gateway carries as many requests as it may (503
    with ``Retry-After: retry_after_s`` over HTTP, UNAVAILABLE over gRPC): retry later."""

    retry_after_s = 1

    @property
    def headers(self) -> dict[str, str]:
        """HTTP headers of the answer (the HTTP adapter adds an error's ``headers``)."""
        return {"Retry-After": str(self.retry_after_s)}


class DeadlineExceeded(NaiadError):
    """The request's timeout passed before an answer came: 503 over HTTP (the request may
    be retried), DEADLINE_EXCEEDED over gRPC."""

    status = HTTPStatus.SERVICE_UNAVAILABLE


class QueueTimeout(Unavailable):
    """The request waited in its model's queue longer than its queue policy's timeout and
    the policy's ``timeout_action`` is REJECT: Triton answers UNAVAILABLE "Request timeout
    expired" (503 over HTTP; core ``dynamic_batch_scheduler.cc``), counted as REJECTED."""


class Unsupported(NaiadError):
    """A valid protocol feature this server does not implement (501)."""

    status = HTTPStatus.NOT_IMPLEMENTED


class PayloadTooLarge(NaiadError):
    """The request body, after undoing its ``Content-Encoding``, is over the server's limit
    (413; RESOURCE_EXHAUSTED over gRPC)."""

    status = HTTPStatus.REQUEST_ENTITY_TOO_LARGE


class RequestTimeout(NaiadError):
    """The request's body (or gRPC message) did not arrive within the server's read
    timeouts (408; DEADLINE_EXCEEDED over gRPC); the connection is closed after the answer."""

    status = HTTPStatus.REQUEST_TIMEOUT


class InferenceFailed(NaiadError):
    """The backend raised while running the model (500); the message is the backend's."""

    status = HTTPStatus.INTERNAL_SERVER_ERROR


class RepositoryError(NaiadError):
    """The model repository is unreachable or holds something unusable (503)."""

    status = HTTPStatus.SERVICE_UNAVAILABLE


class ConfigError(InvalidInput):
    """A ``config.pbtxt`` that does not parse or is inconsistent (400)."""


class Unauthenticated(NaiadError):
    """A restricted API without the right credentials (401; UNAUTHENTICATED over gRPC).
    ``headers`` are extra HTTP response headers (``WWW-Authenticate`` for bearer tokens).
    The message names the header the API needs, never a value."""

    status = HTTPStatus.UNAUTHORIZED

    def __init__(self, message: str, bearer: bool = False):
        super().__init__(message)
        self.headers = {"WWW-Authenticate": 'Bearer realm="naiad"'} if bearer else {}


class ModelControlDisabled(NaiadError):
    """A load or unload request while the model control mode is not ``explicit`` (400;
    UNAVAILABLE over gRPC, as Triton answers)."""

    status = HTTPStatus.BAD_REQUEST


#: gRPC status code NAME per error class (``grpc.StatusCode[name]`` in the adapter; no grpc
#: import here). A class missing here takes its nearest listed base; ``NaiadError`` is INTERNAL.
#: Triton answers UNAVAILABLE for a model that is not ready.
GRPC_CODES: dict[type[NaiadError], str] = {
    NaiadError: "INTERNAL",
    InvalidInput: "INVALID_ARGUMENT",
    ConfigError: "INVALID_ARGUMENT",
    AlreadyExists: "ALREADY_EXISTS",
    UnknownError: "UNKNOWN",
    ModelNotFound: "NOT_FOUND",
    RegionNotFound: "NOT_FOUND",
    ModelNotReady: "UNAVAILABLE",
    Unavailable: "UNAVAILABLE",
    Overloaded: "UNAVAILABLE",
    QueueTimeout: "UNAVAILABLE",
    DeadlineExceeded: "DEADLINE_EXCEEDED",
    Unsupported: "UNIMPLEMENTED",
    PayloadTooLarge: "RESOURCE_EXHAUSTED",
    RequestTimeout: "DEADLINE_EXCEEDED",
    InferenceFailed: "INTERNAL",
    RepositoryError: "UNAVAILABLE",
    ModelControlDisabled: "UNAVAILABLE",
    Unauthenticated: "UNAUTHENTICATED",
}


ERRORS_BY_NAME: dict[str, type[NaiadError]] = {
    cls.__name__: cls
    for cls in (
        NaiadError,
        InvalidInput,
        AlreadyExists,
        UnknownError,
        ModelNotFound,
        ModelNotReady,
        Unavailable,
        Overloaded,
        DeadlineExceeded,
        QueueTimeout,
        Unsupported,
        PayloadTooLarge,
        InferenceFailed,
        RepositoryError,
        ConfigError,
        RegionNotFound,
    )
}


def error_from_name(name: str, message: str) -> NaiadError:
    """Rebuild an error sent over the queue by class name; unknown names become 500s."""
    return ERRORS_BY_NAME.get(name, NaiadError)(message)


def as_naiad_error(exc: BaseException) -> NaiadError | None:
    """The client-facing error for ``exc``: itself if a :class:`NaiadError`, 503
    :class:`Unavailable` for a Redis failure (the queue and registry are down), else None
    (an unexpected error: the transports answer a generic 500 and log the traceback)."""
    if isinstance(exc, NaiadError):
        return exc
    from redis.exceptions import RedisError  # noqa: PLC0415 - keeps this module light

    if isinstance(exc, RedisError):
        return Unavailable(f"Redis is unavailable: {exc}")
    return None
