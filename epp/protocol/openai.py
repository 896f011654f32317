"""Turn a parsed request (headers + a parser's `ParsedRequest`) into the `InferenceRequest` the scheduler sees.

The body itself is read by the `requestHandler` parsers (epp/plugins/parsers); this adds what comes from the
headers (request id, objective, fairness id, the model-rewrite header) and applies model rewrites to the body the
parser can re-encode. The target model is the rewrite header if set, else the config rewrite for the incoming
name, else the incoming name.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from epp.framework.keys import FAIRNESS_HEADER, OBJECTIVE_HEADER, REQUEST_ID_HEADER
from epp.framework.parsing import ParsedRequest, request_path
from epp.framework.types import ApiKind, InferenceRequest

MODEL_REWRITE_HEADER = "x-gateway-model-name-rewrite"
DEFAULT_FAIRNESS_ID = "default-flow"

__all__ = ["bodyless_request", "build_request", "request_path"]


def build_request(
    headers: dict[str, str],
    parsed: ParsedRequest,
    body: bytes,
    model_rewrites: Mapping[str, str] | None = None,
) -> tuple[InferenceRequest, bytes]:
    """The request and the body to forward (re-encoded only if the model changed and the parser can rewrite it)."""
    model = parsed.model
    target = model
    if parsed.rewrite_model is not None:
        target = headers.get(MODEL_REWRITE_HEADER) or (model_rewrites.get(model) if model_rewrites else None) or model
    forward = body
    if target != model and parsed.rewrite_model is not None:
        forward = parsed.rewrite_model(target)
    request = InferenceRequest(
        request_id=headers.get(REQUEST_ID_HEADER) or str(uuid.uuid4()),
        path=request_path(headers),
        api=parsed.api,
        model=model,
        target_model=target,
        body=parsed.body,
        headers=headers,
        prompt=parsed.prompt,
        messages=parsed.messages,
        tools=parsed.tools,
        chat_template_kwargs=parsed.chat_template_kwargs,
        token_ids=parsed.token_ids,
        mm_features=parsed.mm_features,
        cache_salt=parsed.cache_salt,
        stream=parsed.stream,
        max_tokens=parsed.max_tokens,
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
        api=ApiKind.OTHER,
        model="",
        target_model="",
        body={},
        headers=headers,
        fairness_id=headers.get(FAIRNESS_HEADER) or DEFAULT_FAIRNESS_ID,
    )
