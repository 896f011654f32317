"""Predicted latency: TTFT/TPOT per endpoint, from the predicted-latency-producer."""

from __future__ import annotations

from typing import Any, Final

from epp.framework import LATENCY_PREDICTION_INFO, DataKey, Feed

LATENCY_PRODUCER: Final = "predicted-latency-producer"

# A consumer's `latencyPredictionInfoProducerName`; without it, the predicted-latency-producer is added.
LATENCY: Final = Feed(LATENCY_PREDICTION_INFO, "latencyPredictionInfoProducerName", LATENCY_PRODUCER)
DEFAULT_LATENCY_KEY: Final[DataKey[Any]] = LATENCY.of(LATENCY_PRODUCER)

# A request's latency objectives in ms (llm-d's header, then the older name llm-d still reads), for the latency
# predictor and the SLO-deadline ordering.
TTFT_SLO_HEADERS: Final = ("x-llm-d-slo-ttft-ms", "x-slo-ttft-ms")
TPOT_SLO_HEADERS: Final = ("x-llm-d-slo-tpot-ms", "x-slo-tpot-ms")
