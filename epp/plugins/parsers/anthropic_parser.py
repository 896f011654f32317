"""anthropic-parser (llm-d `requestHandler.parsers`): the Anthropic Messages API (`/v1/messages`).

The body becomes the chat messages and tools vLLM renders for it (system prompt, tool use and results, thinking
blocks; see `_convert`), so precise prefix routing sees the engine's tokens. `/v1/messages/count_tokens` is
routed without reading its response, as the router does. Errors are answered in Anthropic's error shape.
"""

from __future__ import annotations

from collections.abc import Mapping

from epp.framework import ApiKind, BadRequest
from epp.framework.parsing import ParsedRequest, match_path_suffix, request_path
from epp.plugins.parsers._common import (
    ParserPlugin,
    cache_salt,
    decode_json_object,
    first_int,
    json_model_rewriter,
    required_model,
)
from epp.plugins.parsers._convert import anthropic_to_chat
from epp.plugins.parsers._media import check_media_parts


class AnthropicParser(ParserPlugin):
    type_name = "anthropic-parser"
    paths = ("messages", "messages/count_tokens")
    error_format = "anthropic"

    def parse(self, headers: Mapping[str, str], body: bytes) -> ParsedRequest:
        path = request_path(headers)
        if match_path_suffix(path, "/messages/count_tokens"):
            parsed = decode_json_object(body)
            return ParsedRequest(
                api=ApiKind.COUNT_TOKENS,
                model=required_model(parsed),
                body=parsed,
                rewrite_model=json_model_rewriter(parsed),
                skip_response=True,
            )
        if not match_path_suffix(path, "/messages"):
            raise BadRequest(f"unsupported API endpoint: {path[:200]}")
        parsed = decode_json_object(body)
        model = required_model(parsed)
        messages, tools = anthropic_to_chat(parsed)
        check_media_parts(messages)
        kwargs = parsed.get("chat_template_kwargs")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise BadRequest("chat_template_kwargs must be an object")
        return ParsedRequest(
            api=ApiKind.MESSAGES,
            model=model,
            body=parsed,
            messages=messages,
            tools=tools,
            chat_template_kwargs=kwargs,
            cache_salt=cache_salt(parsed),
            stream=parsed.get("stream") is True,
            max_tokens=first_int(parsed, "max_tokens"),
            rewrite_model=json_model_rewriter(parsed),
        )
