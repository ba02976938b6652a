"""The OpenTelemetry SDK set up for a Brook process (imported only by `tracing.configure`,
when the environment asks for tracing and the `otel` extra is installed)."""

from __future__ import annotations

import json
import os
import sys

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)


def _one_line(span: ReadableSpan) -> str:
    """A span as one line of JSON, like every other line a Brook process prints."""
    return json.dumps(json.loads(span.to_json()), separators=(",", ":")) + os.linesep


def _exporters() -> list[tuple[SpanExporter, bool]]:
    """(exporter, batched) for each name in OTEL_TRACES_EXPORTER (default `otlp`)."""
    names = [n.strip().lower() for n in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    out: list[tuple[SpanExporter, bool]] = []
    for name in names:
        if name == "console":
            out.append((ConsoleSpanExporter(out=sys.stdout, formatter=_one_line), False))
        elif name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            out.append((OTLPSpanExporter(), True))
    return out


def install(role: str) -> None:
    """A tracer provider for this process, unless the application set one already."""
    if isinstance(trace.get_tracer_provider(), TracerProvider):
        return
    name = os.environ.get("OTEL_SERVICE_NAME") or f"brook-{role}"
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    for exporter, batched in _exporters():
        processor = BatchSpanProcessor(exporter) if batched else SimpleSpanProcessor(exporter)
        provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
