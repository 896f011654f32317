"""Prometheus metrics of the KV-event pool (llm-d router names where they exist)."""

from __future__ import annotations

from prometheus_client import (
    REGISTRY,  # the default registry, which the EPP serves on its metrics port
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)

_default: PoolMetrics | None = None


class PoolMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else REGISTRY
        p = "kv_cache_events_"
        self.queue_depth = Gauge(p + "pool_queue_depth", "Messages waiting in the pool's shard queues", registry=r)
        self.capacity = Gauge(p + "pool_capacity", "Total capacity of the pool's shard queues", registry=r)
        self.messages = Counter(p + "messages_received", "ZMQ messages received (live and replayed)", registry=r)
        self.zmq_errors = Counter(p + "zmq_errors", "ZMQ socket errors and malformed frames", ["kind"], registry=r)
        self.reconnections = Counter(
            p + "subscriber_reconnections", "Subscriber (re)connections after the first", registry=r
        )
        self.active = Gauge(p + "active_subscribers", "Subscribers currently running", registry=r)
        self.replays = Counter(p + "replays", "Replay requests to a publisher's ROUTER socket", ["result"], registry=r)
        self.dropped = Counter(p + "dropped", "Messages dropped before reaching the index", ["reason"], registry=r)
        self.evicted = Counter(
            p + "state_evicted",
            "Per-pod KV-event state forgotten, least recently used first, to make room within its bound",
            ["kind"],
            registry=r,
        )
        self.decode_errors = Counter(p + "decode_errors", "Payloads that failed to decode", registry=r)
        self.blocks = Counter(p + "blocks", "Block events applied to the index", ["op"], registry=r)
        self.skipped = Counter(p + "skipped", "Events skipped by the applier", ["reason"], registry=r)
        self.sequence = Counter(p + "sequence", "Sequence checks by verdict", ["verdict"], registry=r)
        self.config_errors = Counter(
            p + "config_errors", "Endpoint settings that could not be used (see the log)", ["reason"], registry=r
        )
        for op in ("stored", "removed", "cleared"):  # exported at 0 from the start
            self.blocks.labels(op)
        for result in ("ok", "timeout", "error"):
            self.replays.labels(result)
        for reason in ("queue_full", "queue_bytes", "unknown_pod", "rewound"):
            self.dropped.labels(reason)
        for kind in ("model", "rank"):  # a pod's topic models and DP ranks
            self.evicted.labels(kind)
        for reason in ("block_size", "too_many_hashes", "budget", "rate"):  # the EventGuard's refusals
            self.skipped.labels(reason)
        self.config_errors.labels("bad_port_label")


def default_metrics() -> PoolMetrics:
    """One set on the global registry per process (pools share it)."""
    global _default
    if _default is None:
        _default = PoolMetrics()
    return _default


class IndexMetrics:
    """llm-d-kv-cache's index metrics, exported when `indexerConfig.kvBlockIndexConfig.enableMetrics` is true (its
    default is false): admissions and evictions of blocks, lookups, the best pod's hit count per lookup (added to
    both `max_pod_hit_count` and `lookup_hits`, as its instrumented index does) and lookup latency, each under the
    router's `llm_d_router_epp_kv_cache_index_*` name and the deprecated `kvcache_index_*` one."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else REGISTRY
        new, old = "llm_d_router_epp_kv_cache_index_", "kvcache_index_"

        def counter(name: str, help_: str) -> tuple[Counter, Counter]:
            return (
                Counter(new + name, help_, registry=r),
                Counter(old + name, f"Deprecated: use {new}{name}_total. {help_}", registry=r),
            )

        self.admissions = counter("admissions", "Total number of KV-block admissions")
        self.evictions = counter("evictions", "Total number of KV-block evictions")
        self.lookups = counter("lookup_requests", "Total number of lookup calls")
        self.max_pod_hits = counter("max_pod_hit_count", "Maximum cache hits on a single pod on Lookup()")
        self.hits = counter("lookup_hits", "Number of keys found in the cache on Lookup()")
        help_ = "Latency of Lookup calls in seconds"
        self.latency = (
            Histogram(new + "lookup_latency_seconds", help_, registry=r),
            Histogram(
                old + "lookup_latency_seconds", f"Deprecated: use {new}lookup_latency_seconds. {help_}", registry=r
            ),
        )

    @staticmethod
    def add(pair: tuple[Counter, Counter], n: float) -> None:
        for c in pair:
            c.inc(n)

    def lookup(self, seconds: float, best_pod_blocks: int) -> None:
        self.add(self.lookups, 1)
        self.add(self.max_pod_hits, best_pod_blocks)
        self.add(self.hits, best_pod_blocks)
        for h in self.latency:
            h.observe(seconds)

    def summary(self) -> str:
        """The values llm-d-kv-cache's metrics logger prints."""
        v = [c._value.get() for c in (self.admissions[0], self.evictions[0], self.lookups[0], self.hits[0])]
        total = self.latency[0]._sum.get()
        avg = total / v[2] * 1000 if v[2] else 0.0
        return (
            f"admissions={v[0]:.0f} evictions={v[1]:.0f} lookups={v[2]:.0f} hits={v[3]:.0f} "
            f"avg_lookup_latency_ms={avg:.3f}"
        )


_index: IndexMetrics | None = None


def index_metrics() -> IndexMetrics:
    """One set on the global registry per process."""
    global _index
    if _index is None:
        _index = IndexMetrics()
    return _index
