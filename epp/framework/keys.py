"""The data keys built-in plugins exchange. A plugin's private keys live in its own module."""

from __future__ import annotations

from typing import Final

from epp.framework.state import DataKey
from epp.framework.types import LatencyPredictionInfo, PrefixCacheMatchInfo, TokenizedPrompt

# The prompt's token ids (token-producer); read by the precise prefix-cache producer.
TOKENIZED_PROMPT: Final = DataKey[TokenizedPrompt]("tokenized-prompt")

# How much of the prompt each endpoint caches, per producer: `PREFIX_CACHE_MATCH_INFO.of(<producer name>)`.
PREFIX_CACHE_MATCH_INFO: Final = DataKey[PrefixCacheMatchInfo]("prefix-cache-match-info")

# Predicted TTFT/TPOT per endpoint, per producer: `LATENCY_PREDICTION_INFO.of(<producer name>)`.
LATENCY_PREDICTION_INFO: Final = DataKey[LatencyPredictionInfo]("latency-prediction-info")
