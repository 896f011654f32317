"""prefix-based-pd-decider: the uncached-token threshold that sends a request through a prefill pod."""

from __future__ import annotations

from epp.framework import (
    PREFIX_CACHE_MATCH_INFO,
    CycleState,
    Endpoint,
    InferenceRequest,
    PrefixCacheMatchInfo,
    TokenizedPrompt,
)
from epp.framework.keys import TOKENIZED_PROMPT
from epp.plugins.deciders.prefix_based_pd_decider import PrefixBasedPDDecider
from tests.helpers import build
from tests.plugins.support_disagg import chat


def test_prefix_based_decider_thresholds() -> None:
    dec = build(PrefixBasedPDDecider, {"nonCachedTokens": 100, "promptTokens": 300})
    dec.key = PREFIX_CACHE_MATCH_INFO.of("approx-prefix-cache-producer")
    ep = Endpoint("d", "10.0.0.9", 8000)
    st = CycleState()

    def req(tokens: int, cached_blocks: float) -> InferenceRequest:
        r = chat("x")
        r.data.put(TOKENIZED_PROMPT, TokenizedPrompt(list(range(tokens))))
        assert dec.key is not None
        r.data.put(dec.key, PrefixCacheMatchInfo(tokens // 16, 16, {"d": cached_blocks}))
        return r

    assert not dec.disaggregate(st, req(299, 0), ep)  # shorter than promptTokens
    assert dec.disaggregate(st, req(300, 0), ep)  # 300 uncached >= 100
    assert dec.disaggregate(st, req(300, 12.5), ep)  # 300 - 200 = 100 uncached: >= threshold
    assert not dec.disaggregate(st, req(300, 13), ep)  # 300 - 208 = 92 uncached
    assert not dec.disaggregate(st, req(300, 0), None)
    r = chat("x")
    r.data.put(TOKENIZED_PROMPT, TokenizedPrompt(list(range(500))))
    assert not dec.disaggregate(st, r, ep)  # no match info → not disaggregated
    off = build(PrefixBasedPDDecider, {"nonCachedTokens": 0})
    assert not off.disaggregate(st, req(10_000, 0), ep)
