"""Server settings: flags of the ``naiad`` CLI, or ``NAIAD_*`` environment variables.

Flag names mirror ``tritonserver`` where it has one (``--model-repository``,
``--http-port``, ``--metrics-port``, ``--model-control-mode``, ``--repository-poll-secs``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Everything a gateway, scaler or worker needs to know. Built in ``main()`` only."""

    model_config = SettingsConfigDict(env_prefix="NAIAD_", extra="ignore")

    model_repository: str = "model_repository"
    """Local folder, ``s3://bucket/prefix`` or ``s3://host:port/bucket/prefix``."""

    redis_url: str | None = None
    """``redis://``, ``rediss://`` or ``unix://`` URL; None starts an embedded redis-server."""

    http_host: str = "0.0.0.0"
    """Address the HTTP and metrics endpoints bind to."""

    http_port: int = 8000
    """KServe v2 HTTP/REST port."""

    grpc_port: int = 8001
    """KServe v2 gRPC port (``inference.GRPCInferenceService``), bound on ``http_host`` too."""

    metrics_port: int = 8002
    """Prometheus metrics port."""

    metrics_address: str | None = None
    """Address the metrics endpoint binds to (``--metrics-address``, as Triton's); None: the
    same as ``http_host`` (``0.0.0.0`` by default, as Triton). ``127.0.0.1`` keeps it local."""

    http_restricted_api: list[str] = Field(default_factory=list, repr=False)
    """Triton's ``--http-restricted-api <api>,...:<key>=<value>`` groups (see
    :mod:`gateway.access`). From the environment as a JSON list
    (``NAIAD_HTTP_RESTRICTED_API='["inference:Authorization=Bearer ..."]'``), so keys need not
    appear in a process listing. Never shown in a repr or log."""

    grpc_restricted_protocol: list[str] = Field(default_factory=list, repr=False)
    """Triton's ``--grpc-restricted-protocol <api>,...:<key>=<value>`` groups, for gRPC
    metadata (``NAIAD_GRPC_RESTRICTED_PROTOCOL``, a JSON list). Never shown in a repr or log."""

    model_control_mode: Literal["none", "poll", "explicit"] = "none"
    """Triton's model control mode: ``none`` serves every model of the repository as indexed
    at start; ``poll`` also re-indexes every ``repository_poll_secs``; ``explicit`` serves only
    the ``load_model`` models at start, the rest through the repository API's load/unload."""

    repository_poll_secs: float = 15.0
    """Seconds between re-indexings of the repository in ``poll`` mode."""

    load_model: list[str] = Field(default_factory=list)
    """Models loaded at start in ``explicit`` mode (``*``: all of them)."""

    idle_timeout_s: float = 60.0
    """Seconds without requests after which a worker exits (scale to zero)."""

    request_timeout_s: float = 60.0
    """Server default for how long a request may wait for its answer, cold start included,
    when the request sets no ``timeout`` parameter."""

    max_queue_size: int = Field(default=1000, ge=1)
    """Most requests one model's queue (each priority level's) holds, queued or being run;
    one more is refused at once with 503 + ``Retry-After`` / UNAVAILABLE (``--max-queue-size``;
    per model: Triton's ``dynamic_batching { default_queue_policy { max_queue_size: N } }``
    or a level's ``priority_queue_policy``, where 0 means this default: a Naiad queue is
    never unbounded)."""

    gateway_processes: int = Field(default=0, ge=0)
    """Gateway processes of one ``naiad serve`` / ``naiad gateway`` on the same HTTP and gRPC
    ports (``--gateway-processes``; ``SO_REUSEPORT``, the kernel spreads new connections over
    them): the protocol work of one gateway is one core's at most. 0 (the default): one per
    CPU this process may use, at most :data:`gateway.siblings.AUTO_MOST`
    (:func:`gateway.siblings.process_count`). The first process also
    serves the metrics port, indexes and polls the repository; the others start with it and
    stop with it (:mod:`gateway.siblings`: statistics, model control and shared-memory
    regions read the same from each). The limits (``--max-inflight``,
    ``--max-buffered-bytes``, ``--http-max-connections``) are the server's, split evenly
    among its processes (:func:`gateway.siblings.per_process`)."""

    gateway_sibling_of: str = ""
    """Set only by the first gateway process for the others it starts: the folder of the
    processes' control sockets (:mod:`gateway.siblings`). Not a flag."""

    max_inflight: int = Field(default=4096, ge=1)
    """Most inference requests one gateway carries at once (reading, queued, awaiting a
    reply); one more is refused at once with 503 + ``Retry-After`` / UNAVAILABLE, so the
    gateway's memory stays bounded under overload (``--max-inflight``)."""

    pull_attempts: int = Field(default=4, ge=1)
    """Tries a worker makes to pull a model version from the repository before it answers
    the waiting requests 503 with the reason (``NAIAD_PULL_ATTEMPTS``)."""

    pull_backoff_s: float = Field(default=0.5, ge=0)
    """Wait before the second pull attempt; doubled before each next one
    (``NAIAD_PULL_BACKOFF_S``)."""

    redis_down_grace_s: float = Field(default=30.0, gt=0)
    """Seconds Redis may stay unreachable before the gateway reports not live
    (``/v2/health/live`` 400, gRPC ``ServerLive`` false), so an orchestrator restarts it
    (``--redis-down-grace``); a shorter outage only fails the requests it meets (503)."""

    shutdown_grace_s: float = Field(default=30.0, ge=0)
    """Seconds a stopping gateway (SIGTERM/SIGINT) gives its in-flight requests to finish
    after it stopped accepting (aiohttp's ``shutdown_timeout``, gRPC's grace); then they are
    cancelled. ``naiad serve`` stops its workers only after that (``--shutdown-grace``)."""

    worker_id: str = ""
    """A worker's id (:func:`naiad.ids.worker_id`), given by the scaler that starts it
    (``NAIAD_WORKER_ID``, or its warm-pool claim) so it can remove the heartbeat of one that
    died; empty: the worker draws one."""

    heartbeat_s: float = 2.0
    """Seconds between a worker's heartbeats; a worker silent for 3 of them counts as dead."""

    scaler_tick_s: float = 1.0
    """Seconds between the scaler's checks of every model's backlog (wake-ups are immediate)."""

    max_workers_per_model: int = Field(default=4, ge=1)
    """Most worker processes the local scaler runs for one model (``--max-workers``; per
    model: the config parameter ``naiad.max_workers``)."""

    min_workers: int = Field(default=0, ge=0)
    """Workers kept up per model even when idle (``--min-workers``; per model:
    ``naiad.min_workers``). 0: models scale to zero."""

    target_inflight: int = Field(default=8, ge=1)
    """Requests, queued or running, one worker is meant to carry: the scaler wants
    ``ceil(stream length / target_inflight)`` workers (``--target-inflight``; per model:
    ``naiad.target_inflight``)."""

    scale_down_period_s: float = Field(default=30.0, ge=0)
    """Seconds the scaler waits after its last start or stop of a model's worker before it
    stops one more (``--scale-down-period``): scale-down is one worker per period, never
    below ``max(min_workers, 1)``; the last one leaves on its own idle timeout."""

    cache_dir: Path = Field(default_factory=lambda: Path.home() / ".cache" / "naiad" / "models")
    """Worker-side local copy of pulled model versions, shared by the workers of a machine."""

    cache_max_bytes: int = 10 * 1024**3
    """Size cap of ``cache_dir`` in bytes; least recently used versions go first."""

    device: str | None = None
    """Where the local scaler placed this worker: ``cpu`` or ``gpu:<NVML index>``, from
    ``NAIAD_DEVICE``, which the scaler sets with ``CUDA_VISIBLE_DEVICES``
    (:mod:`workers.placement`). None (a worker started by hand or by Kubernetes): from the
    config's ``instance_group``, CUDA unless every group is ``KIND_CPU``."""

    rate_limit: Literal["off", "execution_count"] = "off"
    """Triton's ``--rate-limit``: ``execution_count`` runs a worker's batch only when the
    ``rate_limiter`` resources of its instance group are free on its machine (shared by
    every worker there; waiting workers in Triton's priority order); ``off`` (Triton's
    default) ignores every ``rate_limiter`` (:mod:`workers.rate_limiter`)."""

    rate_limit_resource: list[str] = Field(default_factory=list)
    """Triton's ``--rate-limit-resource NAME:COUNT[:DEVICE]`` (repeatable): ``COUNT`` copies of
    resource ``NAME`` on device ``DEVICE`` (a GPU index; CPU workers count as device 0, as in
    Triton), or on every device without one, or machine-wide for a ``global`` resource.
    Unlisted resources have the most any model's instance group asks for."""

    rate_limit_host: str | None = None
    """The machine whose workers share rate-limiter resources (``--rate-limit-host``; None:
    this host's name). On Kubernetes, give the node's name (``NAIAD_RATE_LIMIT_HOST`` from
    ``spec.nodeName``) so the workers of one node share them."""

    python_on_loop: bool = True
    """A worker runs its Python model (``initialize``, ``execute``, ``finalize``) on its
    event loop's thread, not in a thread of its own (:mod:`workers.model_thread`): no thread
    hand-off per batch; the loop waits while the model runs (its Redis timeouts and
    heartbeat do not: :mod:`naiad.loop_stall`). Not with the rate limiter (its leases renew
    on the loop). ``--python-on-loop false``: a thread of its own."""

    demote_spinning_threads: bool = True
    """A worker runs the threads of its model's frameworks that busy-wait between batches
    (ONNX Runtime's spinning intra-op pool in a ``model.py``'s session, OpenMP's) at
    ``SCHED_IDLE`` between batches and at ``SCHED_OTHER`` during them, so their waiting uses
    only CPU the gateway and other workers leave idle (:mod:`workers.spin_watch`; needs
    root, ``CAP_SYS_NICE`` or ``RLIMIT_NICE``, else off; ``--demote-spinning-threads false``
    leaves them alone)."""

    onnxruntime_spinning: bool = False
    """A worker keeps ONNX Runtime's own default for the sessions a Python model builds
    without a word on spinning (``session.intra_op.allow_spinning`` 1: idle intra-op threads
    busy-wait after each run). Default false: such sessions do not spin, as Naiad's ONNX
    backend's (:mod:`workers.ort_spinning`); a session that sets the key is left as asked."""

    warm_pool_size: int = Field(default=1, ge=0)
    """Generic worker processes the local scaler keeps started ahead of need (interpreter up,
    frameworks imported, connected to Redis, no model yet); a cold start claims one and pays
    only the model load (``--warm-pool-size``; 0: every cold start spawns a bare process)."""

    warm_pool_backends: list[str] = ["onnxruntime"]
    """Backends that get a warm pool of their own, ``warm_pool_size`` processes each, every
    one with that backend's framework imported and warmed up before its claim
    (``--warm-pool-backend pytorch``, repeatable; ``NAIAD_WARM_POOL_BACKENDS='["onnxruntime",
    "pytorch"]'``): a model of that backend then pays only its own load. A model whose backend
    has no pool claims a process of the first-listed pool and imports its framework then (never
    another framework's). Each idle process costs memory (RSS measured on a 2-core CPU
    machine, docs/benchmarks.md): ONNX Runtime 125 MiB, PyTorch 274 MiB, TensorFlow 628 MiB,
    Python 89 MiB; hence only ONNX Runtime by default."""

    warm_pool_idle_timeout_s: float | None = Field(default=None, gt=0)
    """Seconds without any cold start after which the warm pool shrinks to zero processes;
    the next cold start (a bare process) refills it (``--warm-pool-idle-timeout``; None:
    never shrinks)."""

    response_cache_enabled: bool = True
    """Server side of Triton's response cache: models whose config says
    ``response_cache { enable: true }`` are cached in Redis (``--cache-config redis,enable=false``
    turns it off for every model)."""

    response_cache_max_bytes: int = 256 * 1024**2
    """Cap on the bytes of all cached responses, every model together (default 256 MiB); the
    least recently used entries are evicted past it (``--cache-config redis,max_bytes=N``)."""

    response_cache_ttl_s: float = 3600.0
    """Seconds a cached response lives after it was stored (default 1 h;
    ``--cache-config redis,ttl_s=N``)."""

    http_max_body_bytes: int = 64 * 1024**2
    """Largest HTTP request body accepted (aiohttp ``client_max_size``), in bytes."""

    grpc_max_message_bytes: int = Field(default=64 * 1024**2, ge=1024, le=2**31 - 1)
    """Largest gRPC message received or sent, in bytes (``--grpc-max-message-size``). grpc
    core refuses a larger one from its declared length (RESOURCE_EXHAUSTED) before buffering
    it. Default 64 MiB, the HTTP body limit; Triton's 2 GiB - 1 (2147483647) is allowed."""

    max_buffered_bytes: int = Field(default=256 * 1024**2, ge=1024)
    """Most request bytes one gateway buffers at once, every request of both transports
    together (``--max-buffered-bytes``, :mod:`gateway.limits`); one more is refused at once
    with 503 + ``Retry-After`` / UNAVAILABLE. At least the larger of ``http_max_body_bytes``
    and ``grpc_max_message_bytes``, or a largest request could never be read."""

    http_header_timeout_s: float = Field(default=10.0, gt=0)
    """Seconds a new connection has to send a request's complete headers, from its start
    (``--http-header-timeout``); a silent or dribbling client is then disconnected. Also
    gRPC's handshake timeout."""

    http_body_first_byte_timeout_s: float = Field(default=10.0, gt=0)
    """Seconds a request whose body is expected has, after its headers, to send the body's
    first byte (``--http-body-first-byte-timeout``); then 408 and the connection is closed."""

    http_body_timeout_s: float = Field(default=60.0, gt=0)
    """Seconds a request's whole body may take to arrive (``--http-body-timeout``), on HTTP
    and for a gRPC message; then 408 (gRPC: DEADLINE_EXCEEDED) and the connection (HTTP) or
    the call (gRPC) is closed, freeing its in-flight slot."""

    http_keepalive_timeout_s: float = Field(default=75.0, gt=0)
    """Seconds an idle keep-alive connection stays open between requests
    (``--http-keepalive-timeout``; gRPC: its ``max_connection_idle``)."""

    grpc_front: Literal["naiad", "grpcio"] = "naiad"
    """What serves gRPC (``--grpc-front``): ``naiad``, the gateway's own HTTP/2 connections
    (:mod:`gateway.grpc_front`, less than half of grpc.aio's gateway CPU a request), or ``grpcio``, a
    ``grpc.aio`` server."""

    http_fast_infer: bool = True
    """Plain inference requests answered by the gateway's own HTTP/1.1 path
    (:mod:`gateway.http_fast`, ``--http-fast-infer``); false: every request through aiohttp."""

    direct_replies: bool = True
    """Workers on the gateway's machine send it their replies by a Unix socket
    (:mod:`naiad.reply_channel`: one hop instead of two through Redis) and through Redis when
    that fails (``NAIAD_DIRECT_REPLIES``); false: every reply through Redis."""

    direct_requests: bool = True
    """With ``direct_replies``: a worker on the gateway's machine that waits idle takes its
    next request from the gateway by the same socket (:mod:`naiad.reply_channel`, "direct
    hand-off"; ``NAIAD_DIRECT_REQUESTS``); false: every request through Redis."""

    busy_poll_us: int = Field(default=500, ge=0, le=100_000)
    """With ``direct_requests``: while the server carries one request, handed to an idle
    worker, its gateway polls for the answer for up to this many µs instead of sleeping
    (:mod:`naiad.busy_poll`: it stops when another thread takes its CPU, and does not poll
    for a model whose answers take over twice as long; ``--busy-poll-us``,
    ``NAIAD_BUSY_POLL_US``); 0: never. The default covers a small model's answer on the same
    machine (the benchmark's ``digits`` MLP: ~0.2 ms at c1)."""

    http_max_connections: int = Field(default=1024, ge=1)
    """Most HTTP connections open at once per port (``--http-max-connections``); one more is
    answered 503 and closed at once, so file descriptors last."""

    log_level: str = "INFO"
    """Python logging level name."""

    @field_validator("rate_limit_resource")
    @classmethod
    def _resources(cls, values: list[str]) -> list[str]:
        for value in values:
            parse_rate_limit_resource(value)
        return values

    log_format: Literal["text", "json"] = "text"
    """Log record format: ``text`` (one line, human) or ``json`` (one JSON object a line)."""

    log_verbose: int = 0
    """Triton's verbose level: 1 turns Naiad's own loggers to DEBUG, 2 every library's too."""

    log_info: bool = True
    """Triton's ``--log-info``: false drops INFO records."""

    log_warning: bool = True
    """Triton's ``--log-warning``: false drops WARNING records."""

    log_error: bool = True
    """Triton's ``--log-error``: false drops ERROR and CRITICAL records."""

    trace: bool = False
    """OpenTelemetry tracing (needs the ``trace`` extra). The exporter, sampler and service
    name come from the standard ``OTEL_*`` variables (``OTEL_TRACES_EXPORTER=otlp|console|none``,
    ``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_TRACES_SAMPLER``, ``OTEL_SERVICE_NAME``)."""

    @model_validator(mode="after")
    def _budget_holds_a_request(self) -> Settings:
        largest = max(self.http_max_body_bytes, self.grpc_max_message_bytes)
        if self.max_buffered_bytes < largest:
            raise ValueError(f"--max-buffered-bytes ({self.max_buffered_bytes}) must be at least the "
                             f"largest request (--grpc-max-message-size / HTTP body limit: {largest})")
        return self


def parse_rate_limit_resource(value: str) -> tuple[str, int, int | None]:
    """``(name, count, device or None)`` of a ``--rate-limit-resource NAME:COUNT[:DEVICE]``
    value (Triton's form: COUNT >= 0, DEVICE a non-negative integer). Raises ValueError."""
    parts = value.split(":")
    digits = all(p.isascii() and p.isdigit() and len(p) <= 9 for p in parts[1:])
    if len(parts) not in (2, 3) or not parts[0] or not digits:
        raise ValueError(f"--rate-limit-resource {value!r}: expected NAME:COUNT or NAME:COUNT:DEVICE")
    return parts[0], int(parts[1]), int(parts[2]) if len(parts) == 3 else None


#: ``--cache-config redis,<key>=<value>`` keys -> Settings fields and value parsers.
CACHE_CONFIG_KEYS = {
    "enable": ("response_cache_enabled", lambda v: {"true": True, "false": False}[v.lower()]),
    "max_bytes": ("response_cache_max_bytes", int),
    "ttl_s": ("response_cache_ttl_s", float),
}


def parse_cache_config(values: list[str]) -> dict[str, Any]:
    """Settings fields from Triton-style ``--cache-config <cache>,<key>=<value>`` values
    (repeatable; docs/user_guide/response_cache.md). The only cache is ``redis``; keys are
    ``enable`` (true/false), ``max_bytes`` (> 0) and ``ttl_s`` (> 0). Raises ValueError."""
    fields: dict[str, Any] = {}
    for value in values:
        cache, _, setting = value.partition(",")
        key, eq, raw = setting.partition("=")
        if cache.strip() != "redis":
            raise ValueError(f"--cache-config {value!r}: the only cache is 'redis'")
        if not eq or key.strip() not in CACHE_CONFIG_KEYS:
            raise ValueError(f"--cache-config {value!r}: expected redis,<key>=<value> with key in "
                             f"{', '.join(CACHE_CONFIG_KEYS)}")
        field, parse = CACHE_CONFIG_KEYS[key.strip()]
        try:
            parsed = parse(raw.strip())
        except (KeyError, ValueError):
            raise ValueError(f"--cache-config {value!r}: bad value {raw!r}") from None
        if not isinstance(parsed, bool) and parsed <= 0:
            raise ValueError(f"--cache-config {value!r}: the value must be positive")
        fields[field] = parsed
    return fields
