"""The simulator's other request APIs, served the way vLLM serves them: converted to a chat or completions request.

- `/v1/messages` (Anthropic) and `/v1/responses` (OpenAI Responses): vLLM converts the body to chat messages (and
  tools) and renders those; the conversion is the EPP's parser's, which tests/tokenization/test_chat.py
  checks against vLLM's own code. The answer is in the chat-completions shape (usage with cached tokens), which is
  all the routing tests read.
- `/inference/v1/generate`: `token_ids` are the prompt (no tokenization), as vLLM's tokens-in API.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from epp.framework.errors import BadRequest
from epp.plugins.parsers._convert import anthropic_to_chat, responses_to_chat


async def _converted(request: web.Request, convert: Any) -> web.StreamResponse:
    from e2e.sim.engine import EngineError
    from e2e.sim.server import _generate, _json

    body = await _json(request)
    try:
        messages, _tools = convert(body)
    except BadRequest as e:
        raise EngineError(400, e.message) from None
    chat: dict[str, Any] = {"messages": messages, "stream": False}
    for key in ("model", "max_tokens", "cache_salt"):
        if key in body:
            chat[key] = body[key]
    if "max_output_tokens" in body:
        chat["max_tokens"] = body["max_output_tokens"]
    return await _generate(request, chat=True, body=chat)


async def messages(request: web.Request) -> web.StreamResponse:
    return await _converted(request, anthropic_to_chat)


async def responses(request: web.Request) -> web.StreamResponse:
    return await _converted(request, responses_to_chat)


async def generate(request: web.Request) -> web.StreamResponse:
    from e2e.sim.engine import EngineError
    from e2e.sim.server import _generate, _json

    body = await _json(request)
    ids = body.get("token_ids")
    if not isinstance(ids, list) or not ids:
        raise EngineError(400, "`token_ids` must be a non-empty list of token ids.")
    completion: dict[str, Any] = {"prompt": ids, "stream": False}
    sampling = body.get("sampling_params") or {}
    if isinstance(sampling, dict) and "max_tokens" in sampling:
        completion["max_tokens"] = sampling["max_tokens"]
    for key in ("model", "cache_salt"):
        if key in body:
            completion[key] = body[key]
    return await _generate(request, chat=False, body=completion)


def add_api_routes(r: web.UrlDispatcher) -> None:
    r.add_post("/v1/messages", messages)
    r.add_post("/v1/responses", responses)
    r.add_post("/inference/v1/generate", generate)
