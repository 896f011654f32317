"""Framework types: the API kind is a str enum, so logs, JSON and metric labels show the plain names."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry, Counter, generate_latest

from epp.framework import ApiKind
from epp.framework.parsing import ParserRegistry
from epp.plugins.parsers.anthropic_parser import AnthropicParser
from epp.plugins.parsers.openai_parser import OpenAIParser
from epp.plugins.parsers.passthrough_parser import PassthroughParser
from epp.plugins.parsers.vllmhttp_parser import VLLMHTTPParser


def test_the_api_kind_reads_and_prints_as_its_name() -> None:
    assert ApiKind("chat") is ApiKind.CHAT and ApiKind.COUNT_TOKENS.value == "count_tokens"
    assert f"{ApiKind.MESSAGES}" == str(ApiKind.MESSAGES) == "messages"
    assert json.dumps({"api": ApiKind.EMBEDDINGS}) == '{"api": "embeddings"}'
    registry = CollectorRegistry()
    Counter("requests", "by api", ["api"], registry=registry).labels(ApiKind.RESPONSES).inc()
    assert 'requests_total{api="responses"} 1.0' in generate_latest(registry).decode()


def test_parsers_name_the_api_with_the_enum() -> None:
    parsers = ParserRegistry([OpenAIParser(), AnthropicParser(), VLLMHTTPParser(), PassthroughParser()])
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}'
    for path, kind in [
        ("/v1/chat/completions", ApiKind.CHAT),
        ("/v1/completions", ApiKind.COMPLETIONS),
        ("/v1/messages", ApiKind.MESSAGES),
        ("/v1/messages/count_tokens", ApiKind.COUNT_TOKENS),
    ]:
        parser = parsers.resolve(path)
        assert parser is not None
        payload = body if kind is not ApiKind.COMPLETIONS else b'{"model": "m", "prompt": "hi"}'
        parsed = parser.parse({":path": path}, payload)
        assert type(parsed.api) is ApiKind and parsed.api is kind, path
