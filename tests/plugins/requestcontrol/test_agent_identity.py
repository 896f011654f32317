"""agent-identity: the fairness id unless the client sent one."""

from __future__ import annotations

import time

from epp.config.loader import parse_config
from epp.datalayer.datastore import Datastore
from epp.framework import Endpoint, InferenceRequest, Metrics
from epp.requestcontrol.director import SchedulingDirector
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


QUEUE = "plugins:\n- type: queue-scorer\n"


async def test_agent_identity_is_the_fairness_id_unless_the_client_sent_one() -> None:
    ds = pool(0)
    cfg = parse_config(QUEUE + "- type: agent-identity\n  parameters: {additionalSessionHeaders: [x-my-agent]}\n")
    d = SchedulingDirector(ds, build_pipeline(cfg, plugin_context(ds)))
    r1 = chat_req("1", {"session-id": "codex-1", "x-my-agent": "mine"})
    await d.handle_request(r1)
    assert r1.fairness_id == "mine"
    r2 = chat_req("2", {"x-claude-code-session-id": "cc-7", "x-llm-d-inference-fairness-id": "tenant"})
    await d.handle_request(r2)
    assert r2.fairness_id == "tenant"
    r3 = chat_req("3")
    await d.handle_request(r3)
    assert r3.fairness_id == "default-flow"
