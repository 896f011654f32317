"""queue-scorer against its reference formula (llm-d-router v0.10
pkg/epp/framework/plugins/scheduling/scorer/queuedepth)."""

from __future__ import annotations

import time

from epp.framework import (
    CycleState,
    Endpoint,
    InferenceRequest,
    Metrics,
)
from epp.plugins.scorers.queue_scorer import QueueScorer


def ep(name: str, **metrics: object) -> Endpoint:
    e = Endpoint(name, f"10.0.0.{abs(hash(name)) % 250 + 1}", 8000)
    e.metrics = Metrics(update_time=time.monotonic(), **metrics)  # type: ignore[arg-type]
    return e


def req(model: str = "m", headers: dict[str, str] | None = None, rid: str = "r1") -> InferenceRequest:
    return InferenceRequest(rid, "/v1/completions", "completions", model, model, {}, headers=headers or {})


S = CycleState()


def test_queue_scorer_min_max() -> None:
    eps = [ep("a", waiting_queue_size=0), ep("b", waiting_queue_size=5), ep("c", waiting_queue_size=10)]
    assert QueueScorer("q").score(S, req(), eps) == [1.0, 0.5, 0.0]
    same = [ep("a", waiting_queue_size=3), ep("b", waiting_queue_size=3)]
    assert QueueScorer("q").score(S, req(), same) == [1.0, 1.0]
