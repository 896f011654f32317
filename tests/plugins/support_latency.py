"""Helpers shared by the latency predictor, scorer, tier filter and admitter tests."""

from __future__ import annotations

import time

from epp.framework import (
    LATENCY_PREDICTION_INFO,
    PREFIX_CACHE_MATCH_INFO,
    TOKENIZED_PROMPT,
    ApiKind,
    Endpoint,
    InferenceRequest,
    LatencyPrediction,
    LatencyPredictionInfo,
    Metrics,
    PrefixCacheMatchInfo,
    ProfileResult,
    SchedulingResult,
    TokenizedPrompt,
)

PREFIX = PREFIX_CACHE_MATCH_INFO.of("approx-prefix-cache-producer")


INFO = LATENCY_PREDICTION_INFO.of("predicted-latency-producer")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def endpoints(n: int, **metrics: float) -> list[Endpoint]:
    eps = []
    for i in range(n):
        ep = Endpoint(f"pod-{i}", f"10.0.0.{i + 1}", 8000)
        ep.metrics = Metrics(update_time=time.monotonic(), **metrics)  # type: ignore[arg-type]
        eps.append(ep)
    return eps


def request(
    rid: str, prompt: int, matches: dict[str, float] | None = None, headers: dict[str, str] | None = None
) -> InferenceRequest:
    req = InferenceRequest(
        rid, "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {}, headers=headers or {}, stream=True
    )
    req.data.put(TOKENIZED_PROMPT, TokenizedPrompt(list(range(prompt))))
    req.data.put(PREFIX, PrefixCacheMatchInfo(prompt // 16, 16, dict(matches or {})))
    return req


def picked(ep: Endpoint) -> SchedulingResult:
    return SchedulingResult({"default": ProfileResult([ep])}, "default")


def info(
    preds: dict[str, tuple[float, float, float, float]], has_slo: bool = False, dispatched: int = 1
) -> LatencyPredictionInfo:
    """name -> (ttft, tpot, ttft_headroom, tpot_headroom)"""
    return LatencyPredictionInfo(
        {n: LatencyPrediction(t, p, th >= 0, ph >= 0, th, ph, dispatched) for n, (t, p, th, ph) in preds.items()},
        has_slo,
    )
