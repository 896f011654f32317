"""The request-headers answer of a decision: the kept serialization per destination gives the same message as
building it field by field, for every body size, and decisions that set more than the destination are built."""

from __future__ import annotations

import json
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from prometheus_client import CollectorRegistry

from e2e.harness.directors import RoundRobinDirector
from epp.datalayer.datastore import Datastore
from epp.framework.types import Endpoint, InferenceRequest
from epp.requestcontrol.types import RoutingDecision
from epp.server.extproc import RequestStream, ServerState
from epp.server.metrics import RequestMetrics


class _Director(RoundRobinDirector):
    def __init__(self, ds: Datastore, **extra: Any) -> None:
        super().__init__(ds)
        self.extra = extra

    async def handle_request(self, request: InferenceRequest, *, defer_records: bool = False) -> RoutingDecision:
        d = await super().handle_request(request)
        d.headers.update(self.extra.get("headers", {}))
        d.metadata.update(self.extra.get("metadata", {}))
        return d


def _state(**extra: Any) -> ServerState:
    ds = Datastore()
    ds.replace_all([Endpoint(name=f"ep{i}", address="10.0.0.1", port=8000 + i) for i in range(2)])
    return ServerState(_Director(ds, **extra), ds, RequestMetrics(CollectorRegistry()))


async def _route(state: ServerState, prompt: str) -> tuple[RequestStream, pb.ProcessingResponse]:
    body = json.dumps({"model": "m", "prompt": prompt}).encode()
    hdrs = base_pb2.HeaderMap(
        headers=[
            base_pb2.HeaderValue(key=k, raw_value=v.encode())
            for k, v in {":method": "POST", ":path": "/v1/completions", "content-length": str(len(body))}.items()
        ]
    )
    s = RequestStream(state)
    assert list(await s.handle(pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=hdrs)))) == []
    out = list(await s.handle(pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True))))
    assert out[1].request_body.response.body_mutation.streamed_response.body == body
    return s, out[0]


def _built(s: RequestStream, content_length: int) -> pb.ProcessingResponse:
    resp = pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=s._routing_common(content_length)))
    s._put_metadata(resp)
    return resp


async def test_kept_answer_equals_the_built_one_for_every_body() -> None:
    state = _state()
    for i in range(6):  # two destinations, three times each: the second time on from the kept serialization
        s, got = await _route(state, "x" * (i * 37 + 1))
        cl = len(json.dumps({"model": "m", "prompt": "x" * (i * 37 + 1)}))
        assert got == _built(s, cl)
        headers = [(o.header.key, o.header.raw_value) for o in got.request_headers.response.header_mutation.set_headers]
        assert headers == [("x-gateway-destination-endpoint", s.decision.destination.encode()),  # type: ignore[union-attr]
                           ("content-length", str(cl).encode())]  # fmt: skip
        lb = got.dynamic_metadata.fields["envoy.lb"].struct_value.fields
        assert lb["x-gateway-destination-endpoint"].string_value == s.decision.destination  # type: ignore[union-attr]
    assert len(state.routing_wire) == 2


async def test_decisions_with_headers_or_metadata_are_built() -> None:
    state = _state(headers={"x-prefiller-host-port": "10.0.0.9:8000"}, metadata={"extra": "v"})
    s, got = await _route(state, "hello")
    assert got == _built(s, len(json.dumps({"model": "m", "prompt": "hello"})))
    assert "x-prefiller-host-port" not in got.request_headers.response.header_mutation.remove_headers
    assert got.dynamic_metadata.fields["envoy.lb"].struct_value.fields["extra"].string_value == "v"
    assert state.routing_wire == {}
