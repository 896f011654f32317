"""The prompt's length in tokens, shared by the load plugins: the token ids when a token-producer ran, else an
estimate from the text (4 characters a token, the approximate prefix producer's unit)."""

from __future__ import annotations

from epp.framework import TOKENIZED_PROMPT, InferenceRequest
from epp.plugins.producers.approx_prefix_cache_producer import AVERAGE_CHARS_PER_TOKEN, request_text


def input_tokens(request: InferenceRequest) -> int:
    tokenized = request.data.get(TOKENIZED_PROMPT)
    if tokenized is not None:
        return len(tokenized.token_ids)
    return len(request_text(request)) // AVERAGE_CHARS_PER_TOKEN
