"""The request parsers (requestHandler.parsers): each API's fields, validation and errors, the registry's path
resolution as the router's, and a hypothesis fuzz per parser (any body: a ParsedRequest or a BadRequest)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epp.framework.errors import BadRequest
from epp.framework.parsing import NoParser, ParsedRequest, ParserRegistry, request_path
from epp.framework.types import InferenceRequest
from epp.plugins.parsers._common import MAX_JSON_DEPTH, decode_json_object
from epp.plugins.parsers._grpc import grpc_frame
from epp.plugins.parsers.anthropic_parser import AnthropicParser
from epp.plugins.parsers.openai_parser import OpenAIParser, detect_api
from epp.plugins.parsers.passthrough_parser import PassthroughParser
from epp.plugins.parsers.sglanghttp_parser import SGLangHTTPParser
from epp.plugins.parsers.vertexai_parser import VertexAIParser
from epp.plugins.parsers.vllmgrpc_parser import EMBED, GENERATE, VLLMGRPCParser
from epp.plugins.parsers.vllmhttp_parser import VLLMHTTPParser
from epp.protocol.openai import build_request
from epp.wiring.builtins import default_parsers

DEFAULT = default_parsers()


def parse_request(
    headers: dict[str, str], body: bytes, rewrites: Mapping[str, str] | None = None
) -> tuple[InferenceRequest, bytes]:
    """What the server does with a body: the parser for the path, then the request assembly."""
    parsed = DEFAULT.resolve(request_path(headers)).parse(headers, body)
    return build_request(headers, parsed, body, rewrites)


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


# -- the registry: the router's path resolution ------------------------------------------------------------------


def _types(reg: ParserRegistry, *paths: str) -> list[str]:
    return [reg.resolve(p).type_name for p in paths]


def test_default_registry_routes_like_the_router() -> None:
    assert _types(
        DEFAULT,
        "/v1/chat/completions",
        "/v1/completions/render",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/inference/v1/generate",
        "/generate",
        "/v1/images/generations",
        "/anything/else",
    ) == [
        "openai-parser",
        "openai-parser",
        "anthropic-parser",
        "anthropic-parser",
        "vllmhttp-parser",
        "passthrough-parser",  # sglanghttp-parser is not a default
        "openai-parser",
        "passthrough-parser",
    ]


def test_resolution_is_memoized_per_path_with_the_same_answers_and_bounded() -> None:
    reg = ParserRegistry([SGLangHTTPParser(), VLLMHTTPParser(), OpenAIParser(), PassthroughParser("pt")])
    paths = ["/inference/v1/generate", "/generate", "/v1/chat/completions/", "/v1/messages", "/x/y?z"]
    first = [reg._resolve(p) for p in paths]  # the unmemoized walk
    assert [reg.resolve(p) for p in paths] == first
    assert [reg.resolve(p) for p in paths] == first  # from the memo
    for i in range(1000):  # client-chosen paths cannot grow it without bound
        assert reg.resolve(f"/junk/{i}") is reg.fallback
    assert len(reg._resolved) <= ParserRegistry._CACHE_MAX
    strict = ParserRegistry([OpenAIParser()])
    for _ in range(2):  # an unmatched path keeps failing (failures are not memoized)
        with pytest.raises(NoParser):
            strict.resolve("/v1/other")


def test_explicit_list_longest_suffix_no_fallback_and_skips() -> None:
    reg = ParserRegistry([SGLangHTTPParser(), VLLMHTTPParser(), OpenAIParser("a"), OpenAIParser("b")])
    # "inference/v1/generate" is longer than "generate": vllmhttp wins whatever the order
    assert _types(reg, "/inference/v1/generate", "/generate") == ["vllmhttp-parser", "sglanghttp-parser"]
    assert reg.skipped == ["b"]  # a second parser of one type is skipped
    with pytest.raises(NoParser):
        reg.resolve("/v1/other")
    reg = ParserRegistry([OpenAIParser(), PassthroughParser("pt"), AnthropicParser()])
    assert reg.skipped == ["anthropic-parser"]  # after the fallback: skipped
    assert _types(reg, "/v1/messages") == ["passthrough-parser"]


# -- each API -------------------------------------------------------------------------------------------------------


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


ANTHROPIC = {
    "model": "claude",
    "max_tokens": 64,
    "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cch=123"},
        {"type": "text", "text": "You are helpful."},
    ],
    "tools": [{"name": "calc", "description": "math", "input_schema": {"type": "object", "properties": {}}}],
    "messages": [
        {"role": "user", "content": "2+2?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "simple", "signature": "s"},
                {"type": "text", "text": "Let me compute."},
                {"type": "tool_use", "id": "t1", "name": "calc", "input": {"expr": "2+2"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "4"}]},
                {"type": "text", "text": "and 3+3?"},
            ],
        },
    ],
    "stream": True,
}


def test_anthropic_messages_as_vllm_converts_them() -> None:
    req, fwd = parse_request(hdrs("/v1/messages"), json.dumps(ANTHROPIC).encode(), {"claude": "qwen"})
    assert (req.api, req.model, req.target_model, req.max_tokens, req.stream) == (
        "messages",
        "claude",
        "qwen",
        64,
        True,
    )
    assert json.loads(fwd)["model"] == "qwen"
    assert req.messages == [
        {"role": "system", "content": "You are helpful."},  # the billing header is dropped
        {"role": "user", "content": "2+2?"},
        {
            "role": "assistant",
            "reasoning": "simple",
            "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "2+2"}'}}
            ],
            "content": "Let me compute.",
        },
        {"role": "tool", "tool_call_id": "t1", "content": "4"},  # before the user turn that carried it
        {"role": "user", "content": "and 3+3?"},
    ]
    assert req.tools == [
        {
            "type": "function",
            "function": {"name": "calc", "description": "math", "parameters": {"type": "object", "properties": {}}},
        }
    ]
    req, _ = parse_request(hdrs("/v1/messages/count_tokens"), json.dumps(ANTHROPIC).encode())
    assert req.api == "count_tokens" and req.messages is None


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{", "not valid JSON"),
        (b'{"model":"c","max_tokens":1}', "at least one message"),
        (b'{"model":"c","messages":[{"content":"x"}]}', "with a role"),
        (b'{"model":"c","messages":[{"role":"user","content":5}]}', "content must be"),
        (b'{"model":"c","messages":[{"role":"user","content":[{"text":"x"}]}]}', "with a type"),
        (b'{"model":"c","messages":[{"role":"user","content":"x"}],"tools":[{}]}', "tools[0]"),
        (b'{"messages":[{"role":"user","content":"x"}]}', "model not found"),
    ],
)
def test_anthropic_errors_in_anthropic_shape(body: bytes, fragment: str) -> None:
    parser = DEFAULT.resolve("/v1/messages")
    with pytest.raises(BadRequest) as e:
        parser.parse(hdrs("/v1/messages"), body)
    assert fragment in e.value.message
    assert json.loads(e.value.body(parser.error_format)) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": e.value.message},
    }


def test_vllm_generate_token_ids_and_features() -> None:
    body = {
        "token_ids": [1, 2, 3, 4],
        "features": {
            "mm_hashes": {"image": ["h1", "h0"]},
            "mm_placeholders": {"image": [{"offset": 3, "length": 1}, {"offset": 1, "length": 2}]},
        },
        "sampling_params": {"max_tokens": 5},
        "cache_salt": "s",
    }
    req, fwd = parse_request(hdrs("/inference/v1/generate"), json.dumps(body).encode(), {"": "x"})
    assert (req.api, req.token_ids, req.max_tokens, req.cache_salt, req.model) == ("generate", [1, 2, 3, 4], 5, "s", "")
    assert [(f.hash, f.offset, f.length) for f in req.mm_features or []] == [("h0", 1, 2), ("h1", 3, 1)]
    assert fwd == json.dumps(body).encode()  # no model field: nothing to rewrite
    for bad, fragment in [
        ({"token_ids": []}, "non-empty"),
        ({"token_ids": [1, -1]}, "token_ids[1]"),
        ({"token_ids": [1.5]}, "token_ids[0]"),
        ({"token_ids": [1], "features": {"mm_hashes": {"image": [1]}}}, "must be a string"),
    ]:
        with pytest.raises(BadRequest, match=re.escape(fragment)):
            parse_request(hdrs("/inference/v1/generate"), json.dumps(bad).encode())


def test_sglang_generate_ids_batch_text_and_salt() -> None:
    reg = ParserRegistry([SGLangHTTPParser(), OpenAIParser()])
    p = reg.resolve("/generate")
    got = p.parse(
        hdrs("/generate"), b'{"input_ids":[[5,6],[7]],"extra_key":"k","sampling_params":{"max_new_tokens":3}}'
    )
    assert (got.token_ids, got.cache_salt, got.max_tokens) == ([5, 6], "k", 3)
    got = p.parse(hdrs("/generate"), b'{"text":"hello","stream":true}')
    assert (got.api, got.prompt, got.token_ids, got.stream) == ("completions", "hello", None, True)
    for bad, fragment in [(b"{}", "input_ids or text"), (b'{"input_ids":"x"}', "input_ids"),
                          (b'{"input_ids":[1],"extra_key":3}', "extra_key")]:  # fmt: skip
        with pytest.raises(BadRequest, match=fragment):
            p.parse(hdrs("/generate"), bad)
    with pytest.raises(BadRequest, match="unsupported path"):
        p.parse(hdrs("/v2/generate"), b'{"input_ids":[1]}')


def _grpc_headers(method: str) -> dict[str, str]:
    return {":path": f"/{method}", ":method": "POST", "content-type": "application/grpc"}


def test_vllmgrpc_generate_tokenized_text_embed_and_other_methods() -> None:
    from smg_grpc_proto import vllm_engine_pb2 as pb  # vLLM's own gRPC messages

    parser = VLLMGRPCParser()
    msg = pb.GenerateRequest(request_id="r", tokenized=pb.TokenizedInput(input_ids=[9, 8, 7]), stream=True)
    msg.sampling_params.max_tokens = 11
    msg.mm_inputs.mm_hashes.append("img0")
    msg.mm_inputs.mm_placeholders.append(pb.PlaceholderRange(offset=1, length=2))
    got = parser.parse(_grpc_headers(GENERATE), grpc_frame(msg.SerializeToString()))
    assert (got.api, got.token_ids, got.stream, got.max_tokens) == ("generate", [9, 8, 7], True, 11)
    assert [(f.modality, f.hash, f.offset, f.length) for f in got.mm_features or []] == [("image", "img0", 1, 2)]
    text = pb.GenerateRequest(text="hello there")
    got = parser.parse(_grpc_headers(GENERATE), grpc_frame(text.SerializeToString()))
    assert (got.api, got.prompt) == ("completions", "hello there")
    embed = pb.EmbedRequest(tokenized=pb.TokenizedInput(input_ids=[1, 2]))
    assert parser.parse(_grpc_headers(EMBED), grpc_frame(embed.SerializeToString())).token_ids == [1, 2]
    other = parser.parse(_grpc_headers("vllm.grpc.engine.VllmEngine/HealthCheck"), b"\x00\x00\x00\x00\x00")
    assert other.skip_response and other.api == "passthrough"
    for body, fragment in [
        (b"\x00\x00", "at least 5 bytes"),
        (b"\x01\x00\x00\x00\x01x", "compressed"),
        (b"\x00\x00\x00\x00\x09abc", "incomplete"),
        (grpc_frame(pb.GenerateRequest(request_id="r").SerializeToString()), "no input"),
        (grpc_frame(b"\x12\x05\x10"), "truncated"),
    ]:
        with pytest.raises(BadRequest, match=fragment):
            parser.parse(_grpc_headers(GENERATE), body)


def test_vertexai_chat_completions_and_raw_predict() -> None:
    from google.api import httpbody_pb2

    def request(data: bytes) -> bytes:
        body = httpbody_pb2.HttpBody(content_type="application/json", data=data).SerializeToString()
        endpoint = b"projects/p/endpoints/e"
        # ChatCompletionsRequest{endpoint = 1; http_body = 2}
        msg = b"\x0a" + bytes([len(endpoint)]) + endpoint + b"\x12" + bytes([len(body)]) + body
        return grpc_frame(msg)

    parser = VertexAIParser()
    chat = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
    got = parser.parse(
        _grpc_headers("google.cloud.aiplatform.v1beta1.PredictionService/ChatCompletions"), request(chat)
    )
    assert (got.api, got.model, got.messages, got.rewrite_model) == (
        "chat",
        "m",
        [{"role": "user", "content": "hi"}],
        None,
    )
    raw = b'{"model":"m","input":"hello"}'
    got = parser.parse(_grpc_headers("google.cloud.aiplatform.v1.PredictionService/RawPredict"), request(raw))
    assert (got.api, got.messages) == ("responses", [{"role": "user", "content": "hello"}])
    with pytest.raises(BadRequest, match="parsing ChatCompletionsRequest: model not found"):
        parser.parse(_grpc_headers("x.PredictionService/ChatCompletions"), request(b'{"messages":[]}'))
    assert parser.parse(_grpc_headers("x.PredictionService/Predict"), b"").skip_response


def test_passthrough_keeps_the_body_and_reads_nothing() -> None:
    body = b"\x00\xffnot json at all"
    req, fwd = parse_request(hdrs("/custom/api"), body, {"": "x"})
    assert fwd is body and (req.api, req.model, req.prompt, req.messages) == ("passthrough", "", None, None)


# -- fuzz: any body, any parser: a ParsedRequest or a BadRequest, never another exception --------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
_KEYS = ["model", "messages", "prompt", "input", "items", "tools", "system", "role", "content", "type", "text",
         "token_ids", "input_ids", "features", "sampling_params", "instructions", "tool_use_id", "source",
         "chat_template_kwargs", "cache_salt", "extra_key", "mm_hashes", "mm_placeholders", "thinking"]  # fmt: skip
_SHAPED = st.recursive(
    st.none() | st.integers(0, 300) | st.sampled_from(["user", "assistant", "system", "text", "tool_use", "m", ""]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.sampled_from(_KEYS), children, max_size=5),
    max_leaves=30,
)
_PARSERS = [OpenAIParser(), AnthropicParser(), VLLMHTTPParser(), SGLangHTTPParser(), VertexAIParser(),
            VLLMGRPCParser(), PassthroughParser()]  # fmt: skip
_PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings", "/v1/conversations",
          "/v1/images/generations", "/v1/messages", "/v1/messages/count_tokens", "/inference/v1/generate",
          "/generate", f"/{GENERATE}", f"/{EMBED}", "/x.PredictionService/ChatCompletions",
          "/x.PredictionService/RawPredict", "/other"]  # fmt: skip


def _bodies() -> st.SearchStrategy[bytes]:
    as_json = (_JSON | _SHAPED).map(lambda v: json.dumps(v).encode())
    return st.one_of(st.binary(max_size=64), as_json, as_json.map(grpc_frame), st.binary(max_size=40).map(grpc_frame))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_PARSERS), st.sampled_from(_PATHS), _bodies())
def test_fuzz_every_parser(parser: Any, path: str, body: bytes) -> None:
    try:
        parsed = parser.parse(hdrs(path), body)
    except BadRequest as e:
        json.loads(e.body(parser.error_format))
        return
    assert isinstance(parsed, ParsedRequest)
    build_request(hdrs(path), parsed, body, {"m": "n"})


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
