"""`--tracing` (default true, as the anchors): OpenTelemetry spans over OTLP/gRPC, set up as llm-d-router's
InitTracing does it: OTEL_SERVICE_NAME defaults to `llm-d-epp`, and the sampler is parentbased_traceidratio with
OTEL_TRACES_SAMPLER_ARG (default 0.1; another OTEL_TRACES_SAMPLER is logged and replaced, as there). W3C trace
context and baggage propagate.

Spans are exported only to a configured collector (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT,
as the anchors' charts set when tracing is enabled): with neither set the EPP says so once and creates no spans,
instead of logging a failed export to localhost:4317 every few seconds. A configured collector that cannot be
reached costs one warning a minute, without a traceback.

Per request: `gateway.request` (request headers to the end of the response, parented on the caller's traceparent),
with `gateway.request_orchestration` around scheduling; the picked request carries the context upstream (traceparent
added to the request headers Envoy forwards). Spans are exported in batches by a background thread, never on the
request path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "llm-d-epp"
ENDPOINT_ENV = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
# Where the OTel SDK logs failed exports (the exporter, the batch processor and its shared worker).
EXPORT_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.sdk.trace.export",
    "opentelemetry.sdk._shared_internal",
)
QUIET_SECONDS = 60.0


def configured_endpoint() -> str | None:
    """The collector the environment names, or None (then nothing is exported)."""
    for key in ENDPOINT_ENV:
        if os.environ.get(key):
            return os.environ[key]
    return None


def start_tracing() -> Tracing | None:
    """`--tracing`: spans to the configured collector, or None (said once) when there is none."""
    endpoint = configured_endpoint()
    if endpoint is None:
        log.info("tracing: no collector configured (OTEL_EXPORTER_OTLP_ENDPOINT); no spans are exported")
        return None
    return Tracing(endpoint)


class ExportFailures(logging.Filter):
    """A failed export is one WARNING line (no traceback) per QUIET_SECONDS; the rest are dropped."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        super().__init__()
        self.clock = clock
        self.last: float | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        now = self.clock()
        if self.last is not None and now - self.last < QUIET_SECONDS:
            return False
        self.last = now
        cause = record.exc_info[1] if record.exc_info and record.exc_info[1] is not None else None
        record.msg = f"tracing: {record.getMessage()}" + (f" ({type(cause).__name__}: {cause})" if cause else "")
        record.args = None
        record.exc_info = None
        record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def _sampler() -> ParentBased:
    kind = os.environ.get("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    try:
        ratio = float(os.environ.get("OTEL_TRACES_SAMPLER_ARG", "0.1"))
    except ValueError:
        ratio = 0.1
    if kind != "parentbased_traceidratio":
        log.error("tracing: unsupported sampler type %s, fallback to parentbased_traceidratio with 0.1 Ratio", kind)
        ratio = 0.1
    return ParentBased(TraceIdRatioBased(ratio))


class Tracing:
    def __init__(self, endpoint: str) -> None:
        os.environ.setdefault("OTEL_SERVICE_NAME", DEFAULT_SERVICE_NAME)
        insecure = not endpoint.startswith("https://")
        self.provider = TracerProvider(
            sampler=_sampler(), resource=Resource.create({"service.name": os.environ["OTEL_SERVICE_NAME"]})
        )
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=insecure)))
        failures = ExportFailures()
        for name in EXPORT_LOGGERS:
            logging.getLogger(name).addFilter(failures)
        self.tracer = self.provider.get_tracer("pyepp")
        self.propagator = CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
        propagate.set_global_textmap(self.propagator)
        log.info("tracing: OTLP to %s as %s", endpoint, os.environ["OTEL_SERVICE_NAME"])

    def start_request(self, headers: Mapping[str, str]) -> Span:
        parent = self.propagator.extract(carrier=dict(headers))
        return self.tracer.start_span("gateway.request", context=parent, kind=SpanKind.SERVER)

    @contextlib.contextmanager
    def orchestration(self, span: Span | None) -> Iterator[None]:
        if span is None:
            yield
            return
        child = self.tracer.start_span("gateway.request_orchestration", context=trace.set_span_in_context(span))
        try:
            yield
        except Exception as e:
            child.set_status(Status(StatusCode.ERROR, type(e).__name__))
            raise
        finally:
            child.end()

    def inject(self, span: Span) -> dict[str, str]:
        carrier: dict[str, str] = {}
        self.propagator.inject(carrier, context=trace.set_span_in_context(span))
        return carrier

    @staticmethod
    def finish(span: Span, attributes: Mapping[str, Any], error: str | None = None) -> None:
        for k, v in attributes.items():
            if v is not None and v != "":
                span.set_attribute(k, v)
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()

    def shutdown(self) -> None:
        self.provider.shutdown()
