"""predicted-latency-producer: the windowed least squares, pooled and cold fallbacks, learning TTFT/TPOT from the
stream, in-flight tracking, SLO headroom, parameters."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from epp.framework import (
    LATENCY_PREDICTION_INFO,
    PREFIX_CACHE_MATCH_INFO,
    Endpoint,
    ResponseChunk,
    Usage,
)
from epp.plugins.producers._latency_model import LatencyModels, WindowedLeastSquares
from epp.plugins.producers.predicted_latency_producer import PredictedLatencyProducer
from tests.helpers import build
from tests.plugins.support_latency import INFO, Clock, endpoints, picked, request


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
