"""`--tracing`: spans reach an OTLP/gRPC collector (an in-process one speaking OpenTelemetry's own protos) with the
anchors' span names, continue the caller's trace, and the context goes upstream in the routed request's headers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from e2e.harness.ports import free_ports
from e2e.harness.procs import EppProcess
from tests.server.support import DEST, body_msg, exchange, headers_msg, set_headers

pytestmark = pytest.mark.e2e

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[tuple[Any, Any]] = []  # (resource, span)

    async def Export(self, request: Any, context: object) -> trace_service_pb2.ExportTraceServiceResponse:
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                self.spans.extend((rs.resource, s) for s in ss.spans)
        return trace_service_pb2.ExportTraceServiceResponse()


async def test_spans_exported_and_propagated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    collector = Collector()
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    (port,) = free_ports(1)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "1.0")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    cfg = tmp_path / "epp.yaml"
    cfg.write_text("endpoints: [{address: 10.0.0.1, port: 8000}]\n")
    p = EppProcess(cfg, tmp_path, extra_args=["--tracing"])  # the kit passes --tracing=false first; this wins
    try:
        await asyncio.to_thread(p.wait_ready, 60)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{p.ports.grpc}") as ch:
            call = pb_grpc.ExternalProcessorStub(ch).Process()
            traceparent = f"00-{TRACE_ID}-{PARENT_ID}-01"
            msgs = [headers_msg(extra={"traceparent": traceparent}), body_msg(b'{"model":"m","prompt":"x"}', True)]
            first, _ = await exchange(call, msgs, 2)
            hs = set_headers(first)
            assert hs[DEST] == "10.0.0.1:8000"
            _version, trace_id, span_id, flags = hs["traceparent"].split("-")
            assert trace_id == TRACE_ID and span_id != PARENT_ID and flags == "01"
            await call.done_writing()
            await call.read()
        for _ in range(100):
            if len(collector.spans) >= 2:
                break
            await asyncio.sleep(0.1)
        by_name = {s.name: (r, s) for r, s in collector.spans}
        assert {"gateway.request", "gateway.request_orchestration"} <= set(by_name)
        resource, request_span = by_name["gateway.request"]
        _, orchestration = by_name["gateway.request_orchestration"]
        assert request_span.trace_id.hex() == TRACE_ID and request_span.parent_span_id.hex() == PARENT_ID
        assert request_span.span_id.hex() == span_id  # the upstream request continues this span
        assert orchestration.parent_span_id == request_span.span_id
        attrs = {a.key: a.value.string_value for a in request_span.attributes}
        assert attrs["gen_ai.request.model"] == "m" and attrs["x-gateway-destination-endpoint"] == "10.0.0.1:8000"
        service = {a.key: a.value.string_value for a in resource.attributes}["service.name"]
        assert service == "llm-d-epp"
    finally:
        p.stop()
        await server.stop(0)
