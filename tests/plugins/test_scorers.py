"""Each built-in scorer against its reference formula (gie.md §4.2, llmd.md §7.2)."""

from __future__ import annotations

import base64
import time

import pytest

from epp.framework import (
    PREFIX_CACHE_MATCH_INFO,
    CycleState,
    Endpoint,
    InferenceRequest,
    Metrics,
    PluginConfigError,
    PrefixCacheMatchInfo,
    ProfileResult,
    Response,
    SchedulingResult,
)
from epp.plugins.scorers.kv_cache_utilization_scorer import KVCacheUtilizationScorer
from epp.plugins.scorers.load_aware_scorer import LoadAwareScorer
from epp.plugins.scorers.lora_affinity_scorer import LoraAffinityScorer
from epp.plugins.scorers.no_hit_lru_scorer import NoHitLRUScorer
from epp.plugins.scorers.prefix_cache_scorer import PrefixCacheScorer
from epp.plugins.scorers.queue_scorer import QueueScorer
from epp.plugins.scorers.running_requests_size_scorer import RunningRequestsSizeScorer
from epp.plugins.scorers.session_affinity_scorer import SessionAffinityScorer
from tests.helpers import build


def ep(name: str, **metrics: object) -> Endpoint:
    e = Endpoint(name, f"10.0.0.{abs(hash(name)) % 250 + 1}", 8000)
    e.metrics = Metrics(update_time=time.monotonic(), **metrics)  # type: ignore[arg-type]
    return e


def req(model: str = "m", headers: dict[str, str] | None = None, rid: str = "r1") -> InferenceRequest:
    return InferenceRequest(rid, "/v1/completions", "completions", model, model, {}, headers=headers or {})


def result_for(target: Endpoint) -> SchedulingResult:
    return SchedulingResult({"default": ProfileResult([target])}, "default")


S = CycleState()


def test_queue_scorer_min_max() -> None:
    eps = [ep("a", waiting_queue_size=0), ep("b", waiting_queue_size=5), ep("c", waiting_queue_size=10)]
    assert QueueScorer("q").score(S, req(), eps) == [1.0, 0.5, 0.0]
    same = [ep("a", waiting_queue_size=3), ep("b", waiting_queue_size=3)]
    assert QueueScorer("q").score(S, req(), same) == [1.0, 1.0]


def test_kv_and_running_scorers() -> None:
    eps = [ep("a", kv_cache_usage_percent=0.25), ep("b", kv_cache_usage_percent=1.0)]
    assert KVCacheUtilizationScorer("kv").score(S, req(), eps) == [0.75, 0.0]
    eps = [ep("a", running_requests_size=2), ep("b", running_requests_size=6), ep("c", running_requests_size=4)]
    assert RunningRequestsSizeScorer("r").score(S, req(), eps) == [1.0, 0.0, 0.5]


def test_load_aware_scorer() -> None:
    eps = [ep(str(q), waiting_queue_size=q) for q in (0, 32, 64, 128, 500)]
    assert LoadAwareScorer("l", threshold=128).score(S, req(), eps) == [0.5, 0.375, 0.25, 0.0, 0.0]
    with pytest.raises(PluginConfigError, match="threshold"):
        build(LoadAwareScorer, name="l", parameters={"threshold": 0})
    with pytest.raises(PluginConfigError, match="expected an integer"):
        build(LoadAwareScorer, name="l", parameters={"threshold": "many"})


def test_lora_affinity_scorer() -> None:
    eps = [
        ep("active", active_models=frozenset({"lora-a"}), max_active_models=1),
        ep("room", active_models=frozenset({"x"}), max_active_models=4),
        ep("waiting", active_models=frozenset({"x"}), waiting_models=frozenset({"lora-a"}), max_active_models=2),
        ep("full", active_models=frozenset({"x", "y"}), max_active_models=2),
    ]
    assert LoraAffinityScorer("l").score(S, req("lora-a"), eps) == [1.0, 0.8, 0.6, 0.0]


def test_session_affinity_encoded_header() -> None:
    a, b = ep("a"), ep("b")
    token = base64.b64encode(b"default/b").decode()
    s = build(SessionAffinityScorer, name="sa", parameters={})
    assert s.score(S, req(headers={"x-session-token": token}), [a, b]) == [0.0, 1.0]
    assert s.score(S, req(headers={"x-session-token": "%%%"}), [a, b]) == [0.0, 0.0]
    response = Response(200)
    s.response_received(req(), response, a)
    assert base64.b64decode(response.set_headers["x-session-token"]) == b"default/a"


def test_session_affinity_custom_header_round_trips() -> None:
    """With `headerName`, the token goes back in that header, so the client's next request sticks."""
    a, b = ep("a"), ep("b")
    s = build(SessionAffinityScorer, {"headerName": "X-My-Session"})
    response = Response(200)
    s.response_received(req(), response, b)
    assert set(response.set_headers) == {"x-my-session"}
    again = req(headers={"x-my-session": response.set_headers["x-my-session"]})
    assert s.score(S, again, [a, b]) == [0.0, 1.0]


def test_session_affinity_session_id_binds_and_expires() -> None:
    a, b = ep("a"), ep("b")
    s = build(SessionAffinityScorer, name="sa", parameters={"strategy": "session_id", "ttl": "50ms"})
    r = req(headers={"x-session-id": "s1"})
    assert s.score(S, r, [a, b]) == [0.0, 0.0]
    s.pre_request(r, result_for(b))
    assert s.score(S, r, [a, b]) == [0.0, 1.0]
    time.sleep(0.06)
    assert s.score(S, r, [a, b]) == [0.0, 0.0]
    with pytest.raises(PluginConfigError, match="strategy"):
        build(SessionAffinityScorer, name="sa", parameters={"strategy": "sticky"})


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
