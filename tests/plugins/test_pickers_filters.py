"""Pickers, filters and the utilization detector against GIE/llm-d behaviour."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from epp.framework import CycleState, Endpoint, InferenceRequest, Metrics, PluginConfigError
from epp.plugins.filters.by_label import ByLabelFilter
from epp.plugins.filters.decode_filter import DecodeFilter
from epp.plugins.filters.label_selector_filter import LabelSelectorFilter
from epp.plugins.filters.prefill_filter import PrefillFilter
from epp.plugins.pickers._common import PICKER_RANDOM
from epp.plugins.pickers.max_score_picker import MaxScorePicker
from epp.plugins.pickers.random_picker import RandomPicker
from epp.plugins.pickers.weighted_random_picker import WeightedRandomPicker
from epp.plugins.saturation.utilization_detector import UtilizationDetector
from tests.helpers import build

S = CycleState()
R = InferenceRequest("r", "/v1/completions", "completions", "m", "m", {})


def eps(n: int) -> list[Endpoint]:
    return [Endpoint(f"e{i}", f"10.0.0.{i + 1}", 8000) for i in range(n)]


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


def test_random_picker() -> None:
    PICKER_RANDOM.seed(3)
    e = eps(3)
    picks = Counter(RandomPicker("p").pick(S, R, [(x, 0.0) for x in e]).targets[0].name for _ in range(300))
    assert set(picks) == {"e0", "e1", "e2"}
    assert len(RandomPicker("p", max_num=5).pick(S, R, [(x, 0.0) for x in e]).targets) == 3


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


def labeled(labels: list[dict[str, str]]) -> list[Endpoint]:
    out = eps(len(labels))
    for e, lab in zip(out, labels, strict=True):
        e.labels = lab
    return out


def test_label_selector_filter() -> None:
    e = labeled([{"tier": "gpu", "zone": "a"}, {"tier": "cpu"}, {"tier": "gpu", "zone": "b"}, {}])
    selector = {
        "matchLabels": {"tier": "gpu"},
        "matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["b"]}],
    }
    f = build(LabelSelectorFilter, selector)
    assert f.filter(S, R, e) == [e[0]]
    exists = build(LabelSelectorFilter, {"matchExpressions": [{"key": "zone", "operator": "Exists"}]})
    assert exists.filter(S, R, e) == [e[0], e[2]]
    with pytest.raises(PluginConfigError, match="operator"):
        build(LabelSelectorFilter, name="f", parameters={"matchExpressions": [{"key": "z", "operator": "Near"}]})
    with pytest.raises(PluginConfigError, match="at least one value"):
        build(LabelSelectorFilter, name="f", parameters={"matchExpressions": [{"key": "z", "operator": "In"}]})


def test_by_label_and_role_filters() -> None:
    e = labeled([{"llm-d.ai/role": "decode"}, {"llm-d.ai/role": "prefill"}, {}, {"llm-d.ai/role": "both"}])
    assert DecodeFilter("d").filter(S, R, e) == [e[0], e[2], e[3]]
    assert PrefillFilter("p").filter(S, R, e) == [e[1], e[3]]
    f = build(ByLabelFilter, {"label": "llm-d.ai/role", "validValues": ["prefill"], "allowsNoLabel": True})
    assert f.filter(S, R, e) == [e[1], e[2]]
    with pytest.raises(PluginConfigError, match="label"):
        build(ByLabelFilter, name="b", parameters={"validValues": ["x"]})


def with_metrics(q: int, kv: float, age: float = 0.0) -> Endpoint:
    e = Endpoint(f"q{q}kv{kv}age{age}", "10.0.0.9", 8000)
    e.metrics = Metrics(waiting_queue_size=q, kv_cache_usage_percent=kv, update_time=time.monotonic() - age)
    return e


def test_utilization_detector_saturation_formula() -> None:
    d = build(UtilizationDetector, name="u", parameters={})  # queue 5, kv 0.8, staleness 200ms
    assert d.saturation([]) == 1.0
    # max(2/5, 0.4/0.8) = 0.5 ; max(10/5, 0) = 2.0 → mean 1.25
    assert d.saturation([with_metrics(2, 0.4), with_metrics(10, 0.0)]) == pytest.approx(1.25)
    assert d.saturation([with_metrics(0, 0.0, age=1.0)]) == 1.0  # stale = saturated
    never = Endpoint("n", "10.0.0.8", 8000)
    assert d.saturation([never, with_metrics(0, 0.0)]) == 0.5
    d2 = build(UtilizationDetector, name="u", parameters={"queueDepthThreshold": 10, "kvCacheUtilThreshold": 0.5})
    assert d2.saturation([with_metrics(5, 0.2)]) == pytest.approx(0.5)


def test_utilization_detector_filter_and_fail_open() -> None:
    d = build(UtilizationDetector, name="u", parameters={"headroom": 0.2})  # q limit 6, kv limit 0.96
    ok, busy, full, stale = with_metrics(5, 0.5), with_metrics(6, 0.1), with_metrics(0, 0.97), with_metrics(0, 0, 5)
    assert d.filter(S, R, [ok, busy, full, stale]) == [ok]
    assert d.filter(S, R, [busy, stale]) == [busy, stale]  # everything dropped → fail open


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"queueDepthThreshold": 0}, "queueDepthThreshold"),
        ({"kvCacheUtilThreshold": 0}, "kvCacheUtilThreshold"),
        ({"kvCacheUtilThreshold": 1.5}, "kvCacheUtilThreshold"),
        ({"metricsStalenessThreshold": "soon"}, "metricsStalenessThreshold"),
        ({"headroom": -1}, "headroom"),
    ],
)
def test_utilization_detector_bad_parameters(params: dict[str, object], key: str) -> None:
    with pytest.raises(PluginConfigError) as ei:
        build(UtilizationDetector, name="u", parameters=params)
    assert ei.value.key == key and key in str(ei.value)
