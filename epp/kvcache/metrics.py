"""Prometheus metrics of the KV-event pool (llm-d router names where they exist)."""

from __future__ import annotations

from prometheus_client import (
    REGISTRY,  # the default registry, which the EPP serves on its metrics port
    CollectorRegistry,
    Counter,
    Gauge,
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
        for reason in ("queue_full", "queue_bytes", "unknown_pod", "rewound", "too_many_models", "too_many_ranks"):
            self.dropped.labels(reason)
        for reason in ("block_size", "too_many_hashes", "budget", "rate"):  # the EventGuard's refusals
            self.skipped.labels(reason)
        self.config_errors.labels("bad_port_label")


def default_metrics() -> PoolMetrics:
    """One set on the global registry per process (pools share it)."""
    global _default
    if _default is None:
        _default = PoolMetrics()
    return _default
