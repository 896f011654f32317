"""The receive stage: request headers (modes, subset hint, declared length) and the body gathered within its
three bounds: its own size (413), the bytes all streams gather at once (503) and its deadline (408)."""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.server.extproc import BODY_CHUNK_LIMIT, RequestStream
from tests.server.support import (
    DEST,
    Harness,
    body_msg,
    exchange,
    headers_msg,
    set_headers,
    stream_state,
)


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


@pytest.mark.parametrize(
    ("path", "shape"),
    [("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic")],
)
async def test_declared_length_over_the_limit_is_refused_without_gathering(path: str, shape: str) -> None:
    """A content-length over --max-request-body-bytes: no byte of the body is held or counted in the in-flight
    budget; the 413 comes at the end of the body (answered earlier, most clients see a reset instead), in the API's
    own error shape (it used to gather up to the limit first, and answer Anthropic clients in OpenAI's shape)."""
    state = stream_state(max_body_bytes=1000)
    s = RequestStream(state)
    assert list(await s.handle(headers_msg(path, extra={"content-length": "1500"}))) == []
    assert list(await s.handle(body_msg(b"x" * 900, False))) == []
    assert list(await s.handle(body_msg(b"x" * 500, False))) == []
    assert state.inflight_body_bytes == 0 and s._body == b""
    (r,) = list(await s.handle(body_msg(b"x" * 100, True)))
    ir = r.immediate_response
    assert ir.status.code == 413
    err = json.loads(ir.body)
    if shape == "anthropic":
        assert err["type"] == "error" and err["error"]["type"] == "request_too_large", err
    else:
        assert err["error"]["code"] == 413 and "exceeds 1000 bytes" in err["error"]["message"], err
    s = RequestStream(state)  # a huge declared length, then trailers end the body
    await s.handle(headers_msg(path, extra={"content-length": "9" * 5000}))
    assert list(await s.handle(body_msg(b"x" * 10, False))) == []
    (r, *_) = list(await s.handle(pb.ProcessingRequest(request_trailers=pb.HttpTrailers())))
    assert r.immediate_response.status.code == 413
    # A declared length within the limit (or none): gathered, and refused once past the limit.
    for ok in ("1000", ""):
        s = RequestStream(state)
        extra = {"content-length": ok} if ok else {}
        assert list(await s.handle(headers_msg(path, extra=extra))) == []
        assert list(await s.handle(body_msg(b"x" * 1001, False))) == []
        assert state.inflight_body_bytes == 0
        (r,) = list(await s.handle(body_msg(b"x", True)))
        assert r.immediate_response.status.code == 413


@pytest.mark.parametrize("value", ["\u00b2", "\u0661\u0662", "１２", "abc", "-5", "+5", "1_0", "0x10", "12, 12", " "])
async def test_malformed_content_length_is_a_400_in_the_apis_shape(value: str) -> None:
    """Content-Length is 1*DIGIT, ASCII (RFC 9110): anything else is refused with a 400 at the headers, as an HTTP
    server must (RFC 9112 6.3). str.isdigit() took '²' (then int() raised: a 500) and read Arabic-Indic or
    full-width digits as a length."""
    state = stream_state()
    for path, shape in (("/v1/completions", "openai"), ("/v1/messages", "anthropic")):
        s = RequestStream(state)
        (r,) = list(await s.handle(headers_msg(path, extra={"content-length": value})))
        ir = r.immediate_response
        assert ir.status.code == 400, ir
        err = json.loads(ir.body)
        if shape == "anthropic":
            assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error", err
            assert "invalid content-length" in err["error"]["message"], err
        else:
            assert err["error"]["code"] == 400 and "invalid content-length" in err["error"]["message"], err
        assert state.inflight_body_bytes == 0
    s = RequestStream(state)  # surrounding whitespace is allowed (OWS): a valid length
    assert list(await s.handle(headers_msg("/v1/completions", extra={"content-length": " 12 "}))) == []
    assert s._declared == 12


async def test_gathered_body_over_the_limit_is_a_413_in_the_apis_shape() -> None:
    """Without a content-length (chunked), the limit holds while gathering: what was gathered is let go at once,
    the rest dropped as it comes, and the 413 (Anthropic's shape on /v1/messages) comes at the end of the body."""
    state = stream_state(max_body_bytes=1000)
    s = RequestStream(state)
    assert list(await s.handle(headers_msg("/v1/messages"))) == []
    assert list(await s.handle(body_msg(b"x" * 600, False))) == []
    assert state.inflight_body_bytes == 600
    assert list(await s.handle(body_msg(b"x" * 600, False))) == []
    assert state.inflight_body_bytes == 0
    (r,) = list(await s.handle(body_msg(b"x", True)))
    assert r.immediate_response.status.code == 413
    assert json.loads(r.immediate_response.body)["error"]["type"] == "request_too_large"


async def test_oversized_body_gets_413(epp: Harness) -> None:
    epp.server.state.max_body_bytes = 100_000
    call = epp.stub.Process()
    msgs = [headers_msg(), body_msg(b"x" * 60_000, False), body_msg(b"x" * 60_000, False), body_msg(b"x", True)]
    (resp,) = await exchange(call, msgs, 1)  # the 413 comes at the end of the body, the rest dropped meanwhile
    assert resp.immediate_response.status.code == 413
    assert "exceeds 100000 bytes" in json.loads(resp.immediate_response.body)["error"]["message"]
    call.cancel()


async def test_declared_length_is_allocated_once_and_held_in_the_budget() -> None:
    """A body with a content-length is gathered into one buffer of that length, allocated at its first chunk and
    filled in place (growing a bytearray chunk by chunk reallocates it, which for 16 MiB bodies left the EPP at
    2.5-3.1x the body's size); its whole declared length counts in the in-flight budget from the first chunk, so
    declaring much and sending little cannot allocate past the budget. Forwarded byte-exact."""
    state = stream_state()
    s = RequestStream(state)
    body = json.dumps({"model": "m", "prompt": "y" * (3 * BODY_CHUNK_LIMIT)}).encode()
    await s.handle(headers_msg("/v1/completions", extra={"content-length": str(len(body))}))
    chunks = [body[i : i + BODY_CHUNK_LIMIT] for i in range(0, len(body), BODY_CHUNK_LIMIT)]
    assert len(chunks) == 4
    assert list(await s.handle(body_msg(chunks[0], False))) == []
    buf = s._body
    assert isinstance(buf, bytearray) and len(buf) == len(body)
    assert state.inflight_body_bytes == len(body)
    for c in chunks[1:-1]:
        assert list(await s.handle(body_msg(c, False))) == []
        assert s._body is buf and len(buf) == len(body)  # filled in place, never reallocated
    out = list(await s.handle(body_msg(chunks[-1], True)))
    pieces = [r.request_body.response.body_mutation.streamed_response.body for r in out[1:]]
    assert b"".join(pieces) == body
    assert state.inflight_body_bytes == 0


async def test_declared_length_over_the_budget_is_not_preallocated_and_short_bodies_are_cut() -> None:
    state = stream_state(max_inflight_body_bytes=5000)
    s = RequestStream(state)  # declares more than the whole budget: gathered as it comes, refused once past it
    await s.handle(headers_msg("/v1/completions", extra={"content-length": "6000"}))
    assert list(await s.handle(body_msg(b"x" * 100, False))) == []
    assert state.inflight_body_bytes == 100 and isinstance(s._body, bytes)
    (r,) = list(await s.handle(body_msg(b"x" * 4950, False)))
    assert r.immediate_response.status.code == 503 and state.inflight_body_bytes == 0
    # Declared 3000, 20 bytes come, then trailers end the body: the rest of the buffer is not forwarded.
    s = RequestStream(stream_state())
    body = b'{"model":"m","prompt":"hello"}'
    await s.handle(headers_msg("/v1/completions", extra={"content-length": "3000"}))
    assert list(await s.handle(body_msg(body[:20], False))) == []
    assert list(await s.handle(body_msg(body[20:], False))) == []
    out = list(await s.handle(pb.ProcessingRequest(request_trailers=pb.HttpTrailers())))
    sent = [r.request_body.response.body_mutation.streamed_response.body for r in out if r.HasField("request_body")]
    assert b"".join(sent) == body


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
