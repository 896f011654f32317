"""header-label-affinity-scorer."""

from __future__ import annotations

import pytest

from epp.framework import (
    PluginConfigError,
)
from epp.plugins.scorers.header_label_affinity_scorer import HeaderLabelAffinityScorer
from tests.helpers import build
from tests.plugins.support_catalog import S, ep, req


def test_header_label_affinity_scorer() -> None:
    s = build(HeaderLabelAffinityScorer, {"headerName": "X-Preferred-Zone", "labelKey": "zone"})
    e = [ep(1, labels={"zone": "a"}), ep(2, labels={"zone": "b"}), ep(3)]
    assert s.score(S, req({"x-preferred-zone": "b"}), e) == [0.0, 1.0, 0.0]
    assert s.score(S, req(), e) == [0.0, 0.0, 0.0]
    with pytest.raises(PluginConfigError, match="labelKey"):
        build(HeaderLabelAffinityScorer, {"headerName": "x"})
