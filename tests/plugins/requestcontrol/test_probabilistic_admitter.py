"""probabilistic-admitter: the admission curve."""

from __future__ import annotations

import random
import time

import pytest

from epp.framework import Endpoint, Metrics, PluginConfigError
from epp.plugins.requestcontrol.probabilistic_admitter import ProbabilisticAdmitter
from tests.helpers import build
from tests.plugins.flowcontrol.support import chat_req


def test_probabilistic_admitter_curve() -> None:
    a = build(ProbabilisticAdmitter)
    a.rng = random.Random(1)

    def eps(waiting: int) -> list[Endpoint]:
        e = Endpoint("e", "10.0.0.1", 8000)
        e.metrics = Metrics(waiting_queue_size=waiting, update_time=time.monotonic())
        return [e]

    low = chat_req("l")
    low.priority = -1
    assert a.reject_probability(eps(0)) == 0.0
    assert a.reject_probability(eps(1)) == pytest.approx(min(0.2**5 * 300, 1.0))  # ≈ 0.096
    assert a.reject_probability(eps(2)) == 1.0  # 0.4 ≥ 0.34
    assert a.admit(low, eps(2)) is not None and a.admit(low, eps(0)) is None
    critical = chat_req("c")
    assert a.admit(critical, eps(50)) is None
    shed = sum(a.admit(low, eps(1)) is not None for _ in range(2000))
    assert 120 < shed < 270  # ≈ 9.6 % of 2000
    unscraped: list[Endpoint] = [Endpoint("u", "10.0.0.2", 8000)]
    assert a.reject_probability(unscraped) == 1.0
    with pytest.raises(PluginConfigError, match="power"):
        build(ProbabilisticAdmitter, {"power": 0})
