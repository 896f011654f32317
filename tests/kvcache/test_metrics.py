"""indexerConfig.kvBlockIndexConfig.enableMetrics (llm-d-kv-cache's index metrics, off by default): admissions,
evictions, lookups, the best pod's hits and lookup latency under the router's and the deprecated names, and
metricsLoggingInterval's log line; off, nothing is counted."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from prometheus_client import REGISTRY

from epp.framework import Params
from epp.kvcache.events import BlockRemoved, BlockStored, EventBatch
from epp.kvcache.service import KVCacheService, KVCacheSettings

NAMES = ("llm_d_router_epp_kv_cache_index_", "kvcache_index_")


def service(enable: bool, **kbi: Any) -> KVCacheService:
    params = {
        "tokenProcessorConfig": {"blockSize": 4},
        "indexerConfig": {"kvBlockIndexConfig": {"enableMetrics": enable, **kbi}},
        "kvEventsConfig": {"enabled": False},
    }
    return KVCacheService(KVCacheSettings.from_params(Params("p", params)))


def values() -> dict[str, float]:
    out = {}
    for prefix in NAMES:
        for name in ("admissions", "evictions", "lookup_requests", "lookup_hits", "max_pod_hit_count"):
            out[prefix + name] = REGISTRY.get_sample_value(prefix + name + "_total") or 0.0
        out[prefix + "latency_count"] = REGISTRY.get_sample_value(prefix + "lookup_latency_seconds_count") or 0.0
    return out


async def exercise(svc: KVCacheService) -> None:
    tokens = list(range(100, 116))  # 4 blocks of 4
    svc.applier.apply("pod-a", "m", EventBatch(0.0, [BlockStored([1, 2, 3, 4], None, tokens, 4)]))
    svc.applier.apply("pod-b", "m", EventBatch(0.0, [BlockStored([11, 12], None, tokens[:8], 4)]))
    svc.applier.apply("pod-a", "m", EventBatch(0.0, [BlockRemoved([4])]))
    found = await svc.match(svc.tokens.block_keys(tokens, "m"), ["pod-a", "pod-b"])
    assert {p: m.blocks for p, m in found.items()} == {"pod-a": 3, "pod-b": 2}


async def test_enabled_counts_as_llm_d_kv_cache_does(caplog: pytest.LogCaptureFixture) -> None:
    svc = service(True, metricsLoggingInterval="50ms")
    assert svc.settings.enable_metrics and svc.settings.metrics_logging_interval == 0.05
    before = values()
    await exercise(svc)
    after = values()
    delta = {k: after[k] - before[k] for k in after}
    for p in NAMES:
        assert delta[p + "admissions"] == 6 and delta[p + "evictions"] == 1
        assert delta[p + "lookup_requests"] == 1 and delta[p + "latency_count"] == 1
        assert delta[p + "lookup_hits"] == 3 and delta[p + "max_pod_hit_count"] == 3  # the best pod's blocks
    caplog.set_level(logging.INFO, logger="epp.kvcache.service")
    task = asyncio.create_task(svc.log_index_metrics())
    await asyncio.sleep(0.12)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("kv-cache index metrics: ")]
    assert lines and "lookups=" in lines[0] and "admissions=" in lines[0]


async def test_off_by_default_counts_nothing() -> None:
    svc = service(False, metricsLoggingInterval="1s")
    assert svc.index_metrics is None and svc.settings.metrics_logging_interval == 0  # it needs enableMetrics
    before = values()
    await exercise(svc)
    assert values() == before
