"""priority-holdback-policy: ceilings, and low priority held while high priority flows."""

from __future__ import annotations

import asyncio
import time

import pytest

from epp.config.loader import parse_config
from epp.datalayer.datastore import Datastore
from epp.datalayer.objectives import ObjectiveStore
from epp.framework import Endpoint, InferenceRequest, Metrics, PluginConfigError
from epp.plugins.flowcontrol.priority_holdback_policy import PriorityHoldbackPolicy
from epp.requestcontrol.director import SchedulingDirector
from epp.requestcontrol.flowcontrol import FlowController
from epp.requestcontrol.flowcontrol_spec import FlowControlSpec, PriorityBandSpec
from epp.wiring import plugin_context
from epp.wiring.builder import build_pipeline
from tests.helpers import build


def pool(waiting: int) -> Datastore:
    ds = Datastore()
    e = Endpoint("pod-0", "10.0.0.1", 8000)
    e.metrics = Metrics(waiting_queue_size=waiting, update_time=time.monotonic())
    ds.replace_all([e])
    return ds


def fresh(ds: Datastore, waiting: int) -> None:
    for e in ds.endpoints():
        e.metrics = Metrics(waiting_queue_size=waiting, update_time=time.monotonic())


def chat_req(rid: str, headers: dict[str, str] | None = None) -> InferenceRequest:
    msgs = [{"role": "user", "content": "hi"}]
    body = {"model": "m", "messages": msgs}
    return InferenceRequest(
        rid, "/v1/chat/completions", "chat", "m", "m", body, headers=headers or {}, messages=msgs, body_size=40
    )


def fc_director(ds: Datastore, yaml_text: str, spec: FlowControlSpec) -> SchedulingDirector:
    cfg = parse_config(yaml_text)
    pipeline = build_pipeline(cfg, plugin_context(ds))
    fc = FlowController(spec, pipeline.saturation_detector, plugins=pipeline.plugins, poll_interval=0.002)
    return SchedulingDirector(ds, pipeline, ObjectiveStore(cfg.objectives), flow_controller=fc)


QUEUE = "plugins:\n- type: queue-scorer\n"


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
