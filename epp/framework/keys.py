"""The data keys built-in plugins exchange. A plugin's private keys live in its own module."""

from __future__ import annotations

from typing import Final

from epp.framework.state import DataKey
from epp.framework.types import (
    DisaggDecision,
    Endpoint,
    InFlightLoad,
    LatencyPredictionInfo,
    PrefixCacheMatchInfo,
    TokenizedPrompt,
)

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

# Request headers PreRequest plugins set on the request the model server receives (name → value, OVERWRITE).
# The server sends them with the destination; it also removes any client-sent value of a DISAGG_HEADERS name
# that no plugin set.
UPSTREAM_HEADERS: Final = DataKey[dict[str, str]]("upstream-request-headers")

# The stages' pods of a disaggregated request (disagg-profile-handler → its PreRequest, the headers handlers, the
# prefix producers' speculative entries for the prefill pod).
DISAGG_DECISION: Final = DataKey[DisaggDecision]("disagg-decision")

# The model server's response status (the director writes it at the response headers), for the ResponseComplete
# plugins: a response without usage may be an error the engine never computed.
RESPONSE_STATUS: Final = DataKey[int]("response-status")

# CycleState: the pod picked by an earlier stage of the same cycle (decode-first: the decode pick, seen by the
# prefill profile's plugins; prefill-first: the prefill pick, seen by the decode profile's).
PEER_ENDPOINT: Final = DataKey[Endpoint]("disagg-peer-endpoint")

# The request headers the EPP reads (GIE's names, and llm-d-router's where it has its own) and the one it writes for
# Envoy (header and `envoy.lb` metadata).
DESTINATION_HEADER: Final = "x-gateway-destination-endpoint"
REQUEST_ID_HEADER: Final = "x-request-id"
OBJECTIVE_HEADER: Final = "x-gateway-inference-objective"
FAIRNESS_HEADER: Final = "x-gateway-inference-fairness-id"
LLMD_FAIRNESS_HEADER: Final = "x-llm-d-inference-fairness-id"
# Claude Code's per-request text block ("x-anthropic-billing-header: ..."): vLLM drops it from the prompt, and so do
# the parsers, the tokenizer and the estimates that must count the tokens vLLM sees.
BILLING_HEADER_PREFIX: Final = "x-anthropic-billing-header"

# The headers the decode-side routing sidecar reads (llm-d pkg/common/routing).
PREFILL_HEADER: Final = "x-prefiller-host-port"
ENCODER_HEADER: Final = "x-encoder-hosts-ports"
DATA_PARALLEL_HEADER: Final = "x-data-parallel-host-port"
# The peer the routing sidecar pulls cached KV blocks from (p2p-source-producer).
KV_CACHE_SOURCE_HEADER: Final = "x-kv-cache-source-host-port"
# Headers only the EPP may set: a client-sent value never reaches the model server.
DISAGG_HEADERS: Final = (PREFILL_HEADER, ENCODER_HEADER, DATA_PARALLEL_HEADER, KV_CACHE_SOURCE_HEADER)

# Predicted TTFT/TPOT per endpoint, per producer: `LATENCY_PREDICTION_INFO.of(<producer name>)` (latency-scorer,
# slo-headroom-tier-filter, latency-slo-admitter, prefix-cache-affinity-filter's `ttftSource: latencyPredictor` gate).
LATENCY_PREDICTION_INFO: Final = DataKey[LatencyPredictionInfo]("latency-prediction-info")

# A cluster's pool averages, endpoint attributes of a multi-cluster hub's cluster endpoints (llm-d-router's
# `llm-d.ai/multicluster-*` attribute keys): written by multicluster-metrics-extractor, read by the multicluster
# scorers.
MULTICLUSTER_KV_CACHE_UTILIZATION: Final = DataKey[float]("llm-d.ai/multicluster-kv-cache-utilization")
MULTICLUSTER_QUEUE_SIZE: Final = DataKey[float]("llm-d.ai/multicluster-queue-size")
