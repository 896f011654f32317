"""The parser registry (requestHandler.parsers): path resolution as the router's, memoized and bounded, explicit
lists; and a hypothesis fuzz per parser (any body: a ParsedRequest or a clean 4xx)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epp.framework.errors import BadRequest
from epp.framework.parsing import NoParser, ParsedRequest, ParserRegistry
from epp.plugins.parsers._grpc import grpc_frame
from epp.plugins.parsers.anthropic_parser import AnthropicParser
from epp.plugins.parsers.openai_parser import OpenAIParser
from epp.plugins.parsers.passthrough_parser import PassthroughParser
from epp.plugins.parsers.sglanghttp_parser import SGLangHTTPParser
from epp.plugins.parsers.vertexai_parser import VertexAIParser
from epp.plugins.parsers.vllmgrpc_parser import EMBED, GENERATE, VLLMGRPCParser
from epp.plugins.parsers.vllmhttp_parser import VLLMHTTPParser
from epp.protocol.openai import build_request
from tests.plugins.parsers.support import DEFAULT, hdrs


def _types(reg: ParserRegistry, *paths: str) -> list[str]:
    return [reg.resolve(p).type_name for p in paths]


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
