"""predicted-latency-producer, latency-scorer, slo-headroom-tier-filter, latency-slo-admitter."""

from __future__ import annotations

import asyncio
import random
import time

import numpy as np
import pytest

from epp.config import parse_config
from epp.datalayer.datastore import Datastore
from epp.datalayer.objectives import ObjectiveStore
from epp.framework import (
    LATENCY_PREDICTION_INFO,
    PREFIX_CACHE_MATCH_INFO,
    TOKENIZED_PROMPT,
    CycleState,
    Endpoint,
    InferenceRequest,
    LatencyPrediction,
    LatencyPredictionInfo,
    Metrics,
    PrefixCacheMatchInfo,
    ProfileResult,
    ResponseChunk,
    SchedulingResult,
    TokenizedPrompt,
    TooManyRequests,
    Usage,
)
from epp.plugins.admitters.latency_slo_admitter import LatencySLOAdmitter
from epp.plugins.filters.slo_headroom_tier_filter import SLOHeadroomTierFilter
from epp.plugins.producers._latency_model import LatencyModels, WindowedLeastSquares
from epp.plugins.producers.predicted_latency_producer import PredictedLatencyProducer
from epp.plugins.scorers.latency_scorer import LatencyScorer
from epp.requestcontrol.director import SchedulingDirector
from epp.wiring import plugin_context
from epp.wiring.builder import build_pipeline
from tests.helpers import build

PREFIX = PREFIX_CACHE_MATCH_INFO.of("approx-prefix-cache-producer")
INFO = LATENCY_PREDICTION_INFO.of("predicted-latency-producer")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def endpoints(n: int, **metrics: float) -> list[Endpoint]:
    eps = []
    for i in range(n):
        ep = Endpoint(f"pod-{i}", f"10.0.0.{i + 1}", 8000)
        ep.metrics = Metrics(update_time=time.monotonic(), **metrics)  # type: ignore[arg-type]
        eps.append(ep)
    return eps


def request(
    rid: str, prompt: int, matches: dict[str, float] | None = None, headers: dict[str, str] | None = None
) -> InferenceRequest:
    req = InferenceRequest(rid, "/v1/completions", "completions", "m", "m", {}, headers=headers or {}, stream=True)
    req.data.put(TOKENIZED_PROMPT, TokenizedPrompt(list(range(prompt))))
    req.data.put(PREFIX, PrefixCacheMatchInfo(prompt // 16, 16, dict(matches or {})))
    return req


def picked(ep: Endpoint) -> SchedulingResult:
    return SchedulingResult({"default": ProfileResult([ep])}, "default")


# -- the model ---------------------------------------------------------------------------------------------------


def test_windowed_least_squares_recovers_known_coefficients() -> None:
    rng = np.random.default_rng(7)
    truth = np.array([25.0, 180.0, 40.0, 6.0, 12.0, 30.0])  # ms: intercept, uncached_k, prefill_k, ...
    m = WindowedLeastSquares(6, window=256)
    for _ in range(600):
        x = np.array([1.0, rng.uniform(0, 4), rng.uniform(0, 8), rng.integers(0, 8), rng.integers(0, 4), rng.random()])
        m.add(x, float(x @ truth + rng.normal(0, 2.0)))
    theta = m.coefficients()
    assert m.count == 256 and m.total == 600
    np.testing.assert_allclose(theta, truth, rtol=0.08, atol=1.5)


def test_windowed_least_squares_follows_a_change_and_keeps_slopes_non_negative() -> None:
    rng = np.random.default_rng(1)
    m = WindowedLeastSquares(3, window=64)
    for _ in range(200):  # old regime
        x = np.array([1.0, rng.uniform(0, 2), rng.uniform(0, 2)])
        m.add(x, float(10 + 5 * x[1] + 3 * x[2]))
    for _ in range(64):  # new regime fills the window: the old one is forgotten
        x = np.array([1.0, rng.uniform(0, 2), rng.uniform(0, 2)])
        m.add(x, float(50 + 20 * x[1]))
    np.testing.assert_allclose(m.coefficients(), [50, 20, 0], rtol=0.01, atol=1e-9)  # the ridge shrinks a little
    neg = WindowedLeastSquares(2, window=32)
    for i in range(32):  # a decreasing relation is pinned at a zero slope, not fitted negative
        neg.add(np.array([1.0, float(i)]), 100.0 - i)
    theta = neg.coefficients()
    assert theta[1] == 0.0 and theta[0] == pytest.approx(np.mean([100.0 - i for i in range(32)]))


def test_models_fall_back_to_pooled_then_none_when_cold_or_unfit() -> None:
    models = LatencyModels(2, window=32, min_samples=4, max_error=0.5)
    assert models.model_for("a") is None and models.cold()
    for v in (1.0, 2.0, 3.0, 4.0):
        models.observe("a", np.array([1.0, v]), 10 * v)
    assert models.model_for("a") == "a"
    assert models.model_for("b") == ""  # a new endpoint uses the pooled model
    assert models.predict("a", np.array([1.0, 5.0])) == pytest.approx(50.0, rel=0.01)
    for _ in range(12):  # endpoint a turns erratic: its own model and the pooled one become unfit
        models.observe("a", np.array([1.0, 1.0]), 1000.0)
        models.observe("a", np.array([1.0, 1.0]), 1.0)
    assert models.fits["a"].error > 0.5
    assert models.model_for("a") is None


# -- the producer -------------------------------------------------------------------------------------------------


def true_ttft(x: np.ndarray) -> float:
    """ms from the producer's TTFT features [1, uncached_k, prefill_k, in_flight, waiting, kv]."""
    return 20.0 + 150.0 * x[1] + 60.0 * x[2] + 8.0 * x[3]


def true_tpot(x: np.ndarray) -> float:
    return 4.0 + 1.5 * x[1]  # [1, in_flight, kv, prefill_k]


def run_traffic(prod: PredictedLatencyProducer, eps: list[Endpoint], clock: Clock, rounds: int, seed: int) -> None:
    """Batches dispatched at one instant to random pods; each request's first token and end come when its true
    TTFT and TPOT (from its features at dispatch) say, so the producer measures exactly the truth."""
    rng = random.Random(seed)
    n = 0
    for _ in range(rounds):
        batch = []
        for _ in range(rng.randint(1, 6)):
            n += 1
            prompt = rng.randint(64, 3000)
            ep = rng.choice(eps)
            req = request(f"r{n}", prompt, {ep.name: rng.randint(0, prompt // 16)})

            asyncio.run(prod.prepare(req, eps))
            prod.pre_request(req, picked(ep))
            flight = req.data.require(prod.flight_key)
            batch.append((req, ep, flight, true_ttft(flight.x_ttft), true_tpot(flight.x_tpot)))
        t0 = clock.t
        for req, ep, _f, ttft, _ in sorted(batch, key=lambda b: b[3]):
            clock.t = t0 + ttft / 1000.0
            prod.response_chunk(req, ResponseChunk(b"data: {}\n\n", True, False, clock.t), ep)
        for req, ep, f, _, tpot in sorted(batch, key=lambda b: b[2].first + 9 * b[4] / 1000.0):
            clock.t = max(clock.t, f.first + 9 * tpot / 1000.0)
            f.last = f.first + 9 * tpot / 1000.0  # the last chunk came exactly then
            prod.response_complete(req, ep, Usage(completion_tokens=10))
        clock.t += 1.0


def test_producer_learns_ttft_and_tpot_from_the_stream_and_predicts_them() -> None:
    eps = endpoints(3)
    prod = build(PredictedLatencyProducer, {"streamingMode": True, "minSamples": 16})
    clock = prod.clock = Clock()
    req = request("cold", 1000)

    asyncio.run(prod.prepare(req, eps))
    assert req.data.require(INFO).predictions == {}  # cold: nothing predicted
    run_traffic(prod, eps, clock, rounds=120, seed=3)
    assert prod.load and all(not load.flights and load.prefill_tokens == 0 for load in prod.load.values())
    # a fresh request: predictions per endpoint match the truth for that endpoint's state
    req = request("new", 2048, {"pod-1": 100})  # pod-1 caches 1600 of the 2048 tokens
    asyncio.run(prod.prepare(req, eps))
    preds = req.data.require(INFO).predictions
    assert set(preds) == {"pod-0", "pod-1", "pod-2"}
    for ep in eps:
        x_ttft, x_tpot = prod._features(ep, 2048 - (1600 if ep.name == "pod-1" else 0))
        assert preds[ep.name].ttft_ms == pytest.approx(true_ttft(x_ttft), rel=0.05)
        assert preds[ep.name].tpot_ms == pytest.approx(true_tpot(x_tpot), rel=0.05)
    assert preds["pod-1"].ttft_ms < preds["pod-0"].ttft_ms - 200  # 1600 cached tokens ≈ 240 ms less
    coef = prod.ttft.models[""].coefficients()
    np.testing.assert_allclose(coef[:4], [20.0, 150.0, 60.0, 8.0], rtol=0.05, atol=1.0)


def test_producer_tracks_in_flight_load_and_expires_lost_completions() -> None:
    eps = endpoints(2)
    prod = build(PredictedLatencyProducer, {"contextTTL": "10s"})
    clock = prod.clock = Clock()

    a, b = request("a", 1600), request("b", 800, {"pod-0": 25})
    for r in (a, b):
        asyncio.run(prod.prepare(r, eps))
        prod.pre_request(r, picked(eps[0]))
    load = prod.load["pod-0"]
    assert [f.request_id for f in load.flights.values()] == ["a", "b"] and load.prefill_tokens == 1600 + 400
    x_ttft, _ = prod._features(eps[0], 0)
    assert list(x_ttft[2:4]) == [2.0, 2]  # 2000 prefill tokens in flight, 2 requests
    prod.response_chunk(
        a, ResponseChunk(b"data: x\n\n", True, False, clock.t), eps[0]
    )  # a's first token: its prefill is done
    assert load.prefill_tokens == 400
    clock.t += 11  # b's completion is lost: contextTTL releases it
    asyncio.run(prod.prepare(request("c", 10), eps))
    assert not load.flights and load.prefill_tokens == 0
    prod.response_complete(a, eps[0], None)  # late completions are harmless
    prod.response_complete(b, eps[0], None)
    assert not load.flights and load.prefill_tokens == 0


def test_producer_tracks_two_requests_with_the_same_request_id_as_two() -> None:
    """x-request-id is the client's: a second request under the same id must not drop the first one's flight (its
    load would vanish and its completion would release nothing); a request scheduled again replaces its own."""
    eps = endpoints(2)
    prod = build(PredictedLatencyProducer, {"contextTTL": "10s"})
    prod.clock = Clock()
    first, second = request("dup", 1600), request("dup", 800)
    for r in (first, second):
        asyncio.run(prod.prepare(r, eps))
        prod.pre_request(r, picked(eps[0]))
    load = prod.load["pod-0"]
    assert len(load.flights) == 2 and load.prefill_tokens == 1600 + 800
    prod.response_complete(first, eps[0], None)
    assert [f.uncached for f in load.flights.values()] == [800] and load.prefill_tokens == 800
    prod.pre_request(second, picked(eps[1]))  # scheduled again, on pod-1
    assert not load.flights and load.prefill_tokens == 0
    assert len(prod.load["pod-1"].flights) == 1 and prod.load["pod-1"].prefill_tokens == 800
    prod.response_complete(second, eps[1], None)
    assert not prod.load["pod-1"].flights and prod.load["pod-1"].prefill_tokens == 0


def test_producer_headroom_against_slo_headers_and_tpot_neutral_without_streaming() -> None:
    eps = endpoints(2)
    prod = build(PredictedLatencyProducer, {"streamingMode": True, "minSamples": 16})
    clock = prod.clock = Clock()
    run_traffic(prod, eps, clock, rounds=80, seed=5)

    req = request("slo", 1000, headers={"x-llm-d-slo-ttft-ms": "200", "x-slo-tpot-ms": "1000"})
    asyncio.run(prod.prepare(req, eps))
    info = req.data.require(INFO)
    p = info.predictions["pod-0"]
    assert info.has_slo
    assert p.ttft_headroom == pytest.approx(200 - p.ttft_ms) and p.ttft_valid == (p.ttft_ms < 200)
    assert p.tpot_headroom == pytest.approx(1000 - p.tpot_ms) and p.tpot_valid
    bad = request("bad", 1000, headers={"x-llm-d-slo-ttft-ms": "soon"})
    asyncio.run(prod.prepare(bad, eps))
    assert not bad.data.require(INFO).has_slo  # an unparsable SLO is ignored, as llm-d does
    plain = build(PredictedLatencyProducer, {"minSamples": 16}, name="plain")  # streamingMode false (llm-d default)
    plain.clock = clock
    run_traffic(plain, eps, clock, rounds=40, seed=6)
    req = request("e2e", 1000)
    asyncio.run(plain.prepare(req, eps))
    p = req.data.require(LATENCY_PREDICTION_INFO.of("plain")).predictions["pod-0"]
    assert p.tpot_valid and p.tpot_headroom == 0.0  # TPOT neutral, the "TTFT" is the end-to-end latency
    assert p.ttft_ms > 30  # e2e includes the 9 decode steps


def test_producer_parameters() -> None:
    from epp.framework import PluginConfigError

    with pytest.raises(PluginConfigError, match="sloBufferFactor"):
        build(PredictedLatencyProducer, {"sloBufferFactor": 0})
    with pytest.raises(PluginConfigError, match="samplingMean"):
        build(PredictedLatencyProducer, {"samplingMean": -1})
    with pytest.raises(PluginConfigError, match="useEncoderCacheFeatures"):
        build(PredictedLatencyProducer, {"useEncoderCacheFeatures": True})
    p = build(PredictedLatencyProducer, {"predictInProduce": False, "prefixMatchInfoProducerName": "precise"})
    assert p.prefix_key == PREFIX_CACHE_MATCH_INFO.of("precise")

    req = request("x", 100)
    asyncio.run(p.prepare(req, endpoints(1)))
    assert req.data.require(INFO).predictions == {}


# -- scorer, filter, admitter ------------------------------------------------------------------------------------


def info(
    preds: dict[str, tuple[float, float, float, float]], has_slo: bool = False, dispatched: int = 1
) -> LatencyPredictionInfo:
    """name -> (ttft, tpot, ttft_headroom, tpot_headroom)"""
    return LatencyPredictionInfo(
        {n: LatencyPrediction(t, p, th >= 0, ph >= 0, th, ph, dispatched) for n, (t, p, th, ph) in preds.items()},
        has_slo,
    )


def scored(scorer: LatencyScorer, req: InferenceRequest, eps: list[Endpoint]) -> dict[str, float]:
    return {ep.name: s for ep, s in zip(eps, scorer.score(CycleState(), req, eps), strict=True)}


def test_scorer_prefers_lower_predicted_latency_without_slo() -> None:
    eps = endpoints(3)
    scorer = build(LatencyScorer)
    req = request("r", 100)
    req.data.put(INFO, info({"pod-0": (300, 0, -300, 0), "pod-1": (120, 0, -120, 0), "pod-2": (200, 0, -200, 0)}))
    s = scored(scorer, req, eps)
    assert s["pod-1"] > s["pod-2"] > s["pod-0"]
    assert s == {"pod-1": 1.01, "pod-2": 0.56, "pod-0": 0.01}  # llm-d: int((1 - n) * 100) + 1, over 100


def test_scorer_slo_strategies_idle_preference_and_composite_fallback() -> None:
    eps = endpoints(3)
    req = request("r", 100)
    # pod-0 and pod-1 meet the SLO (headroom 50 and 10 ms), pod-2 misses it
    req.data.put(
        INFO, info({"pod-0": (150, 5, 50, 5), "pod-1": (190, 5, 10, 5), "pod-2": (260, 5, -60, 5)}, has_slo=True)
    )
    least = scored(build(LatencyScorer, {"headroomSelectionStrategy": "least"}), req, eps)
    most = scored(build(LatencyScorer, {"headroomSelectionStrategy": "most"}), req, eps)
    assert least["pod-1"] > least["pod-0"] and least["pod-2"] == 0  # bin-packing: closest to the boundary
    assert most["pod-0"] > most["pod-1"] and most["pod-2"] == 0
    # all miss: the idle endpoint (nothing dispatched) wins over lower predicted latency
    idle = info({"pod-0": (300, 5, -100, 5), "pod-1": (250, 5, -50, 5)}, has_slo=True)
    idle.predictions["pod-0"].dispatched = 0
    req.data.put(INFO, idle)
    s = scored(build(LatencyScorer), req, eps[:2])
    assert s["pod-0"] > 0 and s["pod-1"] == 0
    # no predictions (cold model): llm-d's composite of free KV, relative queue and prefix match
    eps[0].metrics.kv_cache_usage_percent, eps[0].metrics.waiting_queue_size = 0.5, 4
    eps[1].metrics.kv_cache_usage_percent = 0.1
    req = request("cold", 160, {"pod-2": 10})
    req.data.put(INFO, LatencyPredictionInfo())
    s = scored(build(LatencyScorer), req, eps)
    assert s == {"pod-0": pytest.approx(0.17), "pod-1": pytest.approx(0.63), "pod-2": pytest.approx(1.0)}


def test_slo_headroom_tier_filter() -> None:
    eps = endpoints(3)
    req = request("r", 100)
    req.data.put(INFO, info({"pod-0": (150, 5, 50, 5), "pod-1": (260, 5, -60, 5)}, has_slo=True))
    f = build(SLOHeadroomTierFilter, {"epsilonExploreNeg": 0.0})
    assert [e.name for e in f.filter(CycleState(), req, eps)] == ["pod-0"]
    always_explore = build(SLOHeadroomTierFilter, {"epsilonExploreNeg": 1.0})
    assert [e.name for e in always_explore.filter(CycleState(), req, eps)] == ["pod-1", "pod-2"]  # + unpredicted
    req.data.put(INFO, LatencyPredictionInfo())
    assert f.filter(CycleState(), req, eps) == eps  # no predictions: no-op
    from epp.framework import PluginConfigError

    with pytest.raises(PluginConfigError, match="epsilonExploreNeg"):
        build(SLOHeadroomTierFilter, {"epsilonExploreNeg": 2})


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


# -- wired: the llm-d chart's predicted-latency config ------------------------------------------------------------

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
