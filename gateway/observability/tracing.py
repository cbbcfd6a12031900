"""OpenTelemetry traces of generation requests, exported over OTLP, configured by the standard ``OTEL_*`` variables.

Off unless the environment asks for it (an OTLP endpoint, or ``OTEL_TRACES_EXPORTER``): then one span per request
(``POST /v1/chat/completions``, a child of the client's ``traceparent`` when it sent one) with children for its
phases: ``admission`` (body, route, prefix match, and within it the ``decision``), ``hold`` when the request waits
at the gateway, ``upstream`` per backend tried (whose span the backend is named as parent in the ``traceparent`` it
is sent) and within it ``first_token``, from sending to the first token. Off, the request path tests one boolean
per phase and creates no span, and the client's ``traceparent`` is passed on to the backend unchanged
(:mod:`gateway.observability.trace_context`).

Spans go through the SDK's batch processor (``OTEL_BSP_*``), off the request path; the sampler, resource and
exporter settings are the SDK's own (``OTEL_TRACES_SAMPLER``, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_EXPORTER_OTLP_*``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Mapping
from contextvars import Token
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from spillgate.gateway.observability.trace_context import TraceHeaders, traceparent

log = logging.getLogger("spillgate.tracing")

_OFF: contextlib.nullcontext[None] = contextlib.nullcontext()
_PROPAGATOR = TraceContextTextMapPropagator()
_SERVICE_NAME = "spillgate"
RequestTrace = tuple[Span, Token[Context]]
"""A request's span and the context token that made it current."""


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the environment asks for traces: an OTLP endpoint, or an exporter other than ``none``."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = _exporter_names(environ)
    if exporters is not None:
        return any(name != "none" for name in exporters)
    return bool(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def _exporter_names(environ: Mapping[str, str]) -> list[str] | None:
    value = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    return [name.strip() for name in value.split(",") if name.strip()] if value else None


def exporters_from(environ: Mapping[str, str]) -> list[SpanExporter]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names (default ``otlp``, over HTTP/protobuf); ``console`` prints
    spans. Unknown names are logged and skipped."""
    found: list[SpanExporter] = []
    for name in _exporter_names(environ) or ["otlp"]:
        if name == "otlp":
            protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            if protocol and protocol != "http/protobuf":
                log.warning("OTLP protocol %r is not supported: traces are sent over http/protobuf", protocol)
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            found.append(OTLPSpanExporter())
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            found.append(ConsoleSpanExporter())
        elif name != "none":
            log.warning("OTEL_TRACES_EXPORTER names %r, which spillgate does not have: skipped", name)
    return found


def provider_from(environ: Mapping[str, str], processors: list[SpanProcessor] | None = None) -> TracerProvider:
    """A tracer provider with the SDK's resource and sampler settings, exporting through ``processors`` (default:
    one batch processor per exporter the environment names)."""
    from opentelemetry.sdk.resources import Resource

    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": _SERVICE_NAME}))
    provider = TracerProvider(resource=resource)
    for processor in processors if processors is not None else [BatchSpanProcessor(e) for e in exporters_from(environ)]:
        provider.add_span_processor(processor)
    return provider


class Tracing:
    """The gateway's tracer: ``on`` is the one boolean the request path tests; without a provider, all is off."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        self.on = provider is not None
        self._provider = provider
        self._tracer = provider.get_tracer("spillgate") if provider is not None else trace.NoOpTracer()

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Tracing:
        environ = os.environ if environ is None else environ
        return cls(provider_from(environ)) if wanted(environ) else cls()

    def shutdown(self) -> None:
        """Export what is left; called once the server has stopped."""
        if self._provider is not None:
            self._provider.shutdown()

    def start_request(self, name: str, client: TraceHeaders, attributes: Mapping[str, Any]) -> RequestTrace:
        """A request's span, under the client's trace if it sent one, made current for the phases within it."""
        parent = _PROPAGATOR.extract({key.decode(): value.decode() for key, value in client}) if client else None
        span = self._tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)
        return span, otel_context.attach(trace.set_span_in_context(span))

    def end_request(self, request: RequestTrace, attributes: Mapping[str, Any], *, failed: bool) -> None:
        span, token = request
        span.set_attributes(attributes)
        if failed:
            span.set_status(Status(StatusCode.ERROR))
        span.end()
        otel_context.detach(token)

    def phase(self, name: str, **attributes: Any) -> contextlib.AbstractContextManager[Span | None]:
        """A child span of the current one for the ``with`` block; nothing at all while tracing is off."""
        if not self.on:
            return _OFF
        return self._tracer.start_as_current_span(name, attributes=attributes)

    def interval(self, name: str, start: float, end: float, **attributes: Any) -> None:
        """A child span of the current one that already happened, between two ``time.perf_counter()`` readings."""
        now_ns, now = time.time_ns(), time.perf_counter()
        span = self._tracer.start_span(
            name, start_time=now_ns - int((now - start) * 1e9), attributes=attributes or None
        )
        span.end(end_time=now_ns - int((now - end) * 1e9))

    @staticmethod
    def outgoing() -> TraceHeaders:
        """The trace headers naming the current span as the parent of what is sent now."""
        context = trace.get_current_span().get_span_context()
        if not context.is_valid:
            return ()
        parent = ((b"traceparent", traceparent(context.trace_id, context.span_id, int(context.trace_flags))),)
        state = context.trace_state.to_header()
        return (*parent, (b"tracestate", state.encode())) if state else parent

    @staticmethod
    def trace_id(request: RequestTrace) -> str:
        return format(request[0].get_span_context().trace_id, "032x")
