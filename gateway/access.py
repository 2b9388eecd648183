"""Access control: which API group a route or RPC belongs to, and whether a request may use it.

Mirrors Triton's "Limit Endpoint Access" (``docs/customization_guide/inference_protocols.md``):
``--http-restricted-api=<api>,<api>,...:<key>=<value>`` and
``--grpc-restricted-protocol=<api>,...:<key>=<value>``, each repeatable, one group of APIs per
flag, an API in at most one group, unknown API names refused at start. A request to a
restricted API must carry the header ``<key>`` (HTTP, any case) or the metadata
``triton-grpc-protocol-<key>`` (gRPC, Triton's form) or ``<key>`` itself (gRPC, so that
``authorization: Bearer ...`` works as any gRPC client sends it) with exactly ``<value>``.
APIs in no group are open. Bearer tokens are the usual choice::

    --http-restricted-api=inference:Authorization=Bearer s3cret-infer
    --http-restricted-api=model-repository,statistics,model-config:Authorization=Bearer s3cret-admin

API groups: Triton's names (``health``, ``metadata``, ``inference``, ``shared-memory``,
``model-config``, ``model-repository``, ``statistics``, ``trace``, ``logging``) plus Naiad's
``metrics`` (``GET /metrics`` on the metrics port). The status page ``GET /`` shows per-model
counters and latency, so it is ``statistics``; ``GET /v2/openapi.json`` is ``metadata``.

Values are compared in constant time (:func:`hmac.compare_digest` over SHA-256 digests, so
not even the length leaks). No message here ever contains a value; :meth:`Restriction.__repr__`
hides it. This module knows no transport: the aiohttp middleware (:mod:`gateway.http`) and the
gRPC handler wrapper (:mod:`gateway.grpc_server`) only hand it a route or method and headers.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from naiad.errors import Unauthenticated

HEALTH = "health"
METADATA = "metadata"
INFERENCE = "inference"
SHARED_MEMORY = "shared-memory"
MODEL_CONFIG = "model-config"
MODEL_REPOSITORY = "model-repository"
STATISTICS = "statistics"
TRACE = "trace"
LOGGING = "logging"
METRICS = "metrics"

#: Every API group name a restriction may list (Triton's, then Naiad's ``metrics``).
API_GROUPS = (
    HEALTH, METADATA, INFERENCE, SHARED_MEMORY, MODEL_CONFIG, MODEL_REPOSITORY, STATISTICS,
    TRACE, LOGGING, METRICS,
)  # fmt: skip

#: gRPC metadata prefix Triton puts in front of a restricted key.
GRPC_PREFIX = "triton-grpc-protocol-"

_MODEL = "/v2/models/{model}"
_VERSION = _MODEL + "/versions/{version}"

#: aiohttp route pattern (``resource.canonical``) -> API group. A route missing here is a
#: bug: ``tests/gateway/test_access.py`` checks that every registered route has a group.
HTTP_GROUPS: dict[str, str] = {
    "/v2/health/live": HEALTH,
    "/v2/health/ready": HEALTH,
    "/v2": METADATA,
    "/v2/openapi.json": METADATA,
    "/": STATISTICS,
    "/v2/models/stats": STATISTICS,
    "/v2/repository/index": MODEL_REPOSITORY,
    "/v2/repository/models/{model}/load": MODEL_REPOSITORY,
    "/v2/repository/models/{model}/unload": MODEL_REPOSITORY,
    "/metrics": METRICS,
}
for _shm in ("/v2/systemsharedmemory", "/v2/cudasharedmemory"):
    HTTP_GROUPS |= {
        _shm + "/status": SHARED_MEMORY,
        _shm + "/unregister": SHARED_MEMORY,
        _shm + "/region/{region}/status": SHARED_MEMORY,
        _shm + "/region/{region}/register": SHARED_MEMORY,
        _shm + "/region/{region}/unregister": SHARED_MEMORY,
    }
for _base in (_MODEL, _VERSION):
    HTTP_GROUPS |= {
        _base: METADATA,
        _base + "/ready": HEALTH,
        _base + "/config": MODEL_CONFIG,
        _base + "/stats": STATISTICS,
        _base + "/infer": INFERENCE,
    }

#: ``inference.GRPCInferenceService`` method name -> API group.
GRPC_GROUPS: dict[str, str] = {
    "ServerLive": HEALTH,
    "ServerReady": HEALTH,
    "ModelReady": HEALTH,
    "ServerMetadata": METADATA,
    "ModelMetadata": METADATA,
    "ModelInfer": INFERENCE,
    "ModelStreamInfer": INFERENCE,
    "ModelConfig": MODEL_CONFIG,
    "ModelStatistics": STATISTICS,
    "RepositoryIndex": MODEL_REPOSITORY,
    "RepositoryModelLoad": MODEL_REPOSITORY,
    "RepositoryModelUnload": MODEL_REPOSITORY,
    "SystemSharedMemoryStatus": SHARED_MEMORY,
    "SystemSharedMemoryRegister": SHARED_MEMORY,
    "SystemSharedMemoryUnregister": SHARED_MEMORY,
    "CudaSharedMemoryStatus": SHARED_MEMORY,
    "CudaSharedMemoryRegister": SHARED_MEMORY,
    "CudaSharedMemoryUnregister": SHARED_MEMORY,
    "TraceSetting": TRACE,
    "LogSettings": LOGGING,
}


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


@dataclass(frozen=True)
class Restriction:
    """One group: the header (lowercase) that must hold the value. The value is kept only as
    its SHA-256 digest, so neither a ``repr`` nor a traceback's locals can show it."""

    header: str
    digest: bytes = field(repr=False)

    def allows(self, given: str | None) -> bool:
        # Always compare, even without a header, so a missing one costs the same time.
        return hmac.compare_digest(_digest(given or ""), self.digest) and given is not None


def parse_restriction(spec: str, flag: str) -> tuple[list[str], Restriction]:
    """``<api>,<api>,...:<key>=<value>`` as (APIs, restriction). The value may hold ``:``
    and ``=``; the key may not be empty. Raises ``ValueError`` with a message that never
    contains the value."""
    apis_part, colon, rest = spec.partition(":")
    key, equals, value = rest.partition("=")
    key = key.strip()
    if not colon or not equals or not key or not value:
        raise ValueError(f"{flag} must be <api>[,<api>...]:<key>=<value> with a key and a value")
    apis = [api.strip() for api in apis_part.split(",")]
    for api in apis:
        if api not in API_GROUPS:
            raise ValueError(f"{flag}: unknown API {api[:40]!r} (known: {', '.join(API_GROUPS)})")
    return apis, Restriction(key.lower(), _digest(value))


class AccessPolicy:
    """API group -> restriction, for one transport (HTTP and gRPC have their own flags)."""

    def __init__(self, specs: Iterable[str] = (), flag: str = "--http-restricted-api"):
        self.groups: dict[str, Restriction] = {}
        for spec in specs:
            apis, restriction = parse_restriction(spec, flag)
            for api in apis:
                if api in self.groups:
                    raise ValueError(f"{flag}: API '{api}' can not be specified in multiple config groups")
                self.groups[api] = restriction

    def __bool__(self) -> bool:
        return bool(self.groups)

    def check(self, group: str | None, headers: Mapping[str, str], grpc: bool = False) -> None:
        """Raise :class:`Unauthenticated` unless ``headers`` (lowercase names for gRPC,
        any case for an HTTP multidict) carry what ``group`` requires; ``None`` (an unknown
        route or method, answered 404/UNIMPLEMENTED later) and open groups pass."""
        restriction = self.groups.get(group) if group else None
        if restriction is None:
            return
        name = restriction.header
        given = headers.get(GRPC_PREFIX + name) if grpc else None
        if given is None:
            given = headers.get(name)
        if not restriction.allows(given):
            what = "missing" if given is None else "wrong"
            shown = f"{GRPC_PREFIX}{name}' or '{name}" if grpc else name
            raise Unauthenticated(
                f"the '{group}' API requires the '{shown}' {'metadata' if grpc else 'header'} "
                f"({what} credentials)",
                bearer=name == "authorization",
            )


def grpc_group(method: str) -> str | None:
    """The API group of a full gRPC method name (``/inference.GRPCInferenceService/X``)."""
    service, _, name = method.rpartition("/")
    return GRPC_GROUPS.get(name) if service == "/inference.GRPCInferenceService" else None


def grpc_headers(metadata: Iterable[tuple[str, str | bytes]] | None) -> dict[str, str]:
    """Invocation metadata as a dict of lowercase text keys (binary ``-bin`` values are
    skipped: a key is text). The first of repeated keys wins."""
    headers: dict[str, str] = {}
    for key, value in metadata or ():
        if isinstance(value, str):
            headers.setdefault(key.lower(), value)
    return headers
