"""Helpers shared by the built-in scorers' tests (requests, endpoints, a cycle state)."""

from __future__ import annotations

import time

from epp.framework import (
    PREFIX_CACHE_MATCH_INFO,
    ApiKind,
    CycleState,
    Endpoint,
    InferenceRequest,
    Metrics,
    PrefixCacheMatchInfo,
    ProfileResult,
    SchedulingResult,
)


def ep(name: str, **metrics: object) -> Endpoint:
    e = Endpoint(name, f"10.0.0.{abs(hash(name)) % 250 + 1}", 8000)
    e.metrics = Metrics(update_time=time.monotonic(), **metrics)  # type: ignore[arg-type]
    return e


def req(model: str = "m", headers: dict[str, str] | None = None, rid: str = "r1") -> InferenceRequest:
    return InferenceRequest(rid, "/v1/completions", ApiKind.COMPLETIONS, model, model, {}, headers=headers or {})


S = CycleState()


def result_for(target: Endpoint) -> SchedulingResult:
    return SchedulingResult({"default": ProfileResult([target])}, "default")


def _with_info(r: InferenceRequest, matches: dict[str, float], total: int = 10, bs: int = 16) -> InferenceRequest:
    r.data.put(PREFIX_CACHE_MATCH_INFO.of("approx-prefix-cache-producer"), PrefixCacheMatchInfo(total, bs, matches))
    return r
