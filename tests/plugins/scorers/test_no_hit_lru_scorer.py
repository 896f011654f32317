"""no-hit-lru-scorer against its reference formula (llm-d-router v0.10
pkg/epp/framework/plugins/scheduling/scorer/nohitlru)."""

from __future__ import annotations

from epp.plugins.scorers.no_hit_lru_scorer import NoHitLRUScorer
from tests.plugins.scorers.support import S, _with_info, ep, req, result_for


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
