"""anthropic-parser: Messages converted as vLLM converts them, errors in Anthropic's shape."""

from __future__ import annotations

import json

import pytest

from epp.framework.errors import BadRequest
from tests.plugins.parsers.support import DEFAULT, hdrs, parse_request

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
