"""header-label-affinity-scorer."""

from __future__ import annotations

import time

import pytest

from epp.framework import (
    CycleState,
    Endpoint,
    InferenceRequest,
    Metrics,
    PluginConfigError,
)
from epp.plugins.scorers.header_label_affinity_scorer import HeaderLabelAffinityScorer
from tests.helpers import build

S = CycleState()


def req(headers: dict[str, str] | None = None) -> InferenceRequest:
    return InferenceRequest("r", "/v1/completions", "completions", "m", "m", {}, headers=headers or {})


def ep(i: int, running: int = 0, waiting: int = 0, kv: float = 0.0, labels: dict[str, str] | None = None) -> Endpoint:
    e = Endpoint(f"e{i}", f"10.0.0.{i}", 8000, labels=labels or {})
    e.metrics = Metrics(waiting, running, kv, update_time=time.monotonic())
    return e


def test_header_label_affinity_scorer() -> None:
    s = build(HeaderLabelAffinityScorer, {"headerName": "X-Preferred-Zone", "labelKey": "zone"})
    e = [ep(1, labels={"zone": "a"}), ep(2, labels={"zone": "b"}), ep(3)]
    assert s.score(S, req({"x-preferred-zone": "b"}), e) == [0.0, 1.0, 0.0]
    assert s.score(S, req(), e) == [0.0, 0.0, 0.0]
    with pytest.raises(PluginConfigError, match="labelKey"):
        build(HeaderLabelAffinityScorer, {"headerName": "x"})
