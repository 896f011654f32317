"""Large request bodies (issue 15): refused early by their declared length in the API's error shape, streamed
on without a list of copies, their budget held until they are sent, the heap trimmed after them; and the bytes-
native JSON decoding gives exactly what the stdlib gave (its fallbacks included)."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from prometheus_client import CollectorRegistry

from e2e.harness.directors import RoundRobinDirector
from epp.datalayer.datastore import Datastore
from epp.framework import BadRequest
from epp.framework.types import Endpoint
from epp.plugins.parsers._common import decode_json_object, json_model_rewriter
from epp.server.extproc import BODY_CHUNK_LIMIT, RequestStream, ServerState
from epp.server.memtrim import TRIM_AFTER_BODY_BYTES, MemoryTrimmer
from epp.server.metrics import RequestMetrics

_METRICS = RequestMetrics(CollectorRegistry())


def _state(**kw: Any) -> ServerState:
    ds = Datastore()
    ds.replace_all([Endpoint("a", "10.0.0.1", 8000), Endpoint("b", "10.0.0.2", 8000)])
    return ServerState(RoundRobinDirector(ds), ds, _METRICS, **kw)


def _headers(path: str, extra: dict[str, str] | None = None) -> pb.ProcessingRequest:
    hs = {":path": path, ":method": "POST", **(extra or {})}
    return pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in hs.items()]
            )
        )
    )


def _body(data: bytes, eos: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=eos))


@pytest.mark.parametrize(
    ("path", "shape"),
    [("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic")],
)
async def test_declared_length_over_the_limit_is_refused_without_gathering(path: str, shape: str) -> None:
    """A content-length over --max-request-body-bytes: no byte of the body is held or counted in the in-flight
    budget; the 413 comes at the end of the body (answered earlier, most clients see a reset instead), in the API's
    own error shape (it used to gather up to the limit first, and answer Anthropic clients in OpenAI's shape)."""
    state = _state(max_body_bytes=1000)
    s = RequestStream(state)
    assert list(await s.handle(_headers(path, {"content-length": "1500"}))) == []
    assert list(await s.handle(_body(b"x" * 900, False))) == []
    assert list(await s.handle(_body(b"x" * 500, False))) == []
    assert state.inflight_body_bytes == 0 and s._body == b""
    (r,) = list(await s.handle(_body(b"x" * 100, True)))
    ir = r.immediate_response
    assert ir.status.code == 413
    err = json.loads(ir.body)
    if shape == "anthropic":
        assert err["type"] == "error" and err["error"]["type"] == "request_too_large", err
    else:
        assert err["error"]["code"] == 413 and "exceeds 1000 bytes" in err["error"]["message"], err
    s = RequestStream(state)  # a huge declared length, then trailers end the body
    await s.handle(_headers(path, {"content-length": "9" * 5000}))
    assert list(await s.handle(_body(b"x" * 10, False))) == []
    (r, *_) = list(await s.handle(pb.ProcessingRequest(request_trailers=pb.HttpTrailers())))
    assert r.immediate_response.status.code == 413
    # A declared length within the limit (or none): gathered, and refused once past the limit.
    for ok in ("1000", ""):
        s = RequestStream(state)
        extra = {"content-length": ok} if ok else {}
        assert list(await s.handle(_headers(path, extra))) == []
        assert list(await s.handle(_body(b"x" * 1001, False))) == []
        assert state.inflight_body_bytes == 0
        (r,) = list(await s.handle(_body(b"x", True)))
        assert r.immediate_response.status.code == 413


@pytest.mark.parametrize("value", ["\u00b2", "\u0661\u0662", "１２", "abc", "-5", "+5", "1_0", "0x10", "12, 12", " "])
async def test_malformed_content_length_is_a_400_in_the_apis_shape(value: str) -> None:
    """Content-Length is 1*DIGIT, ASCII (RFC 9110): anything else is refused with a 400 at the headers, as an HTTP
    server must (RFC 9112 6.3). str.isdigit() took '²' (then int() raised: a 500) and read Arabic-Indic or
    full-width digits as a length."""
    state = _state()
    for path, shape in (("/v1/completions", "openai"), ("/v1/messages", "anthropic")):
        s = RequestStream(state)
        (r,) = list(await s.handle(_headers(path, {"content-length": value})))
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
    assert list(await s.handle(_headers("/v1/completions", {"content-length": " 12 "}))) == []
    assert s._declared == 12


async def test_gathered_body_over_the_limit_is_a_413_in_the_apis_shape() -> None:
    """Without a content-length (chunked), the limit holds while gathering: what was gathered is let go at once,
    the rest dropped as it comes, and the 413 (Anthropic's shape on /v1/messages) comes at the end of the body."""
    state = _state(max_body_bytes=1000)
    s = RequestStream(state)
    assert list(await s.handle(_headers("/v1/messages"))) == []
    assert list(await s.handle(_body(b"x" * 600, False))) == []
    assert state.inflight_body_bytes == 600
    assert list(await s.handle(_body(b"x" * 600, False))) == []
    assert state.inflight_body_bytes == 0
    (r,) = list(await s.handle(_body(b"x", True)))
    assert r.immediate_response.status.code == 413
    assert json.loads(r.immediate_response.body)["error"]["type"] == "request_too_large"


async def test_large_body_streams_on_piece_by_piece_holding_its_budget() -> None:
    """A body larger than one chunk goes back to Envoy in pieces made as they are written, byte-exact, and its
    bytes count against the in-flight budget until the last piece is out."""
    state = _state()
    s = RequestStream(state)
    text = "".join(chr(97 + i % 26) for i in range(3 * BODY_CHUNK_LIMIT + 17))
    body = json.dumps({"model": "m", "prompt": text}).encode()
    await s.handle(_headers("/v1/completions"))
    half = len(body) // 2
    assert list(await s.handle(_body(body[:half], False))) == []
    out = await s.handle(_body(body[half:], True))
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
    state = _state(model_rewrites={"alias": "real"})
    s = RequestStream(state)
    body = json.dumps({"model": "alias", "prompt": "y" * (2 * BODY_CHUNK_LIMIT)}).encode()
    await s.handle(_headers("/v1/completions"))
    out = list(await s.handle(_body(body, True)))
    sent = b"".join(r.request_body.response.body_mutation.streamed_response.body for r in out[1:])
    assert json.loads(sent) == {"model": "real", "prompt": "y" * (2 * BODY_CHUNK_LIMIT)}
    assert state.inflight_body_bytes == 0


async def test_heap_is_trimmed_once_after_large_bodies() -> None:
    """Streams that carried a large body (decided or refused) ask for one debounced malloc_trim; small ones do not."""
    calls: list[int] = []
    state = _state(max_body_bytes=TRIM_AFTER_BODY_BYTES + 10)
    state.trimmer = MemoryTrimmer(delay=0.05, trim=lambda pad: calls.append(pad) or 1)  # type: ignore[func-returns-value]
    small = RequestStream(state)
    await small.handle(_headers("/v1/completions"))
    list(await small.handle(_body(b'{"model":"m","prompt":"x"}', True)))
    small.complete()
    await asyncio.sleep(0.2)
    assert calls == []
    big = b'{"model":"m","prompt":"' + b"x" * TRIM_AFTER_BODY_BYTES + b'"}'
    for _ in range(3):
        s = RequestStream(state)
        await s.handle(_headers("/v1/completions"))
        list(await s.handle(_body(big, True)))
        s.complete()
        s.complete()  # idempotent
    refused = RequestStream(state)  # refused while gathering (over the limit): trimmed after too
    await refused.handle(_headers("/v1/completions"))
    (r,) = list(await refused.handle(_body(big + b" " * 20, True)))
    assert r.immediate_response.status.code == 413
    refused.complete()
    for _ in range(100):
        if calls:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)
    assert calls == [0] and state.trimmer.trims == 1


def test_malloc_trim_is_found_on_glibc() -> None:
    t = MemoryTrimmer()
    assert t.available
    t.trim_now()
    assert t.trims == 1


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"m","a":[1,2.5,-0,1e16,12345678901234567890123],"b":{"c":null,"d":true},"e":"\\u00e9\\n\xc3\xa9"}',
        b'{"a":1,"a":2}',
        b' {"model" : "m" } ',
        b'{"s":"\\ud83d\\ude00 \\ud800 lone"}',  # msgspec refuses the lone surrogate: the stdlib decodes it
        b'{"x":NaN,"y":-Infinity,"z":1e400}',
    ],
)
def test_decoding_matches_the_stdlib(body: bytes) -> None:
    got = decode_json_object(body)
    want = json.loads(body)
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"a":1} x', "request body is not valid JSON: Extra data: line 1 column 9 (char 8)"),
        (b'{"a":"\xff"}', "request body is not valid UTF-8"),
        (b"[1]", "request body must be a JSON object"),
        (b"[" * 5000 + b"]" * 5000, "request body nests deeper than 128 levels"),
        (b'{"a":' + b"[" * 500 + b"]" * 500 + b"}", "request body nests deeper than 128 levels"),
    ],
)
def test_decoding_errors_are_the_stdlibs(body: bytes, message: str) -> None:
    with pytest.raises(BadRequest) as e:
        decode_json_object(body)
    assert e.value.message == message


def test_rewrite_keeps_nonfinite_numbers_and_lone_surrogates() -> None:
    """Re-encoding after a model rewrite writes NaN/Infinity and lone surrogates back as they came (msgspec would
    write NaN as null and cannot encode a lone surrogate)."""
    parsed = decode_json_object(b'{"model":"a","t":NaN,"u":Infinity,"v":1.5}')
    out = json_model_rewriter(parsed)("b")
    assert out == b'{"model":"b","t":NaN,"u":Infinity,"v":1.5}'
    back = json.loads(out)
    assert math.isnan(back["t"])
    parsed = decode_json_object(b'{"model":"a","s":"\\ud800x\xc3\xa9"}')
    assert json_model_rewriter(parsed)("b") == b'{"model":"b","s":"\\ud800x\\u00e9"}'
    parsed = decode_json_object(b'{"model":"a","s":"\xc3\xa9","n":12345678901234567890123}')
    assert json_model_rewriter(parsed)("b") == b'{"model":"b","s":"\xc3\xa9","n":12345678901234567890123}'


@pytest.mark.parametrize("nan", [False, True])
def test_depth_limit_is_exact(nan: bool) -> None:
    """128 levels pass and 129 do not, in lists and objects mixed, also under a root the stdlib decoded (NaN)."""
    extra = b',"n":NaN' if nan else b""

    def body(levels: int) -> bytes:  # the root object is level 1
        inner = b"1"
        for i in range(levels - 1):
            inner = b'{"k":' + inner + b"}" if i % 2 else b"[0," + inner + b"]"
        return b'{"model":"m","x":' + inner + extra + b"}"

    assert decode_json_object(body(128))["model"] == "m"
    with pytest.raises(BadRequest, match="nests deeper than 128 levels"):
        decode_json_object(body(129))


async def test_declared_length_is_allocated_once_and_held_in_the_budget() -> None:
    """A body with a content-length is gathered into one buffer of that length, allocated at its first chunk and
    filled in place (growing a bytearray chunk by chunk reallocates it, which for 16 MiB bodies left the EPP at
    2.5-3.1x the body's size); its whole declared length counts in the in-flight budget from the first chunk, so
    declaring much and sending little cannot allocate past the budget. Forwarded byte-exact."""
    state = _state()
    s = RequestStream(state)
    body = json.dumps({"model": "m", "prompt": "y" * (3 * BODY_CHUNK_LIMIT)}).encode()
    await s.handle(_headers("/v1/completions", {"content-length": str(len(body))}))
    chunks = [body[i : i + BODY_CHUNK_LIMIT] for i in range(0, len(body), BODY_CHUNK_LIMIT)]
    assert len(chunks) == 4
    assert list(await s.handle(_body(chunks[0], False))) == []
    buf = s._body
    assert isinstance(buf, bytearray) and len(buf) == len(body)
    assert state.inflight_body_bytes == len(body)
    for c in chunks[1:-1]:
        assert list(await s.handle(_body(c, False))) == []
        assert s._body is buf and len(buf) == len(body)  # filled in place, never reallocated
    out = list(await s.handle(_body(chunks[-1], True)))
    pieces = [r.request_body.response.body_mutation.streamed_response.body for r in out[1:]]
    assert b"".join(pieces) == body
    assert state.inflight_body_bytes == 0


async def test_declared_length_over_the_budget_is_not_preallocated_and_short_bodies_are_cut() -> None:
    state = _state(max_inflight_body_bytes=5000)
    s = RequestStream(state)  # declares more than the whole budget: gathered as it comes, refused once past it
    await s.handle(_headers("/v1/completions", {"content-length": "6000"}))
    assert list(await s.handle(_body(b"x" * 100, False))) == []
    assert state.inflight_body_bytes == 100 and isinstance(s._body, bytes)
    (r,) = list(await s.handle(_body(b"x" * 4950, False)))
    assert r.immediate_response.status.code == 503 and state.inflight_body_bytes == 0
    # Declared 3000, 20 bytes come, then trailers end the body: the rest of the buffer is not forwarded.
    s = RequestStream(_state())
    body = b'{"model":"m","prompt":"hello"}'
    await s.handle(_headers("/v1/completions", {"content-length": "3000"}))
    assert list(await s.handle(_body(body[:20], False))) == []
    assert list(await s.handle(_body(body[20:], False))) == []
    out = list(await s.handle(pb.ProcessingRequest(request_trailers=pb.HttpTrailers())))
    sent = [r.request_body.response.body_mutation.streamed_response.body for r in out if r.HasField("request_body")]
    assert b"".join(sent) == body
