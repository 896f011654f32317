"""active-request-scorer reads the inflight-load-producer's counters (all replicas')."""

from __future__ import annotations

import logging

import pytest

from epp.plugins.scorers.active_request_scorer import ActiveRequestScorer
from epp.wiring import plugin_context
from tests.helpers import build
from tests.plugins.scorers.support_load import S, book, req, setup


def test_active_request_scorer_idle_and_busy_scores() -> None:
    ds, (a, b, c), p = setup()
    s = build(ActiveRequestScorer, ctx=plugin_context(ds))
    assert s.score(S, req(), [a, b, c]) == [1.0, 1.0, 1.0]
    for i in range(4):
        book(p, a, 10, f"a{i}")
    for i in range(2):
        book(p, b, 10, f"b{i}")
    assert s.score(S, req(), [a, b, c]) == [0.0, 0.5, 1.0]  # max 4: a → 0, b → (4-2)/4, c idle → 1
    s2 = build(ActiveRequestScorer, {"idleThreshold": 2, "maxBusyScore": 0.5}, ctx=plugin_context(ds))
    assert s2.score(S, req(), [a, b, c]) == [0.0, 1.0, 1.0]
    book(p, b, 10, "b2")  # b: 3 > idle 2 → (4-3)/4 · 0.5
    assert s2.score(S, req(), [a, b, c]) == [0.0, 0.125, 1.0]
    p.loads["c"].remote_requests = 8  # another replica's requests count too
    assert s.score(S, req(), [a, b, c]) == [0.5, 0.625, 0.0]


def test_active_request_scorer_accepts_the_deprecated_timeout_and_bad_busy_score_like_llm_d(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        s = build(ActiveRequestScorer, {"requestTimeout": "2m", "maxBusyScore": 3, "idleThreshold": -1})
    assert s.max_busy_score == 1.0 and s.idle_threshold == 0
    assert "requestTimeout is deprecated" in caplog.text and "maxBusyScore" in caplog.text
