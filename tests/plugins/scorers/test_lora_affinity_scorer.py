"""lora-affinity-scorer against its reference formula (llm-d-router v0.10
pkg/epp/framework/plugins/scheduling/scorer/loraaffinity/lora_affinity.go)."""

from __future__ import annotations

from epp.plugins.scorers.lora_affinity_scorer import LoraAffinityScorer
from tests.plugins.scorers.support import S, ep, req


def test_lora_affinity_scorer() -> None:
    eps = [
        ep("active", active_models=frozenset({"lora-a"}), max_active_models=1),
        ep("room", active_models=frozenset({"x"}), max_active_models=4),
        ep("waiting", active_models=frozenset({"x"}), waiting_models=frozenset({"lora-a"}), max_active_models=2),
        ep("full", active_models=frozenset({"x", "y"}), max_active_models=2),
    ]
    assert LoraAffinityScorer("l").score(S, req("lora-a"), eps) == [1.0, 0.8, 0.6, 0.0]
