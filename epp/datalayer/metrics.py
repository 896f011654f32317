"""Pool-level gauges with GIE's names, refreshed every 5 s from endpoints whose metrics are fresh (≤ 2 s old)."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import Gauge

from epp.framework import EndpointView

POOL_AVG_KV = Gauge(
    "inference_pool_average_kv_cache_utilization",
    "The average kv cache utilization for an inference server pool.",
    ["name"],
)
POOL_AVG_QUEUE = Gauge(
    "inference_pool_average_queue_size",
    "The average number of requests pending in the model server queue.",
    ["name"],
)
POOL_AVG_RUNNING = Gauge(
    "inference_pool_average_running_requests",
    "The average number of requests currently being processed by model servers in the pool.",
    ["name"],
)
POOL_READY_PODS = Gauge(
    "inference_pool_ready_pods",
    "The number of ready pods in the inference server pool (with fresh metrics).",
    ["name"],
)
POOL_PER_POD_QUEUE = Gauge(
    "inference_pool_per_pod_queue_size",
    "The total number of requests pending in the model server queue for each underlying pod.",
    ["name", "model_server_pod"],
)


class PoolMetricsReporter:
    def __init__(self, view: EndpointView, pool_name: str, *, staleness: float = 2.0, interval: float = 5.0) -> None:
        self.view = view
        self.pool = pool_name
        self.staleness = staleness
        self.interval = interval
        self._pods: set[str] = set()

    def refresh(self) -> None:
        now = time.monotonic()
        fresh = [ep for ep in self.view.endpoints() if ep.metrics.age(now) <= self.staleness]
        n = len(fresh)
        POOL_READY_PODS.labels(self.pool).set(n)
        if n:
            POOL_AVG_KV.labels(self.pool).set(sum(ep.metrics.kv_cache_usage_percent for ep in fresh) / n)
            POOL_AVG_QUEUE.labels(self.pool).set(sum(ep.metrics.waiting_queue_size for ep in fresh) / n)
            POOL_AVG_RUNNING.labels(self.pool).set(sum(ep.metrics.running_requests_size for ep in fresh) / n)
        pods = set()
        for ep in fresh:
            pods.add(ep.name)
            POOL_PER_POD_QUEUE.labels(self.pool, ep.name).set(ep.metrics.waiting_queue_size)
        for gone in self._pods - pods:
            POOL_PER_POD_QUEUE.remove(self.pool, gone)
        self._pods = pods

    async def run(self) -> None:
        while True:
            self.refresh()
            await asyncio.sleep(self.interval)
