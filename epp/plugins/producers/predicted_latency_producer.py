"""predicted-latency-producer (llm-d): per-endpoint TTFT/TPOT predictions from models fitted online, in process.

llm-d trains XGBoost in sidecars; here the EPP learns from the responses it already proxies. For every request it
picks, it records the endpoint's state at dispatch (uncached prompt tokens on that endpoint, prefill tokens it
already has in flight, requests in flight, waiting queue, KV usage) and measures the outcome from the response
stream: TTFT at the first body chunk and TPOT = (last chunk − first chunk) / (tokens − 1) (`streamingMode: true`),
or the end-to-end latency as the "TTFT" target (`streamingMode: false`, llm-d's default). Windowed least squares
per endpoint plus a pooled model (epp/plugins/producers/_latency_model.py) fit
    TTFT ≈ a + b·uncached_k + c·inflight_prefill_k + d·in_flight + e·waiting + f·kv_usage
    TPOT ≈ a + b·in_flight + c·kv_usage + d·inflight_prefill_k           (k = thousands of tokens, ms)
Before scheduling it writes `LATENCY_PREDICTION_INFO.of(<name>)`: per endpoint the predictions and the headroom
against the request's SLO headers (`x-llm-d-slo-ttft-ms`, `x-llm-d-slo-tpot-ms`, or the older `x-slo-*`). While
the models are cold (fewer than `minSamples` samples) or unfit (relative error above `maxPredictionError`) it writes
no predictions, and latency-scorer, slo-headroom-tier-filter and latency-slo-admitter fall back to their
non-latency behaviour. Predictions, actuals, errors and SLO violations are Prometheus metrics.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import numpy as np
from prometheus_client import Counter, Gauge, Histogram

from epp.framework import (
    LATENCY_PREDICTION_INFO,
    PREFIX_CACHE_MATCH_INFO,
    TOKENIZED_PROMPT,
    DataKey,
    Endpoint,
    InferenceRequest,
    LatencyPrediction,
    LatencyPredictionInfo,
    Params,
    Plugin,
    PluginContext,
    PrefixCacheMatchInfo,
    RemovalListener,
    ResponseChunk,
    SchedulingResult,
    Usage,
)
from epp.framework.labels import MODEL_LABELS
from epp.plugins.contracts.latency import TPOT_SLO_HEADERS, TTFT_SLO_HEADERS
from epp.plugins.contracts.prefix import APPROX_PRODUCER, PREFIX_MATCH
from epp.plugins.producers._latency_model import LatencyModels, Vector

log = logging.getLogger(__name__)

TTFT_DIMS = 6
TPOT_DIMS = 4
_LATENCY_BUCKETS = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0,
    1.5, 2, 3, 4, 5, 7.5, 10, 15, 20, 30, 60,
)  # fmt: skip
_DURATION_BUCKETS = (1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1)


class _Metrics:
    """llm-d's latency-predictor series (`inference_objective_request_*`) plus the model's own."""

    def __init__(self) -> None:
        p = "inference_objective_request_"
        mdl = ("model_name", "target_model_name")
        self.ttft = Histogram(p + "ttft_seconds", "Measured time to first token.", mdl, buckets=_LATENCY_BUCKETS)
        self.predicted_ttft = Histogram(
            p + "predicted_ttft_seconds", "Predicted time to first token (for the picked endpoint).", mdl,
            buckets=_LATENCY_BUCKETS,
        )  # fmt: skip
        self.tpot = Histogram(p + "tpot_seconds", "Measured time per output token.", mdl, buckets=_LATENCY_BUCKETS)
        self.predicted_tpot = Histogram(
            p + "predicted_tpot_seconds", "Predicted time per output token (for the picked endpoint).", mdl,
            buckets=_LATENCY_BUCKETS,
        )  # fmt: skip
        self.ttft_duration = Histogram(
            p + "ttft_prediction_duration_seconds", "Time spent predicting TTFT for all candidates.", mdl,
            buckets=_DURATION_BUCKETS,
        )  # fmt: skip
        self.tpot_duration = Histogram(
            p + "tpot_prediction_duration_seconds", "Time spent predicting TPOT for all candidates.", mdl,
            buckets=_DURATION_BUCKETS,
        )  # fmt: skip
        self.ttft_violations = Counter(p + "ttft_slo_violation", "Requests whose TTFT exceeded their SLO.", mdl)
        self.tpot_violations = Counter(p + "tpot_slo_violation", "Requests whose TPOT exceeded their SLO.", mdl)
        self.samples = Counter("pyepp_latency_model_samples", "Latency samples learned", ["target"])
        self.error = Gauge(
            "pyepp_latency_model_error_ratio",
            "Exponential average of |predicted - measured| / measured, per endpoint model ('' = pooled)",
            ["target", "endpoint"],
        )
        self.abs_error = Histogram(
            "pyepp_latency_prediction_error_seconds",
            "|predicted - measured| for the picked endpoint",
            ["target"],
            buckets=_LATENCY_BUCKETS,
        )
        self.outcomes = Counter(
            "pyepp_latency_predictions",
            "Prediction rounds by outcome: predicted, cold (too few samples), unfit (error too high), disabled",
            ["outcome"],
        )
        for o in ("predicted", "cold", "unfit", "disabled"):
            self.outcomes.labels(o)


_metrics: _Metrics | None = None


def metrics() -> _Metrics:
    """One set per process on the default registry (the EPP serves it), shared by all producer instances."""
    global _metrics
    if _metrics is None:
        _metrics = _Metrics()
    return _metrics


@dataclass(slots=True)
class _Pending:
    """What prepare() learned about this request, for pre_request() to file the pick."""

    prompt_tokens: int
    matched: dict[str, float]  # endpoint name -> cached tokens the prefix producer reports
    ttft_slo: float
    tpot_slo: float
    predictions: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class _Flight:
    """One dispatched request, until its response ends (or `contextTTL` passes)."""

    request_id: str
    endpoint: str
    dispatched: float
    uncached: int
    x_ttft: Vector
    x_tpot: Vector
    predicted_ttft: float | None
    predicted_tpot: float | None
    ttft_slo: float
    tpot_slo: float
    model: str
    target_model: str
    stream: bool
    first: float = 0.0
    last: float = 0.0
    events: int = 0
    prefilling: bool = True


@dataclass(slots=True)
class _EndpointLoad:
    # id(flight) -> flight, oldest first (not by request id: x-request-id is the client's, two requests may share it)
    flights: dict[int, _Flight] = field(default_factory=dict)
    prefill_tokens: int = 0  # uncached prompt tokens of flights that have not produced a token yet

    def min_tpot_slo(self) -> float:
        slos = [f.tpot_slo for f in self.flights.values() if f.tpot_slo > 0]
        return min(slos) if slos else 0.0


_PENDING = DataKey[_Pending]("predicted-latency-pending")
_FLIGHT = DataKey[_Flight]("predicted-latency-flight")


def slo_header(headers: Mapping[str, str], names: tuple[str, ...]) -> float:
    """An SLO in ms from the first of `names` present; 0 when absent or not a positive finite number."""
    raw = next((h for n in names if (h := headers.get(n))), "")
    if not raw:
        return 0.0
    try:
        v = float(raw)
    except ValueError:
        log.debug("ignoring %s: %r is not a number", names[0], raw[:64])
        return 0.0
    return v if math.isfinite(v) and v > 0 else 0.0


class PredictedLatencyProducer(Plugin, RemovalListener):
    type_name = "predicted-latency-producer"
    records_only = True  # PreRequest writes only the flight (for the online fit and the load): may run after the answer

    def __init__(
        self,
        name: str | None = None,
        *,
        streaming_mode: bool = False,
        slo_buffer_factor: float = 1.0,
        context_ttl: float = 300.0,
        endpoint_role_label: str = "",
        predict_in_produce: bool = True,
        prefix_producer: str = APPROX_PRODUCER,
        window: int = 256,
        min_samples: int = 16,
        max_error: float = 0.5,
    ) -> None:
        super().__init__(name)
        self.streaming_mode = streaming_mode
        self.slo_buffer_factor = slo_buffer_factor
        self.context_ttl = context_ttl
        self.role_label = endpoint_role_label
        self.predict_in_produce = predict_in_produce
        self.prefix_key = PREFIX_CACHE_MATCH_INFO.of(prefix_producer)
        self.info_key = LATENCY_PREDICTION_INFO.of(self.name)
        self.pending_key = _PENDING.of(self.name)
        self.flight_key = _FLIGHT.of(self.name)
        self.ttft = LatencyModels(TTFT_DIMS, window, min_samples, max_error)
        self.tpot = LatencyModels(TPOT_DIMS, window, min_samples, max_error)
        self.load: dict[str, _EndpointLoad] = {}
        self.clock = time.monotonic
        self.metrics = metrics()
        self.label = MODEL_LABELS.label

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        # llm-d validates these two and (v0.10) uses neither: TPOT here is averaged over the whole stream.
        params.float("samplingMean", 1000.0, min=0.0, min_exclusive=True)
        params.int("maxDecodeTokenSamplesForPrediction", 0, min=0)
        if params.bool("useEncoderCacheFeatures", False):
            raise params.fail("useEncoderCacheFeatures", "multimodal encoder-cache features are not supported")
        if params.str("encoderCacheMatchInfoProducerName", ""):
            raise params.fail(
                "encoderCacheMatchInfoProducerName", "multimodal encoder-cache features are not supported"
            )
        producer = context.producer_for(PREFIX_MATCH, params, requested_by=name)
        plugin = cls(
            name,
            streaming_mode=params.bool("streamingMode", False),
            slo_buffer_factor=params.float("sloBufferFactor", 1.0, min=0.0, min_exclusive=True),
            context_ttl=params.duration("contextTTL", 300.0),
            endpoint_role_label=params.str("endpointRoleLabel", ""),
            predict_in_produce=params.bool("predictInProduce", True),
            prefix_producer=producer,
            window=params.int("trainingWindow", 256, min=8),
            min_samples=params.int("minSamples", 16, min=2),
            max_error=params.float("maxPredictionError", 0.5, min=0.0, min_exclusive=True),
        )
        context.endpoints.subscribe(plugin)
        return plugin

    def produces(self) -> Collection[DataKey[Any]]:
        return (self.info_key,)

    def consumes(self) -> Collection[DataKey[Any]]:
        return (self.prefix_key,)

    # -- endpoints (EndpointListener) --------------------------------------------------------------------------

    def endpoint_removed(self, endpoint: Endpoint) -> None:
        self.ttft.forget(endpoint.name)
        self.tpot.forget(endpoint.name)
        self.load.pop(endpoint.name, None)
        for target in ("ttft", "tpot"):
            with contextlib.suppress(KeyError):
                self.metrics.error.remove(target, endpoint.name)

    # -- features ----------------------------------------------------------------------------------------------

    def _load(self, endpoint: str) -> _EndpointLoad:
        load = self.load.get(endpoint)
        if load is None:
            load = self.load[endpoint] = _EndpointLoad()
        return load

    def _rows(self, ep: Endpoint, uncached: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """The TTFT and TPOT feature rows of `ep` for a request with `uncached` prompt tokens there."""
        load = self.load.get(ep.name)
        in_flight = float(len(load.flights)) if load else 0.0
        prefill_k = (load.prefill_tokens if load else 0) / 1000.0
        kv = ep.metrics.kv_cache_usage_percent
        waiting = float(ep.metrics.waiting_queue_size)
        return (1.0, uncached / 1000.0, prefill_k, in_flight, waiting, kv), (1.0, in_flight, kv, prefill_k)

    def _features(self, ep: Endpoint, uncached: int) -> tuple[Vector, Vector]:
        x_ttft, x_tpot = self._rows(ep, uncached)
        return np.array(x_ttft), np.array(x_tpot)

    @staticmethod
    def _prompt_tokens(request: InferenceRequest, info: PrefixCacheMatchInfo | None) -> int:
        tokens = request.data.get(TOKENIZED_PROMPT)
        if tokens is not None:
            return len(tokens.token_ids)
        if info is not None and info.total_blocks > 0:
            return info.total_blocks * max(info.block_size_tokens, 1)
        return request.body_size // 4  # ~4 bytes per token, as GIE's estimators assume

    def _tpot_neutral(self, ep: Endpoint) -> bool:
        return not self.streaming_mode or (bool(self.role_label) and ep.labels.get(self.role_label) == "prefill")

    # -- before scheduling -------------------------------------------------------------------------------------

    async def prepare(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        self._expire()
        info = request.data.get(self.prefix_key)
        prompt = self._prompt_tokens(request, info)
        matched: dict[str, float] = {}
        if info is not None and info.matches:
            bs = max(info.block_size_tokens, 1)
            matched = {k: min(float(prompt), v * bs) for k, v in info.matches.items()}
        ttft_slo = slo_header(request.headers, TTFT_SLO_HEADERS)
        tpot_slo = slo_header(request.headers, TPOT_SLO_HEADERS)
        pending = _Pending(prompt, matched, ttft_slo, tpot_slo)
        request.data.put(self.pending_key, pending)
        out = LatencyPredictionInfo(has_slo=ttft_slo > 0 or tpot_slo > 0)
        request.data.put(self.info_key, out)
        m = self.metrics
        if not self.predict_in_produce:
            m.outcomes.labels("disabled").inc()
            return
        labels = (self.label(request.model), self.label(request.target_model))
        t0 = time.perf_counter()
        keys: list[str] = []
        rows_ttft: list[tuple[float, ...]] = []
        rows_tpot: list[tuple[float, ...]] = []
        for ep in endpoints:
            key = self.ttft.model_for(ep.name)
            if key is None:
                m.outcomes.labels("cold" if self.ttft.cold() else "unfit").inc()
                return
            keys.append(key)
            x_ttft, x_tpot = self._rows(ep, max(0, prompt - int(matched.get(ep.name, 0.0))))
            rows_ttft.append(x_ttft)
            rows_tpot.append(x_tpot)
        ttft_list = self.ttft.predict_many(keys, rows_ttft)
        t1 = time.perf_counter()
        tkeys = [self.tpot.model_for(ep.name) for ep in endpoints]
        known = [i for i, k in enumerate(tkeys) if k is not None]
        tpot_list: list[float | None] = [None] * len(endpoints)
        if known:
            got = self.tpot.predict_many([tkeys[i] or "" for i in known], [rows_tpot[i] for i in known])
            for i, v in zip(known, got, strict=True):
                tpot_list[i] = v
        ttfts = {ep.name: ttft_list[i] for i, ep in enumerate(endpoints)}
        tpots = {ep.name: tpot_list[i] for i, ep in enumerate(endpoints)}
        t2 = time.perf_counter()
        m.ttft_duration.labels(*labels).observe(t1 - t0)
        m.tpot_duration.labels(*labels).observe(t2 - t1)
        m.outcomes.labels("predicted").inc()
        buffer = self.slo_buffer_factor
        for ep in endpoints:
            ttft, tpot = ttfts[ep.name], tpots[ep.name]
            pending.predictions[ep.name] = (ttft, tpot)
            load = self.load.get(ep.name)
            if self._tpot_neutral(ep) or tpot is None:
                tpot_valid, tpot_headroom = True, 0.0
            else:
                budget = tpot_slo * buffer
                pod_min = load.min_tpot_slo() if load else 0.0
                if pod_min > 0:  # a new request must not break the tightest TPOT SLO already running there
                    budget = min(budget, pod_min * buffer) if budget > 0 else pod_min * buffer
                tpot_valid, tpot_headroom = tpot < budget, budget - tpot
            out.predictions[ep.name] = LatencyPrediction(
                ttft_ms=ttft,
                tpot_ms=tpot or 0.0,
                ttft_valid=ttft < ttft_slo,
                tpot_valid=tpot_valid,
                ttft_headroom=ttft_slo - ttft,
                tpot_headroom=tpot_headroom,
                dispatched=len(load.flights) if load else 0,
            )

    # -- after the pick ----------------------------------------------------------------------------------------

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        targets = result.targets
        pending = request.data.get(self.pending_key)
        if not targets or pending is None:
            return
        ep = targets[0]
        uncached = max(0, pending.prompt_tokens - int(pending.matched.get(ep.name, 0.0)))
        x_ttft, x_tpot = self._features(ep, uncached)
        pred_ttft, pred_tpot = pending.predictions.get(ep.name, (None, None))
        flight = _Flight(
            request_id=request.request_id,
            endpoint=ep.name,
            dispatched=self.clock(),
            uncached=uncached,
            x_ttft=x_ttft,
            x_tpot=x_tpot,
            predicted_ttft=pred_ttft,
            predicted_tpot=pred_tpot,
            ttft_slo=pending.ttft_slo,
            tpot_slo=pending.tpot_slo,
            model=request.model,
            target_model=request.target_model,
            stream=request.stream,
        )
        old = request.data.pop(self.flight_key)
        if old is not None:  # scheduled again: its earlier flight goes
            self._land(old)
        load = self._load(ep.name)
        load.flights[id(flight)] = flight
        load.prefill_tokens += uncached
        request.data.put(self.flight_key, flight)

    def _land(self, flight: _Flight) -> None:
        """The flight ended: off its endpoint's load (unless contextTTL or the endpoint's removal dropped it)."""
        load = self.load.get(flight.endpoint)
        if load is not None and load.flights.pop(id(flight), None) is not None:
            self._finish_prefill(load, flight)

    def _finish_prefill(self, load: _EndpointLoad, flight: _Flight) -> None:
        if flight.prefilling:
            flight.prefilling = False
            load.prefill_tokens = max(0, load.prefill_tokens - flight.uncached)

    def _expire(self) -> None:
        """Drop flights older than contextTTL, so a lost completion cannot pin an endpoint's load."""
        horizon = self.clock() - self.context_ttl
        for load in self.load.values():
            while load.flights:
                oldest = next(iter(load.flights.values()))
                if oldest.dispatched >= horizon:
                    break
                del load.flights[id(oldest)]
                self._finish_prefill(load, oldest)

    # -- the response ------------------------------------------------------------------------------------------

    def response_chunk(self, request: InferenceRequest, chunk: ResponseChunk, endpoint: Endpoint | None) -> None:
        flight = request.data.get(self.flight_key)
        if flight is None or not chunk.data:
            return
        now = chunk.time
        flight.last = now
        flight.events += chunk.data.count(b"data:")
        if flight.first:
            return
        flight.first = now
        load = self.load.get(flight.endpoint)
        if load is not None and id(flight) in load.flights:
            self._finish_prefill(load, flight)
        else:
            flight.prefilling = False
        if self.streaming_mode and flight.stream and not chunk.end:
            self._learn_ttft(flight, (now - flight.dispatched) * 1000.0)

    def response_complete(self, request: InferenceRequest, endpoint: Endpoint | None, usage: Usage | None) -> None:
        flight = request.data.get(self.flight_key)
        if flight is None:
            return
        request.data.pop(self.flight_key)
        now = self.clock()
        self._land(flight)
        if not self.streaming_mode:
            if flight.first:  # a response came back (not an early reset): its end-to-end latency is the target
                self._learn_ttft(flight, (now - flight.dispatched) * 1000.0)
            return
        if not (flight.stream and flight.first):
            return
        tokens = usage.completion_tokens if usage is not None and usage.completion_tokens > 0 else flight.events - 2
        if tokens > 1 and flight.last > flight.first:
            self._learn_tpot(flight, (flight.last - flight.first) * 1000.0 / (tokens - 1))

    def _learn_ttft(self, flight: _Flight, ms: float) -> None:
        m = self.metrics
        self._learn("ttft", self.ttft, m.ttft, m.predicted_ttft, m.ttft_violations, flight, flight.x_ttft, ms)

    def _learn_tpot(self, flight: _Flight, ms: float) -> None:
        m = self.metrics
        self._learn("tpot", self.tpot, m.tpot, m.predicted_tpot, m.tpot_violations, flight, flight.x_tpot, ms)

    def _learn(
        self,
        target: str,
        models: LatencyModels,
        measured: Histogram,
        predicted_hist: Histogram,
        violations: Counter,
        flight: _Flight,
        x: Vector,
        ms: float,
    ) -> None:
        """Record a measured sample (metrics: actual, predicted, error, SLO violation), then learn from it."""
        m = self.metrics
        labels = (self.label(flight.model), self.label(flight.target_model))
        measured.labels(*labels).observe(ms / 1000.0)
        predicted = flight.predicted_ttft if target == "ttft" else flight.predicted_tpot
        if predicted is not None:
            predicted_hist.labels(*labels).observe(predicted / 1000.0)
            m.abs_error.labels(target).observe(abs(predicted - ms) / 1000.0)
        slo = flight.ttft_slo if target == "ttft" else flight.tpot_slo
        if 0 < slo < ms:
            violations.labels(*labels).inc()
        models.observe(flight.endpoint, x, ms)
        m.samples.labels(target).inc()
        fit = models.fits.get(flight.endpoint)
        if fit is not None and fit.evaluated:
            m.error.labels(target, flight.endpoint).set(fit.error)
