"""The prompt's text as the approximate prefix producers hash it, and its length in tokens as the load plugins
estimate it: the token ids when a token-producer ran, else 4 characters a token (the approximate producer's unit)."""

from __future__ import annotations

import json
from typing import Any

from epp.framework import TOKENIZED_PROMPT, ApiKind, InferenceRequest

AVERAGE_CHARS_PER_TOKEN = 4
# The producer of TOKENIZED_PROMPT, added for the plugins that need the token ids.
TOKEN_PRODUCER = "token-producer"


def request_text(request: InferenceRequest, limit: int | None = None) -> str:
    """The text whose prefix the model server would cache, per API type (only compared within this process).
    With `limit`, a chat or completions prompt is cut to its first `limit` characters (hashing needs no more), so a
    huge one is not copied whole."""
    body = request.body
    if request.api == ApiKind.CHAT or request.messages is not None:
        messages = request.messages if request.messages is not None else body.get("messages") or []
        parts = []
        size = 0
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                if limit is not None and len(content) > limit:
                    content = content[:limit]
                part = f"{m.get('role', '')}\x00{content}\x01"
            else:
                part = json.dumps(m, separators=(",", ":"), ensure_ascii=False, default=str)
            if limit is not None and size + len(part) >= limit:
                parts.append(part[: limit - size])
                break
            parts.append(part)
            size += len(part)
        return "".join(parts)
    if request.api == ApiKind.COMPLETIONS:
        prompt = request.prompt if request.prompt is not None else body.get("prompt")
        if isinstance(prompt, str):
            return prompt if limit is None else prompt[:limit]
        return json.dumps(prompt, separators=(",", ":"))
    if request.api == ApiKind.RESPONSES:
        obj: Any = [body.get("instructions"), body.get("tools"), body.get("input")]
    elif request.api == ApiKind.CONVERSATIONS:
        obj = body.get("items")
    elif request.api == ApiKind.EMBEDDINGS:
        obj = body.get("input")
    else:
        obj = request.prompt if request.prompt is not None else body.get("prompt", body.get("messages"))
    return "" if obj is None else json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=str)


def input_tokens(request: InferenceRequest) -> int:
    tokenized = request.data.get(TOKENIZED_PROMPT)
    if tokenized is not None:
        return len(tokenized.token_ids)
    return len(request_text(request)) // AVERAGE_CHARS_PER_TOKEN
