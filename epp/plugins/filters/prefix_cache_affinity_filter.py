"""prefix-cache-affinity-filter (llm-d): keep only the "sticky" endpoints, those whose prefix-cache score
(matched / total blocks) is >= `affinityThreshold`, unless stickiness costs too much.

- no endpoint passes → all are kept; affinityThreshold <= 0 or a single candidate → pass-through;
- with probability `explorationProbability` the gate is skipped (seeds caches elsewhere over time);
- TTFT load gate (`maxTTFTPenaltyMs` > 0): if the best sticky endpoint's TTFT exceeds the best non-sticky one's by
  more than maxTTFTPenaltyMs, all are kept. TTFT is in-flight tokens / `peakPrefillThroughput` · 1000 ms
  (`ttftSource: prefillThroughput`, from the inflight-load-producer) or the predicted TTFT
  (`ttftSource: latencyPredictor`: the TTFT in the predicted-latency-producer's LATENCY_PREDICTION_INFO; the
  producer is added when none is configured). An endpoint without a prediction gives no signal: it is never the
  fastest, so while the predictor is cold (no predictions at all) the gate holds and the sticky endpoints are kept,
  as llm-d's filter does.

Defaults are llm-d's: 0.80, 0, 18000 ms, prefillThroughput, 15928 tokens/s (Qwen 32B on 2×H100, TP=2). At
V(4) each decision is logged as llm-d's filter logs it (no sticky endpoints / TTFT load gate broken / narrowed).
"""

from __future__ import annotations

import logging
import random
import sys
from collections.abc import Callable, Collection, Sequence
from typing import Any, Self

from epp.framework import (
    INFLIGHT_LOAD,
    LATENCY_PREDICTION_INFO,
    PREFIX_CACHE_MATCH_INFO,
    CycleState,
    DataKey,
    Endpoint,
    InferenceRequest,
    Params,
    Plugin,
    PluginContext,
)
from epp.framework.verbosity import DEBUG, V
from epp.plugins.contracts.latency import LATENCY, LATENCY_PRODUCER
from epp.plugins.contracts.load import INFLIGHT, INFLIGHT_PRODUCER
from epp.plugins.contracts.prefix import APPROX_PRODUCER, PREFIX_MATCH

log = logging.getLogger(__name__)

SOURCE_THROUGHPUT = "prefillThroughput"
SOURCE_PREDICTOR = "latencyPredictor"
NO_PREDICTION = sys.float_info.max  # llm-d's math.MaxFloat64: an endpoint without a prediction is never fastest


class PrefixCacheAffinityFilter(Plugin):
    type_name = "prefix-cache-affinity-filter"

    def __init__(
        self,
        name: str | None = None,
        *,
        affinity_threshold: float = 0.80,
        exploration_probability: float = 0.0,
        max_ttft_penalty_ms: float = 18000.0,
        ttft_source: str = SOURCE_THROUGHPUT,
        peak_prefill_throughput: float = 15928.0,
        prefix_producer: str = APPROX_PRODUCER,
        latency_producer: str = LATENCY_PRODUCER,
        inflight_producer: str = INFLIGHT_PRODUCER,
        rng: Callable[[], float] = random.random,
    ) -> None:
        super().__init__(name)
        self.threshold = affinity_threshold
        self.exploration = exploration_probability
        self.max_penalty = max_ttft_penalty_ms
        self.source = ttft_source
        self.peak = peak_prefill_throughput
        self.prefix_key = PREFIX_CACHE_MATCH_INFO.of(prefix_producer)
        self.ttft_key = LATENCY_PREDICTION_INFO.of(latency_producer)
        self.load_key = INFLIGHT_LOAD.of(inflight_producer)
        self.rng = rng
        self.gate_breaks = 0  # times the TTFT gate opened every endpoint (for tests and debugging)

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        threshold = params.float("affinityThreshold", 0.80, max=1.0)
        exploration = params.float("explorationProbability", 0.0, min=0.0, max=1.0)
        penalty = params.float("maxTTFTPenaltyMs", 18000.0, min=0.0)
        source = params.str("ttftSource", SOURCE_THROUGHPUT, choices=(SOURCE_THROUGHPUT, SOURCE_PREDICTOR))
        peak = params.float("peakPrefillThroughput", 15928.0, min=0.0)
        if source == SOURCE_THROUGHPUT and penalty > 0 and peak == 0:
            raise params.fail("peakPrefillThroughput", "must be > 0 when ttftSource is prefillThroughput")
        prefix = context.producer_for(PREFIX_MATCH, params, requested_by=name)
        gate = penalty > 0
        latency = context.producer_for(
            LATENCY, params, requested_by=name, add_default=gate and source == SOURCE_PREDICTOR
        )
        inflight = context.producer_for(
            INFLIGHT, params, requested_by=name, add_default=gate and source == SOURCE_THROUGHPUT
        )
        return cls(
            name,
            affinity_threshold=threshold,
            exploration_probability=exploration,
            max_ttft_penalty_ms=penalty,
            ttft_source=source,
            peak_prefill_throughput=peak,
            prefix_producer=prefix,
            latency_producer=latency,
            inflight_producer=inflight,
        )

    def consumes(self) -> Collection[DataKey[Any]]:
        keys: list[DataKey[Any]] = [self.prefix_key]
        if self.max_penalty > 0:
            keys.append(self.ttft_key if self.source == SOURCE_PREDICTOR else self.load_key)
        return keys

    def filter(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        if len(endpoints) <= 1 or self.threshold <= 0:
            return list(endpoints)
        if self.exploration > 0 and self.rng() < self.exploration:
            return list(endpoints)
        info = request.data.get(self.prefix_key)
        if info is None or info.total_blocks <= 0 or not info.matches:
            return list(endpoints)
        matches, total, threshold = info.matches, info.total_blocks, self.threshold
        sticky: list[Endpoint] = []
        other: list[Endpoint] = []
        for ep in endpoints:
            (sticky if matches.get(ep.name, 0) / total >= threshold else other).append(ep)
        debug = log.isEnabledFor(V(DEBUG))
        if not sticky:
            if debug:
                log.log(V(DEBUG), "request %s: %s: no sticky endpoints (total %d)", request.request_id, self.name,
                        len(endpoints))  # fmt: skip
            return list(endpoints)
        if self.max_penalty > 0 and other:
            ttft = self._ttft_fn(request)
            best_sticky = min(ttft(ep) for ep in sticky)
            best_other = min(ttft(ep) for ep in other)
            if best_sticky - best_other > self.max_penalty:
                self.gate_breaks += 1
                if debug:
                    log.log(V(DEBUG), "request %s: %s: TTFT load gate broken (best sticky %.0f ms, other %.0f ms)",
                            request.request_id, self.name, best_sticky, best_other)  # fmt: skip
                return list(endpoints)
        if debug:
            log.log(V(DEBUG), "request %s: %s: narrowed to sticky %s of %d (matched blocks %s of %d)",
                    request.request_id, self.name, ",".join(ep.name for ep in sticky), len(endpoints),
                    {ep.name: matches.get(ep.name, 0) for ep in endpoints}, total)  # fmt: skip
        return sticky

    def _ttft_fn(self, request: InferenceRequest) -> Callable[[Endpoint], float]:
        if self.source == SOURCE_PREDICTOR:
            info = request.data.get(self.ttft_key)
            predicted = info.predictions if info is not None else {}

            def from_predictor(ep: Endpoint) -> float:
                p = predicted.get(ep.name)
                return p.ttft_ms if p is not None else NO_PREDICTION

            return from_predictor
        key, peak = self.load_key, self.peak

        def from_load(ep: Endpoint) -> float:
            load = ep.attributes.get(key)
            return (load.total_tokens if load is not None else 0) / peak * 1000.0

        return from_load
