"""The answer stage: what goes back to Envoy. A decision's destination (OVERWRITE), fallbacks, prefiller headers
and `envoy.lb` metadata (scores with --emit-endpoint-scores), in BUFFERED and streamed modes, a large body streamed
back piece by piece; the kept serialization per destination equals the one built field by field; errors an
ImmediateResponse in the API's own shape with the typed drop reason."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf import json_format
from prometheus_client import CollectorRegistry

from e2e.harness.directors import RoundRobinDirector
from epp.datalayer.datastore import Datastore
from epp.framework.errors import TooManyRequests
from epp.framework.keys import DISAGG_HEADERS
from epp.framework.parsing import ParserRegistry
from epp.framework.types import Endpoint, InferenceRequest
from epp.plugins.parsers.vllmgrpc_parser import VLLMGRPCParser
from epp.requestcontrol.types import RoutingDecision
from epp.server.extproc import BODY_CHUNK_LIMIT, RequestStream, ServerState
from epp.server.metrics import RequestMetrics
from tests.server.support import (
    DEST,
    Harness,
    Mode,
    body_msg,
    exchange,
    headers_msg,
    mutation,
    real_server,
    set_headers,
    stream_state,
)


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


async def test_buffered_mode_answers_headers_then_decides_in_body(epp: Harness) -> None:
    call = epp.stub.Process()
    (first,) = await exchange(call, [headers_msg(mode=Mode.BUFFERED, extra={DEST: "6.6.6.6:1"})], 1)
    assert list(first.request_headers.response.header_mutation.remove_headers) == [DEST, *DISAGG_HEADERS]
    (second,) = await exchange(call, [body_msg(b'{"model":"alias","prompt":"x"}', True)], 1)
    hs = set_headers(second)
    # No plugin set a prefiller/encoder header: a client's is removed, in every mode.
    assert mutation(second.request_body.response)[1] == list(DISAGG_HEADERS)
    assert hs[DEST].startswith("10.0.0.1:")
    assert json.loads(second.request_body.response.body_mutation.body) == {"model": "real", "prompt": "x"}
    assert hs["content-length"] == str(len(second.request_body.response.body_mutation.body))
    call.cancel()


async def test_fallback_list_in_header_and_metadata(epp: Harness) -> None:
    epp.director.fallbacks = True
    call = epp.stub.Process()
    first, _ = await exchange(call, [headers_msg(), body_msg(b'{"model":"m","prompt":"x"}', True)], 2)
    assert set_headers(first)[DEST] == "10.0.0.1:8001,10.0.0.1:8000"
    assert (
        first.dynamic_metadata.fields["envoy.lb"].struct_value.fields[DEST].string_value
        == "10.0.0.1:8001,10.0.0.1:8000"
    )
    call.cancel()


async def test_errors_in_each_apis_shape(epp: Harness) -> None:
    """/v1/messages gets Anthropic's error body (400 and a director 429), a gRPC API a gRPC status."""
    call = epp.stub.Process()
    (resp,) = await exchange(call, [headers_msg("/v1/messages"), body_msg(b'{"model":"c","messages":[]}', True)], 1)
    ir = resp.immediate_response
    assert ir.status.code == 400
    assert json.loads(ir.body) == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "invalid messages request: must have at least one message",
        },
    }
    call.cancel()
    epp.director.fail = TooManyRequests("system saturated, sheddable request dropped")
    call = epp.stub.Process()
    ok = b'{"model":"c","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}'
    (resp,) = await exchange(call, [headers_msg("/v1/messages"), body_msg(ok, True)], 1)
    assert resp.immediate_response.status.code == 429
    assert json.loads(resp.immediate_response.body)["error"]["type"] == "rate_limit_error"
    call.cancel()
    epp.director.fail = None
    epp.server.state.parsers = ParserRegistry([VLLMGRPCParser()])
    call = epp.stub.Process()
    path = "/vllm.grpc.engine.VllmEngine/Generate"
    (resp,) = await exchange(call, [headers_msg(path), body_msg(b"\x01\x00\x00\x00\x00", True)], 1)
    ir = resp.immediate_response
    assert (ir.status.code, ir.grpc_status.status, ir.body) == (400, 3, b"compressed gRPC payload is not supported")
    call.cancel()


async def test_typed_drop_reasons_on_503_and_429() -> None:
    """x-llm-d-request-dropped-reason as the router: no endpoints → 503 rejected-no-endpoints; a sheddable request
    under saturation → 429 rejected-saturated."""
    server, channel, stub = await real_server("endpoints: []\nplugins:\n- type: queue-scorer\n")
    try:
        call = stub.Process()
        (resp,) = await exchange(call, [headers_msg(), body_msg(b'{"model":"m","prompt":"x"}', True)], 1)
        ir = resp.immediate_response
        hdrs = {h.header.key: h.header.raw_value for h in ir.headers.set_headers}
        assert (ir.status.code, hdrs["x-llm-d-request-dropped-reason"]) == (503, b"rejected-no-endpoints")
        call.cancel()
    finally:
        await channel.close()
        await server.stop()
    err = TooManyRequests("system saturated, sheddable request dropped", dropped_reason="rejected-saturated")
    from epp.server.extproc import immediate

    ir = immediate(err, "anthropic").immediate_response
    assert {h.header.key: h.header.raw_value for h in ir.headers.set_headers}["x-llm-d-request-dropped-reason"] == (
        b"rejected-saturated"
    )
    assert json.loads(ir.body)["error"]["type"] == "rate_limit_error"


PICK_CONFIG = """
endpoints: [{address: 10.9.0.1, port: 8000}, {address: 10.9.0.2, port: 8000}]
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer, weight: 2}, {pluginRef: kv-cache-utilization-scorer, weight: 1}]
"""


async def test_emit_endpoint_scores_and_the_sampled_pick_log(caplog: pytest.LogCaptureFixture) -> None:
    """--emit-endpoint-scores: envoy.lb `x-gateway-destination-endpoint-scores` = {ip:port: score} for every
    endpoint the primary profile scored (the router's format); the DEBUG pick line has each scorer's score."""
    from epp.scheduling import profile

    caplog.set_level(logging.DEBUG, logger="epp.scheduling.profile")
    old, profile.PICK_LOG_SAMPLE = profile.PICK_LOG_SAMPLE, 1.0
    body = b'{"model":"m","prompt":"hi"}'
    try:
        for emit in (True, False):
            server, channel, stub = await real_server(PICK_CONFIG, emit_endpoint_scores=emit)
            try:
                call = stub.Process()
                out = await exchange(call, [headers_msg(), body_msg(body, True)], 2)
                lb = json_format.MessageToDict(out[0].dynamic_metadata)["envoy.lb"]
                if emit:
                    scores = lb["x-gateway-destination-endpoint-scores"]
                    assert set(scores) == {"10.9.0.1:8000", "10.9.0.2:8000"}
                    assert all(0.0 <= v <= 3.0 for v in scores.values())
                    assert lb[DEST] in scores and scores[lb[DEST]] == max(scores.values())
                else:
                    assert "x-gateway-destination-endpoint-scores" not in lb
                call.cancel()
            finally:
                await channel.close()
                await server.stop()
    finally:
        profile.PICK_LOG_SAMPLE = old
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("pick request=")]
    assert lines and "queue-scorer*2" in lines[0] and "kv-cache-utilization-scorer*1" in lines[0]
    assert "10.9.0.1:8000" in lines[0] and "'total':" in lines[0]


async def test_large_body_streams_on_piece_by_piece_holding_its_budget() -> None:
    """A body larger than one chunk goes back to Envoy in pieces made as they are written, byte-exact, and its
    bytes count against the in-flight budget until the last piece is out."""
    state = stream_state()
    s = RequestStream(state)
    text = "".join(chr(97 + i % 26) for i in range(3 * BODY_CHUNK_LIMIT + 17))
    body = json.dumps({"model": "m", "prompt": text}).encode()
    await s.handle(headers_msg("/v1/completions"))
    half = len(body) // 2
    assert list(await s.handle(body_msg(body[:half], False))) == []
    out = await s.handle(body_msg(body[half:], True))
    assert not isinstance(out, list)  # lazy: nothing body-sized built up front
    assert state.inflight_body_bytes == len(body)
    it = iter(out)
    first = next(it)
    assert first.request_headers.response.header_mutation.set_headers[0].header.key == "x-gateway-destination-endpoint"
    pieces = [r.request_body.response.body_mutation.streamed_response for r in it]
    assert b"".join(p.body for p in pieces) == body
    assert all(len(p.body) <= BODY_CHUNK_LIMIT for p in pieces) and len(pieces) == 4
    assert [p.end_of_stream for p in pieces] == [False, False, False, True]
    assert state.inflight_body_bytes == 0


async def test_large_rewritten_body_streams_the_rewritten_bytes() -> None:
    state = stream_state(model_rewrites={"alias": "real"})
    s = RequestStream(state)
    body = json.dumps({"model": "alias", "prompt": "y" * (2 * BODY_CHUNK_LIMIT)}).encode()
    await s.handle(headers_msg("/v1/completions"))
    out = list(await s.handle(body_msg(body, True)))
    sent = b"".join(r.request_body.response.body_mutation.streamed_response.body for r in out[1:])
    assert json.loads(sent) == {"model": "real", "prompt": "y" * (2 * BODY_CHUNK_LIMIT)}
    assert state.inflight_body_bytes == 0
