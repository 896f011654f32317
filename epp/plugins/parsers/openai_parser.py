"""openai-parser (llm-d `requestHandler.parsers`): the OpenAI API as vLLM serves it.

Claims chat/completions, completions (and their `/render`), responses, conversations, embeddings and
images/generations, like the router's. Chat messages and tools are kept for tokenization; a Responses request's
instructions, input items and function tools become the chat messages and tools vLLM renders for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from epp.framework import ApiKind, BadRequest
from epp.framework.parsing import ParsedRequest, match_path_suffix, request_path
from epp.plugins.parsers._common import (
    ParserPlugin,
    cache_salt,
    check_token_ids,
    decode_json_object,
    first_int,
    json_model_rewriter,
    required_model,
)
from epp.plugins.parsers._convert import responses_to_chat
from epp.plugins.parsers._media import check_media_parts

# (path suffix, api), most specific first, as the router's determineAPITypeFromPath.
_APIS: tuple[tuple[str, ApiKind], ...] = (
    ("/conversations", ApiKind.CONVERSATIONS),
    ("/responses", ApiKind.RESPONSES),
    ("/chat/completions", ApiKind.CHAT),
    ("/chat/completions/render", ApiKind.CHAT),
    ("/completions", ApiKind.COMPLETIONS),
    ("/completions/render", ApiKind.COMPLETIONS),
    ("/embeddings", ApiKind.EMBEDDINGS),
    ("/images/generations", ApiKind.IMAGES),
)


def detect_api(path: str) -> ApiKind:
    """The API of an OpenAI path (the router defaults to completions)."""
    for suffix, api in _APIS:
        if match_path_suffix(path, suffix):
            return api
    return ApiKind.COMPLETIONS


def _empty(value: Any) -> bool:
    return value is None or value == "" or value == [] or value == {}


class OpenAIParser(ParserPlugin):
    type_name = "openai-parser"
    paths = (
        "chat/completions",
        "completions",
        "embeddings",
        "responses",
        "conversations",
        "chat/completions/render",
        "completions/render",
        "images/generations",
    )

    def parse(self, headers: Mapping[str, str], body: bytes) -> ParsedRequest:
        return parse_openai(detect_api(request_path(headers)), body)


def parse_openai(api: ApiKind, body: bytes) -> ParsedRequest:
    parsed = decode_json_object(body)
    model = required_model(parsed)
    out = ParsedRequest(
        api=api,
        model=model,
        body=parsed,
        stream=parsed.get("stream") is True,
        cache_salt=cache_salt(parsed),
        rewrite_model=json_model_rewriter(parsed),
    )
    kwargs = parsed.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise BadRequest("chat_template_kwargs must be an object")
    out.chat_template_kwargs = kwargs
    if api == ApiKind.CHAT:
        messages = parsed.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("chat completions request must have at least one message")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise BadRequest(f"messages[{i}] must be an object with a role")
        tools = parsed.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise BadRequest("tools must be an array")
        check_media_parts(messages)
        out.messages = messages
        out.tools = tools
        out.max_tokens = first_int(parsed, "max_completion_tokens", "max_tokens")
    elif api == ApiKind.COMPLETIONS:
        prompt = parsed.get("prompt")
        if _empty(prompt):
            raise BadRequest("prompt not found in request body")
        if not isinstance(prompt, str | list):
            raise BadRequest("prompt must be a string or a list")
        check_token_ids(prompt, "prompt")
        out.prompt = prompt
        out.max_tokens = first_int(parsed, "max_tokens")
    elif api == ApiKind.RESPONSES:
        if parsed.get("input") is None:
            raise BadRequest("input not found in request body")
        out.prompt = parsed["input"]
        out.messages, out.tools = responses_to_chat(parsed)
        check_media_parts(out.messages, "input")
        out.max_tokens = first_int(parsed, "max_output_tokens")
    elif api == ApiKind.EMBEDDINGS:
        if _empty(parsed.get("input")):
            raise BadRequest("input not found in request body")
        check_token_ids(parsed["input"], "input")
        out.prompt = parsed["input"]
    elif api == ApiKind.CONVERSATIONS:
        if _empty(parsed.get("items")) or not isinstance(parsed["items"], list):
            raise BadRequest("items not found in request body")
    elif api == ApiKind.IMAGES:
        prompt = parsed.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise BadRequest("images generations request must have a prompt")
        out.prompt = prompt
    return out
