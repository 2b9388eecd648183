"""The ``naiad`` command line: ``serve``, ``gateway``, ``scaler`` and ``worker``.

Flags mirror ``tritonserver`` where it has one; each flag also reads from ``NAIAD_<NAME>``
(see :class:`naiad.settings.Settings`). Each command imports only what it runs, so a worker
process never loads the web stack and the gateway never loads an ML framework.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence

from naiad import logs, tracing
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
    "--redis-url": ("redis_url", str, "redis:// or unix:// URL (serve: default embedded redis-server)"),
    "--log-level": ("log_level", str, "DEBUG, INFO, WARNING or ERROR"),
    "--idle-timeout": ("idle_timeout_s", float, "seconds without requests before a worker exits"),
    "--cache-dir": ("cache_dir", str, "local cache of pulled model versions"),
    "--log-format": ("log_format", "text|json", "text (default) or json: one JSON object a line"),
    "--log-verbose": ("log_verbose", int, "Triton's verbose level: 1 DEBUG for naiad, 2 for libraries too"),
    "--log-info": ("log_info", _bool, "true (default) or false: INFO records"),
    "--log-warning": ("log_warning", _bool, "true (default) or false: WARNING records"),
    "--log-error": ("log_error", _bool, "true (default) or false: ERROR records"),
}
GATEWAY_FLAGS = {
    "--http-port": ("http_port", int, "KServe v2 HTTP port (default 8000)"),
    "--grpc-port": ("grpc_port", int, "KServe v2 gRPC port (default 8001)"),
    "--metrics-port": ("metrics_port", int, "Prometheus metrics port (default 8002)"),
    "--request-timeout": ("request_timeout_s", float, "default request timeout, seconds"),
    "--model-control-mode": ("model_control_mode", "none|poll|explicit", "none (default), poll or explicit"),
    "--repository-poll-secs": ("repository_poll_secs", float, "poll mode: seconds between re-indexings"),
    "--load-model": ("load_model", list, "explicit mode: model to load at start, repeatable ('*': all)"),
    "--cache-config": ("cache_config", list, "response cache, repeatable: redis,max_bytes=N | "
                       "redis,ttl_s=SECONDS | redis,enable=false (default 256 MiB, 1 h)"),
}


def _add(parser: argparse.ArgumentParser, flags: dict) -> None:
    for flag, (dest, kind, text) in flags.items():
        if kind is list:  # repeatable
            parser.add_argument(flag, dest=dest, action="append", help=text, default=argparse.SUPPRESS)
        elif isinstance(kind, str):  # one of the '|'-separated choices
            choices = kind.split("|")
            parser.add_argument(flag, dest=dest, choices=choices, help=text, default=argparse.SUPPRESS)
        else:
            parser.add_argument(flag, dest=dest, type=kind, help=text, default=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="naiad", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text, flags in (
        ("serve", "gateway + scaler (+ embedded Redis) on one machine", GATEWAY_FLAGS),
        ("gateway", "the stateless gateway only", GATEWAY_FLAGS),
        ("scaler", "the local scaler only", {}),
        ("worker", "one worker process for one model", {}),
    ):
        sub = commands.add_parser(name, help=text)
        _add(sub, COMMON_FLAGS | flags)
        sub.add_argument("--trace", dest="trace", action="store_true", default=argparse.SUPPRESS,
                         help="OpenTelemetry spans (the 'trace' extra; exporter from OTEL_* variables)")
        if name == "worker":
            sub.add_argument("--model", required=True, help="model name in the repository")
    status = commands.add_parser("status", help="live view of models, workers, queues (Ctrl-C ends)")
    status.add_argument("--redis-url", required=True, help="the Redis the gateways and workers use")
    status.add_argument("--once", action="store_true", help="print one snapshot and exit")
    status.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    fields = set(Settings.model_fields)
    values = {k: v for k, v in vars(args).items() if k in fields}
    return Settings(**values, **parse_cache_config(getattr(args, "cache_config", [])))


async def _until_signal(*runners) -> None:
    """Run ``runners(stop_event)`` until SIGINT/SIGTERM, then let each finish cleanly."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(runner(stop)) for runner in runners]
    done, _ = await asyncio.wait([asyncio.create_task(stop.wait()), *tasks],
                                 return_when=asyncio.FIRST_COMPLETED)
    stop.set()
    for task in tasks:
        if task in done:
            task.result()
    await asyncio.gather(*tasks)


def _scaler_runner(settings: Settings, redis_url: str):
    from workers.scaler import LocalScaler  # noqa: PLC0415

    async def run(stop: asyncio.Event) -> None:
        task = asyncio.create_task(LocalScaler(settings, redis_url).run())
        await stop.wait()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return run


def _gateway_runner(settings: Settings, redis_url: str):
    from gateway.server import run_gateway  # noqa: PLC0415

    return lambda stop: run_gateway(settings, redis_url, stop)


def cmd_serve(settings: Settings, with_gateway: bool = True, with_scaler: bool = True) -> int:
    from naiad.redis_server import EmbeddedRedis  # noqa: PLC0415

    if not (with_gateway and with_scaler) and not settings.redis_url:
        print("naiad: --redis-url is required unless running `naiad serve`", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as stack:
        redis_url = settings.redis_url or stack.enter_context(EmbeddedRedis()).url
        runners = []
        if with_scaler:
            runners.append(_scaler_runner(settings, redis_url))
        if with_gateway:
            runners.append(_gateway_runner(settings, redis_url))
        try:
            asyncio.run(_until_signal(*runners))
        except OSError as exc:  # a port already taken, an address that cannot be bound
            print(f"naiad: cannot serve: {exc}", file=sys.stderr)
            return 1
    return 0


def cmd_worker(settings: Settings, model: str) -> int:
    from workers.worker import Worker  # noqa: PLC0415

    if not settings.redis_url:
        print("naiad worker: --redis-url is required", file=sys.stderr)
        return 2
    return asyncio.run(Worker(settings, model, settings.redis_url).run())


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = _settings(args)
    except ValueError as exc:  # a malformed --cache-config
        parser.error(str(exc))
    if args.command == "status":
        from naiad.status import run_status  # noqa: PLC0415

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
        if args.command == "serve":
            return cmd_serve(settings)
        if args.command == "gateway":
            return cmd_serve(settings, with_scaler=False)
        if args.command == "scaler":
            return cmd_serve(settings, with_gateway=False)
        return cmd_worker(settings, args.model)
    finally:
        tracing.shutdown()  # flushes spans not yet exported


if __name__ == "__main__":
    sys.exit(main())
