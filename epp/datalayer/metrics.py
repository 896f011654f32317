"""Pool-level gauges with GIE's names and llm-d-router v0.10's `llm_d_epp_*` ones (averages and sample standard
deviations, rounded to two decimals as its datalayer logger does), refreshed every 5 s
(`--refresh-prometheus-metrics-interval`) from endpoints whose metrics are fresh (≤ 2 s old). A multi-cluster hub
reads a cluster's load from `llm_d_epp_average_kv_cache_utilization` and `llm_d_epp_average_queue_size`."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence

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

# llm-d-router v0.10 (pkg/epp/metrics/llm_d_router_metrics.go): the same pool gauges under its own subsystem.
LLMD_POOL_AVG_KV = Gauge(
    "llm_d_epp_average_kv_cache_utilization", "The average kv cache utilization for an inference server pool.", ["name"]
)
LLMD_POOL_AVG_QUEUE = Gauge(
    "llm_d_epp_average_queue_size", "The average number of requests pending in the model server queue.", ["name"]
)
LLMD_POOL_AVG_RUNNING = Gauge(
    "llm_d_epp_average_running_requests",
    "The average number of running requests across model servers in the pool.",
    ["name"],
)
LLMD_POOL_STD_KV = Gauge(
    "llm_d_epp_std_dev_kv_cache_utilization",
    "The standard deviation kv cache utilization for an inference server pool.",
    ["name"],
)
LLMD_POOL_STD_QUEUE = Gauge(
    "llm_d_epp_std_dev_queue_size",
    "The standard deviation number of requests pending in the model server queue.",
    ["name"],
)
LLMD_POOL_STD_RUNNING = Gauge(
    "llm_d_epp_std_dev_running_requests",
    "The standard deviation number of running requests across model servers in the pool.",
    ["name"],
)
LLMD_POOL_READY = Gauge(
    "llm_d_epp_ready_endpoints", "The number of ready endpoints in the inference server pool.", ["name"]
)


def mean_and_stdev(values: Sequence[float]) -> tuple[float, float]:
    """llm-d-router's summary: the mean and the sample standard deviation (n-1, at least 1), each rounded to 2."""
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / max(1, n - 1))
    return round(mean, 2), round(sd, 2)


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
        LLMD_POOL_READY.labels(self.pool).set(n)
        if n:
            for values, avg, llmd_avg, llmd_sd in (
                ([ep.metrics.kv_cache_usage_percent for ep in fresh], POOL_AVG_KV, LLMD_POOL_AVG_KV, LLMD_POOL_STD_KV),
                (
                    [ep.metrics.waiting_queue_size for ep in fresh],
                    POOL_AVG_QUEUE,
                    LLMD_POOL_AVG_QUEUE,
                    LLMD_POOL_STD_QUEUE,
                ),
                (
                    [ep.metrics.running_requests_size for ep in fresh],
                    POOL_AVG_RUNNING,
                    LLMD_POOL_AVG_RUNNING,
                    LLMD_POOL_STD_RUNNING,
                ),
            ):
                mean, sd = mean_and_stdev(values)
                avg.labels(self.pool).set(mean)
                llmd_avg.labels(self.pool).set(mean)
                llmd_sd.labels(self.pool).set(sd)
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
