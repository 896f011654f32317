"""max-score-picker: top scores, fallbacks, ties broken at random or rotated."""

from __future__ import annotations

from collections import Counter

import pytest

from epp.framework import PluginConfigError
from epp.plugins.pickers._common import PICKER_RANDOM
from epp.plugins.pickers.max_score_picker import MaxScorePicker
from tests.helpers import build
from tests.plugins.support_pickers_filters import R, S, eps


def test_max_score_picker_top_and_fallbacks() -> None:
    e = eps(4)
    scored = [(e[0], 1.0), (e[1], 3.0), (e[2], 2.0), (e[3], 0.5)]
    assert MaxScorePicker("p").pick(S, R, scored).targets == [e[1]]
    three = build(MaxScorePicker, name="p", parameters={"maxNumOfEndpoints": 3})
    assert three.pick(S, R, scored).targets == [e[1], e[2], e[0]]
    assert build(MaxScorePicker, name="p", parameters={"maxNumOfEndpoints": 0}).max_num == 1  # ≤0 falls back to 1


def test_max_score_picker_breaks_ties_at_random() -> None:
    PICKER_RANDOM.seed(7)
    e = eps(4)
    scored = [(e[0], 2.0), (e[1], 2.0), (e[2], 2.0), (e[3], 1.0)]
    rnd = build(MaxScorePicker, name="p", parameters={"tieBreak": "random"})
    picks = Counter(rnd.pick(S, R, scored).targets[0].name for _ in range(600))
    assert set(picks) == {"e0", "e1", "e2"} and min(picks.values()) > 120
    two = MaxScorePicker("p", max_num=2, tie_break="random")
    for _ in range(50):
        t = two.pick(S, R, scored).targets
        assert len(t) == 2 and len(set(t)) == 2 and e[3] not in t


def test_max_score_picker_rotates_ties_by_default() -> None:
    e = eps(4)
    scored = [(e[0], 2.0), (e[1], 2.0), (e[2], 2.0), (e[3], 1.0)]
    p = build(MaxScorePicker, name="p", parameters={})
    picks = [p.pick(S, R, scored).targets[0].name for _ in range(9)]
    assert Counter(picks) == {"e0": 3, "e1": 3, "e2": 3}  # a burst of equal scores spreads exactly evenly
    assert picks[0] != picks[1] != picks[2]
    two = MaxScorePicker("p", max_num=2)
    firsts: Counter[str] = Counter()
    for _ in range(6):
        t = two.pick(S, R, scored).targets
        assert len(set(t)) == 2 and e[3] not in t
        firsts[t[0].name] += 1
    assert firsts == {"e0": 2, "e1": 2, "e2": 2}
    with pytest.raises(PluginConfigError, match="tieBreak"):
        build(MaxScorePicker, name="p", parameters={"tieBreak": "coin"})
