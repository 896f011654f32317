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
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prometheus_client import REGISTRY, CollectorRegistry, Counter

from epp.framework.params import Params

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
            log.warning(
                "KV index: %s delivered %.0f%% fewer cached tokens than predicted over its last %d requests; "
                "clearing its index entries (they rebuild from its events and delivered hits)",
                pod,
                100 * shortfall,
                len(w.samples),
            )
            self._clear(pod)
            w.samples.clear()
            w.predicted = w.delivered = 0
            w.resyncs += 1
            m.resyncs.labels(pod).inc()
