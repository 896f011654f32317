"""Turn an OpenAI-style HTTP request (headers + JSON body) into an `InferenceRequest`.

API detection follows GIE's parser: the suffix of `:path`, else `x-original-path`, else `x-forwarded-path`
(default `/v1/completions`). Validation per API: chat needs messages, completions needs prompt, responses and
embeddings need input, conversations need items. Any failure is a `BadRequest` (HTTP 400).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from epp.framework.errors import BadRequest
from epp.framework.types import InferenceRequest

MODEL_REWRITE_HEADER = "x-gateway-model-name-rewrite"
OBJECTIVE_HEADER = "x-gateway-inference-objective"
FAIRNESS_HEADER = "x-gateway-inference-fairness-id"
REQUEST_ID_HEADER = "x-request-id"
DEFAULT_FAIRNESS_ID = "default-flow"
# Deeper JSON is refused with 400: no API body nests this deep, and every walk over the body (templates,
# re-encoding, plugins) would otherwise pay for it (or hit Python's recursion limit).
MAX_JSON_DEPTH = 128

# (path suffix, api, required field) — order matters: "/chat/completions" before "/completions".
_APIS: tuple[tuple[str, str, str], ...] = (
    ("/conversations", "conversations", "items"),
    ("/responses", "responses", "input"),
    ("/chat/completions", "chat", "messages"),
    ("/completions", "completions", "prompt"),
    ("/embeddings", "embeddings", "input"),
)


def request_path(headers: Mapping[str, str]) -> str:
    """The API path: `:path`, then `x-original-path`, then `x-forwarded-path` (query string dropped)."""
    for key in (":path", "x-original-path", "x-forwarded-path"):
        value = headers.get(key)
        if value:
            return value.split("?", 1)[0]
    return "/v1/completions"


def detect_api(path: str) -> tuple[str, str | None]:
    """(api name, required body field) for a path; unknown paths are "other" and need only `model`."""
    p = path.rstrip("/")
    for suffix, api, required in _APIS:
        if p.endswith(suffix):
            return api, required
    return "other", None


def decode_json_body(body: bytes, max_depth: int = MAX_JSON_DEPTH) -> dict[str, Any]:
    if not body:
        raise BadRequest("request body is empty")
    try:
        parsed = json.loads(body)
    except UnicodeDecodeError:
        raise BadRequest("request body is not valid UTF-8") from None
    except ValueError as e:
        raise BadRequest(f"request body is not valid JSON: {e}") from None
    except RecursionError:
        raise BadRequest(f"request body nests deeper than {max_depth} levels") from None
    if not isinstance(parsed, dict):
        raise BadRequest("request body must be a JSON object")
    if body.count(b"{") + body.count(b"[") > max_depth:  # only then can it nest that deep (a C-speed check)
        _check_depth(parsed, max_depth)
    return parsed


def _check_depth(root: dict[str, Any], max_depth: int) -> None:
    """Iterative (no recursion): the decoded body's containers nest at most `max_depth` deep."""
    stack: list[tuple[Any, int]] = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise BadRequest(f"request body nests deeper than {max_depth} levels")
        for v in node.values() if isinstance(node, dict) else node:
            if isinstance(v, dict | list):
                stack.append((v, depth + 1))


def encode_json_body(parsed: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON; strings holding lone surrogates (from `\\ud800` escapes) are kept as escapes."""
    try:
        return json.dumps(parsed, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:
        return json.dumps(parsed, ensure_ascii=True, separators=(",", ":")).encode()


def _validate(api: str, required: str | None, body: dict[str, Any]) -> None:
    if required is None:
        return
    value = body.get(required)
    if api == "chat":
        if not isinstance(value, list) or not value:
            raise BadRequest("chat completions request must have at least one message")
        if not all(isinstance(m, dict) for m in value):
            raise BadRequest("messages must be a list of objects")
        return
    if value is None or value == "" or value == []:
        raise BadRequest(f"{required} not found in request body")
    if api == "completions" and not isinstance(value, str | list):
        raise BadRequest("prompt must be a string or a list")


def _max_tokens(body: dict[str, Any]) -> int | None:
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        v = body.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def parse_request(
    headers: dict[str, str],
    body: bytes,
    model_rewrites: Mapping[str, str] | None = None,
) -> tuple[InferenceRequest, bytes]:
    """Parse and validate; returns the request and the body to forward (re-encoded only if the model changed).

    `headers` are lower-cased names (pseudo-headers included). The target model is the rewrite header if set,
    else the config rewrite for the incoming name, else the incoming name.
    """
    path = request_path(headers)
    api, required = detect_api(path)
    parsed = decode_json_body(body)
    model = parsed.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model not found in request body")
    _validate(api, required, parsed)
    target = headers.get(MODEL_REWRITE_HEADER) or (model_rewrites.get(model) if model_rewrites else None) or model
    forward = body
    if target != model:
        parsed["model"] = target
        forward = encode_json_body(parsed)
    request = InferenceRequest(
        request_id=headers.get(REQUEST_ID_HEADER) or str(uuid.uuid4()),
        path=path,
        api=api,
        model=model,
        target_model=target,
        body=parsed,
        headers=headers,
        prompt=parsed.get("prompt") if api == "completions" else parsed.get("input"),
        messages=parsed.get("messages") if api == "chat" else None,
        stream=parsed.get("stream") is True,
        max_tokens=_max_tokens(parsed),
        body_size=len(forward),
        objective=headers.get(OBJECTIVE_HEADER) or None,
        fairness_id=headers.get(FAIRNESS_HEADER) or DEFAULT_FAIRNESS_ID,
    )
    return request, forward


def bodyless_request(headers: dict[str, str]) -> InferenceRequest:
    """A request without a body (GET /v1/models, health checks...): no model, routed without scheduling."""
    path = request_path(headers)
    return InferenceRequest(
        request_id=headers.get(REQUEST_ID_HEADER) or str(uuid.uuid4()),
        path=path,
        api="other",
        model="",
        target_model="",
        body={},
        headers=headers,
        fairness_id=headers.get(FAIRNESS_HEADER) or DEFAULT_FAIRNESS_ID,
    )
