"""Helpers shared by the server tests: ext_proc messages, a director that records its calls, an EPP
served over gRPC on loopback (the `epp` fixture in conftest.py), a real one built from a config, and a bare
`ServerState` for driving a `RequestStream` by hand."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from prometheus_client import CollectorRegistry

from e2e.harness.directors import RoundRobinDirector
from epp.config import parse_config
from epp.datalayer.datastore import Datastore
from epp.framework.types import Endpoint, InferenceRequest, Usage
from epp.requestcontrol.types import RoutingDecision
from epp.server.extproc import ServerState
from epp.server.metrics import RequestMetrics
from epp.server.runner import EppServer, ServeOptions

DEST = "x-gateway-destination-endpoint"


Mode = processing_mode_pb2.ProcessingMode


@dataclass
class RecordingDirector:
    """Round-robin, plus a record of every call; `fail` makes handle_request raise it."""

    inner: RoundRobinDirector
    completes_before_last_answer: bool = False
    fail: BaseException | None = None
    fail_response_headers: bool = False
    fallbacks: bool = False
    metadata: dict[str, object] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    set_response_headers: dict[str, str] = field(default_factory=dict)  # as session-affinity's response hook does
    requests: list[InferenceRequest] = field(default_factory=list)
    response_headers: list[tuple[int, str | None]] = field(default_factory=list)
    completed: list[tuple[str, Usage | None]] = field(default_factory=list)
    chunks: list[tuple[bytes, bool, bool]] = field(default_factory=list)

    async def handle_request(self, request: InferenceRequest, *, defer_records: bool = False) -> RoutingDecision:
        self.requests.append(request)
        if self.fail is not None:
            raise self.fail
        d = await self.inner.handle_request(request)
        if self.fallbacks:
            d.endpoints = list(self.inner._view.endpoints())[::-1]
        d.metadata.update(self.metadata)
        d.headers.update(self.headers)
        return d

    def handle_response_headers(
        self,
        request: InferenceRequest,
        decision: RoutingDecision,
        status: int,
        served: str | None,
        headers: Mapping[str, str],
    ) -> None:
        self.response_headers.append((status, served))
        decision.response_headers.update(self.set_response_headers)
        if self.fail_response_headers:
            raise RuntimeError("plugin bug")

    def handle_response_chunk(
        self, request: InferenceRequest, decision: RoutingDecision | None, data: bytes, first: bool, end: bool
    ) -> None:
        self.chunks.append((data, first, end))

    def run_deferred(self) -> None:
        self.inner.run_deferred()

    def handle_response_complete(
        self, request: InferenceRequest, decision: RoutingDecision | None, usage: Usage | None
    ) -> None:
        self.completed.append((request.request_id, usage))


@dataclass
class Harness:
    server: EppServer
    director: RecordingDirector
    channel: grpc.aio.Channel
    stub: pb_grpc.ExternalProcessorStub
    registry: CollectorRegistry


def headers_msg(
    path: str = "/v1/completions",
    method: str = "POST",
    eos: bool = False,
    extra: dict[str, str] | None = None,
    mode: int = Mode.FULL_DUPLEX_STREAMED,
    subset: list[str] | None = None,
) -> pb.ProcessingRequest:
    hs = {":path": path, ":method": method, ":authority": "gw", "x-request-id": "rid-1", **(extra or {})}
    msg = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in hs.items()]
            ),
            end_of_stream=eos,
        ),
        protocol_config=pb.ProtocolConfiguration(request_body_mode=mode, response_body_mode=mode),
    )
    if subset is not None:
        msg.metadata_context.filter_metadata["envoy.lb.subset_hint"].update(
            {"x-gateway-destination-endpoint-subset": subset}
        )
    return msg


def body_msg(data: bytes, eos: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=eos))


def resp_headers_msg(
    status: int = 200,
    ctype: str = "application/json",
    served: str | None = None,
    extra: dict[str, str] | None = None,
    eos: bool = False,
) -> pb.ProcessingRequest:
    hs = {":status": str(status), "content-type": ctype, **(extra or {})}
    msg = pb.ProcessingRequest(
        response_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in hs.items()]
            ),
            end_of_stream=eos,
        )
    )
    if served:
        msg.metadata_context.filter_metadata["envoy.lb"].update({"x-gateway-destination-endpoint-served": served})
    return msg


def resp_body_msg(data: bytes, eos: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=data, end_of_stream=eos))


def set_headers(resp: pb.ProcessingResponse) -> dict[str, str]:
    which = resp.request_headers if resp.HasField("request_headers") else resp.request_body
    return {h.header.key: h.header.raw_value.decode() for h in which.response.header_mutation.set_headers}


def mutation(common: pb.CommonResponse) -> tuple[dict[str, str], list[str]]:
    """(set headers, removed headers) of a response's header mutation."""
    m = common.header_mutation
    return {h.header.key: h.header.raw_value.decode() for h in m.set_headers}, list(m.remove_headers)


async def exchange(
    call: grpc.aio.StreamStreamCall, msgs: list[pb.ProcessingRequest], expect: int
) -> list[pb.ProcessingResponse]:
    for m in msgs:
        await call.write(m)
    out = []
    for _ in range(expect):
        r = await asyncio.wait_for(call.read(), 5)
        assert r is not grpc.aio.EOF
        out.append(r)
    return out


async def real_server(text: str, **opts: Any) -> tuple[EppServer, grpc.aio.Channel, pb_grpc.ExternalProcessorStub]:
    from epp.wiring.runtime import build_runtime

    runtime = build_runtime(parse_config(text))
    registry = CollectorRegistry()
    options = ServeOptions(bind_address="127.0.0.1", grpc_port=0, grpc_health_port=0, metrics_port=0, **opts)
    server = EppServer(runtime, options, registry=registry, metrics=RequestMetrics(registry))
    await server.start()
    for _ in range(200):
        if runtime.datastore.synced:
            break
        await asyncio.sleep(0.01)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.ports['grpc']}")
    return server, channel, pb_grpc.ExternalProcessorStub(channel)


def bare_server(ds: Datastore, grpc_port: int = 0) -> EppServer:
    """An EppServer (not started) over `ds`, no config, a round-robin director and no endpoint source: `ds.synced`
    is the test's to set."""
    from epp.wiring.runtime import Runtime

    runtime = Runtime(config=parse_config(""), datastore=ds, director=RoundRobinDirector(ds), sources=[])
    registry = CollectorRegistry()
    opts = ServeOptions(bind_address="127.0.0.1", grpc_port=grpc_port, grpc_health_port=0, metrics_port=0)
    return EppServer(runtime, opts, registry=registry, metrics=RequestMetrics(registry))


_METRICS = RequestMetrics(CollectorRegistry())


def stream_state(**kw: Any) -> ServerState:
    ds = Datastore()
    ds.replace_all([Endpoint("a", "10.0.0.1", 8000), Endpoint("b", "10.0.0.2", 8000)])
    return ServerState(RoundRobinDirector(ds), ds, _METRICS, **kw)
