"""The FlowController: a request with no endpoint waits for one until its TTL."""

from __future__ import annotations

import asyncio
import time

import pytest

from epp.config.loader import parse_config
from epp.datalayer.datastore import Datastore
from epp.datalayer.objectives import ObjectiveStore
from epp.framework import Endpoint, InferenceRequest, Metrics
from epp.requestcontrol.director import SchedulingDirector
from epp.requestcontrol.flowcontrol import FlowController
from epp.requestcontrol.flowcontrol_spec import FlowControlSpec
from epp.wiring import plugin_context
from epp.wiring.builder import build_pipeline


def pool(waiting: int) -> Datastore:
    ds = Datastore()
    e = Endpoint("pod-0", "10.0.0.1", 8000)
    e.metrics = Metrics(waiting_queue_size=waiting, update_time=time.monotonic())
    ds.replace_all([e])
    return ds


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


async def test_no_endpoint_request_ttl_waits_for_an_endpoint() -> None:
    from epp.framework import ServiceUnavailable

    ds = Datastore()
    d = fc_director(ds, QUEUE, FlowControlSpec(no_endpoint_request_ttl=1.0))
    pending = asyncio.create_task(d.handle_request(chat_req("r")))
    await asyncio.sleep(0.1)
    assert not pending.done()  # no endpoint yet: it waits instead of a 503
    fresh_pool = pool(0)
    ds.replace_all(list(fresh_pool.endpoints()))
    decision = await asyncio.wait_for(pending, 1)
    assert decision.endpoints[0].name == "pod-0"
    empty = fc_director(Datastore(), QUEUE, FlowControlSpec(no_endpoint_request_ttl=0.1))
    t0 = time.monotonic()
    with pytest.raises(ServiceUnavailable):
        await empty.handle_request(chat_req("x"))
    assert 0.09 <= time.monotonic() - t0 < 1.0
    with pytest.raises(ServiceUnavailable):  # without the setting: at once, as before
        await fc_director(Datastore(), QUEUE, FlowControlSpec()).handle_request(chat_req("y"))
