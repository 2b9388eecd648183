"""OpenTelemetry traces across gateway -> queue -> worker -> backend, when enabled.

Off by default; ``--trace`` (``NAIAD_TRACE=true``) turns it on for a process, and the scaler
passes it to the workers it starts. It needs the ``trace`` extra (``opentelemetry-api``,
``opentelemetry-sdk``, the OTLP/HTTP exporter); nothing here imports ``opentelemetry`` until
:func:`setup` runs with tracing on, so a process without ``--trace`` never loads it, and every
helper below is a cheap no-op then.

Configuration is OpenTelemetry's own environment: ``OTEL_TRACES_EXPORTER`` (``otlp``, the
default, with ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``;
``console``: one JSON span a line on stderr; ``none``), ``OTEL_TRACES_SAMPLER`` and
``OTEL_TRACES_SAMPLER_ARG`` (read by the SDK), ``OTEL_SERVICE_NAME`` (default
``naiad-<command>``), ``OTEL_RESOURCE_ATTRIBUTES``.

Spans (names are stable; attributes ``naiad.model``, ``naiad.version``, ``naiad.request_id``):

- gateway ``naiad.infer`` (SERVER) around :meth:`gateway.dataplane.DataPlane.infer`, with a
  child ``naiad.enqueue`` (PRODUCER) whose context travels in the queue message as a W3C
  ``traceparent`` (header key ``tp``, :mod:`naiad.codec`);
- worker ``naiad.queue`` per request: enqueue time to batch start, child of ``naiad.enqueue``;
- worker ``naiad.batch`` (CONSUMER): child of the first request's ``naiad.enqueue``, linked
  to every request's; its child ``naiad.backend`` is the model run itself.

The SDK's provider is kept here, not installed globally, so tests can set one up with their
own exporter (:func:`setup` ``exporter=``) and shut it down again.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from naiad.settings import Settings

_tracer: Any = None
_provider: Any = None


def enabled() -> bool:
    return _tracer is not None


def _console_exporter() -> Any:
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter  # noqa: PLC0415

    return ConsoleSpanExporter(out=sys.stderr, formatter=lambda span: span.to_json(indent=None) + "\n")


def _exporter_from_env() -> tuple[Any, bool]:
    """``(exporter or None, batched)`` per ``OTEL_TRACES_EXPORTER`` (first of a list)."""
    name = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")[0].strip().lower()
    if name == "none":
        return None, False
    if name == "console":
        return _console_exporter(), False  # every span at once: a worker may exit any time
    if name == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: PLC0415

        return OTLPSpanExporter(), True
    raise RuntimeError(f"OTEL_TRACES_EXPORTER={name!r} is not supported (otlp, console or none)")


def setup(settings: Settings | None, service: str, exporter: Any = None) -> bool:
    """Start tracing for this process when ``settings.trace`` is set or an ``exporter`` is
    given (tests: e.g. the SDK's ``InMemorySpanExporter``, exported synchronously). Returns
    whether tracing is on. Raises RuntimeError when the ``trace`` extra is missing."""
    global _tracer, _provider
    if exporter is None and not (settings is not None and settings.trace):
        return False
    try:
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor  # noqa: PLC0415

        batched = False
        if exporter is None:
            exporter, batched = _exporter_from_env()
    except ImportError as exc:
        raise RuntimeError(f"--trace needs the 'trace' extra (pip install 'naiad[trace]'): {exc}") from None
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": service}
    provider = TracerProvider(resource=Resource.create(attributes))
    if exporter is not None:
        processor = BatchSpanProcessor if batched else SimpleSpanProcessor
        provider.add_span_processor(processor(exporter))
    _provider, _tracer = provider, provider.get_tracer("naiad")
    return True


def shutdown() -> None:
    """Export what is pending and stop tracing (a no-op when it is off)."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


def _context(traceparent: str | None) -> Any:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator  # noqa: PLC0415

    return TraceContextTextMapPropagator().extract({"traceparent": traceparent} if traceparent else {})


def _links(traceparents: Sequence[str | None]) -> list[Any]:
    from opentelemetry import trace  # noqa: PLC0415

    contexts = (trace.get_current_span(_context(tp)).get_span_context() for tp in traceparents if tp)
    return [trace.Link(context) for context in contexts if context.is_valid]


def _kind(kind: str) -> Any:
    from opentelemetry.trace import SpanKind  # noqa: PLC0415

    return SpanKind[kind.upper()]


def span(
    name: str,
    attributes: Mapping[str, Any] | None = None,
    *,
    kind: str = "internal",
    parent: str | None = None,
    links: Sequence[str | None] = (),
) -> contextlib.AbstractContextManager[Any]:
    """A span around the block, current within it (child of the current span, or of the
    W3C ``parent`` traceparent when given; linked to ``links``). Yields None when off (a
    plain ``nullcontext``: no generator on the request path)."""
    if _tracer is None:
        return _OFF
    return _span(name, attributes, kind, parent, links)


_OFF = contextlib.nullcontext()


@contextlib.contextmanager
def _span(
    name: str, attributes: Mapping[str, Any] | None, kind: str, parent: str | None,
    links: Sequence[str | None],
) -> Iterator[Any]:  # fmt: skip
    context = _context(parent) if parent is not None else None
    with _tracer.start_as_current_span(
        name, context=context, kind=_kind(kind), attributes=attributes, links=_links(links)
    ) as current:
        yield current


def record(
    name: str, start_ns: int, end_ns: int, attributes: Mapping[str, Any] | None = None,
    *, parent: str | None = None,
) -> None:
    """A span that already happened (e.g. the wait in the queue), from Unix-epoch ns."""
    if _tracer is None:
        return
    context = _context(parent) if parent is not None else None
    done = _tracer.start_span(name, context=context, attributes=attributes, start_time=start_ns)
    done.end(end_time=max(start_ns, end_ns))


def traceparent() -> str | None:
    """The current span's W3C ``traceparent`` (None when off or outside a span)."""
    if _tracer is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator  # noqa: PLC0415

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent")
