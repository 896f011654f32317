"""The simulator's other request APIs, in the shapes vLLM serves them (and the official SDKs parse).

- `/v1/messages` (Anthropic Messages): vLLM converts the body to chat messages and renders those; the conversion
  is the EPP's parser's, which tests/tokenization/test_chat.py checks against vLLM's own code. The answer is
  a `message` with content blocks and Anthropic usage (`cache_read_input_tokens`), or its event stream
  (`message_start` … `message_stop`); errors are Anthropic's `{"type": "error", "error": {...}}`.
  `/v1/messages/count_tokens` answers `{"input_tokens": n}` for the same rendering.
- `/v1/responses` (OpenAI Responses): a `response` object with one output message, or its event stream
  (`response.created` … `response.completed`, or `response.incomplete` when `max_output_tokens` cut it, as vLLM).
- `/v1/embeddings`: each input is prefilled by the engine (it queues, and hits the prefix cache, like any prompt);
  the vector is a deterministic unit vector of the input's token ids, as floats or base64 float32.
- `/inference/v1/generate`: `token_ids` are the prompt (no tokenization), as vLLM's tokens-in API.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from aiohttp import web

from e2e.sim.engine import EngineError, SimRequest
from e2e.sim.server import (
    APP_KEY,
    Generation,
    _generate,
    _json,
    prepare,
    sse,
    stream_events,
)
from e2e.sim.tokenizer import RenderError
from epp.framework.errors import BadRequest
from epp.plugins.parsers._convert import anthropic_to_chat, responses_to_chat

EMBEDDING_DIM = 896  # Qwen2.5-0.5B's hidden size, the simulator's default model

# Anthropic's error types by status (vLLM's anthropic/protocol.py uses the same vocabulary).
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
}  # fmt: skip


def anthropic_error(status: int, message: str) -> web.Response:
    kind = ANTHROPIC_ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return web.json_response({"type": "error", "error": {"type": kind, "message": message}}, status=status)


def _anthropic(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Any:
    """Answer errors (bad input, injected failures, not ready) in Anthropic's error shape."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        fail = request.app[APP_KEY].failure()
        if fail is not None:
            return anthropic_error(fail.status, fail.message)
        try:
            return await handler(request)
        except EngineError as e:
            return anthropic_error(e.status, e.message)
        except RenderError as e:
            return anthropic_error(400, str(e))

    return wrapped


def _chat_body(body: dict[str, Any], convert: Any) -> dict[str, Any]:
    try:
        messages, _tools = convert(body)
    except BadRequest as e:
        raise EngineError(400, e.message) from None
    chat: dict[str, Any] = {"messages": messages}
    for key in ("model", "max_tokens", "cache_salt", "kv_transfer_params"):
        if key in body:
            chat[key] = body[key]
    if "max_output_tokens" in body:
        chat["max_tokens"] = body["max_output_tokens"]
    return chat


# --- Anthropic Messages ----------------------------------------------------------------------------------
def _anthropic_usage(gen: Generation, output_tokens: int) -> dict[str, Any]:
    """vLLM's: input_tokens excludes the cache reads; the cache fields only when the server reports them."""
    cached = gen.cached
    usage: dict[str, Any] = {"input_tokens": gen.prompt_tokens - (cached or 0), "output_tokens": output_tokens}
    if cached is not None:
        usage["cache_read_input_tokens"] = cached
    return usage


def _stop_reason(gen: Generation) -> str:
    return "max_tokens" if gen.finish == "length" else "end_turn"


async def messages(request: web.Request) -> web.StreamResponse:
    body = await _json(request)
    if not isinstance(body.get("max_tokens"), int):
        raise EngineError(400, "`max_tokens` is required (a positive integer).")
    gen = await prepare(request, True, _chat_body(body, anthropic_to_chat))
    mid = "msg_" + uuid.uuid4().hex
    if body.get("stream"):
        return await _messages_stream(request, gen, mid)
    text = await gen.text()
    msg = {
        "id": mid, "type": "message", "role": "assistant", "model": gen.model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": _stop_reason(gen), "stop_sequence": None, "usage": _anthropic_usage(gen, gen.out),
        **gen.extras(),
    }  # fmt: skip
    return web.json_response(msg, headers=gen.sim.headers())


async def _messages_stream(request: web.Request, gen: Generation, mid: str) -> web.StreamResponse:
    def head() -> list[bytes]:
        start: dict[str, Any] = {
            "id": mid, "type": "message", "role": "assistant", "model": gen.model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": _anthropic_usage(gen, 0),
        }  # fmt: skip
        block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
        return [
            sse({"type": "message_start", "message": start}, "message_start"),
            sse(block, "content_block_start"),
        ]

    def piece(text: str) -> list[bytes]:
        delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}
        return [sse(delta, "content_block_delta")]

    def tail() -> list[bytes]:
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": _stop_reason(gen), "stop_sequence": None},
            "usage": _anthropic_usage(gen, gen.out),
        }
        return [
            sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
            sse(delta, "message_delta"),
            sse({"type": "message_stop"}, "message_stop"),
        ]

    return await stream_events(request, gen, head, piece, tail)


async def count_tokens(request: web.Request) -> web.StreamResponse:
    sim = request.app[APP_KEY]
    chat = _chat_body(await _json(request), anthropic_to_chat)
    sim.engine.lora_for(str(chat.get("model", sim.cfg.model_name)))
    ids = await sim.tok.messages_ids(chat["messages"], add_generation_prompt=True)
    return web.json_response(
        {"input_tokens": len(ids), "context_management": {"original_input_tokens": len(ids)}}, headers=sim.headers()
    )


# --- OpenAI Responses ------------------------------------------------------------------------------------
def _response(body: dict[str, Any], gen: Generation, rid: str, created: int, status: str, output: list[Any]) -> Any:
    """A `response` object with the request's settings echoed back, as vLLM's `ResponsesResponse.from_request`."""
    done = status != "in_progress"
    usage = {
        "input_tokens": gen.prompt_tokens,
        "input_tokens_details": {"cached_tokens": gen.req.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": gen.out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": gen.prompt_tokens + gen.out,
    }
    return {
        "id": rid, "object": "response", "created_at": created, "status": status, "model": gen.model,
        "output": output, "usage": usage if done else None, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.get("instructions"), "metadata": body.get("metadata"),
        "parallel_tool_calls": body.get("parallel_tool_calls", True), "temperature": body.get("temperature"),
        "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools", []), "top_p": body.get("top_p"),
        "max_output_tokens": gen.req.max_tokens, "previous_response_id": body.get("previous_response_id"),
        "reasoning": body.get("reasoning"), "text": body.get("text"), "truncation": body.get("truncation"),
        "user": body.get("user"), "background": False, "service_tier": "auto",
        **(gen.extras() if done else {}),
    }  # fmt: skip


def _message_item(item_id: str, text: str | None) -> dict[str, Any]:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    status = "in_progress" if text is None else "completed"
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


async def responses(request: web.Request) -> web.StreamResponse:
    sim = request.app[APP_KEY]
    fail = sim.maybe_fail()
    if fail is not None:
        return fail
    body = await _json(request)
    gen = await prepare(request, True, _chat_body(body, responses_to_chat))
    rid, item_id, created = "resp_" + uuid.uuid4().hex, "msg_" + uuid.uuid4().hex, int(time.time())
    if body.get("stream"):
        return await _responses_stream(request, body, gen, rid, item_id, created)
    text = await gen.text()
    status = "incomplete" if gen.finish == "length" else "completed"
    return web.json_response(
        _response(body, gen, rid, created, status, [_message_item(item_id, text)]), headers=sim.headers()
    )


async def _responses_stream(
    request: web.Request, body: dict[str, Any], gen: Generation, rid: str, item_id: str, created: int
) -> web.StreamResponse:
    seq = 0
    parts: list[str] = []
    where = {"item_id": item_id, "output_index": 0, "content_index": 0}

    def event(kind: str, **data: Any) -> bytes:
        nonlocal seq
        seq += 1
        return sse({"type": kind, "sequence_number": seq - 1, **data}, kind)

    def head() -> list[bytes]:
        started = _response(body, gen, rid, created, "in_progress", [])
        empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [
            event("response.created", response=started),
            event("response.in_progress", response=started),
            event("response.output_item.added", output_index=0, item=_message_item(item_id, None)),
            event("response.content_part.added", **where, part=empty),
        ]

    def piece(text: str) -> list[bytes]:
        parts.append(text)
        return [event("response.output_text.delta", **where, delta=text, logprobs=[])]

    def tail() -> list[bytes]:
        text = "".join(parts)
        item = _message_item(item_id, text)
        status = "incomplete" if gen.finish == "length" else "completed"
        return [
            event("response.output_text.done", **where, text=text, logprobs=[]),
            event("response.content_part.done", **where, part=item["content"][0]),
            event("response.output_item.done", output_index=0, item=item),
            event(f"response.{status}", response=_response(body, gen, rid, created, status, [item])),
        ]

    return await stream_events(request, gen, head, piece, tail)


# --- embeddings ------------------------------------------------------------------------------------------
def embedding_vector(ids: list[int], dims: int) -> np.ndarray[Any, np.dtype[np.float32]]:
    """A unit vector that depends only on the token ids (same input, same vector)."""
    seed = int.from_bytes(hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).digest()[:8], "little")
    v = np.random.default_rng(seed).standard_normal(dims).astype(np.float32)
    return v / np.float32(np.linalg.norm(v))


async def embeddings(request: web.Request) -> web.StreamResponse:
    sim = request.app[APP_KEY]
    fail = sim.maybe_fail()
    if fail is not None:
        return fail
    body = await _json(request)
    model = body.get("model", sim.cfg.model_name)
    if not isinstance(model, str):
        raise EngineError(400, "`model` must be a string.")
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise EngineError(400, "`encoding_format` must be float or base64.")
    dims = body.get("dimensions", EMBEDDING_DIM)
    if not isinstance(dims, int) or isinstance(dims, bool) or not 1 <= dims <= EMBEDDING_DIM:
        raise EngineError(400, f"`dimensions` must be an integer from 1 to {EMBEDDING_DIM}.")
    if "input" not in body:
        raise EngineError(400, "`input` is required.")
    engine = sim.pick_engine(request)
    lora = engine.lora_for(model)
    prompts = await sim.tok.prompt_ids(body["input"])

    async def prefill(ids: list[int]) -> None:
        req = SimRequest(prompt_ids=ids, max_tokens=1, lora=lora)
        async with contextlib.aclosing(engine.generate(req)) as gen:
            async for _ in gen:
                pass

    await asyncio.gather(*(prefill(ids) for ids in prompts))
    data = []
    for i, ids in enumerate(prompts):
        vec = embedding_vector(ids, dims)
        value: Any = base64.b64encode(vec.astype("<f4").tobytes()).decode() if fmt == "base64" else vec.tolist()
        data.append({"object": "embedding", "index": i, "embedding": value})
    n = sum(len(ids) for ids in prompts)
    resp = {
        "id": "embd-" + uuid.uuid4().hex, "object": "list", "created": int(time.time()), "model": model,
        "data": data, "usage": {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0},
    }  # fmt: skip
    return web.json_response(resp, headers=sim.headers())


# --- tokens in -------------------------------------------------------------------------------------------
async def generate(request: web.Request) -> web.StreamResponse:
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
    r.add_post("/v1/messages", _anthropic(messages))
    r.add_post("/v1/messages/count_tokens", _anthropic(count_tokens))
    r.add_post("/v1/responses", responses)
    r.add_post("/v1/embeddings", embeddings)
    r.add_post("/inference/v1/generate", generate)
