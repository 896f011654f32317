"""OpenAI request parsing, usage reading and the response model-name rewriter (no gRPC, no Envoy)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.framework.errors import BadRequest
from epp.framework.types import Usage
from epp.protocol.openai import bodyless_request, detect_api, parse_request, request_path
from epp.protocol.rewrite import ModelNameRewriter
from epp.protocol.usage import SSEUsageReader, usage_from_json, usage_from_object


def hdrs(path: str = "/v1/completions", **extra: str) -> dict[str, str]:
    return {":path": path, ":method": "POST", **extra}


@pytest.mark.parametrize(
    ("path", "api"),
    [
        ("/v1/completions", "completions"),
        ("/v1/chat/completions", "chat"),
        ("/v1/chat/completions/", "chat"),
        ("/openai/v1/chat/completions", "chat"),
        ("/v1/responses", "responses"),
        ("/v1/embeddings", "embeddings"),
        ("/v1/conversations", "conversations"),
        ("/generate", "other"),
    ],
)
def test_detect_api(path: str, api: str) -> None:
    assert detect_api(path)[0] == api


def test_path_falls_back_to_original_path_and_drops_query() -> None:
    assert request_path({"x-original-path": "/v1/chat/completions?x=1"}) == "/v1/chat/completions"
    assert (
        request_path({":path": "/v1/completions?a=b", "x-original-path": "/v1/chat/completions"}) == "/v1/completions"
    )
    assert request_path({}) == "/v1/completions"


def test_completions_fields() -> None:
    body = b'{"model":"m","prompt":"hi","stream":true,"max_tokens":9}'
    req, fwd = parse_request(hdrs(**{"x-request-id": "r1", "x-gateway-inference-objective": "crit"}), body)
    assert fwd is body  # not re-encoded when the model is unchanged
    assert (req.model, req.target_model, req.prompt, req.stream, req.max_tokens) == ("m", "m", "hi", True, 9)
    assert (req.request_id, req.api, req.objective, req.body_size) == ("r1", "completions", "crit", len(body))
    assert req.fairness_id == "default-flow"


def test_chat_fields_and_max_completion_tokens() -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 4})
    req, _ = parse_request(hdrs("/v1/chat/completions"), body.encode())
    assert req.messages == [{"role": "user", "content": "x"}]
    assert req.max_tokens == 4
    assert req.stream is False


@pytest.mark.parametrize(
    ("path", "body", "fragment"),
    [
        ("/v1/completions", b"", "empty"),
        ("/v1/completions", b"   ", "not valid JSON"),
        ("/v1/completions", b"hello", "not valid JSON"),
        ("/v1/completions", b'"str"', "JSON object"),
        ("/v1/completions", b'{"model": "m", "prompt": "x"', "not valid JSON"),
        ("/v1/completions", b'{"prompt": "x"}', "model not found"),
        ("/v1/completions", b'{"model": "", "prompt": "x"}', "model not found"),
        ("/v1/completions", b'{"model": ["m"], "prompt": "x"}', "model not found"),
        ("/v1/completions", b'{"model": "m"}', "prompt not found"),
        ("/v1/completions", b'{"model": "m", "prompt": 3}', "prompt must be"),
        ("/v1/chat/completions", b'{"model": "m", "messages": []}', "at least one message"),
        ("/v1/chat/completions", b'{"model": "m", "messages": ["x"]}', "list of objects"),
        ("/v1/chat/completions", b'{"model": "m", "prompt": "x"}', "at least one message"),
        ("/v1/embeddings", b'{"model": "m"}', "input not found"),
        ("/v1/completions", b'{"model": "\xc3"}', "UTF-8"),
    ],
)
def test_bad_requests(path: str, body: bytes, fragment: str) -> None:
    with pytest.raises(BadRequest) as e:
        parse_request(hdrs(path), body)
    assert fragment in e.value.message
    assert json.loads(e.value.body())["error"]["code"] == 400


def test_unicode_and_huge_json() -> None:
    prompt = "日本語 🙂 é" * 130_000
    body = json.dumps({"model": "m", "prompt": prompt}, ensure_ascii=False).encode()
    req, _ = parse_request(hdrs(), body)
    assert req.prompt == prompt
    assert len(body) > 2_000_000


def test_model_rewrites_config_and_header() -> None:
    body = '{"model":"alias","prompt":"ü"}'.encode()
    req, fwd = parse_request(hdrs(), body, {"alias": "real"})
    assert (req.model, req.target_model) == ("alias", "real")
    assert json.loads(fwd) == {"model": "real", "prompt": "ü"}
    assert req.body_size == len(fwd)
    req, fwd = parse_request(hdrs(**{"x-gateway-model-name-rewrite": "hdr"}), body, {"alias": "real"})
    assert req.target_model == "hdr"
    assert json.loads(fwd)["model"] == "hdr"


def test_bodyless_request() -> None:
    req = bodyless_request({":path": "/v1/models", ":method": "GET"})
    assert req.api == "other"
    assert req.model == ""
    assert req.request_id


# -- usage -------------------------------------------------------------------------------------------------------


def test_usage_from_json_variants() -> None:
    chat = (
        b'{"object":"chat.completion","usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,'
        b'"prompt_tokens_details":{"cached_tokens":4}}}'
    )
    assert usage_from_json(chat) == Usage(10, 5, 15, 4, cached_tokens_reported=True)
    resp = (
        b'{"object":"response","usage":{"input_tokens":7,"output_tokens":2,"input_tokens_details":{"cached_tokens":1}}}'
    )
    assert usage_from_json(resp) == Usage(7, 2, 9, 1, cached_tokens_reported=True)
    # no details: 0 cached tokens, and not reported (vLLM without --enable-prompt-tokens-details)
    assert usage_from_json(b'{"usage":{"prompt_tokens":3,"prompt_tokens_details":null}}') == Usage(3, 0, 3)
    assert usage_from_json(b'{"usage": null}') is None
    assert usage_from_json(b"not json") is None
    assert usage_from_json(b"") is None
    assert usage_from_object({"type": "response.completed", "response": {"usage": {"input_tokens": 3}}}) == Usage(
        3, 0, 3
    )


SSE = (
    b'data: {"choices":[{"delta":{"content":"a"}}],"usage":null}\n\n'
    b'data: {"choices":[{"delta":{"content":"b\\u00e9"}}]}\r\n\r\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":2,"total_tokens":14}}\n\n'
    b"data: [DONE]\n\n"
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(SSE)), max_size=12))
def test_sse_usage_split_anywhere(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    parts = [SSE[a:b] for a, b in zip([0, *points], [*points, len(SSE)], strict=True)]
    reader = SSEUsageReader()
    for p in parts:
        reader.feed(p)
    reader.close()
    assert reader.usage == Usage(12, 2, 14)


def test_sse_last_usage_wins_and_unterminated_last_line() -> None:
    r = SSEUsageReader()
    r.feed(b'data: {"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\ndata: {"usage":{"prompt_tokens":1,')
    r.feed(b'"completion_tokens":3}}')
    assert r.usage == Usage(1, 1, 2)
    r.close()
    assert r.usage == Usage(1, 3, 4)


def test_sse_garbage_is_ignored() -> None:
    r = SSEUsageReader()
    r.feed(b'event: x\ndata: {"usage": broken\n: comment\ndata:\n\n')
    r.close()
    assert r.usage is None


# -- model rewrite back --------------------------------------------------------------------------------------------

REPLY = (
    b'{"id":"x","model":"served-model","choices":[{"text":"the \\"model\\": \\"served-model\\""}],'
    b'"m":{"model": "served-model"}}'
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(REPLY)), max_size=10))
def test_rewriter_split_anywhere(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    parts = [REPLY[a:b] for a, b in zip([0, *points], [*points, len(REPLY)], strict=True)]
    rw = ModelNameRewriter("served-model", "client")
    out = b"".join(rw.feed(p, i == len(parts) - 1) for i, p in enumerate(parts))
    assert out == REPLY.replace(b'"model":"served-model"', b'"model":"client"').replace(
        b'"model": "served-model"', b'"model": "client"'
    )
    assert json.loads(out)["model"] == "client"


def test_rewriter_holds_back_only_possible_prefixes() -> None:
    rw = ModelNameRewriter("t", "client")
    assert rw.feed(b'data: {"a":1}\n\n') == b'data: {"a":1}\n\n'
    assert rw.feed(b'{"x":1,"mod') == b'{"x":1,'
    assert rw.feed(b'el":"t"}', True) == b'"model":"client"}'


def test_rewriter_unicode_names() -> None:
    rw = ModelNameRewriter("modèle-服务", "client-é")
    body = json.dumps({"model": "modèle-服务"}, ensure_ascii=False).encode()
    assert json.loads(rw.feed(body, True)) == {"model": "client-é"}


def test_json_depth_limit() -> None:
    from epp.protocol.openai import MAX_JSON_DEPTH, decode_json_body

    ok = b'{"a":' + b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1) + b"}"
    assert decode_json_body(ok)
    for depth in (MAX_JSON_DEPTH, 5000, 200_000):
        deep = b'{"a":' + b"[" * depth + b"]" * depth + b"}"
        with pytest.raises(BadRequest, match="nests deeper than 128 levels"):
            decode_json_body(deep)
    many = b'{"a":[' + b",".join([b"[]"] * 5000) + b"]}"  # many containers, shallow: fine
    assert len(decode_json_body(many)["a"]) == 5000


def test_usage_ignores_absurd_token_counts() -> None:
    u = usage_from_json(b'{"usage":{"prompt_tokens":-4,"completion_tokens":' + b"9" * 500 + b"}}")
    assert u is not None and (u.prompt_tokens, u.completion_tokens) == (0, 0)
