"""weighted-random-picker: picks in proportion to the scores."""

from __future__ import annotations

from collections import Counter

from epp.plugins.pickers._common import PICKER_RANDOM
from epp.plugins.pickers.weighted_random_picker import WeightedRandomPicker
from tests.plugins.support_pickers_filters import R, S, eps


def test_weighted_random_picker_is_proportional() -> None:
    PICKER_RANDOM.seed(11)
    e = eps(3)
    scored = [(e[0], 3.0), (e[1], 1.0), (e[2], 0.0)]
    picks = Counter(WeightedRandomPicker("p").pick(S, R, scored).targets[0].name for _ in range(4000))
    assert "e2" not in picks
    assert 2.5 < picks["e0"] / picks["e1"] < 3.6  # expected 3:1
    # all zero → uniform random
    zeros = Counter(WeightedRandomPicker("p").pick(S, R, [(x, 0.0) for x in e]).targets[0].name for _ in range(300))
    assert set(zeros) == {"e0", "e1", "e2"}
    two = WeightedRandomPicker("p", max_num=2).pick(S, R, scored).targets
    assert set(two) == {e[0], e[1]}
