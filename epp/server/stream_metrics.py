"""`--enable-grpc-stream-metrics`: llm-d-router v0.10's opt-in ext_proc stream metrics (pkg/epp/metrics/
grpc_stream_metrics.go), with its names: streams open now, how long each stayed open, and completions by gRPC code."""

from __future__ import annotations

import asyncio
import time

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from epp.server.extproc import ExtProcServicer, ServerState

BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600)
# grpc.StatusCode -> the Go name (codes.Code.String()), e.g. CANCELLED -> Canceled
_GO_NAMES = {
    grpc.StatusCode.OK: "OK", grpc.StatusCode.CANCELLED: "Canceled", grpc.StatusCode.UNKNOWN: "Unknown",
    grpc.StatusCode.INVALID_ARGUMENT: "InvalidArgument", grpc.StatusCode.DEADLINE_EXCEEDED: "DeadlineExceeded",
    grpc.StatusCode.NOT_FOUND: "NotFound", grpc.StatusCode.ALREADY_EXISTS: "AlreadyExists",
    grpc.StatusCode.PERMISSION_DENIED: "PermissionDenied", grpc.StatusCode.RESOURCE_EXHAUSTED: "ResourceExhausted",
    grpc.StatusCode.FAILED_PRECONDITION: "FailedPrecondition", grpc.StatusCode.ABORTED: "Aborted",
    grpc.StatusCode.OUT_OF_RANGE: "OutOfRange", grpc.StatusCode.UNIMPLEMENTED: "Unimplemented",
    grpc.StatusCode.INTERNAL: "Internal", grpc.StatusCode.UNAVAILABLE: "Unavailable",
    grpc.StatusCode.DATA_LOSS: "DataLoss", grpc.StatusCode.UNAUTHENTICATED: "Unauthenticated",
}  # fmt: skip


class StreamMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.inflight = Gauge(
            "llm_d_epp_extproc_streams_inflight", "Number of ext_proc gRPC streams currently open.", registry=registry
        )
        self.duration = Histogram(
            "llm_d_epp_extproc_stream_duration_seconds",
            "Duration an ext_proc gRPC stream stays open, in seconds.",
            buckets=BUCKETS,
            registry=registry,
        )
        self.total = Counter(
            "llm_d_epp_extproc_streams",
            "Total ext_proc gRPC streams completed, by gRPC status code.",
            ["code"],
            registry=registry,
        )


class MeteredExtProcServicer(ExtProcServicer):
    """ExtProcServicer that records each Process stream (the Go EPP's stream interceptor)."""

    def __init__(self, state: ServerState, metrics: StreamMetrics) -> None:
        super().__init__(state)
        self.metrics = metrics

    async def Process(self, request_iterator: object, context: grpc.aio.ServicerContext) -> None:
        m = self.metrics
        m.inflight.inc()
        start = time.perf_counter()
        failed: list[grpc.StatusCode] = []

        def done(_ctx: object) -> None:
            """At the RPC's end, when gRPC knows whether the client cancelled it."""
            if context.cancelled():
                code = grpc.StatusCode.CANCELLED
            else:
                code = context.code() or (failed[0] if failed else grpc.StatusCode.OK)
            m.inflight.dec()
            m.duration.observe(time.perf_counter() - start)
            m.total.labels(_GO_NAMES.get(code, "Unknown")).inc()

        context.add_done_callback(done)  # type: ignore[arg-type]  # (the stub wants a grpc.aio Call callback)
        try:
            await super().Process(request_iterator, context)
        except asyncio.CancelledError:
            failed.append(grpc.StatusCode.CANCELLED)
            raise
        except Exception:
            failed.append(grpc.StatusCode.UNKNOWN)
            raise
