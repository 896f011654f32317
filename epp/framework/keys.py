"""The data keys built-in plugins exchange. A plugin's private keys live in its own module."""

from __future__ import annotations

from typing import Final

from epp.framework.state import DataKey
from epp.framework.types import InFlightLoad, PrefixCacheMatchInfo, TokenizedPrompt

# The prompt's token ids (token-producer); read by the precise prefix-cache producer.
TOKENIZED_PROMPT: Final = DataKey[TokenizedPrompt]("tokenized-prompt")

# How much of the prompt each endpoint caches, per producer: `PREFIX_CACHE_MATCH_INFO.of(<producer name>)`.
PREFIX_CACHE_MATCH_INFO: Final = DataKey[PrefixCacheMatchInfo]("prefix-cache-match-info")

# An endpoint's live in-flight load, an endpoint attribute (`endpoint.attributes`), per producer:
# `INFLIGHT_LOAD.of(<inflight-load-producer name>)`.
INFLIGHT_LOAD: Final = DataKey[InFlightLoad]("inflight-load")

# The tokens this request would add to each endpoint (uncached prompt, plus estimated output when configured),
# endpoint name → tokens, in `request.data`, per producer: `UNCACHED_REQUEST_TOKENS.of(<producer name>)`.
UNCACHED_REQUEST_TOKENS: Final = DataKey[dict[str, int]]("uncached-request-tokens")

# Predicted time to first token (ms) per endpoint name for this request, in `request.data`, per producer:
# `PREDICTED_TTFT_MS.of(<predicted-latency-producer name>)`; read by prefix-cache-affinity-filter's
# `ttftSource: latencyPredictor` load gate. An endpoint without a prediction is never the fastest.
PREDICTED_TTFT_MS: Final = DataKey[dict[str, float]]("predicted-ttft-ms")
