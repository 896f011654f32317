"""Token parity with vLLM: the token ids the EPP computes for chat (with tools), Anthropic Messages and Responses
requests equal what vLLM renders for them, under two template families (Qwen2.5-Instruct's and Llama-3.1-Instruct's
official templates, shipped in templates/).

vLLM's side runs vLLM's own code (tests/tokenization/vllm_source.py): the Anthropic and Responses conversions, the
chat-message parsing into the template's conversation, the tool serialization; then the template is applied and
the text encoded without added special tokens, as vLLM's HF renderer does. Our side is the parser plugin plus the
token-producer's tokenizer (epp.tokenization), from the request bytes.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

import tests.tokenization.vllm_source as vllm
from epp.framework.parsing import request_path
from epp.tokenization.chat import content_format
from epp.tokenization.prompt import HFBackend, PromptTokenizer
from epp.tokenization.qwen import QWEN25_MODEL, load_qwen25_tokenizer, qwen25_tokenizer_dir
from epp.wiring.builtins import default_parsers

TEMPLATES = {p.stem: p.read_text() for p in (Path(__file__).parent / "templates").glob("*.jinja")}
PARSERS = default_parsers()


@pytest.fixture(scope="module")
def hf() -> Any:
    return load_qwen25_tokenizer()


def vllm_ids(hf: Any, template: str, convo: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
    text = hf.apply_chat_template(
        convo, tools=tools, chat_template=template, tokenize=False, add_generation_prompt=True
    )
    return list(hf(text, add_special_tokens=False)["input_ids"])


async def epp_ids(template: str, path: str, body: dict[str, Any]) -> list[int]:
    headers = {":path": path, ":method": "POST"}
    parsed = PARSERS.resolve(request_path(headers)).parse(headers, json.dumps(body).encode())
    tok = PromptTokenizer(HFBackend({QWEN25_MODEL: qwen25_tokenizer_dir()}, chat_template=template))
    assert parsed.messages is not None
    return await tok.tokenize(
        QWEN25_MODEL, messages=parsed.messages, tools=parsed.tools, chat_template_kwargs=parsed.chat_template_kwargs
    )


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

CHAT: dict[str, Any] = {
    "model": QWEN25_MODEL,
    "tools": [WEATHER_TOOL, {"type": "function", "function": {"name": "noop", "strict": True}}],
    "messages": [
        {"role": "system", "content": [{"type": "text", "text": "x-anthropic-billing-header: cch=9\nBe terse."}]},
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}, {"type": "text", "text": "Now."}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "sunny, 24C"}]},
        {"role": "assistant", "content": "Sunny, 24C.", "reasoning": "read the tool output", "tool_calls": []},
        {"role": "user", "content": "And tomorrow?", "name": "ann"},
    ],
}

ANTHROPIC: dict[str, Any] = {
    "model": QWEN25_MODEL,
    "max_tokens": 256,
    "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=abc"},
        {"type": "text", "text": "You are a calculator.", "cache_control": {"type": "ephemeral"}},
    ],
    "tools": [
        {
            "name": "calc",
            "description": "Evaluate an arithmetic expression",
            "input_schema": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]},
        }
    ],
    "messages": [
        {"role": "user", "content": "What is 17*23?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Use the tool.", "signature": "sig"},
                {"type": "text", "text": "Computing."},
                {"type": "tool_use", "id": "toolu_1", "name": "calc", "input": {"expr": "17*23"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "391"}]},
                {"type": "text", "text": "Thanks. Now 391+9?"},
            ],
        },
    ],
}

RESPONSES: dict[str, Any] = {
    "model": QWEN25_MODEL,
    "instructions": "Answer with one word.",
    "tools": [
        {"type": "function", "name": "get_weather", "description": "Weather", "parameters": {"type": "object"}},
        {"type": "web_search_preview"},
    ],
    "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Oslo?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "tool"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "snow"},
        {"type": "message", "role": "assistant", "id": "m1", "status": "completed",
         "content": [{"type": "output_text", "text": "Snow.", "annotations": []}]},
        {"role": "user", "content": "And Rome?"},
    ],
}  # fmt: skip


@pytest.mark.parametrize("family", sorted(TEMPLATES))
async def test_chat_with_tools_matches_vllm(hf: Any, family: str) -> None:
    template = TEMPLATES[family]
    body = copy.deepcopy(CHAT)
    convo = vllm.conversation(body["messages"], body["tools"], content_format(template))
    expected = vllm_ids(hf, template, convo, vllm.chat_tools(body["tools"]))
    assert await epp_ids(template, "/v1/chat/completions", body) == expected
    assert "get_weather" in hf.decode(expected) and "Be terse." in hf.decode(expected)


@pytest.mark.parametrize("family", sorted(TEMPLATES))
async def test_anthropic_messages_match_vllm(hf: Any, family: str) -> None:
    template = TEMPLATES[family]
    messages, tools = vllm.anthropic_to_chat(copy.deepcopy(ANTHROPIC))
    convo = vllm.conversation(messages, tools, content_format(template))
    expected = vllm_ids(hf, template, convo, tools)
    assert await epp_ids(template, "/v1/messages", ANTHROPIC) == expected
    text = hf.decode(expected)
    assert "x-anthropic-billing-header" not in text and "Evaluate an arithmetic expression" in text


@pytest.mark.parametrize("family", sorted(TEMPLATES))
async def test_responses_match_vllm(hf: Any, family: str) -> None:
    template = TEMPLATES[family]
    messages, tools = vllm.responses_to_chat(copy.deepcopy(RESPONSES))
    convo = vllm.conversation(messages, tools, content_format(template))
    expected = vllm_ids(hf, template, convo, tools)
    assert await epp_ids(template, "/v1/responses", RESPONSES) == expected
    assert "Answer with one word." in hf.decode(expected)


def test_conversions_equal_vllms() -> None:
    """Field by field, before any template: our parsers' messages and tools are vLLM's."""
    headers = {":path": "/v1/messages"}
    parsed = PARSERS.resolve("/v1/messages").parse(headers, json.dumps(ANTHROPIC).encode())
    assert (parsed.messages, parsed.tools) == vllm.anthropic_to_chat(copy.deepcopy(ANTHROPIC))
    parsed = PARSERS.resolve("/v1/responses").parse({":path": "/v1/responses"}, json.dumps(RESPONSES).encode())
    messages, tools = vllm.responses_to_chat(copy.deepcopy(RESPONSES))
    assert parsed.messages == messages
    from epp.tokenization.chat import conversation, tool_dicts

    assert tool_dicts(parsed.tools) == tools
    assert conversation(CHAT["messages"]) == vllm.conversation(copy.deepcopy(CHAT["messages"]), None)
    assert tool_dicts(CHAT["tools"]) == vllm.chat_tools(CHAT["tools"])


def test_content_format_detection() -> None:
    assert {k: content_format(t) for k, t in TEMPLATES.items()} == {
        "llama-3.1-instruct": "string",
        "qwen2.5-instruct": "string",
    }
    assert content_format("{% for m in messages %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}") == (
        "openai"
    )
