"""queue-scorer against its reference formula (llm-d-router v0.10
pkg/epp/framework/plugins/scheduling/scorer/queuedepth)."""

from __future__ import annotations

from epp.plugins.scorers.queue_scorer import QueueScorer
from tests.plugins.scorers.support import S, ep, req


def test_queue_scorer_min_max() -> None:
    eps = [ep("a", waiting_queue_size=0), ep("b", waiting_queue_size=5), ep("c", waiting_queue_size=10)]
    assert QueueScorer("q").score(S, req(), eps) == [1.0, 0.5, 0.0]
    same = [ep("a", waiting_queue_size=3), ep("b", waiting_queue_size=3)]
    assert QueueScorer("q").score(S, req(), same) == [1.0, 1.0]
