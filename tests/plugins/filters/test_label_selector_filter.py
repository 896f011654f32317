"""label-selector-filter against GIE/llm-d behaviour."""

from __future__ import annotations

import pytest

from epp.framework import CycleState, Endpoint, InferenceRequest, PluginConfigError
from epp.plugins.filters.label_selector_filter import LabelSelectorFilter
from tests.helpers import build

S = CycleState()


R = InferenceRequest("r", "/v1/completions", "completions", "m", "m", {})


def eps(n: int) -> list[Endpoint]:
    return [Endpoint(f"e{i}", f"10.0.0.{i + 1}", 8000) for i in range(n)]


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
