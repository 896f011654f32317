"""The closed loop on delivered hits: compare the cached tokens the index predicted on the pod that served a request
with the cached tokens the engine reports (`usage.prompt_tokens_details.cached_tokens`), and repair the index.

Per pod it exports predicted, delivered and regret (predicted − delivered, when positive) tokens. Two repairs:
- **confirm**: when the engine delivered more blocks than the index knew of on that pod (a missed BlockStored, or
  blocks the index dropped), those blocks are on the pod now: they are added as entries that expire after
  `confirmTTL` unless another hit confirms them again (they have no engine hash, so no BlockRemoved can remove
  them; the expiry does).
- **resync**: when, over the last `window` requests for which the index predicted at least one block on the pod,
  the delivered tokens fall short of the predicted ones by more than `maxShortfall` (a share of the predicted),
  the pod's entries are wrong (lost BlockRemoved events, a restart without AllBlocksCleared, an eviction the
  engine never announced): they are cleared, and rebuilt from the pod's next events and confirmed hits. Replaying
  the publisher's buffer from seq 0 would not help there: the buffer holds the same lossy history.
A single short hit is normal (a burst's speculative entries, an eviction racing the request), which is why the
decision is over a window; after a resync the window starts again.

**Engine counters**, for responses that carry no `cached_tokens` (a stream without `include_usage`, SGLang, a
client that strips usage): the engine's prefix-cache counters, already scraped with its other metrics
(`vllm:prefix_cache_queries_total` / `vllm:prefix_cache_hits_total`; SGLang's prompt / cached tokens), stand in.
Between two scrapes of a pod the counters' deltas give the hit share the engine delivered (hits / queried tokens);
the requests this EPP routed there and saw complete in that interval give the share the index predicted (predicted
tokens / prompt tokens). Once the closed intervals hold `window` requests with a predicted hit, the pod is resynced
when the delivered share falls short of the predicted one by more than `maxShortfall` (the same rule, on shares: the
counters also count other replicas' and direct traffic, so tokens cannot be compared one for one). Counters that go
backwards (an engine restart) start the comparison again. Confirming blocks needs per-request hits: not from counters.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prometheus_client import REGISTRY, CollectorRegistry, Counter

from epp.framework.params import Params
from epp.framework.services import CountedReport

log = logging.getLogger(__name__)


@dataclass(slots=True)
class FeedbackConfig:
    enabled: bool = True
    window: int = 16  # requests with a predicted hit, per pod
    max_shortfall: float = 0.5  # resync when (predicted - delivered) / predicted over the window exceeds this
    confirm_ttl: float = 60.0  # seconds a block confirmed by a delivered hit stays in the index

    @classmethod
    def from_params(cls, p: Params) -> FeedbackConfig:
        """pyepp's `deliveredHitsConfig` section of the precise producer's parameters."""
        return cls(
            enabled=p.bool("enabled", True),
            window=p.int("window", 16, min=1),
            max_shortfall=p.float("maxShortfall", 0.5, min=0.0, min_exclusive=True, max=1.0),
            confirm_ttl=p.duration("confirmTTL", 60.0),
        )


class FeedbackMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else REGISTRY
        p = "kv_cache_delivered_hits_"
        self.predicted = Counter(
            p + "predicted_tokens",
            "Cached prompt tokens the index predicted on the pod that served",
            ["pod"],
            registry=r,
        )
        self.delivered = Counter(
            p + "delivered_tokens",
            "Cached prompt tokens the engine reported (usage cached_tokens)",
            ["pod"],
            registry=r,
        )
        self.regret = Counter(
            p + "regret_tokens", "Predicted cached tokens the engine did not deliver", ["pod"], registry=r
        )
        self.requests = Counter(p + "requests", "Responses compared with the index's prediction", ["pod"], registry=r)
        self.confirmed = Counter(
            p + "confirmed_blocks", "Blocks added to the index because the engine delivered them", ["pod"], registry=r
        )
        self.resyncs = Counter(
            p + "resyncs",
            "Pods whose index entries were cleared because delivered hits fell short",
            ["pod"],
            registry=r,
        )
        self.counter_intervals = Counter(
            p + "counter_intervals",
            "Scrape intervals compared through the engine's prefix-cache counters (responses without cached_tokens)",
            ["pod"],
            registry=r,
        )


_default: FeedbackMetrics | None = None


def default_feedback_metrics() -> FeedbackMetrics:
    global _default
    if _default is None:
        _default = FeedbackMetrics()
    return _default


@dataclass(slots=True)
class _PodWindow:
    samples: deque[tuple[int, int]] = field(default_factory=deque)  # (predicted, delivered) tokens
    predicted: int = 0
    delivered: int = 0
    resyncs: int = 0


@dataclass(slots=True)
class _CounterWindow:
    """One pod's comparison through the engine's counters: the base (the counters at the last closed interval),
    what was routed since, and the closed intervals (predicted, prompt, engine hits, engine queries, requests with
    a predicted hit)."""

    base_hits: float | None = None
    base_queries: float = 0.0
    predicted: int = 0
    prompt: int = 0
    requests: int = 0
    predicted_requests: int = 0
    intervals: deque[tuple[int, int, float, float, int]] = field(default_factory=deque)

    def totals(self) -> tuple[int, int, float, float, int]:
        p = t = n = 0
        h = q = 0.0
        for a, b, c, d, e in self.intervals:
            p, t, h, q, n = p + a, t + b, h + c, q + d, n + e
        return p, t, h, q, n


class DeliveredHits:
    """The loop for one KV service: `report()` per response; `clear_pod` and `speculate` act on the index."""

    def __init__(
        self,
        cfg: FeedbackConfig,
        clear_pod: Callable[[str], None],
        speculate: Callable[[Sequence[int], str, float], None],
        metrics: FeedbackMetrics | None = None,
    ) -> None:
        self.cfg = cfg
        self._clear = clear_pod
        self._speculate = speculate
        self.metrics = metrics or default_feedback_metrics()
        self.pods: dict[str, _PodWindow] = {}
        self.counter_pods: dict[str, _CounterWindow] = {}

    def report(
        self, pod: str, keys: Sequence[int], predicted_blocks: int, delivered_tokens: int, block_size: int, prompt: int
    ) -> None:
        """One response from `pod`: the index predicted `predicted_blocks` of `keys` there; the engine delivered
        `delivered_tokens` of a `prompt`-token prompt."""
        if not self.cfg.enabled or block_size <= 0 or prompt <= 0:
            return
        # The engine computes at least the prompt's last token, so at most (prompt - 1) // bs blocks can hit.
        hit_limit = min(len(keys), max(0, (prompt - 1) // block_size))
        predicted_blocks = min(predicted_blocks, hit_limit)
        predicted = predicted_blocks * block_size
        delivered = max(0, min(delivered_tokens, prompt))
        m = self.metrics
        m.requests.labels(pod).inc()
        m.predicted.labels(pod).inc(predicted)
        m.delivered.labels(pod).inc(delivered)
        if predicted > delivered:
            m.regret.labels(pod).inc(predicted - delivered)
        delivered_blocks = min(delivered // block_size, hit_limit)
        if delivered_blocks > predicted_blocks and self.cfg.confirm_ttl > 0:
            self._speculate(keys[predicted_blocks:delivered_blocks], pod, self.cfg.confirm_ttl)
            m.confirmed.labels(pod).inc(delivered_blocks - predicted_blocks)
        if predicted <= 0:
            return
        w = self.pods.get(pod)
        if w is None:
            w = self.pods[pod] = _PodWindow()
        w.samples.append((predicted, delivered))
        w.predicted += predicted
        w.delivered += min(delivered, predicted)
        if len(w.samples) > self.cfg.window:
            p, d = w.samples.popleft()
            w.predicted -= p
            w.delivered -= min(d, p)
        if len(w.samples) < self.cfg.window:
            return
        shortfall = (w.predicted - w.delivered) / w.predicted
        if shortfall > self.cfg.max_shortfall:
            self._resync(pod, shortfall, len(w.samples), "requests")
            w.samples.clear()
            w.predicted = w.delivered = 0
            w.resyncs += 1

    def forget(self, pod: str) -> None:
        """The pod left the pool: its windows go (one back at the same address is a new engine)."""
        self.pods.pop(pod, None)
        self.counter_pods.pop(pod, None)

    def report_counted(self, r: CountedReport) -> None:
        """One response from `r.pod` without cached_tokens (see CountedReport); nothing to compare when its
        metrics page has no prefix-cache counters."""
        engine_hits, engine_queries, pod = r.engine_hits, r.engine_queries, r.pod
        if not self.cfg.enabled or r.block_size <= 0 or r.prompt <= 0 or engine_hits is None or engine_queries is None:
            return
        c = self.counter_pods.get(pod)
        if c is None:
            c = self.counter_pods[pod] = _CounterWindow()
        if c.base_hits is None or engine_queries < c.base_queries or engine_hits < c.base_hits:
            # first sight, or the counters went back (an engine restart): compare from here
            c.base_hits, c.base_queries = engine_hits, engine_queries
            c.predicted = c.prompt = c.requests = c.predicted_requests = 0
            c.intervals.clear()
        elif engine_queries > c.base_queries:  # a scrape since the base, with traffic: close the interval
            dh, dq = engine_hits - c.base_hits, engine_queries - c.base_queries
            c.base_hits, c.base_queries = engine_hits, engine_queries
            if c.requests:
                self._close_interval(pod, c, dh, dq)
        hit_limit = min(r.blocks, max(0, (r.prompt - 1) // r.block_size))
        predicted = min(r.predicted_blocks, hit_limit) * r.block_size
        c.predicted += predicted
        c.prompt += r.prompt
        c.requests += 1
        c.predicted_requests += predicted > 0

    def _close_interval(self, pod: str, c: _CounterWindow, dh: float, dq: float) -> None:
        m = self.metrics
        share = min(1.0, max(0.0, dh / dq)) if dq > 0 else 0.0
        delivered = round(share * c.prompt)  # the engine's hit share applied to the prompts routed here
        m.counter_intervals.labels(pod).inc()
        m.requests.labels(pod).inc(c.requests)
        m.predicted.labels(pod).inc(c.predicted)
        m.delivered.labels(pod).inc(delivered)
        if c.predicted > delivered:
            m.regret.labels(pod).inc(c.predicted - delivered)
        # Every interval is kept, with or without a predicted hit: a request's engine counts can land one interval
        # before its prediction (scraped between admission and completion), so choosing intervals by what was
        # predicted would drop hits that were delivered. Over consecutive intervals the shift is one request at
        # each end of the window.
        c.intervals.append((c.predicted, c.prompt, dh, dq, c.predicted_requests))
        c.predicted = c.prompt = c.requests = c.predicted_requests = 0
        predicted, prompt, hits, queries, n = c.totals()
        while c.intervals and (
            n - c.intervals[0][4] >= self.cfg.window or len(c.intervals) > 8 * self.cfg.window
        ):  # keep just over `window` requests with a predicted hit (and a bounded number of intervals)
            p0, t0, h0, q0, n0 = c.intervals.popleft()
            predicted, prompt, hits, queries, n = predicted - p0, prompt - t0, hits - h0, queries - q0, n - n0
        if n < self.cfg.window or predicted <= 0 or prompt <= 0 or queries <= 0:
            return
        want = predicted / prompt
        got = min(1.0, hits / queries)
        shortfall = max(0.0, 1.0 - got / want)
        if shortfall > self.cfg.max_shortfall:
            self._resync(pod, shortfall, n, "requests (engine counters)")
            c.intervals.clear()

    def _resync(self, pod: str, shortfall: float, n: int, what: str) -> None:
        log.warning(
            "KV index: %s delivered %.0f%% fewer cached tokens than predicted over its last %d %s; "
            "clearing its index entries (they rebuild from its events and delivered hits)",
            pod,
            100 * shortfall,
            n,
            what,
        )
        self._clear(pod)
        self.metrics.resyncs.labels(pod).inc()
