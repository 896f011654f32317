"""agent-identity: the fairness id unless the client sent one."""

from __future__ import annotations

from epp.config.loader import parse_config
from epp.requestcontrol.director import SchedulingDirector
from epp.wiring import plugin_context
from epp.wiring.builder import build_pipeline
from tests.plugins.flowcontrol.support import QUEUE, chat_req, pool


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
