"""load-aware-scorer against its reference formula (llm-d-router v0.10
pkg/epp/framework/plugins/scheduling/scorer/loadaware/load_aware.go)."""

from __future__ import annotations

import pytest

from epp.framework import (
    PluginConfigError,
)
from epp.plugins.scorers.load_aware_scorer import LoadAwareScorer
from tests.helpers import build
from tests.plugins.scorers.support import S, ep, req


def test_load_aware_scorer() -> None:
    eps = [ep(str(q), waiting_queue_size=q) for q in (0, 32, 64, 128, 500)]
    assert LoadAwareScorer("l", threshold=128).score(S, req(), eps) == [0.5, 0.375, 0.25, 0.0, 0.0]
    with pytest.raises(PluginConfigError, match="threshold"):
        build(LoadAwareScorer, name="l", parameters={"threshold": 0})
    with pytest.raises(PluginConfigError, match="expected an integer"):
        build(LoadAwareScorer, name="l", parameters={"threshold": "many"})
