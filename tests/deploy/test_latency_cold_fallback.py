"""The chart's predicted-latency profile (`latencyPredictor.enabled` on the default values) before its model has
learned anything: the affinity filters keep a shared prefix on its pod and the latency scorer's composite (free KV,
queue, prefix) spreads the rest, i.e. routing falls back to affinity + load (issue 11 item 2)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from epp.config import parse_config
from epp.datalayer.datastore import Datastore
from epp.datalayer.objectives import ObjectiveStore
from epp.framework import ApiKind, CycleState, Endpoint, InferenceRequest, Metrics
from epp.plugins.producers.predicted_latency_producer import PredictedLatencyProducer
from epp.requestcontrol.director import SchedulingDirector
from epp.wiring import plugin_context
from epp.wiring.builder import build_pipeline
from tests.deploy.test_helm_chart import BASE, one, render


def completion(prompt: str, rid: str) -> InferenceRequest:
    body = {"model": "m", "prompt": prompt, "max_tokens": 8}
    return InferenceRequest(rid, "/v1/completions", ApiKind.COMPLETIONS, "m", "m", body, prompt=prompt)


async def test_cold_latency_profile_routes_on_affinity_and_load() -> None:
    values = {**BASE, "inferenceExtension": {"latencyPredictor": {"enabled": True}}}
    cfg = parse_config(one(render(values), "ConfigMap")["data"]["default-plugins.yaml"])
    ds = Datastore()
    eps = [Endpoint(f"pod-{i}", f"10.0.0.{i + 1}", 8000) for i in range(3)]
    for ep in eps:
        ep.metrics = Metrics(update_time=time.monotonic(), kv_cache_usage_percent=0.1)
    ds.replace_all(eps)
    ctx = plugin_context(ds)
    pipeline = build_pipeline(cfg, ctx)
    for warm in getattr(ctx.services, "warmups", []):
        await warm()
    producer = next(p for p in pipeline.plugins.values() if isinstance(p, PredictedLatencyProducer))
    d = SchedulingDirector(ds, pipeline, ObjectiveStore(cfg.objectives))
    prefix = "You are a support agent for a bank; follow the policy below exactly. " * 60
    first = await d.handle_request(completion(prefix + "Q0", "r0"))
    owner = first.endpoints[0]
    await asyncio.sleep(0)  # the prefix producer records the pick
    # the owner gets busy (queue, KV), the others are idle: a cold model predicts nothing, yet the prefix sticks
    owner.metrics = Metrics(update_time=time.monotonic(), kv_cache_usage_percent=0.7, waiting_queue_size=3)
    for i in range(1, 6):
        r = completion(prefix + f"Q{i}", f"r{i}")
        decision = await d.handle_request(r)
        assert decision.endpoints[0] is owner, i
        assert r.data.require(producer.info_key).predictions == {}  # the model is cold: nothing predicted
        await asyncio.sleep(0)
    # a prompt cached nowhere is scored by load (llm-d's composite of free KV and queue): the busy owner lowest
    other = completion("An unrelated question about the weather. " * 30, "x")
    await d.handle_request(other)
    scorer: Any = pipeline.plugins["latency-scorer"]
    scores = dict(zip([e.name for e in eps], scorer.score(CycleState(), other, eps), strict=True))
    assert all(scores[owner.name] < scores[e.name] for e in eps if e is not owner), scores
