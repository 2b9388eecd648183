"""The ``naiad`` command line: ``serve``, ``gateway``, ``scaler``, ``worker``, and the tools
``status``, ``deploy`` and ``k8s render``.

Flags mirror ``tritonserver`` where it has one; each flag also reads from ``NAIAD_<NAME>``
(see :class:`naiad.settings.Settings`). Each command imports only what it runs, so a worker
process never loads the web stack and the gateway never loads an ML framework.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import pathlib
import signal
import sys
from collections.abc import Sequence

from naiad import eventloop, logs, procs, tracing
from naiad import tasks as naiad_tasks
from naiad.settings import Settings, parse_cache_config


def _bool(text: str) -> bool:
    """Triton's boolean flag values: true/false (also 1/0, yes/no, on/off)."""
    value = {"true": True, "1": True, "yes": True, "on": True,
             "false": False, "0": False, "no": False, "off": False}.get(text.lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value


# flag -> Settings field, for the flags every command shares.
COMMON_FLAGS = {
    "--model-repository": ("model_repository", str, "folder, s3://bucket/prefix or s3://host:port/bucket/prefix"),
    "--redis-url": ("redis_url", str, "redis:// or unix:// URL (default: serve embeds a redis-server)"),
    "--log-level": ("log_level", str, "DEBUG, INFO, WARNING or ERROR"),
    "--idle-timeout": ("idle_timeout_s", float, "seconds without requests before a worker exits"),
    "--cache-dir": ("cache_dir", str, "local cache of pulled model versions"),
    "--log-format": ("log_format", "text|json", "text, or json: one JSON object a line"),
    "--log-verbose": ("log_verbose", int, "Triton's verbose level: 1 DEBUG for naiad, 2 for libraries too"),
    "--log-info": ("log_info", _bool, "true or false: INFO records"),
    "--log-warning": ("log_warning", _bool, "true or false: WARNING records"),
    "--log-error": ("log_error", _bool, "true or false: ERROR records"),
    "--demote-spinning-threads": ("demote_spinning_threads", _bool, "true or false: a worker runs its "
                                  "model's framework threads that busy-wait at SCHED_IDLE between batches"),
    "--onnxruntime-spinning": ("onnxruntime_spinning", _bool, "true or false: ONNX Runtime sessions a Python "
                               "model builds without a word on spinning keep ONNX Runtime's default (spin)"),
    "--python-on-loop": ("python_on_loop", _bool, "true or false: a worker runs its Python model on its "
                         "event loop's thread (false: a thread of its own)"),
}
# flag -> Settings field, for the scaler's policy (serve, scaler; workers read min and idle).
SCALER_FLAGS = {
    "--min-workers": ("min_workers", int, "workers kept per model even when idle"),
    "--max-workers": ("max_workers_per_model", int, "most workers per model"),
    "--target-inflight": ("target_inflight", int, "queued + running requests per worker"),
    "--scale-down-period": ("scale_down_period_s", float,
                            "seconds between stops of one model's workers"),
}
# flag -> Settings field, for Triton's rate limiter (serve, scaler, worker: the workers apply it).
RATE_LIMIT_FLAGS = {
    "--rate-limit": ("rate_limit", "off|execution_count", "execution_count: a worker runs a batch only "
                     "when its instance group's rate_limiter resources are free on its machine"),
    "--rate-limit-resource": ("rate_limit_resource", list, "repeatable NAME:COUNT[:DEVICE]: copies of a "
                              "rate-limiter resource (default: the most any instance group asks for)"),
    "--rate-limit-host": ("rate_limit_host", str, "the machine whose workers share rate-limiter "
                          "resources (default: the host name; on Kubernetes the node name)"),
}
# flag -> Settings field, for the warm pool of the local scaler (serve, scaler).
POOL_FLAGS = {
    "--warm-pool-size": ("warm_pool_size", int, "generic worker processes kept started, 0 for none"),
    "--warm-pool-idle-timeout": ("warm_pool_idle_timeout_s", float,
                                 "seconds without a cold start before the pool empties (default: never)"),
    "--warm-pool-backend": ("warm_pool_backends", list, "repeatable: a backend (onnxruntime, pytorch, "
                            "tensorflow, python) whose own pool processes import its framework ahead"),
}
GATEWAY_FLAGS = {
    "--http-port": ("http_port", int, "KServe v2 HTTP port"),
    "--grpc-port": ("grpc_port", int, "KServe v2 gRPC port"),
    "--metrics-port": ("metrics_port", int, "Prometheus metrics port"),
    "--http-address": ("http_host", str, "address HTTP, gRPC and metrics bind to"),
    "--metrics-address": ("metrics_address", str, "address the metrics port binds to "
                          "(default: --http-address; 127.0.0.1 keeps it local)"),
    "--http-restricted-api": ("http_restricted_api", list, "repeatable <api>,...:<key>=<value>: those "
                              "APIs need header <key>: <value> (env NAIAD_HTTP_RESTRICTED_API keeps "
                              "keys out of process listings)"),
    "--grpc-restricted-protocol": ("grpc_restricted_protocol", list, "repeatable <api>,...:<key>=<value>, "
                                   "for gRPC metadata (env NAIAD_GRPC_RESTRICTED_PROTOCOL)"),
    "--request-timeout": ("request_timeout_s", float, "seconds a request without a 'timeout' parameter "
                          "(or with 0) may wait for its answer, cold start included"),
    "--shutdown-grace": ("shutdown_grace_s", float, "seconds in-flight requests get on SIGTERM"),
    "--redis-down-grace": ("redis_down_grace_s", float, "seconds Redis may be unreachable before "
                           "/v2/health/live says not live"),
    "--max-queue-size": ("max_queue_size", int, "most requests queued per model; more: 503"),
    "--max-inflight": ("max_inflight", int, "most requests the gateway carries (its processes in all); "
                       "more: 503"),
    "--gateway-processes": ("gateway_processes", int, "gateway processes sharing the HTTP and gRPC ports "
                            "(SO_REUSEPORT); 0: one per usable CPU, at most 2"),
    "--max-buffered-bytes": ("max_buffered_bytes", int, "most request bytes buffered at once, HTTP and "
                             "gRPC together; more: 503"),
    "--grpc-max-message-size": ("grpc_max_message_bytes", int, "largest gRPC message in bytes "
                                "(Triton's 2147483647 at most)"),
    "--http-header-timeout": ("http_header_timeout_s", float, "seconds a connection has to send "
                              "complete request headers (also gRPC's handshake)"),
    "--http-body-first-byte-timeout": ("http_body_first_byte_timeout_s", float,
                                       "seconds from the headers to the body's first byte"),
    "--http-body-timeout": ("http_body_timeout_s", float, "seconds a whole body (or gRPC message) may take"),
    "--http-keepalive-timeout": ("http_keepalive_timeout_s", float, "seconds an idle keep-alive "
                                 "connection stays open"),
    "--grpc-front": ("grpc_front", "naiad|grpcio", "naiad (the gateway's own HTTP/2) or grpcio (grpc.aio)"),
    "--http-fast-infer": ("http_fast_infer", _bool, "true or false: plain inference requests skip "
                          "aiohttp's request machinery"),
    "--busy-poll-us": ("busy_poll_us", int, "µs a gateway polls for the answer to the server's only "
                       "request before it sleeps (0: never)"),
    "--http-max-connections": ("http_max_connections", int, "most open HTTP connections per port; more: 503"),
    "--model-control-mode": ("model_control_mode", "none|poll|explicit", "none, poll or explicit"),
    "--repository-poll-secs": ("repository_poll_secs", float, "poll mode: seconds between re-indexings"),
    "--load-model": ("load_model", list, "explicit mode: model to load at start, repeatable ('*': all)"),
    "--cache-config": ("cache_config", list, "response cache, repeatable: redis,max_bytes=N | "
                       "redis,ttl_s=SECONDS | redis,enable=false (default: max_bytes="
                       f"{Settings.model_fields['response_cache_max_bytes'].default}, "
                       f"ttl_s={Settings.model_fields['response_cache_ttl_s'].default:g})"),
}


def _with_default(dest: str, text: str) -> str:
    """``text`` with the default of Settings field ``dest`` appended, as ``--help`` shows it
    (the Settings field is the one place each default is written); none for an empty list
    or None, whose meaning the text gives."""
    field = Settings.model_fields.get(dest)
    default = None if field is None else field.get_default(call_default_factory=True)
    if default is None or default == []:
        return text
    if isinstance(default, bool):
        shown = str(default).lower()  # as the flags take it: true / false
    elif isinstance(default, float):
        shown = f"{default:g}"  # 60, not 60.0
    else:
        shown = str(default)
    return f"{text} (default: {shown})".replace("%", "%%")


def _add(parser: argparse.ArgumentParser, flags: dict) -> None:
    for flag, (dest, kind, text) in flags.items():
        text = _with_default(dest, text)
        if kind is list:  # repeatable
            parser.add_argument(flag, dest=dest, action="append", help=text, default=argparse.SUPPRESS)
        elif isinstance(kind, str):  # one of the '|'-separated choices
            choices = kind.split("|")
            parser.add_argument(flag, dest=dest, choices=choices, help=text, default=argparse.SUPPRESS)
        else:
            parser.add_argument(flag, dest=dest, type=kind, help=text, default=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="naiad", description="Naiad: a scale-to-zero KServe v2 / Triton inference gateway."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text, flags in (
        ("serve", "gateway + scaler (+ embedded Redis) on one machine",
         GATEWAY_FLAGS | SCALER_FLAGS | RATE_LIMIT_FLAGS),
        ("gateway", "the stateless gateway only", GATEWAY_FLAGS),
        ("scaler", "the local scaler only", SCALER_FLAGS | RATE_LIMIT_FLAGS),
        ("worker", "one worker process for one model", SCALER_FLAGS | RATE_LIMIT_FLAGS),
    ):
        sub = commands.add_parser(name, help=text)
        _add(sub, COMMON_FLAGS | flags)
        sub.add_argument("--trace", dest="trace", action="store_true", default=argparse.SUPPRESS,
                         help="OpenTelemetry spans (the 'trace' extra; exporter from OTEL_* variables)")
        if name in ("serve", "scaler"):
            _add(sub, POOL_FLAGS)
        if name == "worker":
            served = sub.add_mutually_exclusive_group(required=True)
            served.add_argument("--model", help="model name in the repository")
            served.add_argument("--pool", action="store_true",
                                help="a warm-pool process: prepare, then serve the model the scaler names")
    status = commands.add_parser("status", help="live view of models, workers, queues (Ctrl-C ends)")
    status.add_argument("--redis-url", required=True, help="the Redis the gateways and workers use")
    status.add_argument("--once", action="store_true", help="print one snapshot and exit")
    status.add_argument("--interval", type=float, default=1.0,
                        help="seconds between refreshes (default: %(default)g)")
    _add_tool_commands(commands)
    return parser


def _add_tool_commands(commands) -> None:
    """``deploy`` and ``k8s render``: client-side tools, no server, no Redis."""
    tool_flags = {flag: COMMON_FLAGS[flag] for flag in ("--model-repository", "--log-level")}
    deploy = commands.add_parser("deploy", help="validate a model folder, then upload it to the repository")
    deploy.add_argument("model_dir", metavar="MODEL_DIR", help="the model folder (config.pbtxt, 1/, 2/, ...)")
    _add(deploy, tool_flags)
    deploy.add_argument("--name", help="the model's name in the repository (default: the folder's name)")
    deploy.add_argument("--load-check", action="store_true",
                        help="also load each version with its backend and run it once on zeros")
    k8s = commands.add_parser("k8s", help="Kubernetes manifests")
    k8s = k8s.add_subparsers(dest="k8s_command", required=True)
    render = k8s.add_parser("render", help="write per-model worker Deployments and KEDA ScaledObjects")
    _add(render, tool_flags)
    render.add_argument("--out", required=True, type=pathlib.Path, help="folder the manifests are written to")
    render.add_argument("--image-worker", default="naiad-worker:latest",
                        help="worker container image (default: %(default)s)")
    render.add_argument("--namespace", default="naiad",
                        help="Kubernetes namespace of the objects (default: %(default)s)")
    render.add_argument("--redis-address", default="redis:6379",
                        help="host:port of Redis as seen from the pods, KEDA's address format "
                        "(default: %(default)s)")
    render.add_argument("--redis-secret", default="",
                        help="a Secret whose 'url' key holds the workers' Redis URL with its password "
                        "(default: redis://<redis-address>/0)")


def _settings(args: argparse.Namespace, redis_url: str | None = None) -> Settings:
    """Settings from the flags (then ``NAIAD_*``); ``redis_url``: one a parent passed
    privately (:func:`naiad.procs.take_redis_url`), before any flag."""
    fields = set(Settings.model_fields)
    values = {k: v for k, v in vars(args).items() if k in fields}
    if redis_url is not None:
        values["redis_url"] = redis_url
    return Settings(**values, **parse_cache_config(getattr(args, "cache_config", [])))


logger = logging.getLogger(__name__)

#: Seconds a shutdown may take beyond the in-flight grace before the rest is cancelled
#: (stopping workers, closing clients): Ctrl-C always ends what the command started.
SHUTDOWN_MARGIN_S = 15.0


async def _until_signal(*runners, grace_s: float = 0.0) -> None:
    """Run ``runners(stop_event)`` until SIGINT/SIGTERM, then let each finish cleanly within
    ``grace_s`` + :data:`SHUTDOWN_MARGIN_S` seconds; past that, cancel what is left."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(runner(stop)) for runner in runners]
    done, _ = await asyncio.wait([asyncio.create_task(stop.wait()), *tasks],
                                 return_when=asyncio.FIRST_COMPLETED)
    stop.set()
    logger.info("shutting down (in-flight requests get %g s)", grace_s)
    for task in tasks:
        if task in done:
            task.result()
    _, pending = await asyncio.wait(tasks, timeout=grace_s + SHUTDOWN_MARGIN_S)
    for task in pending:
        logger.error("shutdown still waiting after %g s: cancelling %s", grace_s + SHUTDOWN_MARGIN_S, task)
        with contextlib.suppress(Exception):  # gathered below
            await naiad_tasks.cancel_and_wait(task)
    await asyncio.gather(*tasks, return_exceptions=bool(pending))


def _scaler_runner(settings: Settings, redis_url: str):
    from workers.scaler import LocalScaler  # noqa: PLC0415

    async def run(stop: asyncio.Event) -> None:
        task = asyncio.create_task(LocalScaler(settings, redis_url).run())
        await stop.wait()
        await naiad_tasks.cancel_and_wait(task)

    return run


def _gateway_runner(settings: Settings, redis_url: str):
    from gateway.server import run_gateway  # noqa: PLC0415

    return lambda stop: run_gateway(settings, redis_url, stop)


def _serve_runner(settings: Settings, redis_url: str):
    """Gateway and scaler, stopped in that order: the gateway first drains its in-flight
    requests while their workers still run, then the scaler stops the workers (drain)."""
    gateway, scaler = _gateway_runner(settings, redis_url), _scaler_runner(settings, redis_url)

    async def run(stop: asyncio.Event) -> None:
        gateway_done = asyncio.Event()
        scaling = asyncio.create_task(scaler(gateway_done))
        try:
            await gateway(stop)
        finally:
            gateway_done.set()
            await scaling

    return run


def _embedded_redis(stack: contextlib.ExitStack, embedded) -> str:
    """Start the embedded Redis (a generated password, an append-only file in its private
    folder, restarted by a supervisor thread when it dies: :mod:`naiad.redis_server`)."""
    server = stack.enter_context(embedded(appendonly=True, password=True))
    server.supervise()
    return server.url


def cmd_serve(settings: Settings, with_gateway: bool = True, with_scaler: bool = True) -> int:
    from naiad.redis_server import EmbeddedRedis  # noqa: PLC0415

    if not (with_gateway and with_scaler) and not settings.redis_url:
        print("naiad: --redis-url is required unless running `naiad serve`", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as stack:
        redis_url = settings.redis_url or _embedded_redis(stack, EmbeddedRedis)
        if with_gateway and with_scaler:
            runners = [_serve_runner(settings, redis_url)]
        elif with_scaler:
            runners = [_scaler_runner(settings, redis_url)]
        else:
            runners = [_gateway_runner(settings, redis_url)]
        try:
            eventloop.run(_until_signal(*runners, grace_s=settings.shutdown_grace_s))
        except OSError as exc:  # a port already taken, an address that cannot be bound
            print(f"naiad: cannot serve: {exc}", file=sys.stderr)
            return 1
    return 0


def cmd_worker(settings: Settings, model: str) -> int:
    from workers.worker import Worker  # noqa: PLC0415

    if not settings.redis_url:
        print("naiad worker: --redis-url is required", file=sys.stderr)
        return 2
    return eventloop.run(Worker(settings, model, settings.redis_url).run())


def parse_worker_command(argv: Sequence[str]) -> tuple[Settings, str]:
    """The settings and model of a ``worker --model M ...`` command line (without the
    interpreter): what a warm-pool process is told to run when it is claimed."""
    args = build_parser().parse_args(list(argv))
    if args.command != "worker" or not args.model:
        raise ValueError(f"not a 'worker --model' command: {list(argv)!r}")
    return _settings(args), args.model


def cmd_pool_worker(settings: Settings) -> int:
    """``naiad worker --pool``: see :mod:`workers.warm_pool`."""
    from workers import warm_pool  # noqa: PLC0415

    if not settings.redis_url:
        print("naiad worker: --redis-url is required", file=sys.stderr)
        return 2
    return eventloop.run(warm_pool.serve_claim(settings, parse_worker_command))


def cmd_deploy(args: argparse.Namespace, settings: Settings) -> int:
    """``naiad deploy``: validate (nothing is uploaded unless it passes), then upload only
    new or changed files with a progress bar. Exit 1 with a message on any problem."""
    from naiad.errors import NaiadError  # noqa: PLC0415
    from repository_store import open_store  # noqa: PLC0415
    from repository_store.deploy import plan_upload, upload, validate_model_dir  # noqa: PLC0415

    try:
        load_check = None
        if args.load_check:
            from workers.load_check import load_check  # noqa: PLC0415
        store = open_store(settings.model_repository)
        store.check()
        model = validate_model_dir(args.model_dir, args.name, load_check, repository=store)
        plan = plan_upload(model, store)
        if plan.uploads or plan.folders:
            _upload_with_progress(plan, store, upload)
    except (NaiadError, ImportError) as exc:
        print(f"naiad deploy: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 1
    folders = f", {len(plan.folders)} empty version folders created" if plan.folders else ""
    print(f"deployed '{model.name}' (versions {', '.join(map(str, model.versions))}) to {store.uri}: "
          f"{len(plan.uploads)} files uploaded, {len(plan.unchanged)} unchanged{folders}")
    return 0


def _upload_with_progress(plan, store, upload) -> None:
    import rich.progress as rp  # noqa: PLC0415
    from rich.console import Console  # noqa: PLC0415

    columns = (rp.TextColumn("{task.description}"), rp.BarColumn(), rp.DownloadColumn(),
               rp.TransferSpeedColumn(), rp.TimeRemainingColumn())
    with rp.Progress(*columns, console=Console(stderr=True)) as progress:
        task = progress.add_task(f"uploading {plan.model.name}", total=plan.total_bytes)
        upload(plan, store, lambda n: progress.advance(task, n),
               lambda rel: progress.update(task, description=f"{plan.model.name}/{rel}"))


def cmd_k8s_render(args: argparse.Namespace, settings: Settings) -> int:
    """``naiad k8s render``: one manifest file per model of the repository."""
    from infra.render import RenderOptions, render_repository  # noqa: PLC0415
    from naiad.errors import RepositoryError  # noqa: PLC0415

    options = RenderOptions(settings.model_repository, args.image_worker, args.namespace, args.redis_address,
                            args.redis_secret)
    try:
        written = render_repository(options, args.out, settings)
    except RepositoryError as exc:
        print(f"naiad k8s render: {exc.message}", file=sys.stderr)
        return 1
    for name, path in written.items():
        print(f"{name}: {path}")
    return 0


def _check_access(settings: Settings) -> None:
    """Refuse malformed restricted-API groups at start (ValueError; never echoes a key)."""
    if settings.http_restricted_api or settings.grpc_restricted_protocol:
        from gateway.access import AccessPolicy  # noqa: PLC0415

        AccessPolicy(settings.http_restricted_api, "--http-restricted-api")
        AccessPolicy(settings.grpc_restricted_protocol, "--grpc-restricted-protocol")


def main(argv: Sequence[str] | None = None) -> int:
    procs.adopt_parent_death()  # a worker started by the scaler dies with it
    procs.take_ready_fd()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        given = procs.take_settings_json()  # a sibling gateway process (gateway.siblings)
        settings = Settings.model_validate_json(given) if given else _settings(args, procs.take_redis_url())
        procs.forget_secrets()  # read into settings: out of the environment model code sees
        _check_access(settings)
    except ValueError as exc:  # a malformed --cache-config, --http-restricted-api ...
        parser.error(str(exc))
    if args.command == "status":
        from gateway.status import run_status  # noqa: PLC0415

        return run_status(args.redis_url, once=args.once, interval_s=args.interval)
    try:
        logs.configure(settings)
    except ValueError as exc:  # an unknown --log-level
        parser.error(str(exc))
    try:
        tracing.setup(settings, f"naiad-{args.command}")
    except RuntimeError as exc:  # --trace without the 'trace' extra, a bad OTEL_TRACES_EXPORTER
        parser.error(str(exc))
    try:
        if args.command == "deploy":
            return cmd_deploy(args, settings)
        if args.command == "k8s":
            return cmd_k8s_render(args, settings)
        if args.command == "serve":
            return cmd_serve(settings)
        if args.command == "gateway":
            return cmd_serve(settings, with_scaler=False)
        if args.command == "scaler":
            return cmd_serve(settings, with_gateway=False)
        if args.pool:
            return cmd_pool_worker(settings)
        return cmd_worker(settings, args.model)
    finally:
        tracing.shutdown()  # flushes spans not yet exported


if __name__ == "__main__":
    sys.exit(main())
