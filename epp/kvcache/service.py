"""One KV-cache service per EPP: token processor, index, event applier and pool, built from llm-d-style
parameters (`tokenProcessorConfig`, `indexerConfig`, `kvEventsConfig`). Plugins share it by key."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from epp.framework.context import RemovalListener
from epp.framework.params import Params
from epp.framework.services import CountedReport, SpeculationHold
from epp.framework.types import Endpoint, PrefixMatch
from epp.kvcache.config import PoolConfig
from epp.kvcache.feedback import DeliveredHits, FeedbackConfig
from epp.kvcache.index import DEFAULT_ENGINE_RUN_SIZE, Index, MemoryIndex
from epp.kvcache.ingest import EventApplier
from epp.kvcache.metrics import index_metrics
from epp.kvcache.pool import EventPool
from epp.kvcache.tokens import BlockSizes, TokenProcessor, request_extra_keys
from epp.kvcache.validation import Budgets, EventGuard

log = logging.getLogger(__name__)


@dataclass
class KVCacheSettings:
    block_size: int | None = None  # canonical; None = learn per model from events / scraped metrics
    block_sizes: dict[str, int] = field(default_factory=dict)
    hash_seed: str = ""
    tier_weights: dict[str, float] = field(default_factory=dict)
    max_keys: int | None = None
    max_pods_per_key: int | None = None
    engine_run_size: int | None = DEFAULT_ENGINE_RUN_SIZE  # None: dict engine maps (compactEngineMap: false)
    redis_address: str | None = None
    pool: PoolConfig = field(default_factory=PoolConfig)
    events_enabled: bool = True
    feedback: FeedbackConfig = field(default_factory=FeedbackConfig)
    enable_metrics: bool = False  # indexerConfig.kvBlockIndexConfig.enableMetrics
    metrics_logging_interval: float = 0.0  # ...metricsLoggingInterval (needs enableMetrics, as llm-d's)

    @classmethod
    def from_params(cls, p: Params) -> KVCacheSettings:
        """llm-d's `tokenProcessorConfig`, `indexerConfig` and `kvEventsConfig`, checked key by key."""
        tpc = p.section("tokenProcessorConfig")
        bs = 0
        for src, key in ((tpc, "blockSizeTokens"), (tpc, "blockSize"), (p, "blockSize")):
            if src.has(key):
                bs = src.int(key, 0, min=1)
                break
        sizes = tpc.section("blockSizes")
        idx = p.section("indexerConfig")
        kbi = idx.section("kvBlockIndexConfig")
        # llm-d's index metrics (admissions, evictions, lookups, hits, latency) and their log interval
        enable_metrics = kbi.bool("enableMetrics", False)
        log_interval = kbi.duration("metricsLoggingInterval", 0.0)
        mem = kbi.section("inMemoryConfig")
        redis = kbi.section("redisConfig") if kbi.has("redisConfig") else kbi.section("valkeyConfig")
        weights: dict[str, float] = {}
        for i, b in enumerate(idx.list("kvCacheBackendConfigs")):
            backend = Params(p.plugin, b, path=f"{idx.path}.kvCacheBackendConfigs[{i}]")
            weights[backend.str("name", "")] = backend.float("weight", 1.0, min=0.0)
        addr = redis.optional_str("address")
        if addr:
            addr = addr.replace("valkeys://", "rediss://").replace("valkey://", "redis://")
        kec = p.section("kvEventsConfig")
        return cls(
            block_size=bs or None,
            block_sizes={str(k): sizes.int(str(k), 0, min=1) for k in sizes.raw},
            hash_seed=str(tpc.get("hashSeed", "")),
            tier_weights=weights,
            max_keys=mem.int("size", 0, min=0) or None,
            max_pods_per_key=mem.int("podCacheSize", 0, min=0) or None,
            engine_run_size=(
                mem.int("engineRunSize", DEFAULT_ENGINE_RUN_SIZE, min=1) if mem.bool("compactEngineMap", True) else None
            ),
            redis_address=addr,
            pool=PoolConfig.from_params(kec),
            events_enabled=kec.bool("enabled", True),
            feedback=FeedbackConfig.from_params(p.section("deliveredHitsConfig")),
            enable_metrics=enable_metrics,
            metrics_logging_interval=log_interval if enable_metrics else 0.0,
        )


class KVCacheService(RemovalListener):
    """The request-side API (keys for a prompt, prefix matches per endpoint) over the event-fed index; subscribed to
    the endpoints, it drops a pod's delivered-hits windows when the pod leaves, KV events on or off."""

    def __init__(self, settings: KVCacheSettings, index: Index | None = None) -> None:
        self.settings = settings
        self.tokens = TokenProcessor(settings.block_size or 16, settings.hash_seed)
        self.block_sizes = BlockSizes(settings.block_sizes, settings.block_size)
        if index is None:
            if settings.redis_address:
                from epp.kvcache.redis_index import RedisIndex

                index = RedisIndex(settings.redis_address, settings.tier_weights)
            else:
                index = MemoryIndex(
                    settings.tier_weights, settings.max_keys, settings.max_pods_per_key, settings.engine_run_size
                )
        self.index = index
        pool = settings.pool
        budgets = Budgets(
            max_blocks_per_pod=pool.max_blocks_per_pod,
            blocks_per_second=float(pool.max_blocks_per_second),
            burst_blocks=max(pool.max_blocks_per_second * 8, 1 << 17),
        )
        self.applier = EventApplier(index, self.tokens, self.block_sizes, EventGuard(budgets))
        self.index_metrics = index_metrics() if settings.enable_metrics else None
        self.applier.index_metrics = self.index_metrics
        self.pool = EventPool(self.applier, settings.pool)
        self.feedback = DeliveredHits(settings.feedback, self.resync_pod, self.speculate)
        self.applier.on_forget = self._forget
        self._flushes: set[asyncio.Task[None]] = set()

    def block_size_for(self, model: str, endpoints: Sequence[Endpoint] = ()) -> int | None:
        """Configured, else learned from events, else from a scraped `cache_config_info` block size."""
        bs = self.block_sizes.get(model)
        if bs is not None:
            return bs
        for ep in endpoints:
            if ep.metrics.cache_block_size > 0:
                return self.block_sizes.learn(model, ep.metrics.cache_block_size)
        return self.block_sizes.any()

    def request_keys(
        self,
        tokens: Sequence[int],
        model: str,
        endpoints: Sequence[Endpoint] = (),
        cache_salt: str | None = None,
        mm_items: Sequence[tuple[str, int, int]] = (),
    ) -> list[int]:
        bs = self.block_size_for(model, endpoints)
        if bs is None:
            return []
        extra = request_extra_keys(len(tokens) // bs, bs, cache_salt, mm_items)
        return self.tokens.block_keys(tokens, model, None, extra, block_size=bs)

    async def match(self, keys: Sequence[int], pods: Iterable[str] | None = None) -> dict[str, PrefixMatch]:
        m = self.index_metrics
        if m is None:
            return await self.index.lookup(keys, pods)
        t0 = time.perf_counter()
        found = await self.index.lookup(keys, pods)
        m.lookup(time.perf_counter() - t0, max((x.blocks for x in found.values()), default=0))
        return found

    async def log_index_metrics(self) -> None:
        """llm-d's metricsLoggingInterval: the index metrics in the log every interval."""
        assert self.index_metrics is not None
        while True:
            await asyncio.sleep(self.settings.metrics_logging_interval)
            log.info("kv-cache index metrics: %s", self.index_metrics.summary())

    def publishes(self, pod: str) -> bool:
        return pod in self.applier.publishing

    def speculate(self, keys: Sequence[int], pod: str, ttl: float, hold: SpeculationHold | None = None) -> None:
        self.index.add_speculative(keys, pod, ttl, hold)

    def speculative_only(self, pod: str, key: int) -> bool:
        return self.index.speculative_only(pod, key)

    def report_delivered(
        self, pod: str, keys: Sequence[int], predicted_blocks: int, delivered_tokens: int, block_size: int, prompt: int
    ) -> None:
        self.feedback.report(pod, keys, predicted_blocks, delivered_tokens, block_size, prompt)

    def report_counted(self, report: CountedReport) -> None:
        self.feedback.report_counted(report)

    def _forget(self, pod: str) -> None:
        self.feedback.forget(pod)

    def endpoint_removed(self, endpoint: Endpoint) -> None:
        # With KV events on the event pool's subscriptions also forget it (and when its publisher changes).
        self._forget(endpoint.hostport)

    def resync_pod(self, pod: str) -> None:
        """The pod's entries are wrong: clear them (its next events and delivered hits rebuild them)."""
        self.applier.clear_pod(pod)
        try:
            task = asyncio.get_running_loop().create_task(self.index.flush())  # Redis: push the clear
        except RuntimeError:  # no loop (tests calling it directly): the next flush carries it
            return
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)
