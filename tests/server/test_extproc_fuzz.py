"""Hypothesis-driven request bodies and response streams through the real ext_proc state machine (parsers,
rewrites, usage readers, metrics): whatever a client or an upstream sends, the answer is a routing decision or a
4xx/503 with a JSON error body, never a 500, and the end-of-request hook runs exactly once."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from e2e.harness.directors import RoundRobinDirector
from epp.datalayer.datastore import Datastore
from epp.framework.types import Endpoint, InferenceRequest, Usage
from epp.requestcontrol.types import RoutingDecision
from epp.server.extproc import RequestStream, ServerState
from epp.server.metrics import RequestMetrics

_REGISTRY = CollectorRegistry()
_METRICS = RequestMetrics(_REGISTRY)

json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=False),
    st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=20),
)  # fmt: skip
json_value = st.recursive(
    json_leaf, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=30
)
fields = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(st.text(max_size=30), json_value),
        "prompt": json_value,
        "messages": st.one_of(st.lists(st.dictionaries(st.sampled_from(["role", "content"]), json_value)), json_value),
        "input": json_value,
        "stream": json_value,
        "max_tokens": json_value,
        "stream_options": json_value,
    },
)


def _encode(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=True).encode()  # lone surrogates become \\ud800 escapes, as clients send


bodies = st.one_of(
    fields.map(_encode),
    st.binary(max_size=200),
    st.builds(lambda d: b"[" * d + b"]" * d, st.integers(1, 3000)),
    st.builds(lambda d: b'{"model":"m","prompt":"x","a":' + b"[" * d + b"]" * d + b"}", st.integers(100, 3000)),
)
paths = st.sampled_from(["/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/embeddings", "/x"])


class _Director(RoundRobinDirector):
    completed = 0

    def handle_response_complete(
        self, request: InferenceRequest, decision: RoutingDecision | None, usage: Usage | None
    ) -> None:
        _Director.completed += 1


def _stream(rewrites: dict[str, str]) -> RequestStream:
    ds = Datastore()
    ds.replace_all([Endpoint("a", "10.0.0.1", 8000), Endpoint("b", "10.0.0.2", 8000)])
    return RequestStream(ServerState(_Director(ds), ds, _METRICS, model_rewrites=rewrites))


def _headers(path: str, extra: dict[str, str]) -> pb.ProcessingRequest:
    hs = {":path": path, ":method": "POST", **extra}
    return pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[
                    base_pb2.HeaderValue(key=k, raw_value=v.encode("utf-8", "surrogatepass")) for k, v in hs.items()
                ]
            )
        )
    )


def _check_immediate(r: pb.ProcessingResponse) -> None:
    ir = r.immediate_response
    assert ir.status.code != 500 and 400 <= ir.status.code < 600, (ir.status.code, ir.body[:300])
    err = json.loads(ir.body)
    assert isinstance(err, dict) and err, ir.body[:300]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=paths, body=bodies, cut=st.integers(0, 400), rewrite=st.booleans(), header_rewrite=st.text(max_size=10))
def test_any_request_body_is_routed_or_a_json_4xx(
    path: str, body: bytes, cut: int, rewrite: bool, header_rewrite: str
) -> None:
    async def run() -> None:
        extra = {"x-gateway-model-name-rewrite": header_rewrite} if header_rewrite else {}
        s = _stream({"m": "target"} if rewrite else {})
        out = list(await s.handle(_headers(path, extra)))
        assert out == []
        k = min(cut, len(body))
        out = list(await s.handle(pb.ProcessingRequest(request_body=pb.HttpBody(body=body[:k], end_of_stream=False))))
        out += await s.handle(pb.ProcessingRequest(request_body=pb.HttpBody(body=body[k:], end_of_stream=True)))
        assert out
        if out[0].HasField("immediate_response"):
            _check_immediate(out[0])
        else:
            assert out[0].HasField("request_headers")
        s.complete()
        assert s.s.inflight_body_bytes == 0

    asyncio.run(run())


@settings(max_examples=100, deadline=None)
@given(
    chunks=st.lists(
        st.one_of(st.binary(max_size=80), fields.map(lambda d: b"data: " + _encode(d) + b"\n\n")), max_size=8
    ),
    sse=st.booleans(),
    status=st.sampled_from([200, 400, 500, 503]),
)
def test_any_response_stream_completes_once(chunks: list[bytes], sse: bool, status: int) -> None:
    async def run() -> None:
        before = _Director.completed
        s = _stream({"m": "target"})
        await s.handle(_headers("/v1/completions", {}))
        out = list(
            await s.handle(
                pb.ProcessingRequest(request_body=pb.HttpBody(body=b'{"model":"m","prompt":"x"}', end_of_stream=True))
            )
        )
        assert not out[0].HasField("immediate_response")
        ctype = "text/event-stream" if sse else "application/json"
        hs = {":status": str(status), "content-type": ctype}
        msg = pb.ProcessingRequest(
            response_headers=pb.HttpHeaders(
                headers=base_pb2.HeaderMap(
                    headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in hs.items()]
                )
            )
        )
        await s.handle(msg)
        sent = b""
        for i, c in enumerate(chunks):
            rs = await s.handle(
                pb.ProcessingRequest(response_body=pb.HttpBody(body=c, end_of_stream=i == len(chunks) - 1))
            )
            for r in rs:
                assert not r.HasField("immediate_response")
                sent += r.response_body.response.body_mutation.streamed_response.body
        s.complete()
        assert _Director.completed == before + 1
        if chunks:
            assert sent == b"".join(chunks).replace(b'"model":"target"', b'"model":"m"').replace(
                b'"model": "target"', b'"model": "m"'
            )

    asyncio.run(run())
