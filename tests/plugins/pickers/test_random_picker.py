"""random-picker against GIE behaviour."""

from __future__ import annotations

from collections import Counter

from epp.plugins.pickers._common import PICKER_RANDOM
from epp.plugins.pickers.random_picker import RandomPicker
from tests.plugins.support_pickers_filters import R, S, eps


def test_random_picker() -> None:
    PICKER_RANDOM.seed(3)
    e = eps(3)
    picks = Counter(RandomPicker("p").pick(S, R, [(x, 0.0) for x in e]).targets[0].name for _ in range(300))
    assert set(picks) == {"e0", "e1", "e2"}
    assert len(RandomPicker("p", max_num=5).pick(S, R, [(x, 0.0) for x in e]).targets) == 3
