"""OpenTelemetry tracing, optional (`pip install 'brook[otel]'`): spans for a job's submit,
its wait and its run, with the W3C trace context stored on the job, so that the run
continues its submitter's trace.

Nothing here imports OpenTelemetry unless it is wanted: tracing is on in a process once a
tracer provider is set there, by the application (a `Client` in a traced program uses the
application's provider) or by `configure` in a Brook process whose environment asks for
it with the standard variables (`OTEL_TRACES_EXPORTER`, `OTEL_EXPORTER_OTLP_ENDPOINT`,
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`; `OTEL_SDK_DISABLED=true` turns it off). Without the
extra, or without those variables, every function here returns at once and Brook imports
nothing of OpenTelemetry (FastAPI may import its API for itself: its native telemetry, a
no-op without a provider).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from brook.common.runtime.log_events import Event, log_event

Carrier = dict[str, str]
TRACER = "brook"
_WANTED = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
)


def active() -> bool:
    """Whether this process traces: OpenTelemetry's API is imported and a tracer provider is
    set (by the application, or by `configure`). A dictionary lookup when it is not
    imported: the untraced path costs nothing more."""
    api = sys.modules.get("opentelemetry.trace")
    if api is None:
        return False
    provider = api.get_tracer_provider()
    return not isinstance(provider, (api.ProxyTracerProvider, api.NoOpTracerProvider))


def wanted(env: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks a Brook process to trace (the standard OTEL_* variables)."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return any(env.get(name) for name in _WANTED)


def configure(role: str) -> bool:
    """Set up the SDK for a Brook process (`api`, `dispatcher`, `worker`) when the environment
    asks for it: a tracer provider named `OTEL_SERVICE_NAME` (default `brook-<role>`), the
    exporters of `OTEL_TRACES_EXPORTER` (`otlp`, the default, configured by the OTEL_EXPORTER_OTLP_*
    variables; `console`, one span per line of JSON on stdout). Whether it traces now."""
    if not wanted():
        return False
    try:
        from brook.common.runtime import tracing_sdk
    except ImportError as exc:
        log_event(
            Event.TRACING_UNAVAILABLE,
            level="warning",
            error=str(exc),
            hint="install the extra: pip install 'brook[otel]'",
        )
        return False
    tracing_sdk.install(role)
    return True


def inject() -> Carrier | None:
    """The current span's W3C trace context (`traceparent`, `tracestate`), to store with a job;
    None when not tracing."""
    if not active():
        return None
    from opentelemetry import propagate

    carrier: Carrier = {}
    propagate.inject(carrier)
    return carrier or None


@contextlib.contextmanager
def span(
    name: str,
    *,
    kind: str = "INTERNAL",
    parent: Mapping[str, str] | None = None,
    links: Sequence[Mapping[str, str]] = (),
    attributes: Mapping[str, Any] | None = None,
    start: datetime | None = None,
) -> Iterator[Any]:
    """A span (the current one inside the block), child of the stored context `parent` if
    given, else of the current span; linked to the stored contexts `links`. Yields the span
    (set attributes on it with `set_attribute`), or None when not tracing."""
    if not active():
        yield None
        return
    from opentelemetry import propagate, trace

    tracer = trace.get_tracer(TRACER)
    context = propagate.extract(dict(parent)) if parent else None
    span_links = []
    for carrier in links:
        linked = trace.get_current_span(propagate.extract(dict(carrier))).get_span_context()
        if linked.is_valid:
            span_links.append(trace.Link(linked))
    with tracer.start_as_current_span(
        name,
        context=context,
        kind=getattr(trace.SpanKind, kind),
        links=span_links,
        attributes={k: v for k, v in (attributes or {}).items() if v is not None},
        start_time=None if start is None else int(start.timestamp() * 1e9),
    ) as current:
        yield current


def record_span(
    name: str,
    *,
    start: datetime,
    end: datetime,
    parent: Mapping[str, str] | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> None:
    """A span that already happened, from two server timestamps (a job's wait)."""
    if not active():
        return
    from opentelemetry import propagate, trace

    tracer = trace.get_tracer(TRACER)
    context = propagate.extract(dict(parent)) if parent else None
    recorded = tracer.start_span(
        name,
        context=context,
        attributes={k: v for k, v in (attributes or {}).items() if v is not None},
        start_time=int(start.timestamp() * 1e9),
    )
    recorded.end(end_time=int(max(end, start).timestamp() * 1e9))


def set_attribute(current: Any, key: str, value: Any) -> None:
    if current is not None and value is not None:
        current.set_attribute(key, value)


def flush() -> None:
    """Export what is buffered (a worker process before it may be killed)."""
    if not active():
        return
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    force_flush = getattr(provider, "force_flush", None)
    if force_flush is not None:
        force_flush()


def instrument_fastapi(app: Any) -> None:
    """FastAPI's instrumentation on the API (a server span per request, continuing a caller's
    `traceparent`), when tracing: FastAPI's own native telemetry where this FastAPI has it
    (it follows the global provider by itself), else OpenTelemetry's instrumentation."""
    if not active() or getattr(app, "_native_telemetry", None) is not None:
        return
    try:
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
    except ImportError:
        return
    FastAPIInstrumentor.instrument_app(app, excluded_urls="healthz,readyz,metrics")
