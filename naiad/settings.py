"""Server settings: flags of the ``naiad`` CLI, or ``NAIAD_*`` environment variables.

Flag names mirror ``tritonserver`` where it has one (``--model-repository``,
``--http-port``, ``--metrics-port``, ``--model-control-mode``, ``--repository-poll-secs``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
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

    heartbeat_s: float = 2.0
    """Seconds between a worker's heartbeats; a worker silent for 3 of them counts as dead."""

    scaler_tick_s: float = 1.0
    """Seconds between the scaler's checks of every model's backlog (wake-ups are immediate)."""

    max_workers_per_model: int = 1
    """Most worker processes the local scaler runs for one model."""

    cache_dir: Path = Field(default_factory=lambda: Path.home() / ".cache" / "naiad" / "models")
    """Worker-side local copy of pulled model versions, shared by the workers of a machine."""

    cache_max_bytes: int = 10 * 1024**3
    """Size cap of ``cache_dir`` in bytes; least recently used versions go first."""

    http_max_body_bytes: int = 64 * 1024**2
    """Largest HTTP request body accepted (aiohttp ``client_max_size``), in bytes."""

    log_level: str = "INFO"
    """Python logging level name."""
