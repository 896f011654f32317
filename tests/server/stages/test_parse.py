"""The parse stage: the gathered body into an InferenceRequest by the path's parser, model rewrites applied
to the forwarded body, bad bodies a 400 in the API's shape (a large body parsed off the loop:
test_parse_large_body.py)."""

from __future__ import annotations

import json

import grpc
import pytest

from epp.framework.types import Usage
from tests.server.support import (
    DEST,
    Harness,
    body_msg,
    exchange,
    headers_msg,
    resp_body_msg,
    resp_headers_msg,
    set_headers,
)


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


async def test_passthrough_forwards_any_body_unchanged(epp: Harness) -> None:
    body = b"\x00\x01 arbitrary, not JSON \xff" * 100
    call = epp.stub.Process()
    out = await exchange(call, [headers_msg("/custom/v9/thing"), body_msg(body, True)], 2)
    assert set_headers(out[0])[DEST] and set_headers(out[0])["content-length"] == str(len(body))
    assert out[1].request_body.response.body_mutation.streamed_response.body == body
    assert epp.director.requests[-1].api == "passthrough" and epp.director.requests[-1].model == ""
    call.cancel()
