"""label-selector-filter against GIE/llm-d behaviour."""

from __future__ import annotations

import pytest

from epp.framework import PluginConfigError
from epp.plugins.filters.label_selector_filter import LabelSelectorFilter
from tests.helpers import build
from tests.plugins.support_pickers_filters import R, S, labeled


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
