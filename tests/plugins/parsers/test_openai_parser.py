"""openai-parser: API detection by path, each API's fields (completions, chat, responses, images, embeddings),
validation, model rewrites and the JSON depth limit."""

from __future__ import annotations

import json
from typing import Any

import pytest

from epp.framework.errors import BadRequest
from epp.framework.parsing import request_path
from epp.plugins.parsers._common import MAX_JSON_DEPTH, decode_json_object
from epp.plugins.parsers.openai_parser import detect_api
from tests.plugins.parsers.support import hdrs, parse_request


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
        ("/generate", "completions"),
    ],
)
def test_detect_api(path: str, api: str) -> None:
    assert detect_api(path) == api


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
        ("/v1/chat/completions", b'{"model": "m", "messages": ["x"]}', "must be an object with a role"),
        ("/v1/chat/completions", b'{"model": "m", "prompt": "x"}', "at least one message"),
        ("/v1/embeddings", b'{"model": "m"}', "input not found"),
        ("/v1/completions", b'{"model": "\xc3"}', "UTF-8"),
        # token ids the prefix hash cannot pack (was an OverflowError traceback on the precise path)
        ("/v1/completions", b'{"model": "m", "prompt": [1, 1180591620717411303424]}', "prompt[1]: invalid token id"),
        ("/v1/completions", b'{"model": "m", "prompt": [-1]}', "prompt[0]: invalid token id -1"),
        ("/v1/completions", b'{"model": "m", "prompt": [[5, 6], [7, 4294967296]]}', "prompt[1][1]: invalid token"),
        ("/v1/embeddings", b'{"model": "m", "input": [3, -2]}', "input[1]: invalid token id"),
        # found by the request fuzzer (fuzz/targets.py): an object as a content part's type was a TypeError (500)
        (
            "/v1/chat/completions",
            b'{"model": "m", "messages": [{"role": "u", "content": [{"type": {"url": "x"}}]}]}',
            "messages[0].content[0].type must be a string",
        ),
    ],
)
def test_bad_requests(path: str, body: bytes, fragment: str) -> None:
    with pytest.raises(BadRequest) as e:
        parse_request(hdrs(path), body)
    assert fragment in e.value.message
    assert json.loads(e.value.body())["error"]["code"] == 400


def test_good_token_ids_and_string_lists_pass() -> None:
    for prompt in ([0, 4294967295], [[1, 2], [3]], ["a", "b"], [1.5]):
        req, _ = parse_request(hdrs(), json.dumps({"model": "m", "prompt": prompt}).encode())
        assert req.prompt == prompt


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


def test_json_depth_limit() -> None:
    ok = b'{"a":' + b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1) + b"}"
    assert decode_json_object(ok)
    for depth in (MAX_JSON_DEPTH, 5000, 200_000):
        deep = b'{"a":' + b"[" * depth + b"]" * depth + b"}"
        with pytest.raises(BadRequest, match="nests deeper than 128 levels"):
            decode_json_object(deep)
    # objects and arrays interleaved: neither kind alone reaches the limit, together they nest past it
    pairs = MAX_JSON_DEPTH // 2
    with pytest.raises(BadRequest, match="nests deeper than 128 levels"):
        decode_json_object(b'{"a":[' * pairs + b"{}" + b"]}" * pairs)
    assert decode_json_object(b'{"a":[' * (pairs - 1) + b"{}" + b"]}" * (pairs - 1))
    many = b'{"a":[' + b",".join([b"[]"] * 5000) + b"]}"  # many containers, shallow: fine
    assert len(decode_json_object(many)["a"]) == 5000


def test_responses_instructions_items_and_tools() -> None:
    body: dict[str, Any] = {
        "model": "m",
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "need a tool"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]},
            {"role": "user", "content": "thanks"},
        ],
        "tools": [
            {"type": "function", "name": "get_weather", "parameters": {"type": "object"}},
            {"type": "web_search"},
        ],
        "max_output_tokens": 7,
    }
    req, _ = parse_request(hdrs("/v1/responses"), json.dumps(body).encode())
    assert req.api == "responses" and req.max_tokens == 7
    assert req.messages == [
        {"role": "system", "content": "Be brief."},
        body["input"][0],
        {
            "role": "assistant",
            "reasoning": "need a tool",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "thanks"},
    ]
    assert req.tools == [
        {"type": "function", "function": {"name": "get_weather", "description": None, "parameters": {"type": "object"}}}
    ]
    with pytest.raises(BadRequest, match="encrypted"):
        parse_request(hdrs("/v1/responses"), b'{"model":"m","input":[{"type":"reasoning","encrypted_content":"x"}]}')
    with pytest.raises(BadRequest, match="unsupported input item"):
        parse_request(hdrs("/v1/responses"), b'{"model":"m","input":[{"type":"nope"}]}')


def test_images_generations_and_embeddings() -> None:
    req, _ = parse_request(hdrs("/v1/images/generations"), b'{"model":"m","prompt":"a cat","size":"64x64"}')
    assert (req.api, req.prompt) == ("images", "a cat")
    with pytest.raises(BadRequest, match="prompt"):
        parse_request(hdrs("/v1/images/generations"), b'{"model":"m"}')
    req, _ = parse_request(hdrs("/v1/embeddings"), b'{"model":"m","input":["a","b"]}')
    assert (req.api, req.prompt) == ("embeddings", ["a", "b"])


async def test_pre_tokenized_requests_need_no_tokenizer() -> None:
    """/inference/v1/generate token ids go to the prefix index as they are: the tokenizer (here a model server
    that does not exist) is never asked."""
    from epp.framework import TOKENIZED_PROMPT
    from epp.plugins.producers.token_producer import TokenProducer
    from epp.tokenization.prompt import HTTPBackend, PromptTokenizer

    backend = HTTPBackend("http://127.0.0.1:1", timeout=0.2)
    producer = TokenProducer("tp", PromptTokenizer(backend))
    req, _ = parse_request(hdrs("/inference/v1/generate"), b'{"token_ids":[5,6,7,8],"model":"m"}')
    await producer.prepare(req, [])
    got = req.data.get(TOKENIZED_PROMPT)
    assert got is not None and got.token_ids == [5, 6, 7, 8]
    chat, _ = parse_request(hdrs("/v1/chat/completions"), b'{"model":"m","messages":[{"role":"user","content":"x"}]}')
    await producer.prepare(chat, [])  # this one needs the (unreachable) tokenizer: no token data, no exception
    assert chat.data.get(TOKENIZED_PROMPT) is None
    await backend.close()
