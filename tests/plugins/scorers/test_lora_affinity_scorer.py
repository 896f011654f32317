"""lora-affinity-scorer against its reference formula (llm-d-router v0.10
pkg/epp/framework/plugins/scheduling/scorer/loraaffinity/lora_affinity.go)."""

from __future__ import annotations

import time

from epp.framework import (
    CycleState,
    Endpoint,
    InferenceRequest,
    Metrics,
)
from epp.plugins.scorers.lora_affinity_scorer import LoraAffinityScorer


def ep(name: str, **metrics: object) -> Endpoint:
    e = Endpoint(name, f"10.0.0.{abs(hash(name)) % 250 + 1}", 8000)
    e.metrics = Metrics(update_time=time.monotonic(), **metrics)  # type: ignore[arg-type]
    return e


def req(model: str = "m", headers: dict[str, str] | None = None, rid: str = "r1") -> InferenceRequest:
    return InferenceRequest(rid, "/v1/completions", "completions", model, model, {}, headers=headers or {})


S = CycleState()


def test_lora_affinity_scorer() -> None:
    eps = [
        ep("active", active_models=frozenset({"lora-a"}), max_active_models=1),
        ep("room", active_models=frozenset({"x"}), max_active_models=4),
        ep("waiting", active_models=frozenset({"x"}), waiting_models=frozenset({"lora-a"}), max_active_models=2),
        ep("full", active_models=frozenset({"x", "y"}), max_active_models=2),
    ]
    assert LoraAffinityScorer("l").score(S, req("lora-a"), eps) == [1.0, 0.8, 0.6, 0.0]
