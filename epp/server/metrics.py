"""Request-level Prometheus metrics with GIE's names (`inference_objective_*`).

`REGISTRY` is prometheus_client's default registry (process/GC collectors, `inference_extension_info`, and every
module-level metric of the EPP); tests and embedded servers may build their own `RequestMetrics` on a private one.
Label sets follow GIE: model = (model_name, target_model_name); the request counter adds `priority`. Model names
are client-chosen, so they pass through a `LabelBudget` (epp.framework.labels): at most `limit` names and `limit`
(model, target) pairs become labels, the rest are counted under `__other__`.
"""

from __future__ import annotations

import os
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from epp import __version__
from epp.framework.labels import MODEL_LABELS, OTHER, LabelBudget
from epp.framework.types import Usage

# The registry /metrics serves: prometheus_client's default one (with its process/GC collectors), so metrics that
# other parts of the EPP declare the usual way (scheduler, data layer, KV events) are served too.
REGISTRY: CollectorRegistry = prometheus_client.REGISTRY
Gauge("inference_extension_info", "General information of the current build.", ["commit", "build_ref"],
      registry=REGISTRY).labels(os.environ.get("PYEPP_COMMIT", "unknown"), __version__).set(1)  # fmt: skip

_DURATION_BUCKETS = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45, 60, 120, 180,
    240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600,
)  # fmt: skip
_SIZE_BUCKETS = (
    64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576, 2097152,
    4194304, 8388608, 16777216, 33554432, 67108864, 134217728, 268435456, 536870912, 1073741824,
)  # fmt: skip
_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)
_MODEL = ("model_name", "target_model_name")
# Token counts beyond this are not real usage (a broken or hostile upstream): not observed.
MAX_TOKEN_COUNT = 1 << 40


class RequestMetrics:
    """The counters and histograms the ext_proc server records per request."""

    def __init__(self, registry: CollectorRegistry = REGISTRY, labels: LabelBudget = MODEL_LABELS) -> None:
        self.labels = labels
        p = "inference_objective_"
        self.requests = Counter(
            p + "request_total", "Counter of inference objective requests.", [*_MODEL, "priority"], registry=registry
        )
        self.errors = Counter(
            p + "request_error_total",
            "Counter of inference objective requests errors.",
            [*_MODEL, "error_code"],
            registry=registry,
        )
        self.duration = Histogram(
            p + "request_duration_seconds",
            "Inference objective response latency distribution in seconds.",
            _MODEL,
            buckets=_DURATION_BUCKETS,
            registry=registry,
        )
        self.request_sizes = Histogram(
            p + "request_sizes", "Inference objective requests size distribution in bytes.", _MODEL,
            buckets=_SIZE_BUCKETS, registry=registry,
        )  # fmt: skip
        self.response_sizes = Histogram(
            p + "response_sizes", "Inference objective responses size distribution in bytes.", _MODEL,
            buckets=_SIZE_BUCKETS, registry=registry,
        )  # fmt: skip
        self.input_tokens = Histogram(
            p + "input_tokens", "Inference objective input token count distribution for requests in each model.",
            _MODEL, buckets=_TOKEN_BUCKETS, registry=registry,
        )  # fmt: skip
        self.output_tokens = Histogram(
            p + "output_tokens", "Inference objective output token count distribution for requests in each model.",
            _MODEL, buckets=_TOKEN_BUCKETS, registry=registry,
        )  # fmt: skip
        self.cached_tokens = Histogram(
            p + "prompt_cached_tokens", "Inference objective prompt cached token count distribution.",
            _MODEL, buckets=_TOKEN_BUCKETS, registry=registry,
        )  # fmt: skip
        self.ntpot = Histogram(
            p + "normalized_time_per_output_token_seconds",
            "Inference objective latency per output token distribution in seconds.",
            _MODEL,
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0),
            registry=registry,
        )
        self.running = Gauge(
            p + "running_requests", "Inference objective number of running requests in each model.", ["model_name"],
            registry=registry,
        )  # fmt: skip

        # (incoming, target) as sent -> its labelled series; only admitted pairs are kept (bounded by the budget).
        self._children: dict[tuple[str, str], _ModelSeries] = {}
        self._other: _ModelSeries | None = None

    def _series(self, model: str, target: str) -> _ModelSeries:
        """Labelled children cached per (model, target): `labels()` takes a lock and builds tuples each call."""
        key = (model, target)
        series = self._children.get(key)
        if series is not None:
            return series
        m, t = self.labels.label(model), self.labels.label(target)
        if OTHER in (m, t) or len(self._children) >= self.labels.limit + len(self.labels):
            if self._other is None:
                self._other = _ModelSeries(self, OTHER, OTHER)
            self.labels.folded += 1
            return self._other
        series = self._children[key] = _ModelSeries(self, m, t)
        return series

    def request_started(self, model: str, target: str, priority: int, size: int) -> None:
        series = self._series(model, target)
        counter = series.requests.get(priority)
        if counter is None:
            counter = series.requests[priority] = self.requests.labels(series.model, series.target, str(priority))
        counter.inc()
        series.request_sizes.observe(size)
        series.running.inc()

    def request_error(self, model: str, target: str, error_code: str) -> None:
        series = self._series(model, target)
        self.errors.labels(series.model, series.target, error_code).inc()

    def request_finished(
        self, model: str, target: str, seconds: float, response_size: int, usage: Usage | None
    ) -> None:
        series = self._series(model, target)
        series.running.dec()
        series.duration.observe(seconds)
        series.response_sizes.observe(response_size)
        if usage is None:
            return
        if 0 < usage.prompt_tokens <= MAX_TOKEN_COUNT:
            series.input_tokens.observe(usage.prompt_tokens)
        if 0 < usage.completion_tokens <= MAX_TOKEN_COUNT:
            series.output_tokens.observe(usage.completion_tokens)
            series.ntpot.observe(seconds / usage.completion_tokens)
        if 0 < usage.cached_tokens <= MAX_TOKEN_COUNT:
            series.cached_tokens.observe(usage.cached_tokens)


class _ModelSeries:
    __slots__ = (
        "cached_tokens",
        "duration",
        "input_tokens",
        "model",
        "ntpot",
        "output_tokens",
        "request_sizes",
        "requests",
        "response_sizes",
        "running",
        "target",
    )

    def __init__(self, m: RequestMetrics, model: str, target: str) -> None:
        self.model = model
        self.target = target
        self.duration = m.duration.labels(model, target)
        self.request_sizes = m.request_sizes.labels(model, target)
        self.response_sizes = m.response_sizes.labels(model, target)
        self.input_tokens = m.input_tokens.labels(model, target)
        self.output_tokens = m.output_tokens.labels(model, target)
        self.cached_tokens = m.cached_tokens.labels(model, target)
        self.ntpot = m.ntpot.labels(model, target)
        self.running = m.running.labels(model)
        self.requests: dict[int, Any] = {}  # priority -> the request counter's child


_BY_REGISTRY: dict[int, RequestMetrics] = {}


def request_metrics(registry: CollectorRegistry = REGISTRY) -> RequestMetrics:
    """The RequestMetrics of a registry, created once (registering the same names twice is an error)."""
    m = _BY_REGISTRY.get(id(registry))
    if m is None:
        m = _BY_REGISTRY[id(registry)] = RequestMetrics(registry)
    return m
