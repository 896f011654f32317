"""prefix-cache-scorer against its reference formula (llm-d-router v0.10
pkg/epp/framework/plugins/scheduling/scorer/prefix)."""

from __future__ import annotations

import pytest

from epp.plugins.scorers.prefix_cache_scorer import PrefixCacheScorer
from tests.plugins.scorers.support import S, _with_info, ep, req


def test_prefix_cache_scorer_formula() -> None:
    a, b, c = ep("a"), ep("b"), ep("c")
    s = PrefixCacheScorer("p")
    assert s.score(S, req(), [a, b]) == [0.0, 0.0]  # no info → 0
    assert s.score(S, _with_info(req(), {"a": 5, "b": 10}), [a, b, c]) == [0.5, 1.0, 0.0]
    w = PrefixCacheScorer("p", match_length_weight=0.5, match_length_scale_tokens=320)
    # a: 0.5·min(1, 5·16/320)² + 0.5·5/10 = 0.5·0.0625 + 0.25
    assert w.score(S, _with_info(req(), {"a": 5}), [a]) == [pytest.approx(0.28125)]
