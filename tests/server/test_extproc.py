"""The ext_proc servicer driven directly over gRPC (grpc.aio client, no Envoy): message order, errors, lifecycle."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from e2e.harness.directors import RoundRobinDirector
from epp.config import parse_config
from epp.datalayer.datastore import Datastore
from epp.discovery.static import StaticEndpointSource
from epp.framework.errors import TooManyRequests
from epp.framework.keys import DISAGG_HEADERS
from epp.framework.parsing import ParserRegistry
from epp.framework.types import Endpoint, InferenceRequest, Usage
from epp.plugins.parsers.vllmgrpc_parser import VLLMGRPCParser
from epp.requestcontrol.types import RoutingDecision
from epp.server.extproc import BODY_CHUNK_LIMIT
from epp.server.metrics import RequestMetrics
from epp.server.runner import EppServer, ServeOptions
from epp.wiring.runtime import Runtime

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


@pytest.fixture
async def epp() -> AsyncIterator[Harness]:
    ds = Datastore()
    eps = [Endpoint(name=f"ep{i}", address="10.0.0.1", port=8000 + i) for i in range(2)]
    director = RecordingDirector(RoundRobinDirector(ds))
    config = parse_config("modelRewrites: {alias: real}\n")
    runtime = Runtime(config=config, datastore=ds, director=director, sources=[StaticEndpointSource(eps)])
    registry = CollectorRegistry()
    opts = ServeOptions(bind_address="127.0.0.1", grpc_port=0, grpc_health_port=0, metrics_port=0)
    server = EppServer(runtime, opts, registry=registry, metrics=RequestMetrics(registry))
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.ports['grpc']}")
    for _ in range(100):
        if ds.synced:
            break
        await asyncio.sleep(0.01)
    yield Harness(server, director, channel, pb_grpc.ExternalProcessorStub(channel), registry)
    await channel.close()
    await server.stop()


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


async def test_streamed_request_split_anywhere_is_reassembled(epp: Harness) -> None:
    body = json.dumps({"model": "m", "prompt": "naïve café ✓ " * 20_000}, ensure_ascii=False).encode()
    cut = body.index("✓".encode()) + 1  # inside a UTF-8 character
    parts = [body[:cut], body[cut : cut + 7], body[cut + 7 :]]
    call = epp.stub.Process()
    msgs = [headers_msg(extra={DEST: "6.6.6.6:1"}), *(body_msg(p, i == 2) for i, p in enumerate(parts))]
    for m in msgs:
        await call.write(m)
    first = await asyncio.wait_for(call.read(), 5)
    assert first.HasField("request_headers")
    hs = set_headers(first)
    assert hs[DEST] in {"10.0.0.1:8000", "10.0.0.1:8001"}
    assert hs["content-length"] == str(len(body))
    assert first.request_headers.response.clear_route_cache
    opt = next(h for h in first.request_headers.response.header_mutation.set_headers if h.header.key == DEST)
    assert opt.append_action == base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
    assert first.dynamic_metadata.fields["envoy.lb"].struct_value.fields[DEST].string_value == hs[DEST]
    got = b""
    while True:
        r = await asyncio.wait_for(call.read(), 5)
        sr = r.request_body.response.body_mutation.streamed_response
        assert len(sr.body) <= BODY_CHUNK_LIMIT
        got += sr.body
        if sr.end_of_stream:
            break
    assert got == body
    assert epp.director.requests[0].prompt == "naïve café ✓ " * 20_000
    call.cancel()


async def test_model_rewrite_changes_body_and_content_length(epp: Harness) -> None:
    call = epp.stub.Process()
    body = b'{"model": "alias", "prompt": "x"}'
    first, second = await exchange(call, [headers_msg(), body_msg(body, True)], 2)
    new = second.request_body.response.body_mutation.streamed_response.body
    assert json.loads(new) == {"model": "real", "prompt": "x"}
    assert set_headers(first)["content-length"] == str(len(new))
    # response: model name rewritten back, split across chunks
    reply = b'{"id":"1","model":"real","usage":{"prompt_tokens":3,"completion_tokens":2}}'
    cut = reply.index(b"real") + 2
    rs = await exchange(
        call, [resp_headers_msg(), resp_body_msg(reply[:cut], False), resp_body_msg(reply[cut:], True)], 3
    )
    out = b"".join(r.response_body.response.body_mutation.streamed_response.body for r in rs[1:])
    assert json.loads(out)["model"] == "alias"
    assert rs[2].response_body.response.body_mutation.streamed_response.end_of_stream
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    assert epp.director.completed == [("rid-1", Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5))]
    # every upstream chunk reached the response hooks, as received, the first and the last marked
    assert epp.director.chunks == [(reply[:cut], True, False), (reply[cut:], False, True)]


async def test_rewrite_header_wins_over_config(epp: Harness) -> None:
    call = epp.stub.Process()
    msgs = [
        headers_msg(extra={"x-gateway-model-name-rewrite": "hdr"}),
        body_msg(b'{"model":"alias","prompt":"x"}', True),
    ]
    _, second = await exchange(call, msgs, 2)
    assert json.loads(second.request_body.response.body_mutation.streamed_response.body)["model"] == "hdr"
    assert epp.director.requests[0].target_model == "hdr"
    call.cancel()


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (b"", 400, "empty"),
        (b'{"model": "\xff"}', 400, "UTF-8"),
        (b"{", 400, "not valid JSON"),
        (b'{"model": 5, "prompt": "x"}', 400, "model not found"),
        (b'{"model": "m"}', 400, "prompt not found"),
    ],
)
async def test_bad_bodies_get_immediate_400(epp: Harness, body: bytes, status: int, fragment: str) -> None:
    call = epp.stub.Process()
    (resp,) = await exchange(call, [headers_msg(), body_msg(body, True)], 1)
    ir = resp.immediate_response
    assert ir.status.code == status
    assert fragment in json.loads(ir.body)["error"]["message"]
    assert {h.header.key: h.header.raw_value for h in ir.headers.set_headers}["content-type"] == b"application/json"
    call.cancel()
    assert epp.director.completed == []


async def test_429_and_internal_500_are_immediate(epp: Harness) -> None:
    epp.director.fail = TooManyRequests("system saturated, sheddable request dropped")
    call = epp.stub.Process()
    (resp,) = await exchange(call, [headers_msg(), body_msg(b'{"model":"m","prompt":"x"}', True)], 1)
    assert resp.immediate_response.status.code == 429
    call.cancel()
    epp.director.fail = RuntimeError("boom")
    call = epp.stub.Process()
    (resp,) = await exchange(call, [headers_msg(), body_msg(b'{"model":"m","prompt":"x"}', True)], 1)
    assert resp.immediate_response.status.code == 500
    message = json.loads(resp.immediate_response.body)["error"]["message"]
    assert message == "inference error: Internal - internal error"  # the cause is logged, never sent
    call.cancel()


async def test_deeply_nested_json_is_a_400_without_exception_text(epp: Harness) -> None:
    for depth in (200, 100_000):
        body = b'{"model":"m","prompt":"x","x":' + b"[" * depth + b"]" * depth + b"}"
        call = epp.stub.Process()
        (resp,) = await exchange(call, [headers_msg(), body_msg(body, True)], 1)
        ir = resp.immediate_response
        assert ir.status.code == 400, depth
        err = json.loads(ir.body)["error"]
        assert err == {
            "message": "inference error: BadRequest - request body nests deeper than 128 levels",
            "type": "BadRequest",
            "code": 400,
        }
        call.cancel()


async def test_lone_surrogates_with_a_model_rewrite_are_forwarded_escaped(epp: Harness) -> None:
    """`\\ud800` escapes decode to lone surrogates, which UTF-8 cannot encode: re-encoding must not 500."""
    call = epp.stub.Process()
    body = b'{"model":"alias","prompt":"x\\ud800y"}'
    rs = await exchange(call, [headers_msg(), body_msg(body, True)], 2)
    assert not rs[0].HasField("immediate_response")
    forwarded = rs[1].request_body.response.body_mutation.streamed_response.body
    assert json.loads(forwarded) == {"model": "real", "prompt": "x\ud800y"}
    call.cancel()
    # The model name itself with a lone surrogate, rewritten by header, then rewritten back in the response.
    call = epp.stub.Process()
    body = b'{"model":"a\\udc00b","prompt":"x"}'
    hs = headers_msg(extra={"x-gateway-model-name-rewrite": "real"})
    rs = await exchange(call, [hs, body_msg(body, True)], 2)
    assert json.loads(rs[1].request_body.response.body_mutation.streamed_response.body)["model"] == "real"
    rs = await exchange(call, [resp_headers_msg(), resp_body_msg(b'{"model":"real","usage":{}}', True)], 2)
    out = rs[1].response_body.response.body_mutation.streamed_response.body
    assert json.loads(out)["model"] == "a\udc00b"
    call.cancel()
    text = epp.server._metrics_http.render().decode()  # a lone surrogate in a label must not break /metrics
    assert 'model_name="a?b"' in text


async def test_huge_token_counts_do_not_skip_the_end_of_request_hook(epp: Harness) -> None:
    call = epp.stub.Process()
    await exchange(call, [headers_msg(), body_msg(b'{"model":"m","prompt":"x"}', True)], 2)
    usage = b'{"usage":{"prompt_tokens":3,"completion_tokens":' + b"9" * 400 + b"}}"
    await exchange(call, [resp_headers_msg(), resp_body_msg(usage, True)], 2)
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    assert epp.director.completed == [("rid-1", Usage(prompt_tokens=3, completion_tokens=0, total_tokens=3))]


async def test_subset_hint_and_extra_metadata_headers(epp: Harness) -> None:
    epp.director.metadata["x-extra"] = "v"
    epp.director.headers["x-prefill"] = "10.0.0.9:1"
    call = epp.stub.Process()
    msgs = [headers_msg(subset=["10.0.0.1:8001"]), body_msg(b'{"model":"m","prompt":"x"}', True)]
    first, _ = await exchange(call, msgs, 2)
    hs = set_headers(first)
    assert hs[DEST] == "10.0.0.1:8001"
    assert hs["x-prefill"] == "10.0.0.9:1"
    lb = first.dynamic_metadata.fields["envoy.lb"].struct_value.fields
    assert lb["x-extra"].string_value == "v"
    assert epp.director.requests[0].subset == ["10.0.0.1:8001"]
    call.cancel()
    call = epp.stub.Process()
    (resp,) = await exchange(call, [headers_msg(subset=[]), body_msg(b'{"model":"m","prompt":"x"}', True)], 1)
    assert resp.immediate_response.status.code == 503


async def test_bodyless_get_routed_at_headers(epp: Harness) -> None:
    call = epp.stub.Process()
    (resp,) = await exchange(call, [headers_msg("/v1/models", "GET", eos=True, extra={DEST: "6.6.6.6:1"})], 1)
    assert set_headers(resp)[DEST].startswith("10.0.0.1:")
    assert resp.dynamic_metadata.fields["envoy.lb"].struct_value.fields[DEST].string_value
    call.cancel()
    assert epp.director.requests == []


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


def mutation(common: pb.CommonResponse) -> tuple[dict[str, str], list[str]]:
    """(set headers, removed headers) of a response's header mutation."""
    m = common.header_mutation
    return {h.header.key: h.header.raw_value.decode() for h in m.set_headers}, list(m.remove_headers)


async def test_buffered_response_rewrite_fixes_content_length(epp: Harness) -> None:
    """Rewriting "real" back to "alias" makes the body longer: the upstream content-length is dropped at the
    headers phase (as GIE does) and, the whole body being known in BUFFERED mode, set to the new length with the
    body mutation (Envoy applies that header mutation before it checks the length, else it answers 500)."""
    call = epp.stub.Process()
    await exchange(call, [headers_msg(mode=Mode.BUFFERED), body_msg(b'{"model":"alias","prompt":"x"}', True)], 2)
    reply = b'{"id":"1","model":"real","usage":{"prompt_tokens":3,"completion_tokens":2}}'
    (rh,) = await exchange(call, [resp_headers_msg(extra={"content-length": str(len(reply))})], 1)
    assert mutation(rh.response_headers.response) == ({}, ["content-length"])
    (rb,) = await exchange(call, [resp_body_msg(reply, True)], 1)
    new = rb.response_body.response.body_mutation.body
    assert json.loads(new)["model"] == "alias"
    assert len(new) == len(reply) + 1
    assert mutation(rb.response_body.response) == ({"content-length": str(len(new))}, [])
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    assert epp.director.completed == [("rid-1", Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5))]


async def test_buffered_response_body_without_eos_is_flushed_whole(epp: Harness) -> None:
    """BUFFERED sends the whole body in one message, with end_of_stream false when trailers follow: the rewriter
    must not hold back a tail that could start a split model name (no later body message would carry it)."""
    call = epp.stub.Process()
    await exchange(call, [headers_msg(mode=Mode.BUFFERED), body_msg(b'{"model":"alias","prompt":"x"}', True)], 2)
    reply = b'{"model":"real","text":"ends in \\"'  # the last '"' could start '"model":"real"'
    await exchange(call, [resp_headers_msg(extra={"content-length": str(len(reply))})], 1)
    (rb,) = await exchange(call, [resp_body_msg(reply, False)], 1)
    new = rb.response_body.response.body_mutation.body
    assert new == b'{"model":"alias","text":"ends in \\"'
    assert mutation(rb.response_body.response) == ({"content-length": str(len(new))}, [])
    call.cancel()


async def test_streamed_response_rewrite_drops_content_length(epp: Harness) -> None:
    """FULL_DUPLEX_STREAMED: the length is unknown when the headers go out, so content-length is dropped (Envoy
    drops it too in this mode; not relying on that) and the body goes chunked. A response hook's headers stay."""
    epp.director.set_response_headers["x-session-token"] = "tok"
    call = epp.stub.Process()
    await exchange(call, [headers_msg(), body_msg(b'{"model":"alias","prompt":"x"}', True)], 2)
    rs = await exchange(
        call, [resp_headers_msg(extra={"content-length": "17"}), resp_body_msg(b'{"model":"real"}', True)], 2
    )
    assert mutation(rs[0].response_headers.response) == ({"x-session-token": "tok"}, ["content-length"])
    sr = rs[1].response_body.response.body_mutation.streamed_response
    assert (sr.body, sr.end_of_stream) == (b'{"model":"alias"}', True)
    assert mutation(rs[1].response_body.response) == ({}, [])
    call.cancel()


@pytest.mark.parametrize("mode", [Mode.BUFFERED, Mode.FULL_DUPLEX_STREAMED])
async def test_response_without_rewrite_keeps_content_length(epp: Harness, mode: int) -> None:
    call = epp.stub.Process()
    await exchange(
        call, [headers_msg(mode=mode), body_msg(b'{"model":"m","prompt":"x"}', True)], 1 + (mode != Mode.BUFFERED)
    )
    reply = b'{"model":"m"}'
    rs = await exchange(call, [resp_headers_msg(extra={"content-length": "13"}), resp_body_msg(reply, True)], 2)
    assert not rs[0].response_headers.response.HasField("header_mutation")
    assert not rs[1].response_body.response.HasField("header_mutation")
    call.cancel()


async def test_bodyless_rewritten_response_keeps_its_headers(epp: Harness) -> None:
    """No body follows (e.g. a 204 / HEAD): nothing will be rewritten, so content-length is left alone."""
    call = epp.stub.Process()
    await exchange(call, [headers_msg(mode=Mode.BUFFERED), body_msg(b'{"model":"alias","prompt":"x"}', True)], 2)
    (rh,) = await exchange(call, [resp_headers_msg(status=204, extra={"content-length": "0"}, eos=True)], 1)
    assert not rh.response_headers.response.HasField("header_mutation")
    call.cancel()


async def test_sse_usage_served_metadata_and_completion_once(epp: Harness) -> None:
    call = epp.stub.Process()
    chat = b'{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true}'
    await exchange(call, [headers_msg("/v1/chat/completions"), body_msg(chat, True)], 2)
    events = [
        b'data: {"model":"m","choices":[{"delta":{"content":"a"}}],"usage":null}\n\n',
        b'data: {"model":"m","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}}\n\n',
        b"data: [DONE]\n\n",
    ]
    stream = b"".join(events)
    parts = [stream[i : i + 13] for i in range(0, len(stream), 13)]
    msgs = [resp_headers_msg(ctype="text/event-stream", served="10.0.0.1:8000")]
    msgs += [resp_body_msg(p, i == len(parts) - 1) for i, p in enumerate(parts)]
    rs = await exchange(call, msgs, 1 + len(parts))
    assert b"".join(r.response_body.response.body_mutation.streamed_response.body for r in rs[1:]) == stream
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    assert epp.director.response_headers == [(200, "10.0.0.1:8000")]
    assert epp.director.completed == [("rid-1", Usage(prompt_tokens=4, completion_tokens=1, total_tokens=5))]


async def test_client_cancel_still_completes_once(epp: Harness) -> None:
    call = epp.stub.Process()
    await exchange(call, [headers_msg(), body_msg(b'{"model":"m","prompt":"x"}', True), resp_headers_msg()], 3)
    call.cancel()
    for _ in range(100):
        if epp.director.completed:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    assert epp.director.completed == [("rid-1", None)]
    assert epp.registry.get_sample_value("inference_objective_running_requests", {"model_name": "m"}) == 0


async def test_health_services(epp: Harness) -> None:
    for port in (epp.server.ports["health"], epp.server.ports["grpc"]):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            for svc in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor", "inference-extension"):
                r = await stub.Check(health_pb2.HealthCheckRequest(service=svc))
                assert r.status == health_pb2.HealthCheckResponse.SERVING, svc


async def test_readiness_waits_for_sync() -> None:
    ds = Datastore()
    runtime = Runtime(config=parse_config(""), datastore=ds, director=RoundRobinDirector(ds), sources=[])
    registry = CollectorRegistry()
    opts = ServeOptions(bind_address="127.0.0.1", grpc_port=0, grpc_health_port=0, metrics_port=0)
    server = EppServer(runtime, opts, registry=registry, metrics=RequestMetrics(registry))
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.ports['health']}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)

            async def status(svc: str) -> int:
                return int((await stub.Check(health_pb2.HealthCheckRequest(service=svc))).status)

            assert await status("liveness") == health_pb2.HealthCheckResponse.SERVING
            assert await status("readiness") == health_pb2.HealthCheckResponse.NOT_SERVING
            ds.synced = True
            for _ in range(100):
                if await status("readiness") == health_pb2.HealthCheckResponse.SERVING:
                    break
                await asyncio.sleep(0.02)
            assert await status("envoy.service.ext_proc.v3.ExternalProcessor") == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop()


async def test_readiness_waits_for_the_tokenizer_warm_up() -> None:
    """A synced datastore is not enough: the server is ready only once its startup loads (tokenizers) finished,
    so no request is the one that loads a tokenizer."""
    ds = Datastore()
    ds.synced = True
    loaded = asyncio.Event()

    async def warm() -> None:
        await loaded.wait()

    runtime = Runtime(
        config=parse_config(""), datastore=ds, director=RoundRobinDirector(ds), sources=[], warmups=[warm]
    )
    registry = CollectorRegistry()
    opts = ServeOptions(bind_address="127.0.0.1", grpc_port=0, grpc_health_port=0, metrics_port=0)
    server = EppServer(runtime, opts, registry=registry, metrics=RequestMetrics(registry))
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.ports['health']}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)

            async def ready() -> bool:
                r = await stub.Check(health_pb2.HealthCheckRequest(service="readiness"))
                return bool(r.status == health_pb2.HealthCheckResponse.SERVING)

            await asyncio.sleep(0.2)  # several readiness polls with the warm-up still running
            assert not await ready()
            loaded.set()
            for _ in range(100):
                if await ready():
                    break
                await asyncio.sleep(0.02)
            assert await ready()
    finally:
        await server.stop()


async def test_graceful_stop_drains_in_flight_stream(epp: Harness) -> None:
    call = epp.stub.Process()
    await exchange(call, [headers_msg(), body_msg(b'{"model":"m","prompt":"x"}', True)], 2)
    stopping = asyncio.create_task(epp.server.stop())
    await asyncio.sleep(0.2)
    assert not stopping.done()  # waits for the open stream
    assert not epp.server.health.ready
    rs = await exchange(call, [resp_headers_msg(), resp_body_msg(b'{"usage":{"prompt_tokens":1}}', True)], 2)
    assert rs[1].response_body.response.body_mutation.streamed_response.end_of_stream
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    await asyncio.wait_for(stopping, 5)
    assert epp.director.completed[0][1] == Usage(prompt_tokens=1, total_tokens=1)


async def test_request_trailers_end_the_body(epp: Harness) -> None:
    call = epp.stub.Process()
    trailers = pb.ProcessingRequest(request_trailers=pb.HttpTrailers())
    rs = await exchange(call, [headers_msg(), body_msg(b'{"model":"m","prompt":"x"}', False), trailers], 3)
    assert set_headers(rs[0])[DEST].startswith("10.0.0.1:")
    sr = rs[1].request_body.response.body_mutation.streamed_response
    assert (sr.body, sr.end_of_stream) == (b'{"model":"m","prompt":"x"}', False)
    assert rs[2].HasField("request_trailers")
    call.cancel()


async def test_oversized_body_gets_413(epp: Harness) -> None:
    epp.server.state.max_body_bytes = 100_000
    call = epp.stub.Process()
    msgs = [headers_msg(), body_msg(b"x" * 60_000, False), body_msg(b"x" * 60_000, False), body_msg(b"x", True)]
    (resp,) = await exchange(call, msgs, 1)  # the 413 comes at the end of the body, the rest dropped meanwhile
    assert resp.immediate_response.status.code == 413
    assert "exceeds 100000 bytes" in json.loads(resp.immediate_response.body)["error"]["message"]
    call.cancel()


async def test_response_hook_failure_does_not_break_the_response(epp: Harness) -> None:
    epp.director.fail_response_headers = True
    call = epp.stub.Process()
    await exchange(call, [headers_msg(), body_msg(b'{"model":"m","prompt":"x"}', True)], 2)
    rs = await exchange(call, [resp_headers_msg(), resp_body_msg(b'{"ok":1}', True)], 2)
    assert rs[0].HasField("response_headers")
    assert rs[1].response_body.response.body_mutation.streamed_response.body == b'{"ok":1}'
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    assert len(epp.director.completed) == 1


async def test_port_in_use_is_a_clear_bind_error() -> None:
    import socket

    from epp.server.runner import BindError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ds = Datastore()
        runtime = Runtime(config=parse_config(""), datastore=ds, director=RoundRobinDirector(ds), sources=[])
        registry = CollectorRegistry()
        opts = ServeOptions(bind_address="127.0.0.1", grpc_port=port, grpc_health_port=0, metrics_port=0)
        server = EppServer(runtime, opts, registry=registry, metrics=RequestMetrics(registry))
        with pytest.raises(BindError, match=f"grpc port 127.0.0.1:{port}"):
            await server.start()


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


def test_cert_path_without_files_is_a_clear_error(tmp_path: Path) -> None:
    from epp.server.tls import TLSError, load_credentials

    with pytest.raises(TLSError, match=r"tls\.crt/tls\.key"):
        load_credentials(tmp_path)


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


async def test_passthrough_forwards_any_body_unchanged(epp: Harness) -> None:
    body = b"\x00\x01 arbitrary, not JSON \xff" * 100
    call = epp.stub.Process()
    out = await exchange(call, [headers_msg("/custom/v9/thing"), body_msg(body, True)], 2)
    assert set_headers(out[0])[DEST] and set_headers(out[0])["content-length"] == str(len(body))
    assert out[1].request_body.response.body_mutation.streamed_response.body == body
    assert epp.director.requests[-1].api == "passthrough" and epp.director.requests[-1].model == ""
    call.cancel()


async def _real_server(text: str, **opts: Any) -> tuple[EppServer, grpc.aio.Channel, pb_grpc.ExternalProcessorStub]:
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
            server, channel, stub = await _real_server(PICK_CONFIG, emit_endpoint_scores=emit)
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


async def test_typed_drop_reasons_on_503_and_429() -> None:
    """x-llm-d-request-dropped-reason as the router: no endpoints → 503 rejected-no-endpoints; a sheddable request
    under saturation → 429 rejected-saturated."""
    server, channel, stub = await _real_server("endpoints: []\nplugins:\n- type: queue-scorer\n")
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


async def test_global_inflight_body_budget(epp: Harness) -> None:
    """Bodies being gathered across all streams are bounded: past the budget a request gets a JSON 503, and the
    bytes come back when a body is decided, refused or its stream dies."""
    state = epp.server.state
    state.max_inflight_body_bytes = 1000
    a = epp.stub.Process()
    await a.write(headers_msg())
    await a.write(body_msg(b'{"model":"m","prompt":"' + b"x" * 700, False))
    for _ in range(100):
        if state.inflight_body_bytes:
            break
        await asyncio.sleep(0.01)
    assert state.inflight_body_bytes == 723
    b = epp.stub.Process()
    (resp,) = await exchange(b, [headers_msg(), body_msg(b'{"model":"m","prompt":"' + b"y" * 300 + b'"}', True)], 1)
    assert resp.immediate_response.status.code == 503
    assert "too many request body bytes in flight" in json.loads(resp.immediate_response.body)["error"]["message"]
    b.cancel()
    rs = await exchange(a, [body_msg(b'"}', True)], 2)  # a finishes: decided, its bytes released
    assert not rs[0].HasField("immediate_response") and state.inflight_body_bytes == 0
    a.cancel()
    c = epp.stub.Process()  # a stream that dies mid-body gives its bytes back too
    await c.write(headers_msg())
    await c.write(body_msg(b"x" * 900, False))
    for _ in range(100):
        if state.inflight_body_bytes:
            break
        await asyncio.sleep(0.01)
    c.cancel()
    for _ in range(100):
        if not state.inflight_body_bytes:
            break
        await asyncio.sleep(0.01)
    assert state.inflight_body_bytes == 0


async def test_reported_attributes_go_to_envoy_with_the_last_body_message(epp: Harness) -> None:
    """request-attribute-reporter writes RESPONSE_METADATA at completion; the stream's last message carries it."""
    from epp.plugins.requestcontrol.request_attribute_reporter import RequestAttributeReporter
    from tests.helpers import build

    reporter = build(
        RequestAttributeReporter,
        {
            "attributes": [
                {"key": {"name": "x-cost"}, "expression": "usage.prompt_tokens + 2 * usage.completion_tokens"}
            ]
        },
    )
    recorded = epp.director.handle_response_complete

    def complete(request: InferenceRequest, decision: RoutingDecision | None, usage: Usage | None) -> None:
        recorded(request, decision, usage)
        reporter.response_complete(request, None, usage)

    epp.director.handle_response_complete = complete  # type: ignore[method-assign]
    epp.director.completes_before_last_answer = True  # as SchedulingDirector says when the reporter is configured
    call = epp.stub.Process()
    await exchange(call, [headers_msg(), body_msg(b'{"model": "m", "prompt": "x"}', True)], 2)
    reply = b'{"id":"1","model":"m","usage":{"prompt_tokens":3,"completion_tokens":2}}'
    rs = await exchange(
        call, [resp_headers_msg(), resp_body_msg(reply[:10], False), resp_body_msg(reply[10:], True)], 3
    )
    assert not rs[1].HasField("dynamic_metadata")
    assert rs[2].dynamic_metadata.fields["envoy.lb"].struct_value.fields["x-cost"].number_value == 7
    call.cancel()


async def test_an_evicted_in_flight_request_ends_with_an_immediate_429(epp: Harness) -> None:
    """flowControl.enableEviction: the decision's eviction event ends the stream mid-response (Envoy then resets the
    upstream request) and the director hears the completion once."""
    event = asyncio.Event()
    handle = epp.director.handle_request

    async def with_eviction(request: InferenceRequest, *, defer_records: bool = False) -> RoutingDecision:
        d = await handle(request, defer_records=defer_records)
        d.evicted = event
        return d

    epp.director.handle_request = with_eviction  # type: ignore[method-assign]
    call = epp.stub.Process()
    await exchange(call, [headers_msg(), body_msg(b'{"model": "m", "prompt": "x"}', True)], 2)
    await exchange(call, [resp_headers_msg(), resp_body_msg(b'data: {"choices":[]}\n\n', False)], 2)
    event.set()
    r = await asyncio.wait_for(call.read(), 5)
    assert r.HasField("immediate_response") and r.immediate_response.status.code == 429
    assert b"evicted" in r.immediate_response.body
    assert await asyncio.wait_for(call.read(), 5) is grpc.aio.EOF
    assert [rid for rid, _ in epp.director.completed] == ["rid-1"]


async def _draining_server(drain: float) -> tuple[EppServer, RecordingDirector]:
    ds = Datastore()
    eps = [Endpoint(name=f"ep{i}", address="10.0.0.1", port=8000 + i) for i in range(2)]
    director = RecordingDirector(RoundRobinDirector(ds))
    runtime = Runtime(config=parse_config(""), datastore=ds, director=director, sources=[StaticEndpointSource(eps)])
    registry = CollectorRegistry()
    opts = ServeOptions(
        bind_address="127.0.0.1", grpc_port=0, grpc_health_port=0, metrics_port=0, drain_timeout=drain
    )  # fmt: skip
    server = EppServer(runtime, opts, registry=registry, metrics=RequestMetrics(registry))
    await server.start()
    for _ in range(100):
        if ds.synced and server.health.ready:
            break
        await asyncio.sleep(0.02)
    return server, director


async def _health(server: EppServer) -> dict[str, int]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.ports['health']}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        names = ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor")
        return {n: int((await stub.Check(health_pb2.HealthCheckRequest(service=n))).status) for n in names}


async def _whole_request(stub: pb_grpc.ExternalProcessorStub) -> str:
    call = stub.Process()
    out = await exchange(call, [headers_msg(), body_msg(b'{"model":"m","prompt":"x"}', True)], 2)
    await exchange(call, [resp_headers_msg(), resp_body_msg(b'{"ok":1}', True)], 2)
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    return set_headers(out[0])[DEST]


async def test_drain_window_serves_new_streams_then_waits_for_in_flight_ones() -> None:
    """llm-d-router's --drain-timeout: at SIGTERM readiness goes NOT_SERVING (liveness stays SERVING) while ext_proc
    keeps serving, new streams included, for the whole window; then new streams are refused and the in-flight ones
    finish in their own time (past the window); then stop() returns."""
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    server, director = await _draining_server(1.0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.ports['grpc']}")
    stub = pb_grpc.ExternalProcessorStub(channel)
    try:
        in_flight = stub.Process()
        await exchange(in_flight, [headers_msg(), body_msg(b'{"model":"m","prompt":"long"}', True)], 2)
        t0 = asyncio.get_running_loop().time()
        stopping = asyncio.create_task(server.stop())
        await asyncio.sleep(0.1)
        h = await _health(server)
        assert h["liveness"] == serving and h["readiness"] == not_serving
        assert h["envoy.service.ext_proc.v3.ExternalProcessor"] == not_serving
        assert (await _whole_request(stub)).startswith("10.0.0.1:")  # a new stream inside the window is served
        await asyncio.sleep(1.2)  # the window is over: new streams are refused, the open one still runs
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await _whole_request(stub)
        assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
        assert not stopping.done()
        rs = await exchange(in_flight, [resp_headers_msg(), resp_body_msg(b'{"usage":{"prompt_tokens":3}}', True)], 2)
        assert rs[1].response_body.response.body_mutation.streamed_response.end_of_stream
        await in_flight.done_writing()
        assert await in_flight.read() is grpc.aio.EOF
        await asyncio.wait_for(stopping, 5)
        assert asyncio.get_running_loop().time() - t0 >= 1.0
        assert [u for _, u in director.completed][-1] == Usage(prompt_tokens=3, total_tokens=3)
        assert len(director.completed) == 2
    finally:
        await channel.close()
        if not server._stopping:
            await server.stop()


async def test_a_second_signal_ends_the_window_and_aborts_in_flight_streams() -> None:
    server, _ = await _draining_server(30.0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.ports['grpc']}")
    try:
        call = pb_grpc.ExternalProcessorStub(channel).Process()
        await exchange(call, [headers_msg(), body_msg(b'{"model":"m","prompt":"x"}', True)], 2)
        stopping = asyncio.create_task(server.stop())
        await asyncio.sleep(0.2)
        assert not stopping.done()  # inside the 30 s window
        server.force_stop()
        await asyncio.wait_for(stopping, 5)
        with pytest.raises(grpc.aio.AioRpcError):
            await call.read()
    finally:
        await channel.close()


class _Context:
    """What ExtProcServicer.Process uses of a grpc.aio context: read() from a list, write() into one."""

    def __init__(self, messages: list[pb.ProcessingRequest]) -> None:
        self.messages = list(messages)
        self.written: list[pb.ProcessingResponse] = []

    async def read(self) -> Any:
        return self.messages.pop(0) if self.messages else grpc.aio.EOF

    async def write(self, resp: pb.ProcessingResponse) -> None:
        self.written.append(resp)


@pytest.mark.parametrize("before", [False, True])
async def test_the_last_answer_is_written_before_the_request_completes(before: bool) -> None:
    """Usage, metrics and the ResponseComplete hooks run after the last body answer is written, off the client's
    path, unless a hook's output goes out with that answer (request-attribute-reporter)."""
    from epp.server.extproc import ExtProcServicer, ServerState

    ds = Datastore()
    ds.replace_all([Endpoint("a", "10.0.0.1", 8000)])
    director = RecordingDirector(RoundRobinDirector(ds), completes_before_last_answer=before)
    ctx = _Context(
        [
            headers_msg(),
            body_msg(b'{"model": "m", "prompt": "x"}', True),
            resp_headers_msg(),
            resp_body_msg(b'{"id":"1","usage":{"prompt_tokens":3,"completion_tokens":2}}', True),
        ]
    )
    seen: list[int] = []
    recorded = director.handle_response_complete

    def complete(request: InferenceRequest, decision: RoutingDecision | None, usage: Usage | None) -> None:
        seen.append(len(ctx.written))
        recorded(request, decision, usage)

    director.handle_response_complete = complete  # type: ignore[method-assign]
    state = ServerState(director, ds, RequestMetrics(CollectorRegistry()))
    await ExtProcServicer(state).Process(None, ctx)  # type: ignore[arg-type]
    assert len(ctx.written) == 4 and ctx.written[3].HasField("response_body")
    assert seen == [3 if before else 4]  # once, before or after the last answer went out
    assert director.completed and director.completed[0][1] is not None  # with the usage read from the body


ACTIVE_CONFIG = """
endpoints: [{address: 10.9.0.1, port: 8000}, {address: 10.9.0.2, port: 8000}]
plugins:
- type: active-request-scorer
schedulingProfiles:
- name: default
  plugins: [{pluginRef: active-request-scorer}]
"""


async def test_the_pick_is_booked_once_its_answer_is_written() -> None:
    """The in-flight booking (a records-only PreRequest hook) is off the answer's path: a stream's own handling
    returns the answer without it, and the servicer makes it once the answer is written, before anything else."""
    from epp.plugins.producers.inflight_load_producer import InFlightLoadProducer
    from epp.requestcontrol.director import SchedulingDirector
    from epp.server.extproc import RequestStream

    server, channel, stub = await _real_server(ACTIVE_CONFIG)
    try:
        director = server.runtime.director
        assert isinstance(director, SchedulingDirector)
        producer = director.pipeline.plugins["inflight-load-producer"]
        assert isinstance(producer, InFlightLoadProducer)

        def booked() -> int:
            return sum(load.requests for load in producer.loads.values())

        body = b'{"model":"m","prompt":"hi"}'
        stream = RequestStream(server.state)
        stream.defer_completion = True  # as the servicer sets it
        assert list(await stream.handle(headers_msg())) == []
        answer = list(await stream.handle(body_msg(body, True)))
        assert set_headers(answer[0])[DEST] and booked() == 0
        stream.written()
        assert booked() == 1
        stream.complete()
        assert booked() == 0

        call = stub.Process()  # through gRPC: booked by the time the client has the answer and the loop turns
        out = await exchange(call, [headers_msg(), body_msg(body, True)], 2)
        assert set_headers(out[0])[DEST]
        for _ in range(100):
            if booked() == 1:
                break
            await asyncio.sleep(0.01)
        assert booked() == 1
        call.cancel()
        for _ in range(100):
            if booked() == 0:
                break
            await asyncio.sleep(0.01)
        assert booked() == 0  # the cancelled stream's completion released it
    finally:
        await channel.close()
        await server.stop()


async def test_a_body_that_never_finishes_gets_a_408_and_its_stream_ends(epp: Harness) -> None:
    """Headers and part of a body, then nothing: the stream was held until Envoy's 300 s idle timeout (~19 KB a
    stream). Past --request-body-timeout: a 408 in the API's shape, the budget given back, the stream closed."""
    state = epp.server.state
    state.body_timeout = 0.3
    call = epp.stub.Process()
    t0 = time.monotonic()
    await call.write(headers_msg(extra={"content-length": "100"}))
    await call.write(body_msg(b'{"model": "m", "prompt": "never', False))
    r = await asyncio.wait_for(call.read(), 5)
    took = time.monotonic() - t0
    assert r.HasField("immediate_response") and r.immediate_response.status.code == 408
    err = json.loads(r.immediate_response.body)["error"]
    assert err["type"] == "RequestTimeout" and "0.3s" in err["message"]
    assert 0.25 < took < 2.0 and state.inflight_body_bytes == 0 and state.body_timeouts == 1
    assert await asyncio.wait_for(call.read(), 5) is grpc.aio.EOF
    # Anthropic's shape on /v1/messages; and a body that completes in time is routed as before
    call = epp.stub.Process()
    await call.write(headers_msg(path="/v1/messages"))
    r = await asyncio.wait_for(call.read(), 5)
    assert json.loads(r.immediate_response.body)["type"] == "error"
    call = epp.stub.Process()
    out = await exchange(call, [headers_msg(), body_msg(b'{"model": "m", "prompt": "x"}', True)], 2)
    assert DEST in set_headers(out[0])
    await call.done_writing()
