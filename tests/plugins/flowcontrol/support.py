"""Helpers shared by the flow-control policy tests (a pool, a director with flow control, dispatch order)."""

from __future__ import annotations

import asyncio
import time

from epp.config.loader import parse_config
from epp.datalayer.datastore import Datastore
from epp.datalayer.objectives import ObjectiveStore
from epp.framework import ApiKind, Endpoint, InferenceRequest, Metrics
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


def fresh(ds: Datastore, waiting: int) -> None:
    for e in ds.endpoints():
        e.metrics = Metrics(waiting_queue_size=waiting, update_time=time.monotonic())


def chat_req(rid: str, headers: dict[str, str] | None = None) -> InferenceRequest:
    msgs = [{"role": "user", "content": "hi"}]
    body = {"model": "m", "messages": msgs}
    return InferenceRequest(
        rid, "/v1/chat/completions", ApiKind.CHAT, "m", "m", body, headers=headers or {}, messages=msgs, body_size=40
    )


def fc_director(ds: Datastore, yaml_text: str, spec: FlowControlSpec) -> SchedulingDirector:
    cfg = parse_config(yaml_text)
    pipeline = build_pipeline(cfg, plugin_context(ds))
    fc = FlowController(spec, pipeline.saturation_detector, plugins=pipeline.plugins, poll_interval=0.002)
    return SchedulingDirector(ds, pipeline, ObjectiveStore(cfg.objectives), flow_controller=fc)


async def order_of(d: SchedulingDirector, ds: Datastore, sends: list[tuple[str, dict[str, str]]]) -> list[str]:
    """Queue the requests on a saturated pool (in list order), then free it: the order they leave."""
    out: list[str] = []

    async def send(rid: str, headers: dict[str, str]) -> None:
        await d.handle_request(chat_req(rid, headers))
        out.append(rid)

    tasks = []
    for rid, h in sends:
        tasks.append(asyncio.create_task(send(rid, h)))
        await asyncio.sleep(0.002)
    await asyncio.sleep(0.02)
    assert out == []
    fresh(ds, 0)
    await asyncio.wait_for(asyncio.gather(*tasks), 2)
    return out


QUEUE = "plugins:\n- type: queue-scorer\n"
