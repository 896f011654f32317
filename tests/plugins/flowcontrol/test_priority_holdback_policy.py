"""priority-holdback-policy: ceilings, and low priority held while high priority flows."""

from __future__ import annotations

import asyncio

import pytest

from epp.framework import PluginConfigError
from epp.plugins.flowcontrol.priority_holdback_policy import PriorityHoldbackPolicy
from epp.requestcontrol.flowcontrol_spec import FlowControlSpec, PriorityBandSpec
from tests.helpers import build
from tests.plugins.flowcontrol.support import QUEUE, chat_req, fc_director, fresh, pool


def test_priority_holdback_ceilings() -> None:
    rank = build(PriorityHoldbackPolicy, {"minCeiling": 0.4, "maxCeiling": 0.9})
    assert rank.ceilings(0.5, [10, 5, -1]) == pytest.approx([0.9, 0.65, 0.4])
    value = build(PriorityHoldbackPolicy, {"minCeiling": 0.4, "domain": "value"})
    assert value.ceilings(0.5, [10, 8, 0]) == pytest.approx([1.0, 0.88, 0.4])
    assert rank.ceilings(0.5, [3]) == [0.9]
    with pytest.raises(PluginConfigError, match="minCeiling"):
        build(PriorityHoldbackPolicy, {})
    with pytest.raises(PluginConfigError, match="shape"):
        build(PriorityHoldbackPolicy, {"minCeiling": 0.1, "shape": "cubic"})


async def test_priority_holdback_holds_low_priority_while_high_flows() -> None:
    # saturation 0.6 (waiting 3 / threshold 5): priority 10 (ceiling 0.9) flows at once, -1 (ceiling 0.4) waits
    ds = pool(3)
    text = (
        QUEUE + "- type: priority-holdback-policy\n  parameters: {minCeiling: 0.4, maxCeiling: 0.9}\n"
        "objectives:\n- {name: high, priority: 10}\n- {name: low, priority: -1}\n"
    )
    bands = [PriorityBandSpec(10), PriorityBandSpec(-1)]
    spec = FlowControlSpec(usage_limit_policy_ref="priority-holdback-policy", priority_bands=bands)
    d = fc_director(ds, text, spec)
    low = asyncio.create_task(d.handle_request(chat_req("low", {"x-gateway-inference-objective": "low"})))
    await asyncio.sleep(0.02)
    assert not low.done()
    high = await asyncio.wait_for(d.handle_request(chat_req("high", {"x-gateway-inference-objective": "high"})), 1)
    assert high.endpoints and not low.done()
    fresh(ds, 1)  # saturation 0.2 < 0.4: the low band opens
    await asyncio.wait_for(low, 1)
