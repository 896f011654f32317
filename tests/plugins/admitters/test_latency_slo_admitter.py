"""latency-slo-admitter: sheddable requests no endpoint can serve within their SLO are rejected, and the chart's
config routes by prediction and sheds through the director."""

from __future__ import annotations

import time

import pytest

from epp.config import parse_config
from epp.datalayer.datastore import Datastore
from epp.datalayer.objectives import ObjectiveStore
from epp.framework import (
    LatencyPredictionInfo,
    ResponseChunk,
    TooManyRequests,
    Usage,
)
from epp.plugins.admitters.latency_slo_admitter import LatencySLOAdmitter
from epp.plugins.producers.predicted_latency_producer import PredictedLatencyProducer
from epp.requestcontrol.director import SchedulingDirector
from epp.wiring import plugin_context
from epp.wiring.builder import build_pipeline
from tests.helpers import build
from tests.plugins.support_latency import INFO, Clock, endpoints, info, picked, request

CHART = """
plugins:
- type: predicted-latency-producer
  parameters: {streamingMode: true, minSamples: 8}
- type: latency-scorer
- type: weighted-random-picker
- type: slo-headroom-tier-filter
- type: latency-slo-admitter
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: predicted-latency-producer
  - pluginRef: slo-headroom-tier-filter
  - pluginRef: latency-scorer
  - pluginRef: weighted-random-picker
objectives:
- name: batch
  priority: -1
"""


def test_admitter_rejects_sheddable_requests_no_endpoint_can_serve_within_slo() -> None:
    eps = endpoints(2, running_requests_size=3, kv_cache_usage_percent=0.5)
    adm = build(LatencySLOAdmitter)
    req = request("r", 100, headers={"x-llm-d-slo-ttft-ms": "100"})
    req.priority = -1
    req.data.put(INFO, info({"pod-0": (150, 5, -50, 0), "pod-1": (260, 5, -160, 0)}, has_slo=True))
    assert adm.admit(req, eps) == "no valid endpoint available to serve the request"
    req.priority = 0
    assert adm.admit(req, eps) is None  # only sheddable requests are shed
    req.priority = -1
    eps[1].metrics.running_requests_size = 0
    assert adm.admit(req, eps) is None  # an idle endpoint
    eps[1].metrics.running_requests_size, eps[1].metrics.kv_cache_usage_percent = 3, 0.01
    assert adm.admit(req, eps) is None  # a cold endpoint
    eps[1].metrics.kv_cache_usage_percent = 0.5
    req.data.put(INFO, LatencyPredictionInfo(has_slo=True))
    assert adm.admit(req, eps) is None  # no predictions: fail open


async def test_chart_config_routes_by_prediction_and_sheds_through_the_director() -> None:
    ds = Datastore()
    eps = endpoints(2, running_requests_size=2, kv_cache_usage_percent=0.4)
    ds.replace_all(eps)
    cfg = parse_config(CHART)
    pipeline = build_pipeline(cfg, plugin_context(ds))
    d = SchedulingDirector(ds, pipeline, ObjectiveStore(cfg.objectives))
    prod = pipeline.plugins["predicted-latency-producer"]
    assert isinstance(prod, PredictedLatencyProducer)
    assert [a.name for a in pipeline.admitters] == ["latency-slo-admitter"]
    assert prod in pipeline.response_streaming
    # train: pod-1 is 4x slower than pod-0 for the same work
    clock = prod.clock = Clock()
    for i in range(40):
        ep = eps[i % 2]
        req = request(f"t{i}", 500 + 37 * i)
        await prod.prepare(req, eps)
        prod.pre_request(req, picked(ep))
        ms = (10 + 0.1 * (500 + 37 * i)) * (4 if ep.name == "pod-1" else 1)
        clock.t += ms / 1000
        prod.response_chunk(req, ResponseChunk(b"data: x\n\n", True, False, clock.t), ep)
        prod.response_complete(req, ep, Usage(completion_tokens=1))
        clock.t += 1
    picks = []
    for i in range(20):
        r = request(f"q{i}", 1200)
        decision = await d.handle_request(r)
        picks.append(decision.endpoints[0].name)
        d.handle_response_complete(r, decision, None)
    assert picks.count("pod-0") >= 15  # weighted-random over scores 1.0 vs 0.01
    for ep in eps:  # fresh metrics: stale ones would count as saturated and shed the request before the admitter
        ep.metrics.update_time = time.monotonic()
    shed = request("shed", 1200, headers={"x-llm-d-slo-ttft-ms": "20", "x-gateway-inference-objective": "batch"})
    with pytest.raises(TooManyRequests, match="request cannot be admitted: no valid endpoint"):
        await d.handle_request(shed)
    ok = request("ok", 1200, headers={"x-llm-d-slo-ttft-ms": "5000", "x-gateway-inference-objective": "batch"})
    assert (await d.handle_request(ok)).endpoints  # admitted (both meet 5 s; `least` packs onto the slower one)
