"""prefix-cache-scorer against its reference formula (llm-d-router v0.10
pkg/epp/framework/plugins/scheduling/scorer/prefix)."""

from __future__ import annotations

import time

import pytest

from epp.framework import (
    PREFIX_CACHE_MATCH_INFO,
    CycleState,
    Endpoint,
    InferenceRequest,
    Metrics,
    PrefixCacheMatchInfo,
)
from epp.plugins.scorers.prefix_cache_scorer import PrefixCacheScorer


def ep(name: str, **metrics: object) -> Endpoint:
    e = Endpoint(name, f"10.0.0.{abs(hash(name)) % 250 + 1}", 8000)
    e.metrics = Metrics(update_time=time.monotonic(), **metrics)  # type: ignore[arg-type]
    return e


def req(model: str = "m", headers: dict[str, str] | None = None, rid: str = "r1") -> InferenceRequest:
    return InferenceRequest(rid, "/v1/completions", "completions", model, model, {}, headers=headers or {})


S = CycleState()


def _with_info(r: InferenceRequest, matches: dict[str, float], total: int = 10, bs: int = 16) -> InferenceRequest:
    r.data.put(PREFIX_CACHE_MATCH_INFO.of("approx-prefix-cache-producer"), PrefixCacheMatchInfo(total, bs, matches))
    return r


def test_prefix_cache_scorer_formula() -> None:
    a, b, c = ep("a"), ep("b"), ep("c")
    s = PrefixCacheScorer("p")
    assert s.score(S, req(), [a, b]) == [0.0, 0.0]  # no info → 0
    assert s.score(S, _with_info(req(), {"a": 5, "b": 10}), [a, b, c]) == [0.5, 1.0, 0.0]
    w = PrefixCacheScorer("p", match_length_weight=0.5, match_length_scale_tokens=320)
    # a: 0.5·min(1, 5·16/320)² + 0.5·5/10 = 0.5·0.0625 + 0.25
    assert w.score(S, _with_info(req(), {"a": 5}), [a]) == [pytest.approx(0.28125)]
