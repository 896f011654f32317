"""no-hit-lru-scorer against its reference formula (llm-d-router v0.10
pkg/epp/framework/plugins/scheduling/scorer/nohitlru)."""

from __future__ import annotations

import time

from epp.framework import (
    PREFIX_CACHE_MATCH_INFO,
    CycleState,
    Endpoint,
    InferenceRequest,
    Metrics,
    PrefixCacheMatchInfo,
    ProfileResult,
    SchedulingResult,
)
from epp.plugins.scorers.no_hit_lru_scorer import NoHitLRUScorer


def ep(name: str, **metrics: object) -> Endpoint:
    e = Endpoint(name, f"10.0.0.{abs(hash(name)) % 250 + 1}", 8000)
    e.metrics = Metrics(update_time=time.monotonic(), **metrics)  # type: ignore[arg-type]
    return e


def req(model: str = "m", headers: dict[str, str] | None = None, rid: str = "r1") -> InferenceRequest:
    return InferenceRequest(rid, "/v1/completions", "completions", model, model, {}, headers=headers or {})


def result_for(target: Endpoint) -> SchedulingResult:
    return SchedulingResult({"default": ProfileResult([target])}, "default")


S = CycleState()


def _with_info(r: InferenceRequest, matches: dict[str, float], total: int = 10, bs: int = 16) -> InferenceRequest:
    r.data.put(PREFIX_CACHE_MATCH_INFO.of("approx-prefix-cache-producer"), PrefixCacheMatchInfo(total, bs, matches))
    return r


def test_no_hit_lru_scorer() -> None:
    a, b, c = ep("a"), ep("b"), ep("c")
    s = NoHitLRUScorer("n")
    # any hit → 0.5 everywhere
    assert s.score(S, _with_info(req(), {"a": 1}), [a, b, c]) == [0.5, 0.5, 0.5]
    # cold, nothing used yet: 1 - i/(N-1) in candidate order
    r = _with_info(req(), {})
    assert s.score(S, r, [a, b, c]) == [1.0, 0.5, 0.0]
    s.pre_request(r, result_for(a))
    r2 = _with_info(req(), {})
    # never-used b, c first; then a
    assert s.score(S, r2, [a, b, c]) == [0.0, 1.0, 0.5]
    s.pre_request(r2, result_for(b))
    # never-used c; then a (least recently used), then b
    assert s.score(S, _with_info(req(), {}), [a, b, c]) == [0.5, 0.0, 1.0]
    # a request with a hit does not touch the LRU
    hit = _with_info(req(), {"c": 3})
    s.score(S, hit, [a, b, c])
    s.pre_request(hit, result_for(c))
    assert list(s._lru) == ["a", "b"]
