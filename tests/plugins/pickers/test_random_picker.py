"""random-picker against GIE behaviour."""

from __future__ import annotations

from collections import Counter

from epp.framework import CycleState, Endpoint, InferenceRequest
from epp.plugins.pickers._common import PICKER_RANDOM
from epp.plugins.pickers.random_picker import RandomPicker

S = CycleState()


R = InferenceRequest("r", "/v1/completions", "completions", "m", "m", {})


def eps(n: int) -> list[Endpoint]:
    return [Endpoint(f"e{i}", f"10.0.0.{i + 1}", 8000) for i in range(n)]


def test_random_picker() -> None:
    PICKER_RANDOM.seed(3)
    e = eps(3)
    picks = Counter(RandomPicker("p").pick(S, R, [(x, 0.0) for x in e]).targets[0].name for _ in range(300))
    assert set(picks) == {"e0", "e1", "e2"}
    assert len(RandomPicker("p", max_num=5).pick(S, R, [(x, 0.0) for x in e]).targets) == 3
